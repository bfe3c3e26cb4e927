

def test_a_server_that_dies_exits_3(terminal: Terminal) -> None:
    dies = "import sys; sys.stdin.readline()"
    win = terminal.start("--server", sys.executable, "--server-args", "-c", dies)
    try:
        terminal.wait_for(win, "EXIT=3")
        assert "the server could not open a session" in terminal.screen(win)
    finally:
        show(terminal, win)
