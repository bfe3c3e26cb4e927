"""The gateway: ACP over WebSocket on ``/acp``, tokens and tenants, ``/health``,
``/status`` and ``/metrics`` — against a real daemon started with ``--gateway``."""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import socket
import ssl
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest
from acp import text_block
from acp.client.connection import ClientSideConnection
from prometheus_client.parser import text_string_to_metric_families
from websockets.asyncio.client import connect as async_connect
from websockets.exceptions import InvalidStatus

from tests.e2e.procs import descendants
from tests.e2e.sdkhost import RecordingClient

from .gateway_helpers import (
    TOKENS,
    GatewayDaemon,
    ManualClient,
    WebSocketTransport,
    WsClient,
    gateway_config,
    http_get,
)
from .helpers import FRAME_TIMEOUT, RpcClient, RpcFailure, short_dir, zeroclaw_argv


@pytest.fixture
def gateway(daemons: Any, scratch_dir: Path) -> GatewayDaemon:
    gateway_config(scratch_dir, '[gateway]\nauth_failures = 3\nauth_window_secs = 600\n')
    return GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0"))


def updates_of(client: RpcClient, kind: str) -> list[dict[str, Any]]:
    return [u["update"] for u in client.updates()
            if u.get("update", {}).get("sessionUpdate") == kind]


def chunk_text(client: RpcClient, kind: str = "agent_message_chunk") -> str:
    return "".join(u["content"]["text"] for u in updates_of(client, kind))


def error_of(client: RpcClient, method: str, params: dict[str, Any]) -> tuple[Any, str]:
    try:
        client.request(method, params)
    except RpcFailure as failure:
        return failure.code, failure.message
    raise AssertionError(f"{method} succeeded")


# --- ACP over /acp --------------------------------------------------------------------


def test_acp_session_flows_over_the_websocket(gateway: GatewayDaemon) -> None:
    """new, a streamed prompt, cancel, a permission request, list, and load from a
    second connection, all in the acp.sock dialect, one message per text frame."""
    cwd = str(gateway.root("alice"))
    with gateway.client() as editor:
        sid = editor.request("session/new", {"cwd": cwd, "mcpServers": []})["sessionId"]
        result = editor.request("session/prompt", {"sessionId": sid, "prompt": "one two three"})
        assert (result["stopReason"], result["content"]) == ("end_turn", "one two three")
        assert chunk_text(editor) == "one two three"
        chunks = [i for i, f in enumerate(editor.frames)
                  if f.get("params", {}).get("update", {}).get("sessionUpdate")
                  == "agent_message_chunk"]
        answer = next(i for i, f in enumerate(editor.frames) if f.get("id") == 3)
        assert chunks and max(chunks) < answer  # streamed before the prompt's answer

        slow = editor.send("session/prompt", {"sessionId": sid, "prompt": "!sleep 30"})
        editor.send("session/cancel", {"sessionId": sid}, notify=True)
        cancelled = editor.wait_response(slow)["result"]
        assert cancelled["stopReason"] == "cancelled"

        write = '!tool file_write {"path": "perm.txt", "content": "perm-ok"}'
        tool = editor.send("session/prompt", {"sessionId": sid, "prompt": write})
        ask = editor.wait_request("session/request_permission")
        assert ask["id"].startswith("zc-out-")
        assert ask["params"]["sessionId"] == sid
        editor.reply(ask["id"], {"outcome": {"outcome": "selected", "optionId": "allow-once"}})
        assert editor.wait_response(tool)["result"]["stopReason"] == "end_turn"
        done = [u for u in updates_of(editor, "tool_call_update") if u["status"] == "completed"]
        assert done and (Path(cwd) / "perm.txt").read_text() == "perm-ok"

        listed = editor.request("session/list", {})["sessions"]
        assert [entry["sessionId"] for entry in listed] == [sid]
    with gateway.client() as second:
        second.request("session/load", {"sessionId": sid, "cwd": cwd})
        replayed = [u["content"]["text"] for u in updates_of(second, "user_message_chunk")]
        assert replayed[0] == "one two three" and len(replayed) == 3


def test_the_agent_query_parameter_is_the_connections_default_agent(
        daemons: Any, scratch_dir: Path) -> None:
    gateway_config(scratch_dir, '[agents.a]\nprovider = "echo"\n[agents.b]\nprovider = "echo"\n')
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0"))
    with gateway.client(query="?agent=b") as pinned, gateway.client(query="?agent=%20") as blank:
        sid = pinned.request("session/new", {})["sessionId"]
        explicit = pinned.request("session/new", {"agentAlias": "a"})["sessionId"]
        assert error_of(blank, "session/new", {})[0] == -32602  # no default: two agents
        with gateway.client("ops") as ops:
            agents = {s["sessionId"]: s["agentAlias"] for s in ops.request("status")["sessions"]}
    assert agents == {sid: "b", explicit: "a"}
    with gateway.client(query="?agent=nope") as unknown:
        assert error_of(unknown, "session/new", {})[0] == -32602


async def test_the_official_acp_sdk_client_over_the_websocket(gateway: GatewayDaemon) -> None:
    client = RecordingClient()
    headers = {"Authorization": f"Bearer {TOKENS['alice']}"}
    async with async_connect(f"{gateway.ws}/acp", additional_headers=headers) as ws:
        conn = ClientSideConnection(client, WebSocketTransport(ws))
        init = await conn.initialize(protocol_version=1)
        assert init.protocol_version == 1 and init.agent_capabilities.load_session
        session = await conn.new_session(cwd=str(gateway.root("alice")), mcp_servers=[])
        response = await conn.prompt(session_id=session.session_id,
                                     prompt=[text_block("hello over websocket")])
        assert response.stop_reason == "end_turn"
        await client.wait_text(session.session_id, "hello over websocket")
        listed = await conn.list_sessions()
        assert [s.session_id for s in listed.sessions] == [session.session_id]
        await conn.close()


# --- tokens ---------------------------------------------------------------------------


def status_code(url: str, **options: Any) -> int:
    with pytest.raises(InvalidStatus) as refused:
        WsClient(url, **options)
    return refused.value.response.status_code


def test_tokens_are_checked_before_the_upgrade(gateway: GatewayDaemon) -> None:
    url = f"{gateway.ws}/acp"
    assert status_code(url) == 401
    assert status_code(url, token="not-a-token") == 401
    with WsClient(url, token=TOKENS["bob"]) as by_header:
        assert by_header.request("session/list", {}) == {"sessions": []}
    with WsClient(f"{url}?token={TOKENS['bob']}") as by_query:
        assert by_query.request("session/list", {}) == {"sessions": []}
    offered = ["acp", f"zeroclaw.token.{TOKENS['bob']}"]
    with WsClient(url, subprotocols=offered) as by_subprotocol:
        assert by_subprotocol.ws.subprotocol == "acp"  # the token entry is never echoed
        assert by_subprotocol.request("session/list", {}) == {"sessions": []}
    assert gateway.get("/status")[0] == 401
    assert gateway.get("/metrics", "bob")[0] == 403  # metrics: admin only
    assert gateway.get("/nowhere", "bob")[0] == 404


def test_failed_logins_are_rate_limited_per_address(gateway: GatewayDaemon) -> None:
    url = f"{gateway.ws}/acp"
    # one guess per request: a second token in the same request is not tried
    assert status_code(f"{url}?token=guess&token={TOKENS['alice']}") == 401
    assert status_code(f"{url}?token={TOKENS['alice']}", subprotocols=["zeroclaw.token.guess"]) \
        == 401
    assert status_code(url, token="guess") == 401  # the third failure
    assert status_code(url, token="guess") == 429
    assert status_code(url, token=TOKENS["alice"]) == 429  # even the right one, for a while
    status, _, headers = gateway.get("/status", "ops")
    assert status == 429 and int(headers["Retry-After"]) > 0
    assert http_get(gateway.http + "/health")[0] != 429  # needs no token


def test_tokens_never_appear_in_logs_status_or_errors(gateway: GatewayDaemon) -> None:
    bodies = [gateway.get("/status", tenant)[1] for tenant in TOKENS]
    bodies += [http_get(f"{gateway.http}/status?token={TOKENS['bob']}x")[1]]
    with gateway.client(query=f"?token={TOKENS['bob']}") as alice:
        sid = alice.request("session/new", {})["sessionId"]
        alice.request("session/prompt", {"sessionId": sid, "prompt": "hi"})
        bodies.append(json.dumps(alice.frames))
        bodies.append(json.dumps(alice.request("status")))
    with gateway.daemon.client() as local:
        bodies.append(json.dumps(local.request("status")))
    gateway.daemon.terminate()
    bodies.append(gateway.daemon.stderr_path.read_text())
    for token in TOKENS.values():
        assert not [b for b in bodies if token in b]


# --- tenants --------------------------------------------------------------------------


CROSS_TENANT = [
    ("session/load", {}), ("session/resume", {}), ("session/prompt", {"prompt": "x"}),
    ("session/close", {}), ("session/stop", {}), ("session/delete", {}),
    ("session/cancel", {}), ("session/set_mode", {"modeId": "full"}),
    ("session/event", {"type": "note"}),
]


def test_tenants_cannot_see_or_touch_each_others_sessions(gateway: GatewayDaemon) -> None:
    cwd = str(gateway.root("alice"))
    alice = gateway.client("alice")
    sid = alice.request("session/new", {"cwd": cwd})["sessionId"]
    alice.request("session/prompt", {"sessionId": sid, "prompt": "alice's secret title"})
    with gateway.client("bob") as bob:
        bob_sid = bob.request("session/new", {})["sessionId"]
        assert bob.request("session/list", {})["sessions"][0]["sessionId"] == bob_sid
        assert bob.request("session/list", {"cwd": cwd})["sessions"] == []
        ghost = str(uuid.uuid4())
        for method, extra in CROSS_TENANT:
            real = error_of(bob, method, {"sessionId": sid, "cwd": cwd, **extra})
            fake = error_of(bob, method, {"sessionId": ghost, "cwd": cwd, **extra})
            assert real[0] == fake[0] == -32000, method
            assert real[1].replace(sid, "ID") == fake[1].replace(ghost, "ID"), method
        assert [s["sessionId"] for s in bob.request("status")["sessions"]] == [bob_sid]
    alice.close()
    with gateway.client("alice") as again:  # alice's own session is still hers, intact
        again.request("session/load", {"sessionId": sid, "cwd": cwd})
        assert chunk_text(again, "user_message_chunk") == "alice's secret title"
    assert "alice's secret" not in gateway.get("/status", "bob")[1]
    admin_view = json.loads(gateway.get("/status", "ops")[1])
    assert {sid, bob_sid} <= {s["sessionId"] for s in admin_view["sessions"]}
    bob_view = json.loads(gateway.get("/status", "bob")[1])
    assert [s["sessionId"] for s in bob_view["sessions"]] == [bob_sid]
    assert "workers" not in bob_view and "store" not in bob_view
    with RpcClient(gateway.daemon.socket_path.parent / "acp.sock") as owner:  # local: the owner
        listed = {s["sessionId"] for s in owner.request("session/list", {})["sessions"]}
    assert {sid, bob_sid} <= listed


def test_a_tenants_session_cap_and_workspace_root(daemons: Any, scratch_dir: Path) -> None:
    root = scratch_dir / "alice-root"
    (root / "project").mkdir(parents=True)
    gateway_config(scratch_dir, alice=f'max_sessions = 1\nworkspace_root = "{root}"')
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0"))
    with gateway.client("alice") as alice, gateway.client("bob") as bob:
        assert error_of(alice, "session/new", {"cwd": "/tmp"})[0] == -32602
        escape = str(root / "project" / ".." / "..")
        assert error_of(alice, "session/new", {"cwd": escape})[0] == -32602
        made = alice.request("session/new", {})
        assert made["workspaceDir"] == str(root.resolve())
        slow = alice.send("session/prompt", {"sessionId": made["sessionId"],
                                             "prompt": "!sleep 30"})
        assert error_of(alice, "session/new", {"cwd": str(root / "project")})[0] == -32001
        bob.request("session/new", {})  # bob has no cap
        bob.request("session/new", {})
        alice.send("session/cancel", {"sessionId": made["sessionId"]}, notify=True)
        assert slow is not None and "result" in alice.wait_response(slow)
        inside = alice.request("session/new", {"cwd": str(root / "project")})  # evicts `made`
        assert inside["workspaceDir"] == str(root.resolve())  # the root: its only workspace
        alice.request("session/resume", {"sessionId": made["sessionId"]})  # evicts `inside`


# --- ops over HTTP --------------------------------------------------------------------


def metric_values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_metrics_after_a_known_workload(gateway: GatewayDaemon) -> None:
    status_code(f"{gateway.ws}/acp", token="wrong")
    status_code(f"{gateway.ws}/acp")
    with gateway.client("alice") as alice:
        sid = alice.request("session/new", {})["sessionId"]
        for text in ("one", "two"):
            alice.request("session/prompt", {"sessionId": sid, "prompt": text})
        slow = alice.send("session/prompt", {"sessionId": sid, "prompt": "!sleep 30"})
        alice.send("session/cancel", {"sessionId": sid}, notify=True)
        alice.wait_response(slow)
        alice.request("session/new", {})
        status, text, headers = gateway.get("/metrics", "ops")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    values = metric_values(text)
    assert values[("zeroclaw_turns_total", (("stop_reason", "end_turn"),))] == 2
    assert values[("zeroclaw_turns_total", (("stop_reason", "cancelled"),))] == 1
    assert values[("zeroclaw_turn_duration_seconds_count", ())] == 3
    assert values[("zeroclaw_turn_duration_seconds_bucket", (("le", "+Inf"),))] == 3
    assert values[("zeroclaw_turn_duration_seconds_sum", ())] > 0
    assert values[("zeroclaw_sessions_live", (("state", "idle"),))] == 2
    assert values[("zeroclaw_gateway_connections", ())] == 1  # alice, during the scrape
    assert values[("zeroclaw_gateway_auth_failures_total", (("reason", "invalid"),))] == 1
    assert values[("zeroclaw_gateway_auth_failures_total", (("reason", "missing"),))] == 1
    workers = values[("zeroclaw_workers", ())]
    rss = [v for (name, _), v in values.items() if name == "zeroclaw_worker_rss_bytes"]
    assert workers >= 1 and len(rss) == workers and min(rss) > 0


def healthy_once_started(gateway: GatewayDaemon, timeout: float = 20.0) -> str:
    """The first 200 of ``/health`` (503 while the host and its workers start)."""
    deadline = time.monotonic() + timeout
    while True:
        status, body, _ = gateway.get("/health")
        if status == 200:
            return body
        assert status == 503 and time.monotonic() < deadline, body
        time.sleep(0.05)


def test_health_reports_the_store_and_the_workers(gateway: GatewayDaemon) -> None:
    body = healthy_once_started(gateway)
    assert json.loads(body)["status"] == "ok"
    store = gateway.daemon.config_dir / "data" / "sessions" / "acp-sessions.db"
    store.unlink()
    status, body, _ = gateway.get("/health")
    assert status == 503
    assert json.loads(body)["status"] == "unhealthy" and json.loads(body)["reasons"]


# --- starting -------------------------------------------------------------------------


def test_plain_http_off_loopback_is_refused_at_start(scratch_dir: Path) -> None:
    gateway_config(scratch_dir)
    done = subprocess.run(
        zeroclaw_argv("daemon", "--config-dir", str(scratch_dir), "--gateway", "0.0.0.0:0"),
        capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "not a loopback address" in done.stderr and "allow_plaintext" in done.stderr


def test_tenant_add_list_remove(scratch_dir: Path) -> None:
    def tenant(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(zeroclaw_argv("tenant", "--config-dir", str(scratch_dir), *args),
                              capture_output=True, text=True, timeout=30)

    added = tenant("add", "carol", "--admin", "--max-sessions", "3")
    assert added.returncode == 0, added.stderr
    token = added.stdout.strip()
    assert len(token) >= 40
    text = (scratch_dir / "config.toml").read_text()
    assert token not in text and "token_sha256" in text
    assert tenant("add", "carol").returncode == 1
    listed = json.loads(tenant("list", "--json").stdout)
    carol_id = listed[0].pop("id")
    assert len(carol_id) == 32 and f'id = "{carol_id}"' in text
    assert listed == [{"name": "carol", "admin": True, "maxSessions": 3, "workspaceRoot": None,
                       "sandboxNetwork": True}]
    assert token not in tenant("list").stdout
    assert tenant("remove", "carol").returncode == 0
    assert tenant("remove", "carol").returncode == 1
    assert json.loads(tenant("list", "--json").stdout) == []


def test_a_tenant_token_from_tenant_add_opens_the_gateway(daemons: Any) -> None:
    config_dir = short_dir()
    added = subprocess.run(zeroclaw_argv("tenant", "--config-dir", str(config_dir), "add", "dev"),
                           capture_output=True, text=True, timeout=30)
    gateway = GatewayDaemon(daemons(config_dir, "--gateway", "127.0.0.1:0"))
    with WsClient(f"{gateway.ws}/acp", token=added.stdout.strip()) as dev:
        assert dev.request("session/list", {}) == {"sessions": []}


# --- the connection itself ------------------------------------------------------------


def test_envelope_rules_and_the_handshake_gate_hold_on_the_websocket(
        gateway: GatewayDaemon) -> None:
    with gateway.client(initialize=False) as raw:
        raw.ws.send("{not json")
        assert raw.read_frame()["error"]["code"] == -32700
        assert error_of(raw, "session/new", {})[0] == -32010  # initialize first
        raw.request("initialize", {"protocolVersion": 1})
        raw.ws.send(json.dumps({"jsonrpc": "2.0", "id": 7, "method": "session/new",
                                "params": None}))
        assert raw.read_frame()["error"]["code"] == -32600
        assert error_of(raw, "no/such", {})[0] == -32601
        assert raw.request("session/list", {}) == {"sessions": []}  # still usable


def test_a_client_gone_while_a_permission_is_pending_denies_the_tool(
        gateway: GatewayDaemon) -> None:
    editor = gateway.client()
    sid = editor.request("session/new", {})["sessionId"]
    editor.send("session/prompt", {"sessionId": sid,
                                   "prompt": '!tool file_write {"path": "x.txt", "content": "y"}'})
    editor.wait_request("session/request_permission")
    editor.close()
    with gateway.client() as again:
        again.request("session/load", {"sessionId": sid})
        tools = updates_of(again, "tool_call_update")
    assert tools and tools[-1]["status"] == "failed"
    assert not (gateway.daemon.config_dir / "agents" / "default" / "workspace" / "x.txt").exists()


def test_sigterm_answers_running_prompts_on_the_gateway_then_exits_0(
        gateway: GatewayDaemon) -> None:
    editor = gateway.client()
    sid = editor.request("session/new", {})["sessionId"]
    slow = editor.send("session/prompt", {"sessionId": sid, "prompt": "!sleep 30"})
    editor.request("status")  # the prompt is in before the signal
    gateway.daemon.proc.send_signal(signal.SIGTERM)
    assert editor.wait_response(slow)["result"]["stopReason"] == "cancelled"
    assert gateway.daemon.wait(20) == 0


def test_an_upgrade_asked_after_sigterm_on_a_connection_opened_before_gets_503(
        gateway: GatewayDaemon) -> None:
    """The daemon is stopping: a connection it accepted before asks for ``/acp`` only
    now, and gets no new session (its worker is held still, so the stop lasts)."""
    editor = gateway.client()
    sid = editor.request("session/new", {})["sessionId"]
    editor.send("session/prompt", {"sessionId": sid, "prompt": "!sleep 30"})
    editor.request("status")  # the prompt is in before the signal
    host, port = gateway.http.removeprefix("http://").rsplit(":", 1)
    late = socket.create_connection((host, int(port)), timeout=FRAME_TIMEOUT)
    gateway.get("/health")  # accepted after ``late``: so ``late`` is too
    held = descendants(gateway.daemon.pid)
    for process in held:
        process.suspend()  # the cancelled turn cannot end before the stop times out
    try:
        gateway.daemon.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + FRAME_TIMEOUT
        while "received SIGTERM: stopping" not in gateway.daemon.stderr():
            assert time.monotonic() < deadline, gateway.daemon.stderr()
            time.sleep(0.02)
        late.sendall(
            "GET /acp HTTP/1.1\r\nHost: gateway\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            f"Sec-WebSocket-Version: 13\r\nAuthorization: Bearer {TOKENS['alice']}\r\n"
            "\r\n".encode())
        answer = late.recv(4096)
    finally:
        for process in held:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.resume()
        late.close()
        editor.close()
    assert answer.startswith(b"HTTP/1.1 503"), answer


def test_a_client_that_does_not_read_is_dropped_and_others_go_on(
        daemons: Any, scratch_dir: Path) -> None:
    gateway_config(scratch_dir, "[acp]\nclient_stall_timeout_secs = 1\n")
    daemon = daemons(scratch_dir, "--gateway", "127.0.0.1:0")
    gateway = GatewayDaemon(daemon)
    with gateway.client() as editor:  # made here: the stuck client cannot read its id
        sid = editor.request("session/new", {})["sessionId"]
    stuck = ManualClient(f"{gateway.ws}/acp", TOKENS["alice"])
    stuck.send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": 1}})
    stuck.send({"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
                "params": {"sessionId": sid, "prompt": "word " * 200_000}})
    deadline = time.monotonic() + 30
    while "client stalled" not in daemon.stderr_path.read_text():  # the whole log
        assert time.monotonic() < deadline, daemon.stderr()
        time.sleep(0.05)
    with gateway.client("bob") as other:
        other_sid = other.request("session/new", {})["sessionId"]
        result = other.request("session/prompt", {"sessionId": other_sid, "prompt": "still here"})
        assert result["content"] == "still here"
    stuck.close()


def test_a_slow_client_gets_its_whole_turn_paced_not_dropped(
        daemons: Any, scratch_dir: Path) -> None:
    """Its turn waits for it (the updates held back, merged) instead of filling the
    connection's queue up to the high-water mark that would drop it."""
    gateway_config(scratch_dir)
    daemon = daemons(scratch_dir, "--gateway", "127.0.0.1:0",
                     env_extra={"ZEROCLAW_WRITE_HIGH_WATER": str(1024 * 1024)})
    gateway = GatewayDaemon(daemon)
    with gateway.client() as editor:
        sid = editor.request("session/new", {})["sessionId"]
    slow = ManualClient(f"{gateway.ws}/acp", TOKENS["alice"])
    prompt = "word " * 200_000
    slow.send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
               "params": {"protocolVersion": 1}})
    slow.send({"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
               "params": {"sessionId": sid, "prompt": prompt}})
    time.sleep(2)  # reads nothing for a while: far more than 1 MiB is produced meanwhile
    answer, before = slow.read_until(2)
    slow.close()
    assert answer["result"]["stopReason"] == "end_turn"
    text = "".join(m["params"]["update"]["content"]["text"] for m in before
                   if m.get("params", {}).get("update", {}).get("sessionUpdate")
                   == "agent_message_chunk")
    assert text.split() == prompt.split()
    assert "closing gateway connection" not in daemon.stderr_path.read_text()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is needed for a test cert")
def test_tls_lets_the_gateway_listen_off_loopback(daemons: Any, scratch_dir: Path) -> None:
    cert, key = scratch_dir / "cert.pem", scratch_dir / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    gateway_config(scratch_dir, f'[gateway]\ntls_cert = "{cert}"\ntls_key = "{key}"\n')
    gateway = GatewayDaemon(daemons(scratch_dir, "--gateway", "0.0.0.0:0"))
    assert gateway.http.startswith("https://")
    port = gateway.http.rsplit(":", 1)[1]
    context = ssl.create_default_context(cafile=str(cert))
    with WsClient(f"wss://127.0.0.1:{port}/acp", token=TOKENS["alice"], ssl=context) as secure:
        assert secure.request("session/list", {}) == {"sessions": []}


def test_an_id_reused_by_the_owner_after_a_delete_is_not_the_old_tenants(
        gateway: GatewayDaemon) -> None:
    """Ownership comes from the session as it is now, never from what was once seen:
    the owner deletes a tenant's session locally and makes one under the same id."""
    with gateway.client("alice") as alice:
        sid = alice.request("session/new", {})["sessionId"]
        alice.request("session/prompt", {"sessionId": sid, "prompt": "mine"})
    with RpcClient(gateway.daemon.socket_path.parent / "acp.sock") as owner:
        owner.request("session/delete", {"sessionId": sid})
    with gateway.daemon.client() as rpc:
        rpc.request("session/new", {"sessionId": sid})
        rpc.request("session/prompt", {"sessionId": sid, "prompt": "the owner's now"})
    with gateway.client("alice") as alice:
        for method, extra in CROSS_TENANT:
            assert error_of(alice, method, {"sessionId": sid, **extra})[0] == -32000, method
        assert alice.request("session/list", {}) == {"sessions": []}


def test_an_ephemeral_daemon_counts_gateway_clients(daemons: Any, scratch_dir: Path) -> None:
    gateway_config(scratch_dir)
    daemon = daemons(scratch_dir, "--ephemeral", "--gateway", "127.0.0.1:0")
    gateway = GatewayDaemon(daemon)
    assert gateway.get("/health")[0] in (200, 503)  # plain HTTP is not a client
    assert daemon.proc.poll() is None
    with gateway.client() as editor:
        editor.request("session/new", {})
        time.sleep(1.5)  # longer than the grace period: a connected client keeps it up
        assert daemon.proc.poll() is None
    assert daemon.wait(20) == 0  # gone a second after the last client left
