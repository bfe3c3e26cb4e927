"""Session keys and labels (OpenClaw's bridge rules) through the official ACP SDK client
against real ``zeroclaw acp`` processes sharing one store: ``_meta.sessionKey`` creates a
session on first use and gives it back after (its transcript replayed right after the
answer), labels resolve existing sessions, a reset gives the key a fresh transcript
with the old session kept (listed, loadable) as its ``parentSessionId``, and the
command line's ``--session KEY`` does the same for an editor that sends no ``_meta``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from .conftest import SdkHostFactory
from .helpers import split_turns
from .sdkhost import SdkHost, expect_error

SET_INFO = "zeroclaw/session_info_update"  # the SDK adds the leading "_"


async def new_named(host: SdkHost, workspace: Path, **meta: Any) -> tuple[str, dict[str, Any]]:
    """``session/new`` with ``_meta`` (the SDK sends its keyword arguments there): the
    session id and the answer's ``_meta``."""
    answer = await host.conn.new_session(cwd=str(workspace), **meta)
    return answer.session_id, dict(answer.field_meta or {})


async def listed(host: SdkHost) -> dict[str, dict[str, Any]]:
    """``session/list``: each session's ``_meta`` by id."""
    answer = await host.conn.list_sessions()
    return {s.session_id: dict(s.field_meta or {}) for s in answer.sessions}


def user_texts(host: SdkHost, sid: str, start: int = 0) -> list[str]:
    return [turn.user for turn in split_turns(host.client.of(sid, start=start))]


async def test_a_key_names_one_conversation_across_hosts(
        sdk_hosts: SdkHostFactory, workspace: Path) -> None:
    async with sdk_hosts() as first:
        await first.initialize()
        sid, meta = await new_named(first, workspace, sessionKey="agent:main:main")
        assert meta == {"sessionKey": "agent:main:main"}
        await first.prompt(sid, "remember the word heron")
        again, meta = await new_named(first, workspace, sessionKey="agent:main:main")
        assert again == sid and meta["zeroclaw"] == {"resumed": True}
        other, _ = await new_named(first, workspace, sessionKey="agent:qa:bug-123")
        assert other != sid
    async with sdk_hosts() as second:
        await second.initialize()
        mark = second.client.mark()
        resumed, meta = await new_named(second, workspace, sessionKey="agent:main:main")
        assert resumed == sid and meta == {"sessionKey": "agent:main:main",
                                           "zeroclaw": {"resumed": True}}
        await second.client.wait_text(sid, "heron", start=mark)  # replayed after the answer
        assert user_texts(second, sid, mark) == ["remember the word heron"]
        await second.prompt(sid, "and a second turn")
        entries = await listed(second)
        assert entries[sid] == {"sessionKey": "agent:main:main"}
        assert entries[other] == {"sessionKey": "agent:qa:bug-123"}


async def test_labels_resolve_existing_sessions_only(
        sdk_hosts: SdkHostFactory, workspace: Path) -> None:
    async with sdk_hosts() as host:
        await host.initialize()
        missing = await expect_error(host.conn.new_session(
            cwd=str(workspace), sessionLabel="support inbox"), -32602)
        assert "no session is labelled 'support inbox'" in str(missing.data or missing)
        required = await expect_error(host.conn.new_session(
            cwd=str(workspace), sessionKey="nobody-yet", zeroclaw={"requireExisting": True}),
            -32602)
        assert "no session has the key 'nobody-yet'" in str(required.data or required)
        sid, meta = await new_named(host, workspace, sessionKey="inbox",
                                    sessionLabel="support inbox")
        assert meta == {"sessionKey": "inbox", "sessionLabel": "support inbox"}
        await host.prompt(sid, "ticket one")
        by_label, meta = await new_named(host, workspace, sessionLabel="support inbox")
        assert by_label == sid and meta["sessionKey"] == "inbox"
        plain = await host.new_session(workspace)
        taken = await expect_error(host.conn.ext_method(
            SET_INFO, {"sessionId": plain, "_meta": {"sessionLabel": "support inbox"}}), -32602)
        assert f"already labels session {sid}" in str(taken.data or taken)
        mark = host.client.mark()
        answer = await host.conn.ext_method(
            SET_INFO, {"sessionId": plain, "_meta": {"sessionLabel": "scratch"}})
        assert answer == {"sessionId": plain, "_meta": {"sessionLabel": "scratch"}}
        [info] = host.client.of(plain, "session_info_update", mark)
        assert info.field_meta == {"sessionLabel": "scratch"}
        entries = await listed(host)
        assert entries[plain] == {"sessionLabel": "scratch"}
        await host.conn.ext_method(SET_INFO, {"sessionId": plain, "_meta": {"sessionLabel": None}})
        assert (await listed(host))[plain] == {}
        await expect_error(host.conn.ext_method(
            SET_INFO, {"sessionId": plain, "_meta": {"sessionLabel": 7}}), -32602)


async def test_a_reset_gives_the_key_a_fresh_transcript_and_keeps_the_old(
        sdk_hosts: SdkHostFactory, workspace: Path) -> None:
    async with sdk_hosts() as host:
        await host.initialize()
        old, _ = await new_named(host, workspace, sessionKey="k", sessionLabel="main work")
        await host.prompt(old, "the old transcript")
        new, meta = await new_named(host, workspace, sessionKey="k", resetSession=True)
        assert new != old
        assert meta == {"sessionKey": "k", "sessionLabel": "main work",
                        "zeroclaw": {"parentSessionId": old}}
        assert user_texts(host, new) == []
        await host.prompt(new, "the new transcript")
        [info] = host.client.of(new, "session_info_update")  # the first turn's title
        assert info.title == "the new transcript"
        assert info.field_meta == {"zeroclaw": {"parentSessionId": old}}
        [old_info] = host.client.of(old, "session_info_update")
        assert old_info.field_meta is None
        again, _ = await new_named(host, workspace, sessionKey="k")
        assert again == new
        entries = await listed(host)
        assert entries[old] == {"zeroclaw": {"formerSessionKey": "k"}}
        assert entries[new] == meta
        by_label, _ = await new_named(host, workspace, sessionLabel="main work")
        assert by_label == new  # the label moved with the key
        newest, meta = await new_named(host, workspace, sessionLabel="main work",
                                       resetSession=True)
        assert meta == {"sessionKey": "k", "sessionLabel": "main work",
                        "zeroclaw": {"parentSessionId": new}}
    async with sdk_hosts() as later:
        await later.initialize()
        await later.conn.load_session(cwd=str(workspace), session_id=old)
        assert user_texts(later, old) == ["the old transcript"]
        await later.conn.load_session(cwd=str(workspace), session_id=new)
        assert user_texts(later, new) == ["the new transcript"]
        assert (await listed(later))[newest]["zeroclaw"] == {"parentSessionId": new}


async def test_the_command_line_session_key_resumes_across_processes(
        sdk_hosts: SdkHostFactory, workspace: Path) -> None:
    async with sdk_hosts(None, "--session", "agent:design:main") as first:
        await first.initialize()
        sid = await first.new_session(workspace)  # no _meta: the command line's key
        await first.prompt(sid, "first process turn")
        assert (await listed(first))[sid] == {"sessionKey": "agent:design:main"}
    async with sdk_hosts(None, "--session", "agent:design:main") as second:
        await second.initialize()
        mark = second.client.mark()
        assert await second.new_session(workspace) == sid
        await second.client.wait_text(sid, "first process turn", start=mark)
        await second.prompt(sid, "second process turn")
    async with sdk_hosts(None, "--session", "agent:design:main", "--reset-session") as third:
        await third.initialize()
        fresh = await third.new_session(workspace)
        assert fresh != sid
        assert await third.new_session(workspace) == fresh  # the reset was for first use only
        entries = await listed(third)
        assert entries[fresh] == {"sessionKey": "agent:design:main",
                                  "zeroclaw": {"parentSessionId": sid}}
    async with sdk_hosts(None, "--session-label", "nothing such") as fourth:
        await fourth.initialize()
        await expect_error(fourth.conn.new_session(cwd=str(workspace)), -32602)
    async with sdk_hosts(None, "--session", "absent", "--require-existing") as fifth:
        await fifth.initialize()
        await expect_error(fifth.conn.new_session(cwd=str(workspace)), -32602)


async def test_provenance_meta_names_host_agent_and_model(
        sdk_hosts: SdkHostFactory, workspace: Path) -> None:
    async with sdk_hosts(None, "--provenance", "meta") as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        outcome = await host.prompt(sid, "who answered")
        provenance = host.last_result("session/prompt", sid)["_meta"]["provenance"]
        assert outcome.stop_reason == "end_turn"
        assert provenance["host"].startswith("zeroclaw/")
        assert provenance["agent"] and provenance["model"].count("/") == 1
    async with sdk_hosts() as plain:
        await plain.initialize()
        sid = await plain.new_session(workspace)
        await plain.prompt(sid, "no provenance")
        assert "provenance" not in plain.last_result("session/prompt", sid).get("_meta", {})


async def test_provenance_meta_receipt_gives_the_agent_a_source_receipt(
        sdk_hosts: SdkHostFactory, workspace: Path) -> None:
    """The echo agent says back what it got: the user's text, then the receipt."""
    import socket

    async with sdk_hosts(None, "--provenance", "meta+receipt", "--session", "agent:x:y") as host:
        await host.initialize()
        sid = await host.new_session(workspace)
        outcome = await host.prompt(sid, "where from")
        assert host.last_result("session/prompt", sid)["_meta"]["provenance"]["agent"]
        text = outcome.content
        assert text.startswith("where from")
        for line in ("[Source Receipt]", "bridge=zeroclaw-acp",
                     f"originHost={socket.gethostname()}", f"acpSessionId={sid}",
                     "targetSession=agent:x:y", "[/Source Receipt]"):
            assert line in text, (line, text)
        assert f"originCwd={workspace}" in text or "originCwd=~" in text
        status = await host.prompt(sid, "/status")  # the host answers: no receipt
        assert "Source Receipt" not in status.content
    async with sdk_hosts(None, "--provenance", "meta+receipt") as again:
        await again.initialize()
        await again.conn.load_session(session_id=sid, cwd=str(workspace))
        [first, _] = user_texts(again, sid)  # the stored turn keeps its receipt
        assert first.startswith("where from") and "targetSession=agent:x:y" in first
        other = await again.new_session(workspace)  # no key: the session id is the target
        assert f"targetSession={other}" in (await again.prompt(other, "hi")).content


async def test_concurrent_first_uses_of_a_key_make_one_session(
        sdk_hosts: SdkHostFactory, workspace: Path) -> None:
    async with sdk_hosts() as host:
        await host.initialize()
        answers = await asyncio.gather(*(new_named(host, workspace, sessionKey="raced")
                                         for _ in range(4)))
        assert len({sid for sid, _ in answers}) == 1
        assert sorted("zeroclaw" in meta for _, meta in answers) == [False, True, True, True]
        assert list((await listed(host)).values()) == [{"sessionKey": "raced"}]
