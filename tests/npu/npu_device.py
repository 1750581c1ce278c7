"""Build, cache and install the `npu` test device (device/npu_device.cpp).

`install()` compiles the device library (or reuses a cached build), loads it, and wires
it into torch the way torch_npu does: PrivateUse1 renamed to "npu", the generated
`Tensor.npu()` / `Module.npu()` / `is_npu` methods, and `torch.npu` (npu_module.py).

The build is cached under a key made of the sources, this file's compile flags, torch's
version and the Python ABI, in a folder outside the repository (``$XDG_CACHE_HOME`` or
``~/.cache``, then ``ampforge/npu-device/<key>``; ``AMPFORGE_NPU_DEVICE_CACHE`` replaces
the parent folder). A missing or unwritable cache only costs a build. Concurrent sessions
are safe: each builds in a private temporary folder and renames it into place; the loser
of a race discards its folder (its own copy is already loaded: the same code).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import npu_module
import torch

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "device" / "npu_device.cpp",)
LIB_NAME = "ampforge_npu_device"
# -O1 -g0: the device only copies and dispatches; its cold build time counts against CI.
CFLAGS = ("-O1", "-g0")
# Bumped when the way the library is built changes without a source change.
BUILD_RECIPE = "1"
BACKEND = "npu"


@dataclass(frozen=True)
class Installed:
    ops: Any  # torch.ops.ampforge_npu: the device library's own entry points
    path: Path  # the loaded library, in its cache folder
    built: bool  # False: loaded from the cache
    build_seconds: float  # compile time (0.0 when loaded from the cache)


_installed: Optional[Installed] = None


def cache_key() -> str:
    h = hashlib.sha256()
    for src in SOURCES:
        h.update(src.name.encode())
        h.update(src.read_bytes())
    for part in (
        " ".join(CFLAGS),
        BUILD_RECIPE,
        torch.__version__,
        str(torch.version.git_version),
        sys.version,
        str(sysconfig.get_config_var("SOABI")),
    ):
        h.update(b"\0" + part.encode())
    return h.hexdigest()[:24]


def default_cache_root() -> Path:
    override = os.environ.get("AMPFORGE_NPU_DEVICE_CACHE")
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "ampforge" / "npu-device"


def _library(folder: Path) -> Optional[Path]:
    lib = folder / f"{LIB_NAME}.so"
    return lib if lib.is_file() else None


@contextlib.contextmanager
def _ninja_on_path() -> Iterator[None]:
    """torch's JIT builder runs `ninja` from PATH; the dev extra installs it into the
    venv's bin folder, which is not on PATH when the venv's python is run directly."""
    old = os.environ.get("PATH", "")
    extra = [str(Path(sys.executable).parent)]
    with contextlib.suppress(ImportError):
        import ninja  # type: ignore[import-untyped]  # noqa: PLC0415

        extra.insert(0, str(ninja.BIN_DIR))
    os.environ["PATH"] = os.pathsep.join([*extra, old])
    try:
        yield
    finally:
        os.environ["PATH"] = old


def _compile_and_load(into: Path) -> None:
    """Build into `into`. torch's JIT builder also loads what it built (from `into`, which
    is renamed afterwards: the loaded file stays mapped)."""
    from torch.utils import cpp_extension  # noqa: PLC0415

    with _ninja_on_path():
        cpp_extension.verify_ninja_availability()
        cpp_extension.load(
            name=LIB_NAME,
            sources=[str(s) for s in SOURCES],
            extra_cflags=list(CFLAGS),
            build_directory=str(into),
            is_python_module=False,  # a plain library: its registrations are its interface
            verbose=bool(os.environ.get("AMPFORGE_NPU_DEVICE_VERBOSE")),
        )


def build_and_load(
    cache_root: Path, fallback_root: Optional[Path] = None
) -> tuple[Path, bool, float]:
    """Load the device library, building it first unless the cache has it. Returns
    (library path, built now, compile seconds). `fallback_root` is used when `cache_root`
    cannot be written."""
    key = cache_key()
    final = cache_root / key
    lib = _library(final)
    if lib is not None:
        torch.ops.load_library(str(lib))
        return lib, False, 0.0
    try:
        cache_root.mkdir(parents=True, exist_ok=True)
        # The cache folder itself is the lock (no lock file is left in it): parallel test
        # workers start together; one compiles, the others wait and load its build.
        lock = os.open(cache_root, os.O_RDONLY)
    except OSError:
        if fallback_root is None:
            raise
        return build_and_load(fallback_root, None)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lib = _library(final)
        if lib is not None:
            torch.ops.load_library(str(lib))
            return lib, False, 0.0
        return _build_into(cache_root, key, final)
    finally:
        os.close(lock)  # releases the lock


def _build_into(cache_root: Path, key: str, final: Path) -> tuple[Path, bool, float]:
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=cache_root))
    try:
        start = time.monotonic()
        _compile_and_load(tmp)
        seconds = time.monotonic() - start
        if _library(tmp) is None:
            raise RuntimeError(f"the npu device build left no {LIB_NAME}.so in {tmp}")
        try:
            os.rename(tmp, final)  # atomic: readers see no folder or a complete one
        except OSError:
            if _library(final) is None:
                raise
            # Another session finished first with the same key; ours is loaded already.
            shutil.rmtree(tmp, ignore_errors=True)
        lib = _library(final)
        assert lib is not None
        return lib, True, seconds
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def install(cache_root: Optional[Path] = None, fallback_root: Optional[Path] = None) -> Installed:
    """Build (or reuse) and load the device, then register it with torch. Idempotent
    within a process (PrivateUse1 can be claimed only once). Must run before the process's
    first backward pass (see _check_autograd)."""
    global _installed
    if _installed is not None:
        return _installed
    name = torch._C._get_privateuse1_backend_name()
    if name not in ("privateuseone", BACKEND):
        raise RuntimeError(f"PrivateUse1 is already taken by {name!r} in this process")

    lib, built, seconds = build_and_load(cache_root or default_cache_root(), fallback_root)
    ops = torch.ops.ampforge_npu
    ops.init()

    if name != BACKEND:
        torch.utils.rename_privateuse1_backend(BACKEND)
    if not hasattr(torch.Tensor, BACKEND):
        generate = torch.utils.generate_methods_for_privateuse1_backend
        kwargs = {"for_tensor": True, "for_module": True, "for_storage": True}
        # PackedSequence.npu() is generated from torch 2.2 on; torch 2.1 has no such argument.
        if "for_packed_sequence" in inspect.signature(generate).parameters:
            kwargs["for_packed_sequence"] = True
        generate(**kwargs)
    npu_module._bind(ops)
    if getattr(torch, BACKEND, None) is not npu_module:
        torch._register_device_module(BACKEND, npu_module)

    _check_autograd()
    _installed = Installed(ops=ops, path=lib, built=built, build_seconds=seconds)
    return _installed


# --- one pytest session's device (tests/conftest.py, tests/npu/conftest.py) -------------------
_session_failure: Optional[BaseException] = None


def _install_for_tests() -> Installed:
    # The cache outside the repository is only an optimisation: where it cannot be
    # written, the build goes to a folder under the system's temporary directory.
    return install(fallback_root=Path(tempfile.gettempdir()) / "ampforge-npu-device")


def install_at_collection() -> None:
    """Install the device when collection ends, before any test runs (so before the session's
    first backward pass). A build failure is kept: ``session_device()`` raises it against the
    tests that need the device, and only those fail."""
    global _session_failure
    if _installed is not None or _session_failure is not None:
        return
    try:
        _install_for_tests()
    except Exception as exc:  # noqa: BLE001 (any failure is kept and reported by the tests)
        _session_failure = exc


def session_device() -> Installed:
    """The session's installed device (installed now if collection did not ask for it)."""
    if _session_failure is not None:
        raise RuntimeError(
            f"the npu test device could not be installed: {_session_failure}"
        ) from _session_failure
    return _installed if _installed is not None else _install_for_tests()


def installed() -> Optional[Installed]:
    return _installed


def _check_autograd() -> None:
    """Run one backward pass on the device. Autograd sizes its per-device worker threads
    once per process, at the first backward, from the devices registered then: a device
    installed after that fails every backward with an internal assertion. Say why."""
    x = torch.ones(2, device=BACKEND, requires_grad=True)
    try:
        (x * 3).sum().backward()
    except RuntimeError as exc:
        if "device_ready_queues_" not in str(exc):
            raise
        raise RuntimeError(
            "the npu test device was installed after this process's first backward pass; "
            "autograd cannot use it: install it before any backward (tests/npu/conftest.py "
            "does so at the end of collection)"
        ) from exc
    assert x.grad is not None and x.grad.device.type == BACKEND
