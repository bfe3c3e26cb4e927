"""``zeroclaw acp --attach ws://…``: an editor's stdio bridged to a remote gateway's
``/acp`` — against a real daemon started with ``--gateway``, the bridge a real
``zeroclaw acp`` process driven over its stdio (:class:`Editor`)."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import ServerConnection, serve

from tests.e2e.procs import host_env, reap_leaks

from .gateway_helpers import TOKENS, GatewayDaemon, gateway_config
from .helpers import short_dir, zeroclaw_argv
from .test_acp_socket import Editor


@pytest.fixture
def gateway(daemons: Any, scratch_dir: Path) -> GatewayDaemon:
    gateway_config(scratch_dir, '[gateway]\nauth_failures = 3\nauth_window_secs = 600\n')
    return GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0"))


@pytest.fixture
def editor_dir() -> Iterator[Path]:
    """The bridge's own config dir: nothing of the daemon's (a remote machine's)."""
    path = short_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def token_env(tenant: str = "alice") -> dict[str, str]:
    return host_env({"ZEROCLAW_GATEWAY_TOKEN": TOKENS[tenant]})


def remote_editor(gateway: GatewayDaemon, editor_dir: Path, *options: str,
                  env: dict[str, str] | None = None, query: str = "") -> Editor:
    return Editor(editor_dir, token_env() if env is None else env,
                  attach=(f"{gateway.ws}/acp{query}", *options))


def test_an_editor_attached_over_the_websocket_shares_the_daemons_sessions(
        gateway: GatewayDaemon, editor_dir: Path) -> None:
    cwd = str(gateway.root("alice"))
    one = remote_editor(gateway, editor_dir)
    assert one.request("initialize", {"protocolVersion": 1})["agentInfo"]["name"] == "zeroclaw-acp"
    sid = one.request("session/new", {"cwd": cwd})["sessionId"]
    result = one.request("session/prompt", {"sessionId": sid, "prompt": "over the wire"})
    assert (result["stopReason"], result["content"]) == ("end_turn", "over the wire")
    assert "".join(u["content"]["text"] for u in one.updates
                   if u["sessionUpdate"] == "agent_message_chunk") == "over the wire"
    assert one.quit() == 0
    two = remote_editor(gateway, editor_dir)
    two.request("initialize", {"protocolVersion": 1})
    two.request("session/load", {"sessionId": sid, "cwd": cwd})
    assert [u["content"]["text"] for u in two.updates
            if u["sessionUpdate"] == "user_message_chunk"] == ["over the wire"]
    assert two.quit() == 0
    assert TOKENS["alice"] not in gateway.daemon.stderr()


def test_the_token_comes_from_a_file_and_a_refused_one_is_a_clear_error(
        gateway: GatewayDaemon, editor_dir: Path) -> None:
    token_file = editor_dir / "token"
    token_file.write_text(TOKENS["bob"] + "\n")
    token_file.chmod(0o600)
    by_file = remote_editor(gateway, editor_dir, "--token-file", str(token_file),
                            "--log-level", "debug", env=host_env())
    by_file.request("initialize", {"protocolVersion": 1})
    assert by_file.request("session/list", {}) == {"sessions": []}
    assert TOKENS["bob"] not in by_file.stderr_text()  # not even at debug level
    assert by_file.quit() == 0

    wrong = "wrong-token-0123456789"
    refused = remote_editor(gateway, editor_dir,
                            env=host_env({"ZEROCLAW_GATEWAY_TOKEN": wrong}))
    refused.send("initialize", {"protocolVersion": 1})
    assert refused.proc.wait(20) == 1
    assert refused.proc.stdout is not None and refused.proc.stdout.read() == b""
    stderr = refused.stderr_text()
    assert "refused the token (HTTP 401: invalid token)" in stderr
    assert wrong not in stderr
    refused.quit()

    missing = remote_editor(gateway, editor_dir, env=host_env())
    assert missing.proc.wait(20) == 1
    assert "ZEROCLAW_GATEWAY_TOKEN" in missing.stderr_text()
    missing.quit()

    in_url = remote_editor(gateway, editor_dir, query=f"?token={wrong}")
    assert in_url.proc.wait(20) == 1
    assert "do not put the token in the URL" in in_url.stderr_text()
    assert wrong not in in_url.stderr_text()
    in_url.quit()


def test_a_revoked_token_ends_the_bridge_with_the_gateways_reason(
        gateway: GatewayDaemon, editor_dir: Path) -> None:
    editor = remote_editor(gateway, editor_dir)
    editor.request("initialize", {"protocolVersion": 1})
    daemon = gateway.daemon
    removed = subprocess.run(
        zeroclaw_argv("tenant", "--config-dir", str(daemon.config_dir), "remove", "alice"),
        capture_output=True, text=True, timeout=30, env=daemon.env)
    assert removed.returncode == 0, removed.stderr
    assert editor.proc.wait(20) == 1
    assert "(WebSocket close 1008: token revoked)" in editor.stderr_text()
    editor.quit()


def test_a_permission_question_after_the_editor_closed_its_input_is_refused(
        gateway: GatewayDaemon, editor_dir: Path) -> None:
    """A WebSocket cannot be half-closed: the bridge answers the gateway's questions
    for an editor whose input ended (the tool is denied, as on acp.sock), and closes
    once the editor's prompt was answered."""
    editor = remote_editor(gateway, editor_dir)
    editor.request("initialize", {"protocolVersion": 1})
    sid = editor.request("session/new", {})["sessionId"]
    write = '!tool file_write {"path": "denied.txt", "content": "no"}'
    prompt = editor.send("session/prompt", {"sessionId": sid, "prompt": write})
    assert editor.proc.stdin is not None
    editor.proc.stdin.close()
    answer = editor.answer(prompt)
    assert answer["result"]["stopReason"] == "end_turn", answer
    assert not (gateway.root("alice") / "denied.txt").exists()
    assert editor.proc.wait(20) == 0, editor.stderr_text()
    editor.stderr.close()


def test_a_line_over_the_frame_limit_is_answered_and_the_bridge_goes_on(
        gateway: GatewayDaemon, editor_dir: Path) -> None:
    (editor_dir / "config.toml").write_text("[acp]\nframe_limit = 4096\n")
    editor = remote_editor(gateway, editor_dir)
    assert editor.proc.stdin is not None and editor.proc.stdout is not None
    editor.proc.stdin.write(b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"p":"'
                            + b"x" * 10_000 + b'"}}\n')
    editor.proc.stdin.flush()
    too_large = json.loads(editor.proc.stdout.readline())
    assert (too_large["id"], too_large["error"]["code"]) == (None, -32600)
    editor.next_id = 1
    assert editor.request("initialize", {"protocolVersion": 1})["protocolVersion"] == 1
    assert editor.quit() == 0


def test_a_gateway_that_dies_mid_turn_fails_the_pending_prompt(
        gateway: GatewayDaemon, editor_dir: Path) -> None:
    editor = remote_editor(gateway, editor_dir)
    editor.request("initialize", {"protocolVersion": 1})
    sid = editor.request("session/new", {})["sessionId"]
    daemon = psutil.Process(gateway.daemon.pid)
    family = [daemon, *daemon.children(recursive=True)]
    prompt = editor.send("session/prompt", {"sessionId": sid, "prompt": "!sleep 30"})
    daemon.send_signal(signal.SIGKILL)
    answer = editor.answer(prompt)
    assert answer["error"]["code"] == -32603, answer
    assert editor.proc.wait(15) == 1
    assert "closed the connection" in editor.stderr_text()
    editor.stderr.close()
    assert not reap_leaks([p for p in family if p.is_running()], timeout=10)


def test_a_connection_dropped_before_any_answer_is_dialled_again_and_replayed(
        editor_dir: Path) -> None:
    """A gateway that upgrades and closes before answering (restarting, say): the
    bridge dials again and replays what the editor sent, as on acp.sock."""
    seen: list[Any] = []

    def handler(connection: ServerConnection) -> None:
        request = json.loads(connection.recv())
        seen.append((request["id"], connection.request.headers["Authorization"]))
        if len(seen) == 2:
            connection.send(json.dumps({"jsonrpc": "2.0", "id": request["id"],
                                        "result": {"protocolVersion": 1}}))
            connection.recv()  # until the bridge closes (the editor's input ended)

    with serve(handler, "127.0.0.1", 0) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.socket.getsockname()[1]
        editor = Editor(editor_dir, token_env(), attach=(f"ws://127.0.0.1:{port}/acp",))
        assert editor.request("initialize", {"protocolVersion": 1}) == {"protocolVersion": 1}
        assert editor.quit() == 0
        server.shutdown()
    assert seen == [(1, f"Bearer {TOKENS['alice']}")] * 2


def test_a_gateway_frame_over_the_frame_limit_is_not_read_into_memory(
        editor_dir: Path) -> None:
    """A hostile gateway sends a frame far over the editor's frame limit: the bridge
    fails the connection before reading it (close 1009), the editor never sees it,
    its pending request is answered -32603 and the bridge ends."""
    (editor_dir / "config.toml").write_text("[acp]\nframe_limit = 4096\n")
    closed: list[Any] = []

    def handler(connection: ServerConnection) -> None:
        request = json.loads(connection.recv())
        connection.send(json.dumps({"jsonrpc": "2.0", "id": request["id"],
                                    "result": {"protocolVersion": 1}}))
        connection.recv()
        with contextlib.suppress(ConnectionClosed):
            connection.send(json.dumps({"jsonrpc": "2.0", "method": "session/update",
                                        "params": {"huge": "x" * 1_000_000}}))
            connection.recv()
        closed.append(connection.close_code)

    with serve(handler, "127.0.0.1", 0, compression=None) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.socket.getsockname()[1]
        editor = Editor(editor_dir, token_env(), attach=(f"ws://127.0.0.1:{port}/acp",))
        assert editor.request("initialize", {"protocolVersion": 1}) == {"protocolVersion": 1}
        answer = editor.answer(editor.send("session/list", {}))
        assert answer["error"]["code"] == -32603, answer
        assert editor.proc.wait(15) == 1
        assert "1009" in editor.stderr_text()
        editor.stderr.close()
        server.shutdown()
    assert closed == [1009]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed for a test cert")
def test_wss_verifies_the_gateway_with_the_given_ca_file(
        daemons: Any, scratch_dir: Path, editor_dir: Path) -> None:
    cert, key = scratch_dir / "cert.pem", scratch_dir / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    gateway_config(scratch_dir, f'[gateway]\ntls_cert = "{cert}"\ntls_key = "{key}"\n')
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0"))
    assert gateway.ws.startswith("wss://")
    unverified = remote_editor(gateway, editor_dir)
    assert unverified.proc.wait(20) == 1
    assert "--ca-file" in unverified.stderr_text()
    unverified.quit()
    secure = remote_editor(gateway, editor_dir, "--ca-file", str(cert))
    secure.request("initialize", {"protocolVersion": 1})
    assert secure.request("session/list", {}) == {"sessions": []}
    assert secure.quit() == 0


def _outbound_address() -> str | None:
    """This machine's address on its default route (no packet is sent), if any."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.254", 9))
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") else address


def test_a_token_sent_unencrypted_to_another_machine_is_warned_about(
        daemons: Any, scratch_dir: Path, editor_dir: Path) -> None:
    """``ws://`` to a host that is not this machine sends the token in clear text: the
    bridge works (a trusted network, a tunnel) but says so on stderr."""
    address = _outbound_address()
    if address is None:
        pytest.skip("this machine has no address besides loopback")
    gateway_config(scratch_dir, "[gateway]\nallow_plaintext = true\n")
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "0.0.0.0:0"))
    port = gateway.ws.rpartition(":")[2]
    remote = Editor(editor_dir, token_env(), attach=(f"ws://{address}:{port}/acp",))
    remote.request("initialize", {"protocolVersion": 1})
    assert remote.request("session/list", {}) == {"sessions": []}
    assert f"the token goes unencrypted over ws:// to {address}" in remote.stderr_text()
    assert remote.quit() == 0
    local = Editor(editor_dir, token_env(), attach=(f"ws://127.0.0.1:{port}/acp",))
    local.request("initialize", {"protocolVersion": 1})
    assert "unencrypted" not in local.stderr_text()
    assert local.quit() == 0
