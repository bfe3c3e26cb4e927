"""The import rules of the code (docs/architecture.md, "Import rules"), read from the source.

1. No circle between modules.
2. Nothing in ``ipc/``, ``actors/`` or ``storage/`` imports ``supervisor``.
3. Every ``supervisor`` module sits in one of the packages of :data:`LAYERS` and imports
   only modules of its own package or of the packages after it there.

Every import statement counts: module-level and inside functions, and those under
``if TYPE_CHECKING:`` as well (an annotation that names a module is a dependency on it,
even when it is not imported at run time); relative imports are resolved against their
package. ``from P import name`` depends on ``P.name`` when that is a module, else on ``P``.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ipc", "actors", "storage", "supervisor")
BELOW_SUPERVISOR = ("ipc", "actors", "storage")
#: The supervisor packages, each importing only itself and those after it.
LAYERS = ("cli", "servers", "ops", "host", "hosted", "workers", "core", "config")

Graph = dict[str, set[str]]


def module_names(root: Path, packages: Iterable[str] = PACKAGES) -> dict[str, Path]:
    """Every module under ``root``'s ``packages``, by dotted name (a package by its own)."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool,
              modules: dict[str, Path]) -> Iterator[str]:
    """The dotted names one import statement of ``module`` reaches for."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        anchor = module.split(".") if is_package else module.split(".")[:-1]
        anchor = anchor[:len(anchor) - (node.level - 1)]
        base = ".".join(anchor + ([node.module] if node.module else []))
    for alias in node.names:  # P.name when it is a module, else P itself
        yield f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base


def import_graph(root: Path, packages: Iterable[str] = PACKAGES) -> Graph:
    """Each module's imports of other modules under ``root``'s ``packages``."""
    modules = module_names(root, packages)

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: Graph = {}
    for module, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = _imported(node, module, path.name == "__init__.py", modules)
                targets.update(t for t in map(known, names) if t is not None)
        targets.discard(module)
        graph[module] = targets
    return graph


def _components(graph: Graph) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _cycle_through(graph: Graph, component: list[str]) -> list[str]:
    """One circle of imports inside ``component``, from its first module back to it."""
    members = set(component)
    start = component[0]
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node] & members):
                if target == start:
                    path = [start, node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return path[::-1]
                if target not in came_from:
                    came_from[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"no circle in {component}")


def circles(graph: Graph) -> list[str]:
    """Each import circle as ``a -> b -> a``, one per group of modules that import
    each other (directly or around)."""
    found = []
    for component in _components(graph):
        path = _cycle_through(graph, component)
        found.append(" -> ".join(path) + f"   (modules in the circle: {', '.join(component)})")
    return found


def upward_imports(graph: Graph) -> list[str]:
    """``a -> b`` for each module below ``supervisor/`` that imports ``supervisor``."""
    return [f"{source} -> {target}" for source, targets in sorted(graph.items())
            for target in sorted(targets)
            if source.split(".")[0] in BELOW_SUPERVISOR and target.split(".")[0] == "supervisor"]


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else None


def layer_breaks(graph: Graph) -> list[str]:
    """``a -> b (why)`` for each supervisor import the package order forbids, and each
    supervisor module outside the packages."""
    broken = []
    for source, targets in sorted(graph.items()):
        if not source.startswith("supervisor.") or source == "supervisor":
            continue
        layer = _layer(source)
        if layer not in LAYERS:
            broken.append(f"{source}: in no package of {LAYERS}")
            continue
        for target in sorted(targets):
            if target == "supervisor":
                broken.append(f"{source} -> supervisor (the top package exports nothing)")
            elif target.startswith("supervisor."):
                other = _layer(target)
                if other in LAYERS and LAYERS.index(other) < LAYERS.index(layer):
                    broken.append(f"{source} -> {target} ({layer} may not import {other})")
    return broken


def _problems(root: Path) -> dict[str, list[str]]:
    graph = import_graph(root)
    return {"circles": circles(graph), "upward": upward_imports(graph),
            "layers": layer_breaks(graph)}


def _report(kind: str, found: list[str]) -> str:
    return f"{len(found)} {kind}:\n  " + "\n  ".join(found)


def test_no_module_imports_itself_around_a_circle() -> None:
    found = circles(import_graph(ROOT))
    assert not found, _report("import circles", found)


def test_nothing_below_supervisor_imports_it() -> None:
    found = upward_imports(import_graph(ROOT))
    assert not found, _report("upward imports", found)


def test_supervisor_packages_import_only_those_after_them() -> None:
    found = layer_breaks(import_graph(ROOT))
    assert not found, _report("imports against the package order", found)


def test_the_graph_reads_the_real_tree() -> None:
    """The rules above looked at something: the known arrows of the host are there."""
    graph = import_graph(ROOT)
    assert "supervisor.core.live" in graph["supervisor.host.host"]
    assert "ipc.version" in graph["actors.worker.agents.acp_process"]
    assert len(graph) > 100


# -- the checks themselves, on planted trees ------------------------------------------

def _plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    for package in PACKAGES:
        for directory in [root / package, *(p for p in (root / package).rglob("*") if p.is_dir())]:
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "__init__.py").touch()
    return root


def test_a_planted_circle_is_found_and_printed_whole(tmp_path: Path) -> None:
    root = _plant(tmp_path, {
        "supervisor/core/a.py": "from supervisor.core.b import B\n",
        "supervisor/core/b.py": """
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from supervisor.core import c
            """,
        "supervisor/core/c.py": "def later():\n    from . import a\n",
        "supervisor/core/d.py": "import supervisor.core.a\n",
    })
    found = _problems(root)
    assert found["circles"] == [
        "supervisor.core.a -> supervisor.core.b -> supervisor.core.c -> supervisor.core.a"
        "   (modules in the circle: supervisor.core.a, supervisor.core.b, supervisor.core.c)"]
    assert found["upward"] == [] and found["layers"] == []


def test_a_planted_upward_import_is_found(tmp_path: Path) -> None:
    root = _plant(tmp_path, {
        "supervisor/config/config.py": "X = 1\n",
        "actors/worker/agent.py": "def v():\n    from supervisor.config import config\n",
        "storage/store.py": "from ..supervisor.config.config import X\n",
    })
    found = _problems(root)
    assert found["upward"] == ["actors.worker.agent -> supervisor.config.config",
                               "storage.store -> supervisor.config.config"]
    assert found["circles"] == []


def test_a_planted_import_against_the_package_order_is_found(tmp_path: Path) -> None:
    root = _plant(tmp_path, {
        "supervisor/flat.py": "",
        "supervisor/core/routes.py": "from supervisor.host.sessions import Sessions\n",
        "supervisor/host/sessions.py": "from supervisor.core.routes import Route\n"
                                       "from supervisor import __version__\n",
        "supervisor/servers/gateway.py": "from supervisor.ops import metrics\n",
        "supervisor/ops/metrics.py": "",
    })
    found = _problems(root)
    assert found["layers"] == [
        "supervisor.core.routes -> supervisor.host.sessions (core may not import host)",
        "supervisor.flat: in no package of " + str(LAYERS),
        "supervisor.host.sessions -> supervisor (the top package exports nothing)",
    ]
    assert found["circles"] == [
        "supervisor.core.routes -> supervisor.host.sessions -> supervisor.core.routes"
        "   (modules in the circle: supervisor.core.routes, supervisor.host.sessions)"]
