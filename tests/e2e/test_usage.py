"""The host's usage totals in ``status`` over ``zeroclaw acp`` (SPEC §4 ``status``
answers on every transport): kept current as turns commit and sessions are deleted."""

from __future__ import annotations

from pathlib import Path

from .helpers import host_status, stored_session
from .sdkhost import SdkHost


async def test_usage_totals_follow_turns_and_deletes(host: SdkHost, workspace: Path) -> None:
    kept = await host.new_session(workspace)
    dropped = await host.new_session(workspace)
    assert (await host_status(host))["usage"] == {"totalTokens": 0, "turns": 0}
    await host.prompt(kept, "alpha beta gamma")
    await host.prompt(dropped, "delta epsilon")
    await host.prompt(dropped, "/status")  # answered by the host: a turn, no tokens
    tokens = {}
    for sid in (kept, dropped):
        session, _ = stored_session(host.config_dir, sid)
        assert session is not None and session.token_count > 0
        tokens[sid] = session.token_count
    status = await host_status(host)
    assert status["usage"] == {"totalTokens": tokens[kept] + tokens[dropped], "turns": 3}
    entries = {s["sessionId"]: s["usage"] for s in status["sessions"]}
    assert entries == {sid: {"totalTokens": count} for sid, count in tokens.items()}
    await host.raw("session/delete", {"sessionId": dropped})
    assert (await host_status(host))["usage"] == {"totalTokens": tokens[kept], "turns": 1}
