"""ampforge's own packaging metadata: the license is an SPDX expression, written the way the
setuptools at hand can (setup.py's license_kwargs; pyproject.toml says why it is dynamic), and
building the metadata raises no setuptools deprecation (the table form of ``project.license``
is one, and stops building in 2027)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from email.parser import Parser
from pathlib import Path

import setuptools

REPO = Path(__file__).resolve().parent.parent


def _setup_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("ampforge_setup", REPO / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_license_argument_follows_setuptools_version() -> None:
    setup = _setup_module()
    assert setup.LICENSE == "BSD-3-Clause"
    assert setup.license_kwargs("75.3.2") == {"license": "BSD-3-Clause"}
    assert setup.license_kwargs("77.0.3") == {
        "license_expression": "BSD-3-Clause",
        "license_files": ["LICENSE"],
    }
    assert setup.license_kwargs("84.2.1")["license_expression"] == "BSD-3-Clause"


def test_the_metadata_carries_the_spdx_license_without_deprecations(tmp_path: Path) -> None:
    """The metadata this setuptools writes for a copy of the checkout (no extension: no torch
    needed), as a frontend asks for it (PEP 517's prepare_metadata_for_build_wheel)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, src / name)
    (src / "amp").mkdir()
    shutil.copy2(REPO / "amp" / "_version.py", src / "amp" / "_version.py")
    (src / "amp" / "__init__.py").write_text("")
    out = tmp_path / "meta"
    out.mkdir()
    code = (
        "import sys, warnings; warnings.simplefilter('always');"
        "from setuptools import build_meta as b;"
        "print(b.prepare_metadata_for_build_wheel(sys.argv[1]))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(out)],
        cwd=src,
        capture_output=True,
        text=True,
        env={"AMP_BUILD_EXT": "0", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Deprecat" not in r.stderr, r.stderr[-3000:]
    meta = Parser().parsestr((out / r.stdout.strip().splitlines()[-1] / "METADATA").read_text())
    if int(setuptools.__version__.split(".")[0]) >= 77:
        assert meta["License-Expression"] == "BSD-3-Clause", meta.items()
        assert meta["License"] is None
        assert meta.get_all("License-File") == ["LICENSE"]
    else:
        assert meta["License"] == "BSD-3-Clause", meta.items()


def test_metadata_commands_are_told_from_builds() -> None:
    setup = _setup_module()
    # What setuptools' PEP 517 backend runs: get_requires (egg_info), prepare_metadata
    # (dist_info), each possibly after global flags from config settings.
    assert setup.metadata_only(["setup.py", "dist_info", "--output-dir", "m", "--keep-egg-info"])
    assert setup.metadata_only(["setup.py", "--quiet", "egg_info"])
    assert not setup.metadata_only(["setup.py", "bdist_wheel", "--dist-dir", "d"])
    assert not setup.metadata_only(["setup.py", "--quiet", "build_ext", "--inplace"])
    assert not setup.metadata_only(["setup.py"])


def test_the_metadata_of_an_extension_build_does_not_import_torch(tmp_path: Path) -> None:
    """pip asks for the metadata (prepare_metadata_for_build_wheel) before it builds: with the
    extension wanted, that step must not import torch (a second of every rebuild). A torch on
    the path that fails on import proves it is not imported."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, src / name)
    (src / "amp").mkdir()
    shutil.copy2(REPO / "amp" / "_version.py", src / "amp" / "_version.py")
    (src / "amp" / "__init__.py").write_text("")
    poison = tmp_path / "poison" / "torch"
    poison.mkdir(parents=True)
    (poison / "__init__.py").write_text("raise ImportError('torch imported for metadata')\n")
    out = tmp_path / "meta"
    out.mkdir()
    code = (
        "import sys; from setuptools import build_meta as b;"
        "print(b.prepare_metadata_for_build_wheel(sys.argv[1]))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(out)],
        cwd=src,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(poison.parent), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    meta = Parser().parsestr((out / r.stdout.strip().splitlines()[-1] / "METADATA").read_text())
    assert meta["Name"] == "ampforge"
    assert "torch>=2.1" in meta.get_all("Requires-Dist")
