"""actors.worker.protected: ``within`` on path strings agrees with pathlib's own
``is_relative_to`` (which it replaced on the way of every session/new), and the
protected paths a worker was given are parsed once for all its sessions."""

from __future__ import annotations

import itertools
from pathlib import Path

from actors.worker.protected import PROTECTED_VARIABLE, ProtectedPaths, within

CASES = ["/", "/a", "/a/b", "/ab", "/a/bc", "/a/b/c", "/b", "/a.b", "/a/b.c", "a", "a/b", "ab"]


def test_within_agrees_with_pathlib_on_every_pair() -> None:
    for path, root in itertools.product(map(Path, CASES), map(Path, CASES)):
        assert within(path, root) == (path == root or path.is_relative_to(root)), (path, root)


def test_a_workers_sessions_share_one_parse_of_its_protected_paths(tmp_path: Path) -> None:
    env = {PROTECTED_VARIABLE: f"{tmp_path}/:{tmp_path / 'config.toml'}"}
    first, second = ProtectedPaths.from_env(env), ProtectedPaths.from_env(dict(env))
    assert first is second
    root = tmp_path.resolve()
    assert first.dirs == (root,) and first.files == (root / "config.toml",)
    assert ProtectedPaths.from_env({}) == ProtectedPaths()
