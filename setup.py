"""Build script: the `amp` package plus its compiled kernels, `amp._C`.

Metadata lives in pyproject.toml. The extension is built against the torch that is
importable here (builds run with --no-build-isolation), and records that torch's
version inside the module so amp/_ext.py can refuse a mismatched binary at import.

Environment:
  AMP_BUILD_EXT=0   build a pure-Python package (amp falls back to torch ops)
  AMP_EXT_DEBUG=1   keep debug symbols (-g -O0) for gdb
  AMP_TORCH_VERSION the torch version to record in amp._C instead of the importable one
                    (cross builds compile against a target torch the build host cannot import)
  AMP_LOCAL_VERSION a PEP 440 local label appended to the version, e.g. torch2.13 -> 0.1.0+torch2.13
                    (wheels carry the torch they were built against)
"""
from __future__ import annotations

import glob
import os
import re

from setuptools import setup


def _want_extension() -> bool:
    value = os.environ.get("AMP_BUILD_EXT", "1").strip().lower()
    return value not in ("0", "false", "no", "off")


_VERSION_RE = re.compile(r"^[0-9A-Za-z.+\-]+$")


def _recorded_torch_version(importable: str) -> str:
    value = os.environ.get("AMP_TORCH_VERSION", "").strip() or importable
    if not _VERSION_RE.match(value):
        raise SystemExit(f"setup.py: AMP_TORCH_VERSION={value!r} is not a version (e.g. 2.9.1+cpu)")
    return value


def _version() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "amp", "_version.py"), encoding="utf-8") as f:
        m = re.search(r'__version__\s*=\s*"([^"]+)"', f.read())
    if m is None:
        raise SystemExit("setup.py: no __version__ in amp/_version.py")
    version = m.group(1)
    label = os.environ.get("AMP_LOCAL_VERSION", "").strip()
    if label:
        if not re.fullmatch(r"[A-Za-z0-9]+(?:\.[A-Za-z0-9]+)*", label):
            raise SystemExit(
                f"setup.py: AMP_LOCAL_VERSION={label!r} is not a PEP 440 local label"
                " (letters, digits and dots, e.g. torch2.13)"
            )
        version = f"{version}+{label}"
    return version


def _extension_kwargs() -> dict:
    # Imported lazily: a pure-Python build must not need torch.
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    debug = os.environ.get("AMP_EXT_DEBUG", "0") == "1"
    opt = ["-O0", "-g"] if debug else ["-O3", "-g0"]
    compile_args = opt + [
        # CppExtension does not add OpenMP: without it at::parallel_for is serial.
        "-fopenmp",
        # Lets sqrt vectorize (no errno side effect to preserve).
        "-fno-math-errno",
        # Round exactly where torch.optim does (explicit fma only where torch fuses).
        "-ffp-contract=off",
        f'-DAMP_TORCH_VERSION="{_recorded_torch_version(torch.__version__)}"',
    ]
    link_args = ["-fopenmp"] + ([] if debug else ["-s"])
    sources = sorted(glob.glob(os.path.join("kernels", "*.cpp")))
    ext = CppExtension(
        name="amp._C",
        sources=sources,
        include_dirs=[os.path.abspath("kernels")],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
    )
    return {
        "ext_modules": [ext],
        "cmdclass": {"build_ext": BuildExtension.with_options(use_ninja=False)},
    }


setup(version=_version(), **(_extension_kwargs() if _want_extension() else {}))
