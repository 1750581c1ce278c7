"""Loaded by every Python process of a cross build (its folder is first on PYTHONPATH).

The project's setup.py runs on the *host* interpreter with the host's (x86_64) torch, because
only that one can be imported. torch.utils.cpp_extension would then hand the compiler the host
torch's headers and libraries. This hook lets the module load normally and then points its two
path roots at the *target* torch (``$AMPFORGE_CROSS_TORCH_DIR``), so ``include_paths()``,
``library_paths()`` and everything built on them describe the aarch64 torch. No change to the
project is needed, which is what lets ``--project PATH`` cross-build any torch extension.

The C++ standard follows the target torch too: torch 2.10+ compiles extensions as C++20, 2.9 and
older as C++17. Under C++20, libstdc++'s ``ostringstream::str() const&`` (GLIBCXX_3.4.29, GCC
11) is what torch 2.9's inline ``c10::str`` calls, which would make the wheel need the C++
runtime of glibc-2.34 systems, above the manylinux_2_28 of the torch it runs with.

So does the C++ string ABI (``$AMPFORGE_CROSS_CXX11_ABI``, 0 or 1: the cell's record, from the
support table's torch_cxx11_abi). The host torch's cpp_extension would pass its own
``-D_GLIBCXX_USE_CXX11_ABI`` (torch 2.13's passes none: GCC's default, the C++11 ABI), and a
module compiled with the other ABI than the target torch's links, then fails to import: the
aarch64 torch 2.1-2.5 wheels use the pre-C++11 one. Every such define is replaced by the
target's.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import re
import sys

# Every Python process of the build loads this hook, so it imports nothing more for its
# annotations: they are the type checker's alone (it reads a name TYPE_CHECKING as true).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

# "" when unset: the hook then installs nothing (the end of this file).
_TARGET = os.environ.get("AMPFORGE_CROSS_TORCH_DIR", "")
_ABI = os.environ.get("AMPFORGE_CROSS_CXX11_ABI", "")
_MODULE = "torch.utils.cpp_extension"
_ABI_DEFINE = "-D_GLIBCXX_USE_CXX11_ABI="


def _redirect(module: Any) -> None:  # torch.utils.cpp_extension
    missing = [n for n in ("_TORCH_PATH", "TORCH_LIB_PATH") if not hasattr(module, n)]
    if missing:
        raise RuntimeError(
            f"ampforge cross build: {_MODULE} of the host torch has no {', '.join(missing)}; "
            "cannot point it at the target torch. Use a host torch between 2.1 and 2.13."
        )
    module._TORCH_PATH = _TARGET
    module.TORCH_LIB_PATH = os.path.join(_TARGET, "lib")
    std = _target_std()
    abi = f"{_ABI_DEFINE}{_ABI}" if _ABI in ("0", "1") else None
    if std is None and abi is None:
        return
    build_cls = module.BuildExtension
    if abi is not None and hasattr(build_cls, "_add_gnu_cpp_abi_flag"):
        # Host torches up to 2.12 add their own define per extension: make it the target's.
        def _add_gnu_cpp_abi_flag(self: Any, extension: Any) -> None:
            self._add_compile_flag(extension, abi)

        build_cls._add_gnu_cpp_abi_flag = _add_gnu_cpp_abi_flag
    original = build_cls.build_extensions

    def build_extensions(self: Any) -> Any:
        for ext in self.extensions:
            args = ext.extra_compile_args
            cxx = args.setdefault("cxx", []) if isinstance(args, dict) else args
            # torch appends its own -std only when the extension names none: name the target's.
            if std is not None and not any(str(a).startswith("-std=") for a in cxx):
                cxx.append(std)
            if abi is not None:
                # A project's own define (or none) gives way to the target torch's.
                cxx[:] = [a for a in cxx if not str(a).startswith(_ABI_DEFINE)] + [abi]
        return original(self)

    build_cls.build_extensions = build_extensions


def _target_std() -> str | None:
    """``-std=c++NN`` as the target torch's cpp_extension would add it (None: unknown)."""
    try:
        with open(os.path.join(_TARGET, "utils", "cpp_extension.py"), encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return None
    m = re.search(r"cpp_flag_prefix \+ 'c\+\+(\d+)'", text)
    return f"-std=c++{m.group(1)}" if m else None


class _CppExtensionRedirect(importlib.abc.MetaPathFinder):
    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)  # find the real module without recursing into ourselves
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        real_exec = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            real_exec(module)
            _redirect(module)

        # On this spec's loader object only: the real module runs, then is redirected.
        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if _TARGET:
    sys.meta_path.insert(0, _CppExtensionRedirect())
