"""No import circle in amp/ or builder/ (issue 36).

The graph is read from the source with `ast`, nothing is imported: every ``import`` and
``from ... import`` counts, at module level and inside functions (a function-local import that
closes a circle still fails when the function first runs, in whatever order modules happen to be
loaded). Relative imports are resolved against the importing module's package, and
``from X import Y`` counts an edge to X and, where Y is a submodule, to X.Y. Imports under
``if TYPE_CHECKING:`` are left out: they never run, so they cannot close a circle at import time.
Importing a.b.c runs a and a.b first, so those packages count too, except the importer's own
packages: they have already started loading (a package's ``__init__`` that imports its own
submodules would otherwise make every package a circle). For the same reason
``from pkg import sub`` inside pkg counts only pkg.sub (Python finds the submodule without the
half-run ``__init__``); ``from pkg import name`` inside pkg, reading a name that ``__init__`` may
not have defined yet, counts pkg.
"""

from __future__ import annotations

import ast
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("amp", "builder")


@dataclass(frozen=True)
class Edge:
    target: str
    path: Path
    line: int


def module_names(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under each package directory."""
    names: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in the tree, function-local ones included, except those under
    ``if TYPE_CHECKING:`` (their ``else:`` branch does run, so it is kept)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _resolve_base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    # The package the relative import starts from: a package's own name for its __init__.
    parts = module.split(".") if is_package else module.split(".")[:-1]
    if node.level > 1:
        parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, node.module] if node.module else parts)


def import_graph(names: dict[str, Path]) -> dict[str, list[Edge]]:
    """Module -> the modules of `names` it imports, with where."""
    graph: dict[str, list[Edge]] = {}
    for module, path in names.items():
        is_package = path.name == "__init__.py"
        edges: list[Edge] = []
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _resolve_base(module, is_package, node)
                submodules = [f"{base}.{alias.name}" for alias in node.names]
                targets = [name for name in submodules if name in names]
                # `base` itself runs first, but a package above the importer has already
                # started by then: only a name read from it (not a submodule) depends on it.
                ancestor = module.startswith(base + ".") or (is_package and module == base)
                if not ancestor or len(targets) < len(submodules):
                    targets.append(base)
            for target in targets:
                # Importing a.b.c runs a and a.b first: those that have not started yet (that
                # are not the importer's own packages) are imported by this line too.
                parts = target.split(".")
                for depth in range(1, len(parts) + 1):
                    name = ".".join(parts[:depth])
                    own = module == name or (depth < len(parts) and module.startswith(name + "."))
                    if name in names and not own and not any(e.target == name for e in edges):
                        edges.append(Edge(name, path, node.lineno))
        graph[module] = edges
    return graph


def circles(graph: dict[str, list[Edge]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[Edge]]] = [(start, iter(graph[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            advanced = False
            for edge in edges:
                if edge.target not in index:
                    index[edge.target] = low[edge.target] = counter
                    counter += 1
                    stack.append(edge.target)
                    on_stack.add(edge.target)
                    work.append((edge.target, iter(graph[edge.target])))
                    advanced = True
                    break
                if edge.target in on_stack:
                    low[node] = min(low[node], index[edge.target])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
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
    return sorted(found)


def describe(component: list[str], graph: dict[str, list[Edge]]) -> str:
    """One concrete circle through the component's first module, each step with its line."""
    members = set(component)
    start = component[0]
    # Breadth-first inside the component for the shortest way back to `start`.
    previous: dict[str, tuple[str, Edge]] = {}
    frontier = [start]
    seen = {start}
    closing: tuple[str, Edge] | None = None
    while frontier and closing is None:
        following = []
        for node in frontier:
            for edge in graph[node]:
                if edge.target == start:
                    closing = (node, edge)
                    break
                if edge.target in members and edge.target not in seen:
                    seen.add(edge.target)
                    previous[edge.target] = (node, edge)
                    following.append(edge.target)
            if closing is not None:
                break
        frontier = following
    assert closing is not None, component
    steps = [closing]
    node = closing[0]
    while node != start:
        steps.append(previous[node])
        node = previous[node][0]
    steps.reverse()
    lines = [f"{src} -> {edge.target}  ({_shown(edge.path)}:{edge.line})" for src, edge in steps]
    return f"circle of {len(component)} modules ({', '.join(component)}):\n  " + "\n  ".join(lines)


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:  # a synthetic package under tmp_path
        return str(path)


def find_circles(root: Path, packages: tuple[str, ...]) -> list[str]:
    graph = import_graph(module_names(root, packages))
    return [describe(component, graph) for component in circles(graph)]


def test_no_import_circle_in_amp_or_builder() -> None:
    # CPU time, not wall time: the machine running the suite may be loaded (about 0.7 s here).
    started = time.process_time()
    names = module_names(REPO, PACKAGES)
    # Guards the walk itself: an empty or tiny module set would pass vacuously.
    assert len(names) > 100, sorted(names)
    found = find_circles(REPO, PACKAGES)
    assert not found, "import circles:\n" + "\n".join(found)
    assert time.process_time() - started < 5


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize(
    ("files", "members"),
    [
        pytest.param(
            {
                "pkg/__init__.py": "",
                "pkg/a.py": "from pkg.b import thing\n",
                "pkg/b.py": "import pkg.c\n",
                "pkg/c.py": "def f():\n    from . import a  # function-local, relative\n",
            },
            "pkg.a, pkg.b, pkg.c",
            id="absolute-then-local-relative",
        ),
        pytest.param(
            {
                "pkg/__init__.py": "",
                "pkg/sub/__init__.py": "",
                "pkg/sub/a.py": "from .. import b  # b is a submodule of pkg\n",
                "pkg/b.py": "from .sub.a import x\n",
                "pkg/c.py": "",
            },
            "pkg.b, pkg.sub.a",
            id="from-package-import-submodule",
        ),
    ],
)
def test_detector_finds_a_synthetic_circle(
    tmp_path: Path, files: dict[str, str], members: str
) -> None:
    _write(tmp_path, files)
    found = find_circles(tmp_path, ("pkg",))
    assert len(found) == 1, found
    assert f"modules ({members}):" in found[0], found


def test_detector_names_the_modules_and_lines(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "import os\nfrom pkg.b import thing\n",
            "pkg/b.py": "def f():\n    import pkg.a\n",
        },
    )
    (found,) = find_circles(tmp_path, ("pkg",))
    assert "circle of 2 modules (pkg.a, pkg.b)" in found
    assert "pkg.a -> pkg.b" in found and "a.py:2" in found
    assert "pkg.b -> pkg.a" in found and "b.py:2" in found


def test_detector_ignores_type_checking_and_external_imports(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "import pkg.b\n",
            "pkg/b.py": (
                "from typing import TYPE_CHECKING\nimport os\nif TYPE_CHECKING:\n    import pkg.a\n"
            ),
        },
    )
    assert find_circles(tmp_path, ("pkg",)) == []


def test_detector_counts_a_name_read_from_the_package_being_loaded(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "from pkg.a import f\nVALUE = 1\n",
        "pkg/a.py": "from pkg import b\n",  # a submodule: no dependence on pkg's __init__
        "pkg/b.py": "",
    }
    _write(tmp_path, files)
    assert find_circles(tmp_path, ("pkg",)) == []
    # Reading VALUE needs pkg's __init__ to have run past the line that imports pkg.a: it has not.
    _write(tmp_path, {"pkg/a.py": "from pkg import VALUE, b\n"})
    (found,) = find_circles(tmp_path, ("pkg",))
    assert "modules (pkg, pkg.a):" in found


def test_detector_counts_the_packages_an_import_runs_first(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/sub/__init__.py": "from pkg.a import helper\n",
            "pkg/sub/leaf.py": "",
            "pkg/a.py": "import pkg.sub.leaf  # runs pkg/sub/__init__.py first\n",
        },
    )
    (found,) = find_circles(tmp_path, ("pkg",))
    assert "modules (pkg.a, pkg.sub):" in found and "pkg.a -> pkg.sub " in found


if __name__ == "__main__":  # the pre-commit hook: no pytest run, the same check
    import sys

    found = find_circles(REPO, PACKAGES)
    print("\n".join(found) if found else f"no import circle in {', '.join(PACKAGES)}")
    sys.exit(1 if found else 0)
