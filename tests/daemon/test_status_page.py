"""The gateway's status page (``GET /``): served without a token and holding no data,
then loaded in headless Chromium against a real daemon with real turns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .browser import Browser, chromium_or_skip
from .gateway_helpers import TOKENS, GatewayDaemon, gateway_config, http_get

HOSTILE_TITLE = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2"> & co'


@pytest.fixture
def gateway(daemons: Any, scratch_dir: Path) -> GatewayDaemon:
    gateway_config(scratch_dir)
    return GatewayDaemon(daemons(scratch_dir, "--gateway", "127.0.0.1:0"))


def test_the_page_is_static_needs_no_token_and_forbids_inline_script(
        gateway: GatewayDaemon) -> None:
    with gateway.client("alice") as alice:
        sid = alice.request("session/new", {})["sessionId"]
        alice.request("session/prompt", {"sessionId": sid, "prompt": "a private title"})
    status, body, headers = http_get(f"{gateway.http}/?token={TOKENS['alice']}")
    assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
    assert sid not in body and "private title" not in body and TOKENS["alice"] not in body
    policy = headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert "frame-ancestors 'none'" in policy and headers["Referrer-Policy"] == "no-referrer"
    for path, kind in (("/status_page.js", "text/javascript"), ("/status_page.css", "text/css")):
        status, body, headers = http_get(gateway.http + path)
        assert status == 200 and headers["Content-Type"].startswith(kind) and body
    assert http_get(f"{gateway.http}/status_page.html")[0] == 404


def test_answers_that_hold_a_tenants_data_are_never_stored_by_a_cache(
        gateway: GatewayDaemon) -> None:
    """``/status`` may be asked with ``?token=``, which a shared cache would key on: no
    cache (the browser's, a proxy's) may keep it, nor ``/metrics``."""
    for url, headers in ((f"{gateway.http}/status", {"Authorization": f"Bearer {TOKENS['bob']}"}),
                         (f"{gateway.http}/status?token={TOKENS['bob']}", {}),
                         (f"{gateway.http}/metrics", {"Authorization": f"Bearer {TOKENS['ops']}"})):
        status, _, answer_headers = http_get(url, headers)
        assert status == 200
        assert "no-store" in answer_headers.get("Cache-Control", ""), url


def test_status_has_what_the_page_shows(gateway: GatewayDaemon) -> None:
    """Each session's cwd and title; the turns committed (a tenant: its own only); the
    host's RSS for an admin only."""
    cwd = str(gateway.root("alice").resolve())
    with gateway.client("alice") as alice, gateway.client("bob") as bob:
        sid = alice.request("session/new", {"cwd": cwd})["sessionId"]
        for text in ("first line\nsecond line", "another turn"):
            alice.request("session/prompt", {"sessionId": sid, "prompt": text})
        bob_sid = bob.request("session/new", {})["sessionId"]
        bob.request("session/prompt", {"sessionId": bob_sid, "prompt": "bob's"})
    alice_view = json.loads(gateway.get("/status", "alice")[1])
    assert [(s["sessionId"], s["title"], s["cwd"], s["turns"])
            for s in alice_view["sessions"]] == [(sid, "first line", cwd, 2)]
    assert alice_view["turnsCommitted"] == 2
    assert "rssBytes" not in alice_view and "pid" not in alice_view
    admin_view = json.loads(gateway.get("/status", "ops")[1])
    assert admin_view["turnsCommitted"] == 3 and admin_view["rssBytes"] > 0
    assert {s["sessionId"]: s["title"] for s in admin_view["sessions"]} == {
        sid: "first line", bob_sid: "bob's"}


def _rows(browser: Browser) -> dict[str, dict[str, str]]:
    """The rendered session table: id -> {title, state, turns, agent}."""
    rows: dict[str, dict[str, str]] = browser.evaluate("""Object.fromEntries(
        [...document.querySelectorAll('#sessions tbody tr[data-session-id]')].map((row) => [
          row.dataset.sessionId, {
            id: row.querySelector('.session-id').textContent,
            title: row.querySelector('.title').textContent,
            turns: row.querySelector('.turns').textContent,
            agent: row.querySelector('.agent').textContent}]))""")
    return rows


def _chart(browser: Browser, name: str) -> dict[str, Any]:
    chart: dict[str, Any] = browser.evaluate(f"""(() => {{
        const chart = document.getElementById('chart-{name}');
        const line = chart.querySelector('polyline');
        return {{count: Number(chart.dataset.count || 0), max: Number(chart.dataset.max || 0),
                 drawn: line ? line.getAttribute('points').trim().split(/\\s+/).length : 0}};
    }})()""")
    return chart


@pytest.fixture
def chromium() -> str:
    return chromium_or_skip()


def test_the_page_in_headless_chromium(chromium: str, gateway: GatewayDaemon,
                                       tmp_path: Path) -> None:
    """A tenant's page shows its own sessions (the hostile title as text), its chart
    grows with more turns; an admin's shows every session, the workers and RSS."""
    with gateway.client("alice") as alice, gateway.client("bob") as bob:
        hostile = alice.request("session/new", {})["sessionId"]
        alice.request("session/prompt", {"sessionId": hostile, "prompt": HOSTILE_TITLE})
        plain = alice.request("session/new", {})["sessionId"]
        alice.request("session/prompt", {"sessionId": plain, "prompt": "refactor the parser"})
        bobs = bob.request("session/new", {})["sessionId"]
        bob.request("session/prompt", {"sessionId": bobs, "prompt": "bob's own work"})

        with Browser(chromium, tmp_path / "profile") as browser:
            browser.goto(f"{gateway.http}/#token={TOKENS['alice']}")
            browser.wait_until("() => document.querySelectorAll('#sessions tbody tr').length == 2")
            rows = _rows(browser)
            assert set(rows) == {hostile, plain}  # not bob's
            assert rows[hostile] == {"id": hostile, "title": HOSTILE_TITLE, "turns": "1",
                                     "agent": "default"}
            assert rows[plain]["title"] == "refactor the parser"
            assert browser.evaluate(
                "window.pwned === undefined"
                " && !document.querySelector('#sessions img, #sessions script')")
            assert browser.evaluate("location.href") == f"{gateway.http}/"  # token taken out
            assert browser.evaluate("sessionStorage.getItem('zeroclaw.gateway.token')") \
                == TOKENS["alice"]
            assert browser.evaluate("document.getElementById('workers').hidden"
                                    " && !document.getElementById('workers-hidden').hidden")

            # the chart: a rate needs two answers; none of them saw a turn yet
            before = browser.wait_until(
                "() => Number(document.getElementById('chart-turns').dataset.count) >= 1"
                " && {...document.getElementById('chart-turns').dataset}")
            assert float(before["max"]) == 0.0
            for n in range(5):
                alice.request("session/prompt", {"sessionId": plain, "prompt": f"more {n}"})
            browser.wait_until(
                "() => Number(document.getElementById('chart-turns').dataset.max) > 0")
            after = _chart(browser, "turns")
            assert after["count"] > int(before["count"]) and after["drawn"] == after["count"]
            browser.wait_until("() => document.querySelector("
                               f"'#sessions tr[data-session-id=\"{plain}\"] .turns')"
                               ".textContent == '6'")
            browser.screenshot(tmp_path / "status-page-tenant.png")

            # an admin's token, typed into the form
            browser.evaluate("document.getElementById('forget').click()")
            browser.wait_until("() => !document.getElementById('login').hidden")
            browser.evaluate(f"""(() => {{
                document.getElementById('token').value = {json.dumps(TOKENS['ops'])};
                document.getElementById('login').requestSubmit(); }})()""")
            browser.wait_until(
                "() => document.querySelectorAll('#sessions tbody tr').length == 3"
                " && document.querySelectorAll('#workers tbody tr:not(.note)').length >= 1"
                " && Number(document.getElementById('chart-rss').dataset.count) >= 1")
            assert set(_rows(browser)) == {hostile, plain, bobs}
            assert _chart(browser, "turns")["max"] == 0  # a new series: no turn since
            assert _chart(browser, "rss")["max"] > 10  # MiB: host + workers
            shot = browser.screenshot(tmp_path / "status-page-admin.png")
            assert shot.stat().st_size > 10_000

            # a wrong token gets the form back, with the reason
            browser.evaluate("document.getElementById('forget').click()")
            browser.evaluate("""(() => {
                document.getElementById('token').value = 'not-a-token';
                document.getElementById('login').requestSubmit(); })()""")
            browser.wait_until("() => document.getElementById('login-reason').textContent"
                               ".includes('refused')")
            assert browser.exceptions == []
            assert [e for e in browser.log_errors if "401" not in e] == []
