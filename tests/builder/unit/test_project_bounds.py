"""``plan`` never lists a cell the project cannot be installed on (its ``requires-python`` and
torch bound, read from its pyproject.toml), and an unsupported Python or torch says why and
names the oldest supported combination."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from helpers.builder_testlib import SUPPORT, run_cli, write_config
from packaging.version import Version

from builder.config import REPO_ROOT
from builder.config.support import load_support
from builder.plan.project import read_bounds

# The upstream Apex-for-Ascend guide's combination: torch 2.1.0 publishes cp38-cp311 wheels.
TABLE_WITH_21 = """\
torch:
  "2.1.0":
    x86_64: ["3.8", "3.9", "3.10", "3.11"]
  "2.8.0":
    x86_64: ["3.9", "3.10", "3.11", "3.12", "3.13"]
unsupported:
  python:
    "3.8": "end of life (test reason)"
  torch:
    "2.1": "a missing API (test reason)"
"""


def _project(tmp_path: Path, requires_python: str, torch: str) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "pyproject.toml").write_text(
        textwrap.dedent(f"""\
        [project]
        name = "demo"
        version = "1"
        requires-python = "{requires_python}"
        dependencies = ["numpy", "torch{torch}"]
        """)
    )
    return root


def test_this_projects_torch_bound_matches_the_support_table() -> None:
    bounds = read_bounds(REPO_ROOT)
    assert bounds is not None and bounds.torch is not None and bounds.requires_python
    table = load_support(SUPPORT)
    torches = sorted(table.wheels, key=Version)
    # Every torch of the table is inside the bound, and the bound admits nothing older than
    # the table's oldest line: pip must not accept a torch the project was never measured on.
    assert all(bounds.torch_ok(t) for t in torches)
    oldest = Version(torches[0])
    older = f"{oldest.major}.{oldest.minor - 1}.0" if oldest.minor else f"{oldest.major - 1}.99.0"
    assert not bounds.torch_ok(older)
    # ... and each Python of the table that requires-python refuses is dropped, never listed.
    pythons = {py for per in table.wheels.values() for pys in per.values() for py in pys}
    r = run_cli("plan", "--format", "json")
    assert r.rc == 0, r.err
    listed = {c["python"] for c in json.loads(r.out)["cells"]}
    assert listed <= {py for py in pythons if bounds.python_ok(py)}


def test_plan_drops_cells_outside_the_projects_bounds(tmp_path: Path) -> None:
    support = write_config(tmp_path, TABLE_WITH_21, "support.yaml")
    cfg = write_config(
        tmp_path,
        f"""\
        support: {support}
        matrix:
          arch: [X86]
          python: ["3.8", "3.9", "3.11"]
          torch: ["2.1.0", "2.8.0"]
        """,
    )
    project = _project(tmp_path, ">=3.9", ">=2.8")
    r = run_cli("plan", "--config", str(cfg), "--project", str(project), "--format", "json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    cells = {(c["python"], c["torch"]) for c in doc["cells"]}
    assert cells == {("3.9", "2.8.0"), ("3.11", "2.8.0")}
    dropped = {(d["python"], d["torch"]): d["reason"] for d in doc["dropped"]}
    assert "demo requires-python >=3.9" in dropped[("3.8", "2.1.0")]
    assert "demo needs torch>=2.8" in dropped[("3.9", "2.1.0")]
    assert "demo requires-python >=3.9" in dropped[("3.8", "2.8.0")]
    # Without the bounds (a project that states none) the same matrix lists the 2.1.0 cells.
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "setup.py").write_text("")
    r = run_cli("plan", "--config", str(cfg), "--project", str(bare), "--format", "json")
    assert ("3.8", "2.1.0") in {(c["python"], c["torch"]) for c in json.loads(r.out)["cells"]}


def test_an_unsupported_python_or_torch_says_why_and_the_oldest_combination(tmp_path: Path) -> None:
    support = write_config(tmp_path, TABLE_WITH_21, "support.yaml")
    cfg = write_config(
        tmp_path,
        f"""\
        support: {support}
        matrix:
          arch: [X86]
          python: ["3.9", "3.11"]
          torch: ["2.8.0"]
        """,
    )
    project = _project(tmp_path, ">=3.9", ">=2.8")
    oldest = "Python 3.9 with torch 2.8.0 (cp39-manylinux_x86_64-torch2.8.0)"
    r = run_cli("plan", "--config", str(cfg), "--project", str(project), "--python", "3.8")
    assert r.rc == 2
    assert "Python 3.8 is not supported: demo requires-python >=3.9" in r.err
    assert "end of life (test reason)" in r.err and oldest in r.err
    r = run_cli("plan", "--config", str(cfg), "--project", str(project), "--torch", "2.1.0")
    assert r.rc == 2
    assert "torch 2.1.0 is not supported: demo needs torch>=2.8" in r.err
    assert "a missing API (test reason)" in r.err and oldest in r.err
    # An include outside the bounds is refused as well (exit 2), naming the rule.
    inc = write_config(
        tmp_path,
        f"""\
        support: {support}
        matrix:
          arch: [X86]
          python: ["3.9"]
          torch: ["2.8.0"]
          include: [{{arch: X86, python: "3.8", torch: "2.1.0"}}]
        """,
        "inc.yaml",
    )
    r = run_cli("plan", "--config", str(inc), "--project", str(project))
    assert r.rc == 2 and "matrix.include[0]" in r.err and "cannot install the project" in r.err


def test_the_default_plan_builds_the_guides_python_38_and_torch_21_and_explains_37() -> None:
    """The upstream guide's Python 3.8 / torch 2.1.0, asked of this repository's own plan: a cell
    (issue 33); Python 3.7 still says why not."""
    r = run_cli("plan", "--python", "3.8", "--torch", "2.1.0", "--format", "json")
    assert r.rc == 0, r.err
    assert {c["id"] for c in json.loads(r.out)["cells"]} >= {"cp38-manylinux_x86_64-torch2.1.0"}
    # Python 3.8 with the modern matrix's torches: none publishes cp38, each says so.
    r = run_cli("plan", "--python", "3.8")
    assert r.rc == 2
    assert "torch 2.8.0 publishes no cp38 wheel for x86_64" in r.err
    assert "The oldest supported combination is Python 3.8 with torch 2.1.0" in r.err
    r = run_cli("plan", "--python", "3.7")
    assert r.rc == 2
    assert "Python 3.7 is not supported: ampforge requires-python >=3.8" in r.err
    assert "end of life" in r.err
