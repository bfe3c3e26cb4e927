"""Session ownership leases on a shared PostgreSQL store: one host runs a session.

A row of ``session_leases`` (session id, host id, expiry in the database's clock) says
which host owns a live session. A host takes it before it opens the session (a lease
of another host that has not expired refuses the open, naming that host), renews those
of its live sessions every third of the TTL (the heartbeat), checks it in the transaction of
every turn it commits (a host whose lease was taken over after it stalled commits
nothing more), and releases it when the session closes or is evicted, and all of
them when it stops. Taking is one ``INSERT ... ON CONFLICT DO UPDATE ... WHERE``:
two hosts racing for one session serialise on its key and one of them wins.

The table is created by the PostgreSQL schema step :func:`create_table`; an SQLite
store has no leases (one host owns its file).

Threads: the persistence actor's (every function runs inside its transaction).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import peewee

__all__ = ["LeaseHeld", "LeaseLost", "Leases", "create_table"]


class LeaseHeld(Exception):
    """Another host owns the session: a live lease, or (takeover ``never``) an expired
    one (``expires_in`` < 0)."""

    def __init__(self, session_id: str, owner: str, expires_in: float) -> None:
        if expires_in >= 0:
            why = f"its lease ends in {expires_in:.0f} s unless renewed"
        else:
            why = (f"its lease expired {-expires_in:.0f} s ago, and this host takes over "
                   'no session ([store] takeover = "never"): it waits for that host or '
                   "for an operator to free it")
        super().__init__(f"session {session_id} is owned by host {owner} ({why})")
        self.session_id = session_id
        self.owner = owner
        self.expires_in = expires_in


class LeaseLost(Exception):
    """This host no longer owns the session (its lease expired and another took it)."""


def create_table(db: peewee.Database, version: int) -> None:
    """The PostgreSQL schema step that makes ``session_leases`` (safe to rerun)."""
    db.execute_sql("CREATE TABLE IF NOT EXISTS session_leases ("
                   "session_id TEXT PRIMARY KEY, host_id TEXT NOT NULL, "
                   "expires_at DOUBLE PRECISION NOT NULL)")
    db.execute_sql("CREATE INDEX IF NOT EXISTS session_leases_host "
                   "ON session_leases (host_id)")


_NOW = "EXTRACT(EPOCH FROM clock_timestamp())"


@dataclass(frozen=True, slots=True)
class Leases:
    """This host's leases: its id, how long a lease lasts without renewal, and whether
    it takes over a lease that expired (``[store] takeover``)."""

    host_id: str
    ttl_secs: float
    take_over_expired: bool = True

    def take(self, db: peewee.Database, session_id: str) -> None:
        """Own ``session_id`` from now for the TTL, unless another host's lease is live
        (:class:`LeaseHeld`). Taking over an expired lease is how a dead host's
        sessions move on; without ``take_over_expired`` an expired lease refuses too."""
        taken = db.execute_sql(*self.take_statement(session_id)).fetchone()
        if taken is not None:
            return
        self.refused(db, session_id)

    def take_statement(self, session_id: str) -> tuple[str, list[Any]]:
        """:meth:`take` as one statement: it returns a row when the lease is taken, none
        when :meth:`refused` should say why."""
        return ("INSERT INTO session_leases AS l (session_id, host_id, expires_at) "
                f"VALUES (%s, %s, {_NOW} + %s) ON CONFLICT (session_id) DO UPDATE SET "
                "host_id = EXCLUDED.host_id, expires_at = EXCLUDED.expires_at "
                f"WHERE l.host_id = EXCLUDED.host_id OR (%s AND l.expires_at < {_NOW}) "
                "RETURNING host_id",
                [session_id, self.host_id, self.ttl_secs, self.take_over_expired])

    def refused(self, db: peewee.Database, session_id: str) -> None:
        """Raise :class:`LeaseHeld` for a take that was refused, naming the owner."""
        found = db.execute_sql(f"SELECT host_id, expires_at - {_NOW} FROM session_leases "
                               "WHERE session_id = %s", (session_id,)).fetchone()
        owner, left = found if found is not None else ("unknown", 0.0)
        raise LeaseHeld(session_id, str(owner), float(left))

    def hold(self, db: peewee.Database, session_id: str) -> None:
        """Renew the lease of a session this host writes a turn of; :class:`LeaseLost`
        when it is no longer this host's."""
        cursor = db.execute_sql(*self.hold_statement(session_id))
        if cursor.rowcount != 1:
            raise LeaseLost(f"session {session_id} is no longer owned by this host "
                            f"({self.host_id}): another host took it over")

    def hold_statement(self, session_id: str) -> tuple[str, list[Any]]:
        """:meth:`hold` as one statement: its row count is 1 while the lease is this host's."""
        return (f"UPDATE session_leases SET expires_at = {_NOW} + %s "
                "WHERE session_id = %s AND host_id = %s",
                [self.ttl_secs, session_id, self.host_id])

    def renew(self, db: peewee.Database, live: Sequence[str] | None = None) -> list[str]:
        """The heartbeat: the leases of the sessions ``live`` here (None: all of this
        host's) last the TTL from now, and this host's leases of other sessions are
        released (a session that left while its release could not be written). Returns
        the ids renewed: a live session missing from them is no longer this host's."""
        if live is None:
            cursor = db.execute_sql(f"UPDATE session_leases SET expires_at = {_NOW} + %s "
                                    "WHERE host_id = %s RETURNING session_id",
                                    (self.ttl_secs, self.host_id))
            return [str(row[0]) for row in cursor.fetchall()]
        ids = list(live)
        db.execute_sql("DELETE FROM session_leases WHERE host_id = %s "
                       "AND NOT (session_id = ANY(%s))", (self.host_id, ids))
        cursor = db.execute_sql(f"UPDATE session_leases SET expires_at = {_NOW} + %s "
                                "WHERE host_id = %s AND session_id = ANY(%s) "
                                "RETURNING session_id", (self.ttl_secs, self.host_id, ids))
        return [str(row[0]) for row in cursor.fetchall()]

    def release(self, db: peewee.Database, session_id: str) -> None:
        db.execute_sql("DELETE FROM session_leases WHERE session_id = %s AND host_id = %s",
                       (session_id, self.host_id))

    def release_all(self, db: peewee.Database) -> int:
        """Every lease of this host (at start: a host of this id that died left them;
        at stop)."""
        return int(db.execute_sql("DELETE FROM session_leases WHERE host_id = %s",
                                  (self.host_id,)).rowcount)
