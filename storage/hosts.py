"""The hosts of one shared PostgreSQL store, and the tenant tokens revoked among them.

Hosts know each other only through the database. Each host beats in ``zeroclaw_hosts``
(one row per host id: when it started, its last heartbeat in the database's clock, its
version) and reads the others' rows with their live sessions (their unexpired leases
in ``session_leases``). A host that stops deletes its row; one that died keeps it,
shown as not alive once its heartbeat is older than the lease TTL, and removed by the
others a day later.

``tenant_revocations`` is an append-only log of removed tenants (their id and token
hash, which host removed them, when): ``zeroclaw tenant remove`` on one host appends
to it, and every host polls it (:func:`revocations_after`, by sequence number, every
second) and stops serving those tenants. A poll, not LISTEN/NOTIFY: a notification
sent while a host's connection is down is lost, while a poll of an indexed log after
the last sequence seen catches up after any outage, and costs one index probe a
second per host.

Both tables are made by the PostgreSQL schema step :func:`create_tables` (safe to
rerun; an SQLite store has one host, and its tenants are its configuration's).

Threads: every function runs on the caller's thread, on a connection it alone uses
(the host's shared-store watch: :mod:`supervisor.shared_store`; ``zeroclaw tenant``).
"""

from __future__ import annotations

from dataclasses import dataclass

import peewee

__all__ = ["HostRow", "Revocation", "beat", "create_tables", "forget", "list_hosts",
           "revocations_after", "revoke"]

_NOW = "EXTRACT(EPOCH FROM clock_timestamp())"
#: A dead host's row is removed once its heartbeat is this old (seconds).
FORGET_AFTER_SECS = 86400.0


def create_tables(db: peewee.Database, version: int) -> None:
    """The PostgreSQL schema step that makes ``zeroclaw_hosts`` and
    ``tenant_revocations`` (safe to rerun)."""
    db.execute_sql("CREATE TABLE IF NOT EXISTS zeroclaw_hosts ("
                   "host_id TEXT PRIMARY KEY, started_at DOUBLE PRECISION NOT NULL, "
                   "heartbeat_at DOUBLE PRECISION NOT NULL, version TEXT NOT NULL)")
    db.execute_sql("CREATE TABLE IF NOT EXISTS tenant_revocations ("
                   "seq BIGSERIAL PRIMARY KEY, tenant_id TEXT NOT NULL, "
                   "token_sha256 TEXT NOT NULL, host_id TEXT NOT NULL, "
                   "revoked_at DOUBLE PRECISION NOT NULL)")


@dataclass(frozen=True, slots=True)
class HostRow:
    """One host as the database knows it."""

    host_id: str
    started_at: float
    heartbeat_age_secs: float
    version: str
    live_sessions: int

    def alive(self, ttl_secs: float) -> bool:
        return self.heartbeat_age_secs <= ttl_secs

    def to_wire(self, ttl_secs: float, own_id: str) -> dict[str, object]:
        return {"hostId": self.host_id, "self": self.host_id == own_id,
                "alive": self.alive(ttl_secs), "liveSessions": self.live_sessions,
                "lastHeartbeatSecsAgo": round(max(0.0, self.heartbeat_age_secs), 3),
                "startedAt": self.started_at, "version": self.version}


@dataclass(frozen=True, slots=True)
class Revocation:
    """A removed tenant: its id and token hash (never the token)."""

    seq: int
    tenant_id: str
    token_sha256: str
    host_id: str


def beat(db: peewee.Database, host_id: str, started_at: float, version: str) -> float | None:
    """This host's heartbeat (its row made or renewed); dead hosts' old rows go. The
    start time the row had before (None: no row): another process's, when two share
    one host id."""
    with db.atomic():
        before = db.execute_sql("SELECT started_at FROM zeroclaw_hosts WHERE host_id = %s "
                                "FOR UPDATE", (host_id,)).fetchone()
        db.execute_sql(
            "INSERT INTO zeroclaw_hosts AS h (host_id, started_at, heartbeat_at, version) "
            f"VALUES (%s, %s, {_NOW}, %s) ON CONFLICT (host_id) DO UPDATE SET "
            "started_at = EXCLUDED.started_at, heartbeat_at = EXCLUDED.heartbeat_at, "
            "version = EXCLUDED.version", (host_id, started_at, version))
        db.execute_sql(f"DELETE FROM zeroclaw_hosts WHERE heartbeat_at < {_NOW} - %s",
                       (FORGET_AFTER_SECS,))
    return None if before is None else float(before[0])


def forget(db: peewee.Database, host_id: str) -> None:
    """A host that stops: its row goes."""
    db.execute_sql("DELETE FROM zeroclaw_hosts WHERE host_id = %s", (host_id,))


def list_hosts(db: peewee.Database) -> list[HostRow]:
    """Every host with a row, by id, with its live (unexpired) leases."""
    cursor = db.execute_sql(
        f"SELECT h.host_id, h.started_at, {_NOW} - h.heartbeat_at, h.version, "
        "(SELECT count(*) FROM session_leases l WHERE l.host_id = h.host_id "
        f"AND l.expires_at > {_NOW}) FROM zeroclaw_hosts h ORDER BY h.host_id")
    return [HostRow(str(host), float(started), float(age), str(version), int(live))
            for host, started, age, version, live in cursor.fetchall()]


def revoke(db: peewee.Database, tenant_id: str, token_sha256: str, host_id: str) -> int:
    """Append a removed tenant to the log; its sequence number."""
    row = db.execute_sql(
        "INSERT INTO tenant_revocations (tenant_id, token_sha256, host_id, revoked_at) "
        f"VALUES (%s, %s, %s, {_NOW}) RETURNING seq",
        (tenant_id, token_sha256, host_id)).fetchone()
    return int(row[0])


def revocations_after(db: peewee.Database, seq: int) -> list[Revocation]:
    """The revocations logged after sequence number ``seq`` (0: all), in order."""
    cursor = db.execute_sql("SELECT seq, tenant_id, token_sha256, host_id "
                            "FROM tenant_revocations WHERE seq > %s ORDER BY seq", (seq,))
    return [Revocation(int(s), str(t), str(h), str(by)) for s, t, h, by in cursor.fetchall()]
