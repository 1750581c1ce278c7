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

from setuptools import Command, setup
from setuptools.command.build_py import build_py

# The `apex` import name (amp/_shim/apex/): a path line in a .pth file at the top of
# site-packages puts amp/_shim on sys.path *after* the site directory, so ampforge never owns a
# top-level apex/ that another distribution (NVIDIA apex, Ascend's apex wheel) may own too: pip
# would overwrite that distribution's files, and uninstalling either would break the other.
APEX_PTH = "ampforge-apex.pth"
APEX_SHIM = "amp/_shim"  # relative to the site directory in a wheel, to this file in a checkout


class BuildPyWithApexName(build_py):
    def run(self) -> None:
        super().run()
        os.makedirs(self.build_lib, exist_ok=True)
        with open(os.path.join(self.build_lib, APEX_PTH), "w", encoding="utf-8") as f:
            f.write(APEX_SHIM + "\n")

    def get_outputs(self, include_bytecode: bool = True) -> list:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, APEX_PTH)]


class ApexPthForCheckout(Command):
    """``setup.py apex_pth --site DIR``: an editable install has no ampforge-apex.pth (setuptools
    keeps only packages in it), so `make setup` writes one pointing at this checkout."""

    description = "write ampforge-apex.pth (the apex import name) for this checkout into --site"
    user_options = [("site=", None, "the site-packages directory of the environment")]

    def initialize_options(self) -> None:
        self.site = ""

    def finalize_options(self) -> None:
        if not self.site or not os.path.isdir(self.site):
            raise SystemExit(f"setup.py apex_pth: --site {self.site!r} is not a directory")

    def run(self) -> None:
        shim = os.path.join(os.path.dirname(os.path.abspath(__file__)), APEX_SHIM)
        with open(os.path.join(self.site, APEX_PTH), "w", encoding="utf-8") as f:
            f.write(shim + "\n")


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


kwargs = _extension_kwargs() if _want_extension() else {}
kwargs["cmdclass"] = {**kwargs.get("cmdclass", {}), "build_py": BuildPyWithApexName,
                     "apex_pth": ApexPthForCheckout}
setup(version=_version(), **kwargs)
