"""The CUDA toolkit the tests compile device code with: the support table's CUDA 13.0 pins
(nvcc, runtime, CCCL, crt, nvvm) installed from the package index with --require-hashes, into
one cache folder named after the pins' content under the builder's cache root: downloaded once
per machine and shared by every test and session."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from builder.cache import cache_root, content_key, ensure_entry
from builder.config import DEFAULT_CONFIG
from builder.config.cuda import Toolkit
from builder.config.load import load_settings
from builder.config.model import CliOverrides
from helpers.enginelib import missing

#: The CUDA version whose toolkit the tests install.
CUDA = "13.0"


def toolkit() -> Toolkit:
    """The support table's toolkit pins for :data:`CUDA`."""
    table = load_settings(CliOverrides(config=str(DEFAULT_CONFIG)), env={}).config.support.cuda
    found = table.toolkit(CUDA)
    assert found is not None, f"configs/support.yaml pins no toolkit for CUDA {CUDA}"
    return found


def index_nvcc() -> Path:
    """The index's nvcc (``…/site/nvidia/cu13/bin/nvcc``); its ``..`` is the build's CUDA_HOME."""
    requirements = toolkit().requirements("x86_64")
    final = cache_root() / "cuda-toolkits" / f"cu130-{content_key(requirements)}"

    def fill(tmp: Path) -> None:
        (tmp / "requirements.txt").write_text("".join(r + "\n" for r in requirements))
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                "--no-deps",
                "--require-hashes",
                "--target",
                str(tmp / "site"),
                "-r",
                str(tmp / "requirements.txt"),
            ],
            capture_output=True,
            text=True,
            timeout=900,
        )
        if proc.returncode != 0:
            missing(
                f"the CUDA toolkit's wheels could not be installed from the package index:\n"
                f"{proc.stderr[-1500:]}",
                "CI needs the package index for the CUDA tests",
            )

    ensure_entry(final, fill)
    found = final / "site" / "nvidia" / "cu13" / "bin" / "nvcc"
    assert found.is_file(), sorted(p.name for p in (final / "site").iterdir())
    return found
