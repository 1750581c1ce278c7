"""Build script: the `amp` package plus its compiled kernels, `amp._C`.

Metadata lives in pyproject.toml. The extension is built against the torch that is
importable here (builds run with --no-build-isolation), and records that torch's
version inside the module so amp/_ext.py can refuse a mismatched binary at import.

Environment:
  AMP_BUILD_EXT=0   build a pure-Python package (amp falls back to torch ops)
  AMP_EXT_DEBUG=1   keep debug symbols (-g -O0) for gdb
"""
from __future__ import annotations

import glob
import os

from setuptools import setup


def _want_extension() -> bool:
    value = os.environ.get("AMP_BUILD_EXT", "1").strip().lower()
    return value not in ("0", "false", "no", "off")


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
        f'-DAMP_TORCH_VERSION="{torch.__version__}"',
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


setup(**(_extension_kwargs() if _want_extension() else {}))
