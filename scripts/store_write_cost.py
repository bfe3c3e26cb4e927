#!/usr/bin/env python3
"""What the persistence actor's hot writes cost, without the actor: microseconds per
finished turn (10 rows: user, assistant, thoughts, tool calls) and per new session.

Usage: ``.venv/bin/python scripts/store_write_cost.py [--turns N]``

Two ways, each in its own transaction per turn on a fresh store file:
``prepared`` (:class:`storage.prepared_writes.PreparedWrites`, what the host
runs) and ``peewee`` (the same rows through peewee query objects built per
turn: ``insert_many`` + ``update``). Prints one line per way and a JSON line.
Runs on the main thread.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import peewee

from ipc.events import TextItem, ToolItem, TurnItem, TurnRecord
from storage import StoredSession, open_store
from storage.models import MessageRow, SessionRow, ToolCallRow
from storage.prepared_writes import PreparedWrites
from storage.store import write_transaction


def ten_items(n: int) -> tuple[TurnItem, ...]:
    items: list[TurnItem] = [TextItem("user", f"prompt {n}")]
    for k in range(4):
        items.append(ToolItem(f"c{n}-{k}", "shell", {"command": f"ls {k}"}, "out", "completed"))
        items.append(TextItem("assistant", f"step {k}"))
    items.append(TextItem("assistant", f"answer {n}"))
    return tuple(items)


def session(sid: str) -> StoredSession:
    return StoredSession(id=sid, agent_alias="main", workspace_dir="/ws", cwd="/src",
                         mode="supervised", created_at=1.0, last_activity=1.0)


def peewee_turn(db: peewee.Database, record: TurnRecord, turn: int, seq: int) -> None:
    """The same rows through peewee query objects built for this turn."""
    messages, tools = [], []
    for item in record.items:
        if isinstance(item, TextItem):
            messages.append({"session": record.session_id, "turn": turn, "seq": seq,
                             "role": item.role, "content": item.text,
                             "created_at": record.finished_at})
        else:
            tools.append({"session": record.session_id, "turn": turn, "seq": seq,
                          "tool_call_id": item.tool_call_id, "name": item.name,
                          "arguments": item.arguments, "result": item.result,
                          "outcome": item.outcome})
        seq += 1
    MessageRow.insert_many(messages).execute(db)
    ToolCallRow.insert_many(tools).execute(db)
    SessionRow.update({SessionRow.turn_count: SessionRow.turn_count + 1,
                       SessionRow.last_activity: record.finished_at}).where(
        SessionRow.id == record.session_id).execute(db)


def measure(name: str, turns: int, write: Callable[[Any, TurnRecord, int], None]) -> float:
    with tempfile.TemporaryDirectory() as temp:
        store = open_store(Path(temp) / "s.db")
        db = store.writer
        prepared = PreparedWrites(db)
        with write_transaction(db):
            prepared.insert_session(session("s1"))
        prepared.commit_staged()
        context = (db, prepared)
        for n in range(20):  # warm
            with write_transaction(db):
                write(context, TurnRecord("s1", ten_items(n), "end_turn", "", 1.0, 2.0), n)
            prepared.commit_staged()
        started = time.perf_counter()
        for n in range(20, 20 + turns):
            with write_transaction(db):
                write(context, TurnRecord("s1", ten_items(n), "end_turn", "", 1.0, 2.0), n)
            prepared.commit_staged()
        micros = (time.perf_counter() - started) / turns * 1e6
        store.close()
    print(f"{name:10s} {micros:8.1f} us per 10-row turn (commit included)")
    return micros


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--turns", type=int, default=2000)
    args = parser.parse_args(argv)
    results = {
        "prepared": measure("prepared", args.turns,
                            lambda ctx, record, n: ctx[1].write_turn(record)),
        "peewee": measure("peewee", args.turns,
                          lambda ctx, record, n: peewee_turn(ctx[0], record, n + 1, 10 * n)),
    }
    print(json.dumps({"us_per_turn": {k: round(v, 1) for k, v in results.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
