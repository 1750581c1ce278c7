"""The documentation's command blocks are true: each ```bash block of README.md and of every
docs/*.md page says, in an HTML comment on the line before it, which tests run its commands
(``<!-- checked-by: path::test ... -->``) or why none can on a machine like CI's
(``<!-- not-run: reason -->``). This test holds every page to that: a block without the comment,
or naming a test that does not exist, fails; and every ``make`` command in a block names a real
target of the Makefile (``make -n``, which runs nothing). Each docs page starts with its
``# Title``.

A checked block's tests must start from what the block's reader has -- a fresh clone, an
installed tool, a bundle, a fresh venv -- not from this suite's own environment (whose
interpreter has torch and the compiled amp): at least one of them carries
``@pytest.mark.starts_from("...")`` saying where it starts, or the comment says why the block is
checked from the suite's environment only (``<!-- checked-by: tests... ; suite environment:
reason -->``).
"""

from __future__ import annotations

import ast
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
#: Every page whose blocks are held to the rule: the front door and the docs site's pages.
PAGES = (README, *sorted((ROOT / "docs").glob("*.md")))
MARK = re.compile(r"^<!-- (checked-by|not-run): (.+?) -->$")


@dataclass(frozen=True)
class Block:
    page: str  # relative to the repository: README.md, docs/arm.md
    line: int  # of the opening fence, 1-based
    mark: str | None  # "checked-by" / "not-run"
    detail: str
    commands: tuple[str, ...]  # the block's lines without comments, continuation-joined


def page_blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    name = page.relative_to(ROOT).as_posix()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```bash":
            i += 1
            continue
        above = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        m = MARK.match(above)
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            body.append(lines[j])
            j += 1
        blocks.append(
            Block(
                name,
                i + 1,
                m.group(1) if m else None,
                m.group(2) if m else "",
                tuple(_commands(body)),
            )
        )
        i = j + 1
    return blocks


def _commands(body: list[str]) -> list[str]:
    out: list[str] = []
    for raw in body:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        out.append(re.split(r"\s+#\s", line, maxsplit=1)[0].strip())
    return out


BLOCKS = [b for page in PAGES for b in page_blocks(page)]


#: What separates a checked block's tests from why they start in the suite's environment.
SUITE_ENV = "; suite environment:"


def _refs(block: Block) -> tuple[list[str], str]:
    """A checked block's test references and its suite-environment reason ('' if none)."""
    refs, _, why = block.detail.partition(SUITE_ENV)
    return refs.split(), why.strip()


def _test_node(ref: str) -> tuple[ast.Module, ast.FunctionDef] | None:
    path, _, name = ref.partition("::")
    file = ROOT / path
    if not file.is_file() or not name:
        return None
    tree = ast.parse(file.read_text())
    found = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name]
    return (tree, found[0]) if found else None


def _test_exists(ref: str) -> bool:
    return _test_node(ref) is not None


def _starts_from(ref: str) -> str | None:
    """The ``starts_from`` mark's argument on the test *ref* or its module, else None."""
    node = _test_node(ref)
    if node is None:
        return None
    tree, func = node
    marks = list(func.decorator_list)
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in stmt.targets
        ):
            value = stmt.value
            marks += value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
    for mark in marks:
        if (
            isinstance(mark, ast.Call)
            and isinstance(mark.func, ast.Attribute)
            and mark.func.attr == "starts_from"
            and mark.args
            and isinstance(mark.args[0], ast.Constant)
        ):
            return str(mark.args[0].value)
    return None


def test_the_readme_has_command_blocks() -> None:
    assert len(BLOCKS) >= 10
    assert len([b for b in BLOCKS if b.page == "README.md"]) >= 3
    assert len({b.page for b in BLOCKS}) >= 10, "the docs pages' blocks are not being read"


@pytest.mark.parametrize("page", PAGES[1:], ids=[p.name for p in PAGES[1:]])
def test_each_docs_page_starts_with_its_title(page: Path) -> None:
    first = page.read_text().split("\n", 1)[0]
    assert first.startswith("# ") and first[2:].strip(), (
        f"{page.relative_to(ROOT)}:1: a page starts with its '# Title' line, not {first!r}"
    )


@pytest.mark.parametrize("block", BLOCKS, ids=[f"{b.page}:{b.line}" for b in BLOCKS])
def test_each_block_says_which_tests_run_it(block: Block) -> None:
    where = f"{block.page}:{block.line}"
    assert block.mark, (
        f"{where}: a ```bash block without '<!-- checked-by: "
        "tests/...::test_... -->' or '<!-- not-run: reason -->' on the line "
        "before it"
    )
    if block.mark == "not-run":
        assert len(block.detail.split()) >= 3, f"{where}: say why it cannot run"
        return
    refs, _ = _refs(block)
    missing = [r for r in refs if not _test_exists(r)]
    assert refs and not missing, f"{where}: no such test: {missing}"


CHECKED = [b for b in BLOCKS if b.mark == "checked-by"]


@pytest.mark.parametrize("block", CHECKED, ids=[f"{b.page}:{b.line}" for b in CHECKED])
def test_each_checked_block_starts_where_its_reader_does(block: Block) -> None:
    refs, why = _refs(block)
    starts = {r: _starts_from(r) for r in refs}
    if any(starts.values()):
        return
    assert len(why.split()) >= 3, (
        f"{block.page}:{block.line}: none of {refs} starts from what this block's reader has "
        "(@pytest.mark.starts_from('fresh clone' | 'installed tool' | 'bundle' | 'fresh venv')); "
        f"add one that does, or say why in the comment: '<!-- checked-by: ...{SUITE_ENV} "
        "reason -->'"
    )


def test_a_reader_start_is_recognised() -> None:
    """The mark is found on the front door's own test (so the rule above can fail)."""
    ref = "tests/builder/e2e/test_front_door.py::test_readme_make_wheel_arm_py39_from_a_fresh_clone"
    assert _starts_from(ref) == "fresh clone"
    assert _starts_from("tests/test_readme_blocks.py::test_the_readme_has_command_blocks") is None


MAKE_LINES = [
    (f"{b.page}:{b.line}", c) for b in BLOCKS for c in b.commands if c.startswith("make ")
]


@pytest.mark.parametrize(
    ("where", "command"), MAKE_LINES, ids=[f"{where}:{c.split()[1]}" for where, c in MAKE_LINES]
)
def test_make_commands_name_real_targets(where: str, command: str) -> None:
    argv = [a for a in shlex.split(command.replace("…", "x")) if not a.startswith("[")]
    r = subprocess.run(
        ["make", "-n", *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert "No rule to make target" not in r.stderr, f"{where}: {command}: {r.stderr}"
