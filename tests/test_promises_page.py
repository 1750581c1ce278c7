"""docs/promises.md is the tests' `promise` markers, row for row (`make promises` rewrites it),
and a malformed marker is refused naming its file and line."""

from __future__ import annotations

from pathlib import Path

import pytest
from promises_page import PAGE, PromiseError, collect, main, render


def test_promises_page_matches_the_tests():
    promises = collect()
    assert promises, "no test carries a promise marker"
    expected = render(promises)
    actual = PAGE.read_text() if PAGE.exists() else ""
    assert actual == expected, "docs/promises.md is out of date: run `make promises`"
    tests = {p.test for p in promises}
    assert len(tests) == len(promises), "one row per test"


def test_check_mode_agrees(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`--check` (the pre-commit hook) passes on the current page and fails on a stale one."""
    assert main(["--check"]) == 0
    stale = tmp_path / "promises.md"
    stale.write_text(PAGE.read_text() + "| a row no test has |\n")
    monkeypatch.setattr("promises_page.PAGE", stale)
    assert main(["--check"]) == 1


def _tree(tmp_path: Path, decorator: str) -> Path:
    (tmp_path / "tests" / "builder").mkdir(parents=True)
    (tmp_path / "tests" / "builder" / "test_x.py").write_text(
        f"import pytest\n\n{decorator}\ndef test_it():\n    pass\n"
    )
    return tmp_path


@pytest.mark.parametrize(
    "decorator,message",
    [
        ('@pytest.mark.promise(promise="p", fault="f")', "missing or empty: result"),
        ('@pytest.mark.promise("p", fault="f", result="r")', "by keyword"),
        (
            '@pytest.mark.promise(promise="p", fault="f", result="r", why="w")',
            "unknown field 'why'",
        ),
        ('@pytest.mark.promise(promise="p", fault=F, result="r")', "fault= must be a literal"),
    ],
)
def test_a_malformed_marker_is_refused_naming_file_and_line(tmp_path, decorator, message):
    with pytest.raises(PromiseError) as err:
        collect(_tree(tmp_path, decorator))
    assert "tests/builder/test_x.py:3: test_it:" in str(err.value) and message in str(err.value)


def test_a_row_per_marked_test_with_pipes_escaped(tmp_path):
    root = _tree(tmp_path, '@pytest.mark.promise(promise="a | b", fault="f", result="r")')
    page = render(collect(root))
    assert "| a \\| b | f | `tests/builder/test_x.py::test_it` | r |" in page
    assert "## The builder" in page
