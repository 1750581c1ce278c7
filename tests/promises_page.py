"""docs/promises.md from the tests: every test marked ``@pytest.mark.promise(promise=...,
fault=..., result=...)`` is one row (promise, the fault injected, the test, the result it
asserts). The page is generated, never edited by hand, so it cannot drift from the tests:
tests/test_promises_page.py fails when the two differ.

    python tests/promises_page.py          # print the page
    python tests/promises_page.py --write  # rewrite docs/promises.md (what `make promises` runs)
    python tests/promises_page.py --check  # exit 1 if docs/promises.md is out of date (pre-commit)
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "promises.md"
FIELDS = ("promise", "fault", "result")
# The areas, in the page's order: a test's folder under tests/ names its area.
AREAS = {
    "builder": "The builder",
    "amp": "amp",
    "optimizers": "amp's optimizers",
    "kernels": "amp's kernels",
    "npu": "amp on an NPU",
}


class PromiseError(ValueError):
    """A promise marker the page cannot be made from (it names the file and line)."""


@dataclass(frozen=True)
class Promise:
    area: str
    test: str  # tests/path.py::name
    line: int
    promise: str
    fault: str
    result: str


def _marker_fields(node: ast.expr) -> dict[str, str] | None:
    """The keyword strings of a ``pytest.mark.promise(...)`` decorator, None for others."""
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "promise"
        and ast.unparse(node.func) == "pytest.mark.promise"
    ):
        return None
    if node.args:
        raise PromiseError("pass promise=, fault= and result= by keyword")
    fields: dict[str, str] = {}
    for kw in node.keywords:
        if kw.arg not in FIELDS:
            raise PromiseError(f"unknown field {kw.arg!r} (expected {', '.join(FIELDS)})")
        if not (isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str)):
            raise PromiseError(f"{kw.arg}= must be a literal string")
        fields[kw.arg] = " ".join(kw.value.value.split())
    missing = [f for f in FIELDS if not fields.get(f)]
    if missing:
        raise PromiseError(f"missing or empty: {', '.join(missing)}")
    return fields


def collect(root: Path = ROOT) -> list[Promise]:
    found: list[Promise] = []
    for path in sorted((root / "tests").rglob("test_*.py")):
        rel = path.relative_to(root).as_posix()
        parts = path.relative_to(root / "tests").parts
        area = parts[0] if len(parts) > 1 else "project"
        tree = ast.parse(path.read_text(), filename=rel)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for deco in node.decorator_list:
                try:
                    fields = _marker_fields(deco)
                except PromiseError as exc:
                    raise PromiseError(f"{rel}:{deco.lineno}: {node.name}: {exc}") from None
                if fields is not None:
                    found.append(Promise(area, f"{rel}::{node.name}", deco.lineno, **fields))
    order = list(AREAS)
    return sorted(
        found,
        key=lambda p: (
            order.index(p.area) if p.area in order else len(order),
            p.area,
            p.test.split("::")[0],
            p.line,
        ),
    )


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render(promises: list[Promise]) -> str:
    out = [
        "# Promises and the faults that test them",
        "",
        "What the builder and amp promise when things go wrong, the fault each test injects",
        "to check it, and what the test asserts. Each row is one test of the suite (CI runs",
        "them all); the page is generated from the tests' `promise` markers by",
        "`make promises`, and `tests/test_promises_page.py` fails when it is out of date.",
    ]
    for area in dict.fromkeys(p.area for p in promises):
        out += [
            "",
            f"## {AREAS.get(area, area)}",
            "",
            "| Promise | Fault injected | Test | Result |",
            "|---|---|---|---|",
        ]
        out += [
            f"| {_cell(p.promise)} | {_cell(p.fault)} | `{p.test}` | {_cell(p.result)} |"
            for p in promises
            if p.area == area
        ]
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    try:
        page = render(collect())
    except PromiseError as exc:
        print(f"promises: {exc}", file=sys.stderr)
        return 2
    if argv == ["--write"]:
        PAGE.parent.mkdir(exist_ok=True)
        tmp = PAGE.with_suffix(".md.tmp")
        tmp.write_text(page)
        tmp.replace(PAGE)
        print(f"wrote {PAGE.relative_to(ROOT)}")
    elif argv == ["--check"]:
        if (PAGE.read_text() if PAGE.exists() else "") != page:
            print("docs/promises.md is out of date: run `make promises`", file=sys.stderr)
            return 1
    elif argv:
        print("usage: promises_page.py [--write | --check]", file=sys.stderr)
        return 2
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
