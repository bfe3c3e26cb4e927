"""actors/worker/turn.py runs a turn against a narrow view of its session
(:class:`actors.worker.turn.TurnSession`, checked by mypy where the session actor builds
its turn context), not against ``actors.worker.session``, which imports it: no import circle."""

from __future__ import annotations

import ast
from pathlib import Path

import actors.worker.turn


def _imported_modules(source: Path) -> set[str]:
    """Every module ``source`` imports, wherever the import is (TYPE_CHECKING too)."""
    modules = set()
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
    return modules


def test_the_turn_module_does_not_import_the_session_module() -> None:
    assert "actors.worker.session" not in _imported_modules(Path(actors.worker.turn.__file__))
