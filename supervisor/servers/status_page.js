// The zeroclaw status page: polls /status with the gateway token and draws it.
//
// Everything shown comes from /status and is set as text (textContent, SVG
// attributes), never parsed as HTML: session titles and cwds are user input.
// The token comes from the address (#token= or ?token=, removed from the address
// bar at once) or the form, and is kept in this tab's sessionStorage only.
// After each poll the document gets a "zeroclaw:rendered" event.
"use strict";

(() => {
  const POLL_MS = 2000;
  const WINDOW_SECS = 300;
  const MIN_SPAN_SECS = 60;
  const MAX_SESSION_ROWS = 500;
  const TOKEN_KEY = "zeroclaw.gateway.token";
  const SVG_NS = "http://www.w3.org/2000/svg";
  const CHART = { width: 600, height: 120, left: 44, top: 8, bottom: 18 };

  const $ = (id) => document.getElementById(id);
  let token = null;
  let timer = null;
  let inFlight = false;
  let polls = 0;
  let previous = null; // the last answer's {uptime, turns}
  const series = []; // {t: uptime secs, rate: turns/s or null, rss: MiB or null}

  // --- the token ------------------------------------------------------------------

  function tokenFromAddress() {
    const url = new URL(window.location.href);
    const fragment = new URLSearchParams(url.hash.slice(1));
    const found = fragment.get("token") || url.searchParams.get("token");
    if (fragment.has("token") || url.searchParams.has("token")) {
      fragment.delete("token");
      url.searchParams.delete("token");
      url.hash = fragment.toString();
      window.history.replaceState(null, "", url.pathname + url.search + url.hash);
    }
    return found;
  }

  function rememberToken(value) {
    token = value;
    try {
      if (value) window.sessionStorage.setItem(TOKEN_KEY, value);
      else window.sessionStorage.removeItem(TOKEN_KEY);
    } catch (error) {
      // storage disabled: the token lives in memory until the tab closes
    }
  }

  function storedToken() {
    try {
      return window.sessionStorage.getItem(TOKEN_KEY);
    } catch (error) {
      return null;
    }
  }

  function askForToken(reason) {
    rememberToken(null);
    stopPolling();
    forgetSeries(); // another token may see other sessions and turns
    $("status").hidden = true;
    $("forget").hidden = true;
    $("problem").hidden = true;
    $("summary").textContent = "a gateway token is needed";
    $("login-reason").textContent = reason || "";
    $("login").hidden = false;
    $("token").focus();
  }

  // --- polling --------------------------------------------------------------------

  function stopPolling() {
    if (timer !== null) window.clearTimeout(timer);
    timer = null;
  }

  function schedule(delay) {
    stopPolling();
    timer = window.setTimeout(poll, delay);
  }

  async function poll() {
    timer = null;
    if (!token || inFlight) return;
    if (document.visibilityState === "hidden") return; // resumed by visibilitychange
    inFlight = true;
    try {
      await pollOnce();
    } finally {
      inFlight = false;
    }
  }

  async function pollOnce() {
    let response;
    let status;
    try {
      response = await window.fetch("/status", {
        headers: { Authorization: "Bearer " + token },
        cache: "no-store",
        credentials: "omit",
        signal: AbortSignal.timeout(10000),
      });
      if (response.ok) status = await response.json();
    } catch (error) {
      showProblem("the gateway does not answer (" + error.name + "); retrying");
      schedule(POLL_MS);
      return;
    }
    if (response.status === 401) {
      askForToken("the gateway refused that token");
    } else if (response.status === 429) {
      askForToken("too many wrong tokens from this address: wait a minute, then try again");
    } else if (!response.ok) {
      showProblem("the gateway answered " + response.status + "; retrying");
      schedule(POLL_MS);
    } else {
      render(status);
      schedule(POLL_MS);
    }
  }

  function showProblem(text) {
    $("problem").textContent = text;
    $("problem").hidden = false;
  }

  // --- what one answer adds to the chart ---------------------------------------------

  function forgetSeries() {
    series.length = 0;
    previous = null;
  }

  function record(status) {
    const uptime = Number(status.uptimeSecs) || 0;
    const turns = Number(status.turnsCommitted) || 0;
    if (previous !== null && (uptime < previous.uptime || turns < previous.turns)) {
      forgetSeries(); // the daemon restarted: a new series
    }
    let rate = null;
    if (previous !== null && uptime > previous.uptime) {
      rate = (turns - previous.turns) / (uptime - previous.uptime);
    }
    previous = { uptime, turns };
    series.push({ t: uptime, rate, rss: totalRssMiB(status) });
    while (series.length && series[0].t < uptime - WINDOW_SECS) series.shift();
    return rate;
  }

  function totalRssMiB(status) {
    if (!Array.isArray(status.workers)) return null; // a tenant's view: no processes
    let bytes = Number(status.rssBytes) || 0;
    for (const worker of status.workers) {
      bytes += Number(worker.rssBytes) || 0;
      for (const agent of worker.agents || []) bytes += Number(agent.rssBytes) || 0;
    }
    return bytes / 1048576;
  }

  // --- rendering ------------------------------------------------------------------

  function render(status) {
    polls += 1;
    const rate = record(status);
    const sessions = Array.isArray(status.sessions) ? status.sessions : [];
    const latest = series[series.length - 1];
    $("login").hidden = true;
    $("problem").hidden = true;
    $("status").hidden = false;
    $("forget").hidden = false;
    $("summary").textContent = summaryText(status);
    $("card-sessions").textContent = String(sessions.length);
    $("card-busy").textContent = String(sessions.filter((s) => s.state === "busy").length);
    $("card-rate").textContent = rate === null ? "–" : rate.toFixed(1);
    $("card-rss").textContent = latest.rss === null ? "admin only" : latest.rss.toFixed(0) + " MiB";
    drawChart($("chart-turns"), "rate", $("turns-caption"), " turns/s");
    drawChart($("chart-rss"), "rss", $("rss-caption"), " MiB");
    renderSessions(sessions);
    renderProcesses(status);
    document.body.dataset.polls = String(polls);
    document.dispatchEvent(new CustomEvent("zeroclaw:rendered", { detail: { polls } }));
  }

  function summaryText(status) {
    const parts = ["version " + status.serverVersion, "up " + duration(status.uptimeSecs)];
    if (status.tenant) parts.push("tenant " + status.tenant + " (own sessions only)");
    parts.push("updated " + new Date().toLocaleTimeString());
    return parts.join(" · ");
  }

  function cell(row, text, className) {
    const td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "" : String(text);
    if (className) td.className = className;
    row.appendChild(td);
    return td;
  }

  function note(text, columns) {
    const row = document.createElement("tr");
    row.className = "note";
    cell(row, text).colSpan = columns;
    return row;
  }

  function replaceRows(table, rows) {
    table.tBodies[0].replaceChildren(...rows);
  }

  function renderSessions(sessions) {
    const ordered = sessions.slice().sort((a, b) =>
      (a.state === "busy" ? 0 : 1) - (b.state === "busy" ? 0 : 1)
      || (Number(b.lastActivity) || 0) - (Number(a.lastActivity) || 0));
    const rows = ordered.slice(0, MAX_SESSION_ROWS).map((session) => {
      const row = document.createElement("tr");
      row.dataset.sessionId = String(session.sessionId);
      cell(row, session.sessionId, "mono session-id");
      cell(row, session.agentAlias, "agent");
      cell(row, session.state, "state state-" + String(session.state).replace(/[^a-z]/g, ""));
      cell(row, session.title, "title");
      cell(row, session.cwd, "mono cwd");
      cell(row, session.turns, "num turns");
      cell(row, session.clients, "num");
      cell(row, ago(session.lastActivity), "");
      return row;
    });
    if (ordered.length > MAX_SESSION_ROWS) {
      rows.push(note("… and " + (ordered.length - MAX_SESSION_ROWS) + " more", 8));
    } else if (!ordered.length) {
      rows.push(note("no live session", 8));
    }
    replaceRows($("sessions"), rows);
    $("sessions-count").textContent = "(" + sessions.length + " live)";
  }

  function renderProcesses(status) {
    const shown = Array.isArray(status.workers);
    for (const id of ["workers", "agents"]) {
      $(id).hidden = !shown;
      $(id + "-hidden").hidden = shown;
    }
    const workers = shown ? status.workers : [];
    replaceRows($("workers"), workers.length ? workers.map((worker) => {
      const row = document.createElement("tr");
      cell(row, worker.pid, "num");
      cell(row, mib(worker.rssBytes), "num");
      cell(row, percent(worker.cpuPercent), "num");
      cell(row, worker.sessions, "num");
      cell(row, worker.responsive ? "yes" : "no", worker.responsive ? "" : "no");
      return row;
    }) : [note("no worker process is running", 5)]);
    const agents = workers.flatMap((worker) =>
      (worker.agents || []).map((agent) => ({ worker: worker.pid, ...agent })));
    replaceRows($("agents"), agents.length ? agents.map((agent) => {
      const row = document.createElement("tr");
      cell(row, agent.agentAlias, "");
      cell(row, agent.pid, "num");
      cell(row, agent.worker, "num");
      cell(row, mib(agent.rssBytes), "num");
      cell(row, percent(agent.cpuPercent), "num");
      cell(row, agent.sessions, "num");
      cell(row, agent.restarts, "num");
      return row;
    }) : [note("no agent process is running (agents of provider \"acp\" run in one)", 7)]);
  }

  // --- the charts: hand-drawn SVG ----------------------------------------------------

  function svg(name, attributes, text) {
    const node = document.createElementNS(SVG_NS, name);
    for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, String(value));
    if (text !== undefined) node.textContent = text;
    return node;
  }

  function drawChart(chart, key, caption, unit) {
    const points = series.filter((p) => p[key] !== null);
    const values = points.map((p) => p[key]);
    const top = niceCeiling(Math.max(0, ...values));
    const { width, height, left, top: pad, bottom } = CHART;
    const plotHeight = height - pad - bottom;
    const now = series.length ? series[series.length - 1].t : 0;
    const span = Math.min(WINDOW_SECS, Math.max(MIN_SPAN_SECS, now - (series.length ? series[0].t : now)));
    const x = (t) => left + ((t - (now - span)) / span) * (width - left - 4);
    const y = (v) => pad + plotHeight - (top ? (v / top) * plotHeight : 0);
    const nodes = [
      svg("line", { class: "grid", x1: left, x2: width, y1: pad, y2: pad }),
      svg("line", { class: "grid", x1: left, x2: width, y1: pad + plotHeight, y2: pad + plotHeight }),
      svg("text", { class: "axis-label", x: left - 6, y: pad + 4, "text-anchor": "end" }, formatNumber(top)),
      svg("text", { class: "axis-label", x: left - 6, y: pad + plotHeight + 4, "text-anchor": "end" }, "0"),
      svg("text", { class: "axis-label", x: left, y: height - 2 }, "−" + duration(span)),
      svg("text", { class: "axis-label", x: width - 4, y: height - 2, "text-anchor": "end" }, "now"),
    ];
    if (points.length) {
      const coordinates = points.map((p) => x(p.t).toFixed(1) + "," + y(p[key]).toFixed(1));
      nodes.push(svg("polyline", { points: coordinates.join(" ") }));
    } else {
      const why = key === "rss" && series.length ? "admin token only" : "waiting for data…";
      nodes.push(svg("text", { class: "empty", x: width / 2, y: height / 2, "text-anchor": "middle" }, why));
    }
    chart.replaceChildren(...nodes);
    chart.dataset.count = String(points.length);
    chart.dataset.latest = points.length ? String(values[values.length - 1]) : "";
    chart.dataset.max = points.length ? String(Math.max(...values)) : "";
    caption.textContent = points.length
      ? "now " + formatNumber(values[values.length - 1]) + unit + ", max " + formatNumber(Math.max(...values)) + unit
      : "";
  }

  function niceCeiling(value) {
    if (value <= 0) return 1;
    const magnitude = 10 ** Math.floor(Math.log10(value));
    for (const step of [1, 2, 2.5, 5, 10]) if (value <= step * magnitude) return step * magnitude;
    return 10 * magnitude;
  }

  // --- formats --------------------------------------------------------------------

  function formatNumber(value) {
    if (value >= 100) return value.toFixed(0);
    return value >= 10 ? value.toFixed(1) : value.toFixed(2);
  }

  function mib(bytes) {
    return (Number(bytes) / 1048576).toFixed(1) + " MiB";
  }

  function percent(value) {
    return (Number(value) || 0).toFixed(1) + " %";
  }

  function duration(secs) {
    const s = Math.floor(Number(secs) || 0);
    if (s < 120) return s + " s";
    if (s < 7200) return Math.floor(s / 60) + " min";
    return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min";
  }

  function ago(epochSecs) {
    const secs = Date.now() / 1000 - Number(epochSecs);
    return Number.isFinite(secs) ? duration(Math.max(0, secs)) + " ago" : "";
  }

  // --- start ----------------------------------------------------------------------

  function start() {
    $("window-minutes").textContent = String(WINDOW_SECS / 60);
    $("login").addEventListener("submit", (event) => {
      event.preventDefault();
      const typed = $("token").value.trim();
      $("token").value = "";
      if (!typed) return;
      rememberToken(typed);
      $("login").hidden = true;
      $("summary").textContent = "connecting…";
      poll();
    });
    $("forget").addEventListener("click", () => askForToken(""));
    document.addEventListener("visibilitychange", () => {
      if (document.visibilityState === "visible" && token && timer === null) poll();
    });
    const given = tokenFromAddress();
    if (given) rememberToken(given);
    token = given || storedToken();
    if (token) poll();
    else askForToken("");
  }

  start();
})();
