"""Shared fixtures: every test leaves no actor running.

Hypothesis runs under the ``ci`` profile unless ``HYPOTHESIS_PROFILE`` names
another: ``ci`` is derandomized (the same examples every run, so a failure is a
defect, never luck) and keeps no example database; ``explore`` draws new
examples each run, for hunting locally.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pykka
import pytest
from hypothesis import HealthCheck, settings

from actors.persistence import PersistenceActor
from storage import Store, open_store
from storage.store import open_store_url
from tests.pg_support import BACKENDS, fresh_database

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("explore", settings.get_profile("ci"), derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(params=BACKENDS)
def store_backend(request: pytest.FixtureRequest) -> str:
    """Each store test runs on both backends: ``sqlite`` and ``postgresql``."""
    return str(request.param)


@pytest.fixture
def store_url(store_backend: str) -> Iterator[str | None]:
    """A fresh PostgreSQL database's URL, or ``None`` on SQLite."""
    if store_backend == "sqlite":
        yield None
        return
    with fresh_database() as url:
        yield url


@pytest.fixture
def store(tmp_path: Path, store_url: str | None) -> Iterator[Store]:
    """A fresh session store in a temp data dir, or in a fresh PostgreSQL database
    (a module may define its own)."""
    if store_url is None:
        opened = open_store(tmp_path / "data" / "sessions" / "acp-sessions.db")
    else:
        opened = open_store_url(store_url)
    yield opened
    opened.close()


@pytest.fixture
def writer(store: Store) -> Iterator[Any]:
    """A running persistence actor's proxy, writing to ``store``."""
    ref = PersistenceActor.start(store)
    yield ref.proxy()
    ref.stop()


@pytest.fixture(autouse=True)
def _stop_all_actors() -> Iterator[None]:
    yield
    pykka.ActorRegistry.stop_all()
