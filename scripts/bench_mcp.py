#!/usr/bin/env python3
"""Measure an MCP server's start and tool-call round trip through zeroclaw's client.

    .venv/bin/python scripts/bench_mcp.py [--calls N] [--command CMD ARGS...]

Starts one server the way a session does (:class:`actors.worker.mcp.SessionMcp`: the
process-tree launcher, the shell's sandbox, a clean environment; the SDK's client on
the worker's MCP loop thread), then calls a tool N times from this thread as a
session actor does. The default server is the test fixture
(``tests/fixtures/mcp_fault_server.py``, tool ``echo``). Prints JSON: the start time
(spawn to tools listed), and the calls' p50/p99 in milliseconds and per second.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from actors.worker.mcp.session_servers import SessionMcp  # noqa: E402
from actors.worker.tools import PathPolicy, ToolEnv  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--tool", default="echo")
    parser.add_argument("--argument", default="text", help="the tool's one string argument")
    parser.add_argument("--command", nargs=argparse.REMAINDER,
                        default=[sys.executable, str(ROOT / "tests/fixtures/mcp_fault_server.py")])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as ws:
        paths = PathPolicy.build(ws, ws, [])
        entry = {"name": "bench", "command": args.command[0], "args": args.command[1:]}
        servers = SessionMcp.from_config({}, [entry], paths)
        assert servers is not None
        started = time.perf_counter()
        servers.start()
        problems = servers.ready()
        start_ms = (time.perf_counter() - started) * 1000
        if problems:
            print(json.dumps({"problems": problems}))
            return 1
        tool = servers.tools(())[f"bench__{args.tool}"]
        env = ToolEnv(paths=paths, cancelled=threading.Event())
        times = []
        for n in range(args.calls):
            begin = time.perf_counter()
            tool.run({args.argument: f"call {n}"}, env)
            times.append((time.perf_counter() - begin) * 1000)
        servers.stop()
    times.sort()
    print(json.dumps({"start_ms": round(start_ms, 1), "calls": args.calls,
                      "call_p50_ms": round(statistics.median(times), 3),
                      "call_p99_ms": round(times[int(len(times) * 0.99) - 1], 3),
                      "calls_per_sec": round(1000 * len(times) / sum(times), 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
