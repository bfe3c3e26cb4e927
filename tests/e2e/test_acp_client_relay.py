"""A hosted ACP agent's requests for its client (``fs/*``, ``terminal/*``) over stdio:
relayed to an SDK client that advertised them, served by zeroclaw itself for one that
did not (files under the path policy, commands in its sandboxed terminals), and
answered with a clear error when the client does not answer in time; and extension
methods (``_name``) forwarded both ways (issue "Real agents 1", points 3 and 4). The
agent is ``tests/fixtures/acp_fixture_agent.py``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from acp.schema import ClientCapabilities, FileSystemCapabilities

from .conftest import SdkHostFactory
from .sdkhost import expect_error
from .test_acp_hosting import acp_config, fixture_command, prompt_text

OFFERING = ClientCapabilities(
    fs=FileSystemCapabilities(read_text_file=True, write_text_file=True), terminal=True)


async def test_fs_and_terminal_requests_are_relayed_to_a_client_that_offers_them(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    acp_config(config_dir, fixture_command())
    async with sdk_hosts() as host:
        await host.initialize(OFFERING)
        sid = await host.new_session(workspace)
        text, _ = await prompt_text(host, sid, "caps")
        assert json.loads(text) == {"fs": {"readTextFile": True, "writeTextFile": True},
                                    "terminal": True}
        text, _ = await prompt_text(host, sid, f"read {workspace / 'notes.txt'}")
        assert text == f"read: the client's copy of {workspace / 'notes.txt'}"
        text, _ = await prompt_text(host, sid, f"write {workspace / 'new.txt'} from-agent")
        assert text == "wrote" and not (workspace / "new.txt").exists()
        text, _ = await prompt_text(host, sid, "term make test")
        assert text == "exit=7 output=the client's terminal"
        requests = host.client.client_requests
        assert [method for method, _ in requests] == [
            "fs/read_text_file", "fs/write_text_file", "terminal/create",
            "terminal/wait_for_exit", "terminal/output", "terminal/release"]
        assert all(params["session_id"] == sid for _, params in requests)
        assert requests[1][1]["content"] == "from-agent"
        assert requests[2][1]["command"] == "make test"
        terminal_ids = {params.get("terminal_id") for _, params in requests[3:]}
        assert terminal_ids == {"client-term-3"}


async def test_a_client_that_offers_neither_gets_zeroclaws_own_fs_and_terminals(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path, tmp_path: Path
) -> None:
    acp_config(config_dir, fixture_command())
    (workspace / "notes.txt").write_text("on disk\n")
    async with sdk_hosts(env_extra={"HOST_SECRET_TOKEN": "do-not-pass"}) as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        text, _ = await prompt_text(host, sid, f"read {workspace / 'notes.txt'}")
        assert text == "read: on disk\n"
        text, _ = await prompt_text(host, sid, "term echo out; echo err >&2; pwd; exit 3")
        assert text == f"exit=3 output=out\nerr\n{workspace}\n"
        await prompt_text(host, sid, f"term touch {tmp_path / 'escaped'}")
        assert not (tmp_path / "escaped").exists()  # confined: written nowhere outside
        text, _ = await prompt_text(host, sid, "term echo $HOST_SECRET_TOKEN.")
        assert text == "exit=0 output=.\n"
        await host.conn.set_session_mode(session_id=sid, mode_id="read_only")
        text, _ = await prompt_text(host, sid, "term echo never")
        assert text.startswith("terminal error -32602 ") and "read_only" in text
        assert not host.client.client_requests


async def test_a_relayed_request_the_client_never_answers_fails_after_the_timeout(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    acp_config(config_dir, fixture_command())
    async with sdk_hosts(env_extra={"ZEROCLAW_acp__session_timeout_secs": "2"}) as host:
        await host.initialize(OFFERING)
        sid = await host.new_session(workspace)
        host.client.client_gate.clear()
        text, outcome = await asyncio.wait_for(prompt_text(host, sid, "read /any"), 30)
        assert outcome.stop_reason == "end_turn"
        assert text.startswith("read: {'code': -32603, ") and "within 2s" in text
        host.client.client_gate.set()
        text, _ = await prompt_text(host, sid, "read /again")
        assert text == "read: the client's copy of /again"


async def test_extension_methods_are_forwarded_both_ways(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    acp_config(config_dir, fixture_command(), extra='[agents.plain]\nprovider = "echo"')
    async with sdk_hosts() as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        answer = await host.raw("_vendor/ping", {"sessionId": sid, "n": 1})
        assert answer["method"] == "_vendor/ping" and answer["params"]["n"] == 1
        assert answer["params"]["sessionId"].startswith("fx-session-")  # the agent's own id
        await expect_error(host.raw("_vendor/ping", {"n": 1}), -32601)  # no session: not ours
        plain = (await host.raw("session/new", {"cwd": str(workspace),
                                                "agentAlias": "plain"}))["sessionId"]
        await expect_error(host.raw("_vendor/ping", {"sessionId": plain}), -32601)
        text, _ = await prompt_text(host, sid, "ext _editor/hello")
        assert json.loads(text) == {"answeredBy": "the client", "method": "editor/hello"}
        assert host.client.client_requests == [
            ("_editor/hello", {"sessionId": sid, "from": "agent"})]


async def test_the_agents_own_modes_are_offered_and_set_mode_is_forwarded(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    acp_config(config_dir, fixture_command(), extra='env = {FIXTURE_MODE = "modes"}')
    async with sdk_hosts() as host:
        await host.initialize()
        created = await host.conn.new_session(cwd=str(workspace))
        sid = created.session_id
        assert created.modes is not None and created.modes.current_mode_id == "ask"
        assert [m.id for m in created.modes.available_modes] == ["ask", "code"]
        await host.conn.set_session_mode(session_id=sid, mode_id="code")
        text, _ = await prompt_text(host, sid, "mode")
        assert text == "code"
        assert [u.current_mode_id for u in host.client.of(sid, "current_mode_update")] == [
            "code"]
        await host.conn.set_session_mode(session_id=sid, mode_id="read_only")  # zeroclaw's
        text, _ = await prompt_text(host, sid, f"write {workspace / 'x.txt'} no")
        assert "read_only" in text and not (workspace / "x.txt").exists()
        await expect_error(host.conn.set_session_mode(session_id=sid, mode_id="nonsense"),
                           -32602)
        resumed = await host.conn.resume_session(cwd=str(workspace), session_id=sid)
        assert resumed.modes is not None and resumed.modes.current_mode_id == "code"


async def test_extension_notifications_go_on_as_notifications_both_ways(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    acp_config(config_dir, fixture_command())
    async with sdk_hosts() as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        notes = host.client.client_notifications
        await host.conn.ext_notification("vendor/note", {"sessionId": sid, "n": 1})
        await host.client.wait_until(lambda: bool(notes), "the agent hears a notification",
                                     timeout=5)
        assert notes == [("_fixture/heard", {"sessionId": sid, "method": "_vendor/note"})]
        text, _ = await prompt_text(host, sid, "note _editor/note")
        assert text == "sent"
        await host.client.wait_until(lambda: len(notes) == 2, "the client hears a notification",
                                     timeout=5)
        assert notes[1] == ("_editor/note", {"sessionId": sid, "from": "agent"})
        assert host.client.client_requests == []  # neither went out as a request


async def test_a_mode_the_agent_switches_to_itself_is_relayed_and_kept(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    acp_config(config_dir, fixture_command(), extra='env = {FIXTURE_MODE = "modes"}')
    async with sdk_hosts() as host:
        await host.initialize()
        sid = (await host.conn.new_session(cwd=str(workspace))).session_id
        text, _ = await prompt_text(host, sid, "switch code")  # e.g. it leaves plan mode
        assert text == "switched"
        assert [u.current_mode_id for u in host.client.of(sid, "current_mode_update")] == [
            "code"]
        resumed = await host.conn.resume_session(cwd=str(workspace), session_id=sid)
        assert resumed.modes is not None and resumed.modes.current_mode_id == "code"
        loaded = await host.conn.load_session(cwd=str(workspace), session_id=sid)
        assert loaded.modes is not None and loaded.modes.current_mode_id == "code"


async def test_the_agents_own_mode_on_an_evicted_session_reopens_it(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    acp_config(config_dir, fixture_command(), extra='env = {FIXTURE_MODE = "modes"}')
    async with sdk_hosts(env_extra={"ZEROCLAW_acp__max_sessions": "1"}) as host:
        await host.initialize()
        evicted = await host.new_session(workspace)
        await host.new_session(workspace)  # the first one is evicted
        await host.conn.set_session_mode(session_id=evicted, mode_id="code")
        assert [u.current_mode_id for u in host.client.of(evicted, "current_mode_update")
                ] == ["code"]
        text, _ = await prompt_text(host, evicted, "mode")
        assert text == "code"
        await expect_error(host.conn.set_session_mode(session_id=evicted, mode_id="nonsense"),
                           -32602)


async def test_client_terminals_a_session_leaves_are_released_when_it_goes(
    sdk_hosts: SdkHostFactory, config_dir: Path, workspace: Path
) -> None:
    acp_config(config_dir, fixture_command())
    async with sdk_hosts(env_extra={"ZEROCLAW_acp__max_sessions": "1"}) as host:
        await host.initialize(OFFERING)
        requests = host.client.client_requests

        def released(terminal_id: str) -> bool:
            return any(method == "terminal/release" and params["terminal_id"] == terminal_id
                       for method, params in requests)

        first = await host.new_session(workspace)
        kept, _ = await prompt_text(host, first, "keep sleep 30")
        assert kept == "client-term-1"
        second = await host.new_session(workspace)  # evicts the first
        await host.client.wait_until(lambda: released(kept), "released on eviction", timeout=5)
        kept_too, _ = await prompt_text(host, second, "keep sleep 30")
        await host.raw("session/close", {"sessionId": second})
        await host.client.wait_until(lambda: released(kept_too), "released on close",
                                     timeout=5)
        assert [m for m, _ in requests].count("terminal/release") == 2
