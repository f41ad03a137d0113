"""The emulator's modules are layered: none imports a module that imports it back.

Every import counts: at the top, inside a function, and under ``if TYPE_CHECKING:`` (a
type needed both ways belongs in a lower module, or behind a Protocol the lower module
defines). A cycle is named with the line of each import in it.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EMULATOR = ROOT / "adapters" / "emulator"
#: How the emulator's modules import each other by absolute name.
PACKAGE = "georep.adapters.emulator"

#: module -> {imported module: line of the first such import}
Graph = dict[str, dict[str, int]]


def _target(module: str | None, alias: str, folder: Path) -> str | None:
    """The module of ``folder``'s package that ``from <module> import <alias>`` loads, where
    ``module`` is relative to the package ("" for the package itself); None if outside."""
    if module is None:
        return None
    if module == "":
        # `from . import Emulator` reads the package's __init__; `from . import _x`, _x.
        return alias if (folder / f"{alias}.py").exists() else "__init__"
    return module.split(".")[0]


def _relative(name: str) -> str | None:
    """``georep.adapters.emulator._x`` -> ``_x``, the package itself -> "", else None."""
    if name == PACKAGE:
        return ""
    if name.startswith(PACKAGE + "."):
        return name[len(PACKAGE) + 1 :]
    return None


def imports_of(path: Path) -> dict[str, int]:
    """The modules of ``path``'s package that ``path`` imports, each with its first line."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str | None] = []
        if isinstance(node, ast.Import):
            targets = [_target(_relative(alias.name), "", path.parent) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1:
                module: str | None = node.module or ""
            elif node.level == 0:
                module = _relative(node.module or "")
            else:
                module = None  # above the package
            targets = [_target(module, alias.name, path.parent) for alias in node.names]
        for target in targets:
            if target and target != path.stem:
                found[target] = min(found.get(target, node.lineno), node.lineno)
    return found


def import_graph(folder: Path) -> Graph:
    return {path.stem: imports_of(path) for path in sorted(folder.glob("*.py"))}


def cycles(graph: Graph) -> list[list[str]]:
    """The cycles to name: in each strongly connected component of more than one module
    (Tarjan), the shortest cycle through each of its modules, each named once."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, {})):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    found: set[tuple[str, ...]] = set()
    for component in components:
        for member in component:
            cycle = _one_cycle(graph, component, member)[:-1]
            first = cycle.index(min(cycle))  # one spelling per cycle, whatever its start
            rotated = (*cycle[first:], *cycle[:first])
            found.add((*rotated, rotated[0]))
    return sorted(list(cycle) for cycle in found)


def _one_cycle(graph: Graph, members: set[str], start: str) -> list[str]:
    """A shortest path from ``start`` back to itself through ``members`` (breadth first)."""
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for successor in sorted(graph[node]):
            if successor == start:
                return [*paths[node], start]
            if successor in members and successor not in paths:
                paths[successor] = [*paths[node], successor]
                queue.append(successor)
    raise AssertionError(f"{start} is in no cycle")  # Tarjan said it was


def describe(graph: Graph, cycle: list[str]) -> str:
    return (
        " -> ".join(
            f"{module}.py:{graph[module][after]}" for module, after in itertools.pairwise(cycle)
        )
        + f" -> {cycle[-1]}.py"
    )


def test_the_emulator_has_no_import_cycle() -> None:
    graph = import_graph(EMULATOR)
    assert {"_server", "_broker", "_amqp", "_control"} <= set(graph)
    found = [describe(graph, cycle) for cycle in cycles(graph)]
    assert found == [], (
        "import cycles in adapters/emulator (module.py:line imports the next; move the type "
        "both need to a lower module, or pass a Protocol or callback in):\n" + "\n".join(found)
    )


def test_every_kind_of_import_is_an_edge(tmp_path: Path) -> None:
    (tmp_path / "_low.py").write_text("")
    (tmp_path / "_mid.py").write_text("")
    (tmp_path / "_typed.py").write_text("")
    (tmp_path / "__init__.py").write_text("")
    (tmp_path / "_high.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "from ._low import thing\n"
        "from . import _mid, Public\n"
        "import georep.adapters.emulator._low\n"
        "from georep.adapters.emulator import _low\n"
        "from .. import elsewhere\n"
        "if TYPE_CHECKING:\n"
        "    from ._typed import Type\n"
        "def later():\n"
        "    from ._high import itself\n"
    )
    assert imports_of(tmp_path / "_high.py") == {
        "_low": 2,
        "_mid": 3,
        "__init__": 3,
        "_typed": 8,
    }


def test_a_cycle_is_named_with_the_line_of_each_import() -> None:
    graph: Graph = {
        "_a": {"_b": 3},
        "_b": {"_c": 5, "_d": 6},
        "_c": {"_a": 7},
        "_d": {},
        "_e": {"_f": 1},
        "_f": {"_e": 2},
    }
    assert [describe(graph, cycle) for cycle in cycles(graph)] == [
        "_a.py:3 -> _b.py:5 -> _c.py:7 -> _a.py",
        "_e.py:1 -> _f.py:2 -> _e.py",
    ]


def test_every_cycle_of_a_knot_is_named() -> None:
    graph: Graph = {"_hub": {"_a": 1, "_b": 2}, "_a": {"_hub": 3}, "_b": {"_hub": 4}}
    assert [describe(graph, cycle) for cycle in cycles(graph)] == [
        "_a.py:3 -> _hub.py:1 -> _a.py",
        "_b.py:4 -> _hub.py:2 -> _b.py",
    ]
