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
  AMP_BINDING       auto (default) | stable | pybind11: which binding of the kernels to compile.
                    auto takes the stable one (kernels/bindings_stable.cpp: torch's stable C ABI
                    with TORCH_TARGET_VERSION 2.10 and Python's limited API 3.10, so one abi3
                    module loads into every torch >= 2.10 on every CPython >= 3.10) when the
                    torch built against is >= 2.10 and this Python >= 3.10; else pybind11
                    (kernels/bindings.cpp: tied to that one torch and Python). Both compile the
                    same kernel core.
"""

from __future__ import annotations

import os
import re
import sys

import setuptools
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


# The license, as an SPDX expression (pyproject.toml lists `license` as dynamic: see there why).
LICENSE = "BSD-3-Clause"


def license_kwargs(setuptools_version: str) -> dict:
    """setup()'s license arguments for this setuptools: the SPDX expression (Metadata 2.4's
    License-Expression, with the LICENSE file) from setuptools 77 on, the License field before
    (Python 3.8's last setuptools is 75)."""
    m = re.match(r"(\d+)", setuptools_version)
    if m is not None and int(m.group(1)) >= 77:
        return {"license_expression": LICENSE, "license_files": ["LICENSE"]}
    return {"license": LICENSE}


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


def _stable_abi() -> tuple[tuple[int, int], tuple[int, int]]:
    """(oldest torch, oldest Python) of the stable binding: pyproject.toml's
    [tool.ampforge.stable-abi], which the builder reads too (one source for both)."""
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
    # No TOML parser on Python < 3.11 without a dependency: the two keys are plain strings.
    m = re.search(r"(?ms)^\[tool\.ampforge\.stable-abi\]\s*$(.*?)(?=^\[|\Z)", text)
    found = {}
    for key in ("torch", "python"):
        v = re.search(rf'(?m)^{key}\s*=\s*"(\d+)\.(\d+)"', m.group(1)) if m else None
        if v is None:
            raise SystemExit(
                f'setup.py: pyproject.toml [tool.ampforge.stable-abi] needs {key} = "X.Y"'
            )
        found[key] = (int(v.group(1)), int(v.group(2)))
    return found["torch"], found["python"]


# The oldest torch and Python the stable binding serves (see pyproject.toml for why these).
STABLE_MIN_TORCH, ABI3_FLOOR = _stable_abi()
# The kernel core, compiled the same into either binding: element-wise kernels per ISA and the
# ops over the shared driver (apex's multi_tensor_* entry points are amp/kernels/apex_ops.py's).
CORE_SOURCES = ["ops_generic.cpp", "ops_avx2.cpp", "ops_avx512.cpp", "ops.cpp"]
BINDING_SOURCES = {"stable": "bindings_stable.cpp", "pybind11": "bindings.cpp"}


def _torch_minor(version: str) -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", version)
    if m is None:
        raise SystemExit(f"setup.py: cannot read a torch version from {version!r}")
    return int(m.group(1)), int(m.group(2))


def binding_for(torch_version: str, python: tuple[int, int], asked: str = "auto") -> str:
    """The binding to compile: 'stable' or 'pybind11' (see AMP_BINDING above)."""
    asked = asked.strip().lower() or "auto"
    if asked not in ("auto", "stable", "pybind11"):
        raise SystemExit(f"setup.py: AMP_BINDING={asked!r}; expected auto, stable or pybind11")
    can_stable = _torch_minor(torch_version) >= STABLE_MIN_TORCH and python >= ABI3_FLOOR
    if asked == "stable" and not can_stable:
        raise SystemExit(
            f"setup.py: AMP_BINDING=stable needs torch >= {'.'.join(map(str, STABLE_MIN_TORCH))}"
            f" and Python >= {'.'.join(map(str, ABI3_FLOOR))}; building against torch "
            f"{torch_version} on Python {python[0]}.{python[1]}"
        )
    if asked == "auto":
        return "stable" if can_stable else "pybind11"
    return asked


def kernel_headers() -> list[str]:
    """kernels/*.h, as the extension's `depends`: setuptools rebuilds an extension only when a
    file of its sources or depends is newer than the built module, and most kernel code lives in
    headers (cpu_ops_impl.h, driver.h, ...), so without them an edit there left `pip install -e
    .` (make setup) and `setup.py build_ext --inplace` with the stale amp._C."""
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")
    return [os.path.join("kernels", f) for f in sorted(os.listdir(folder)) if f.endswith(".h")]


def _extension_kwargs() -> dict:
    # Imported lazily: a pure-Python build must not need torch.
    import torch  # noqa: PLC0415
    from torch.utils.cpp_extension import BuildExtension, CppExtension  # noqa: PLC0415

    debug = os.environ.get("AMP_EXT_DEBUG", "0") == "1"
    torch_version = _recorded_torch_version(torch.__version__)
    binding = binding_for(torch_version, sys.version_info[:2], os.environ.get("AMP_BINDING", ""))
    stable = binding == "stable"
    opt = ["-O0", "-g"] if debug else ["-O3", "-g0"]
    compile_args = opt + [
        # pybind11: CppExtension does not add OpenMP, and without it at::parallel_for (a
        # header template, inlined here) is serial. stable: parallel_for runs inside libtorch,
        # so only the kernels' `omp simd` loops need the flag, and no OpenMP runtime is linked.
        "-fopenmp-simd" if stable else "-fopenmp",
        # Lets sqrt vectorize (no errno side effect to preserve).
        "-fno-math-errno",
        # Round exactly where torch.optim does (explicit fma only where torch fuses).
        "-ffp-contract=off",
        f'-DAMP_TORCH_VERSION="{torch_version}"',
    ]
    if stable:
        major, minor = STABLE_MIN_TORCH
        compile_args += [
            f"-DTORCH_TARGET_VERSION=0x{major:02x}{minor:02x}000000000000",
            f'-DAMP_TORCH_MIN="{major}.{minor}"',
            # The same token torch's BuildExtension adds for py_limited_api (no redefinition
            # warning); spelled here too since older torches' BuildExtension do not add it.
            "-DPy_LIMITED_API=0x{:02X}{:02X}0000".format(*ABI3_FLOOR),
        ]
    link_args = ([] if stable else ["-fopenmp"]) + ([] if debug else ["-s"])
    sources = [os.path.join("kernels", f) for f in CORE_SOURCES + [BINDING_SOURCES[binding]]]
    ext = CppExtension(
        name="amp._C",
        sources=sources,
        depends=kernel_headers(),
        include_dirs=[os.path.abspath("kernels")],
        extra_compile_args=compile_args,
        extra_link_args=link_args,
        py_limited_api=stable,
    )
    base = BuildExtension.with_options(use_ninja=False)

    class BuildOneBinding(base):  # type: ignore[misc, valid-type]
        """Removes the other binding's amp._C from the folder this build writes to (build/ or,
        editable, the checkout): with both there, Python would import the version-specific one
        (_C.cpython-3XY-*.so) before _C.abi3.so, and a wheel would ship both."""

        def run(self) -> None:
            super().run()
            # Where this build wrote amp._C: the checkout (--inplace, editable) or build_lib.
            path = self.get_ext_fullpath(ext.name)
            folder, built = os.path.dirname(path), os.path.basename(path)
            for name in os.listdir(folder):
                if name.startswith("_C.") and name.endswith(".so") and name != built:
                    os.remove(os.path.join(folder, name))

    kwargs: dict = {"ext_modules": [ext], "cmdclass": {"build_ext": BuildOneBinding}}
    if stable:  # the wheel's tag: cp310-abi3 (installs on every CPython >= 3.10)
        kwargs["options"] = {"bdist_wheel": {"py_limited_api": "cp{}{}".format(*ABI3_FLOOR)}}
    return kwargs


#: setuptools commands that only write metadata: what a PEP 517 frontend runs to ask for the
#: build's requirements (egg_info) and for the wheel's metadata (dist_info) before it builds.
METADATA_COMMANDS = ("dist_info", "egg_info")


def metadata_only(argv: list) -> bool:
    """Whether setup.py was run for metadata only (its first command, after global flags, is
    one of METADATA_COMMANDS): the extension is not part of the metadata, and defining it
    imports torch, a second of every build's front end (pip runs this file twice per wheel)."""
    command = next((a for a in argv[1:] if not a.startswith("-")), "")
    return command in METADATA_COMMANDS


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import binding_for
    wanted = _want_extension() and not metadata_only(sys.argv)
    kwargs = _extension_kwargs() if wanted else {}
    kwargs["cmdclass"] = {
        **kwargs.get("cmdclass", {}),
        "build_py": BuildPyWithApexName,
        "apex_pth": ApexPthForCheckout,
    }
    setup(version=_version(), **license_kwargs(setuptools.__version__), **kwargs)
