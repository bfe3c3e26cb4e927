"""The runs every vendor module compares, from its own ``bench`` fixture
(:class:`tests.vendors.bench.Bench`): the adapter driven directly, then through
``zeroclaw acp``; each once per module."""

from __future__ import annotations

import pytest

from .bench import Bench, Hosted, Run


@pytest.fixture(scope="module")
def direct(bench: Bench) -> Run:
    return bench.direct()


@pytest.fixture(scope="module")
def hosted(bench: Bench, direct: Run) -> Hosted:
    """After ``direct``: the two runs share the bench's cwd path and model server."""
    return bench.hosted()
