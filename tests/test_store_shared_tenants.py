"""The shared tenants of a PostgreSQL store (:mod:`storage.shared_tenants`), and the
schema step that adds their table to a database made before it existed. Runs against
the throw-away cluster of ``scripts/test``."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from storage import hosts, shared_tenants
from storage.shared_tenants import SharedTenant
from storage.store import open_store_url
from tests.pg_support import fresh_database, insert_old_session


@pytest.fixture
def database() -> Iterator[str]:
    with fresh_database() as url:
        yield url


def test_shared_tenants_are_added_listed_and_removed_with_their_revocation(
        database: str) -> None:
    store = open_store_url(database)
    db = store.writer
    try:
        bob = SharedTenant("bob", "id-bob", "b" * 64, max_sessions=3, workspace_root="/w",
                           sandbox_network=False, created_by="one")
        shared_tenants.add_tenant(db, bob)
        shared_tenants.add_tenant(db, SharedTenant("amy", "id-amy", "a" * 64, admin=True))
        with pytest.raises(shared_tenants.TenantExists):
            shared_tenants.add_tenant(db, SharedTenant("bob", "id-2", "c" * 64))
        listed = shared_tenants.list_tenants(db)
        assert [t.name for t in listed] == ["amy", "bob"]
        assert listed[0].admin and listed[0].sandbox_network
        got = listed[1]
        assert (got.tenant_id, got.token_sha256, got.max_sessions, got.workspace_root,
                got.sandbox_network, got.created_by) == ("id-bob", "b" * 64, 3, "/w",
                                                         False, "one")
        assert 0 < got.created_at <= got.updated_at
        assert shared_tenants.remove_tenant(db, "nobody", "two") is None
        assert shared_tenants.remove_tenant(db, "bob", "two") == \
            SharedTenant("bob", "id-bob", "b" * 64)
        assert [t.name for t in shared_tenants.list_tenants(db)] == ["amy"]
        assert [(r.tenant_id, r.token_sha256, r.host_id)
                for r in hosts.revocations_after(db, 0)] == [("id-bob", "b" * 64, "two")]
    finally:
        store.close()


def test_a_database_of_the_previous_release_gets_the_shared_tenants_table(
        database: str) -> None:
    """A store made before ``shared_tenants`` (the schema step adds it; rows stay)."""
    open_store_url(database).close()
    with psycopg.connect(database, autocommit=True) as admin:
        admin.execute("DROP TABLE shared_tenants")
        insert_old_session(admin)
    store = open_store_url(database)
    try:
        assert store.reader.get_session("old") is not None
        assert shared_tenants.list_tenants(store.writer) == []
        shared_tenants.add_tenant(store.writer, SharedTenant("bob", "id-bob", "b" * 64))
        assert [t.name for t in shared_tenants.list_tenants(store.writer)] == ["bob"]
    finally:
        store.close()
