"""``canonical`` (actors/worker/tools/paths.py) on plain strings gives what its pathlib
form gives: ``~`` expanded, made absolute against the base, symlinks resolved."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from actors.worker.tools.paths import canonical


def _pathlib_canonical(path: str | Path, base: Path | None = None) -> Path:
    """The general form: every step a Path."""
    expanded = Path(os.path.expanduser(str(path)))
    if not expanded.is_absolute():
        expanded = (base or Path.cwd()) / expanded
    return Path(os.path.realpath(expanded))


@pytest.mark.parametrize("path", [
    "/etc", "~/.ssh", "~", "~root/x", "~no-such-user-zc/x", "rel/x", "./x/../y", "", ".",
    "..", "//x", "///x", "/a//b/./c/", "/tmp/", "x\\y", "ln/b/up/ln", "ln/../x", "ln/b/up",
    Path("/tmp/x/../y"), Path("rel"),
])
def test_canonical_is_its_pathlib_form(tmp_path: Path, path: str | Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "ln").symlink_to(tmp_path / "a")
    (tmp_path / "a" / "b" / "up").symlink_to("../..")
    for base in (None, tmp_path, tmp_path / "ln"):
        expected = _pathlib_canonical(path, base)
        assert canonical(path, base) == expected
        assert str(canonical(path, base)) == str(expected)
