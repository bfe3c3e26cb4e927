"""The gateway at the open-file limit: its connections count against the daemon's guard."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import psutil

from .gateway_helpers import GatewayDaemon, gateway_config
from .test_daemon_limits import _limits, _nofile, _wait_log


def _connect_until_stalled(port: int, into: list[socket.socket], most: int = 300) -> None:
    """TCP connections to the gateway, kept open (saying nothing), until ``most`` are
    held or one is not taken within a second (accepting paused, the backlog full)."""
    while len(into) < most:
        try:
            into.append(socket.create_connection(("127.0.0.1", port), timeout=1.0))
        except OSError:
            return


def test_at_the_fd_limit_the_gateway_pauses_accepting_quietly_and_resumes(
        daemons: Any, scratch_dir: Path, flood: list[socket.socket]) -> None:
    """soft = hard = 128: gateway clients past the limit get the Unix sockets' treatment
    (one warning, no traceback, an idle CPU), and new clients are served again once
    the flood has gone."""
    gateway_config(scratch_dir)
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0",
                                    preexec_fn=_nofile(128, 128)))
    daemon = gateway.daemon
    assert _limits(daemon.pid) == (128, 128)
    with gateway.client() as client:
        client.request("session/list", {})  # the host (workers, store) is up
    port = int(gateway.http.rsplit(":", 1)[1])
    _connect_until_stalled(port, flood)
    _wait_log(daemon, "out of file descriptors")
    process = psutil.Process(daemon.pid)
    before = process.cpu_times()
    time.sleep(2.0)  # the window over which CPU use is measured
    after = process.cpu_times()
    busy = (after.user + after.system) - (before.user + before.system)
    assert busy < 0.2, f"the daemon used {busy:.2f} s of CPU in 2 s at its fd limit"
    log = daemon.stderr_path.read_text(errors="replace")
    assert "Traceback" not in log and "out of system resource" not in log
    assert log.count("out of file descriptors") == 1
    for sock in flood:
        sock.close()
    flood.clear()
    with gateway.client() as client:
        assert client.request("session/list", {}) == {"sessions": []}
    assert daemon.terminate() == 0
