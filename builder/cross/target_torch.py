"""The target's torch: the aarch64 wheel, unpacked with its pure-Python dependencies.

One cached site-packages folder per (torch wheel content, target Python) serves both jobs:
compiling (``torch/include``, ``torch/lib``) and running under QEMU (``PYTHONPATH=<site>``).
The index's aarch64 torch 2.9.1 is a CPU build; 2.13.0 is a CUDA-13 build that needs CUDA
libraries even to import, so pick a CPU torch for verification (configs/support.yaml lists them).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

from builder.cache import cache_root, content_key, ensure_entry
from builder.cross.sysroot import TargetPython, precompile
from builder.errors import StepFailed
from builder.release.manifest import sha256_file
from builder.wheel import wheelmeta

# The glibc of the index's aarch64 torch wheels when the caller names none (2.8.0 and newer).
DEFAULT_PLATFORM = "manylinux_2_28_{arch}"
#: The legacy names of manylinux tags: pip's --platform matches a wheel's tag by name, and the
#: Ascend lines' aarch64 torch wheels are tagged manylinux2014 only.
_LEGACY_TAGS = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


def platform_args(plat: str) -> list[str]:
    """pip ``--platform`` arguments for every tag a wheel for *plat* may carry:
    ``manylinux_2_28_aarch64`` -> manylinux_2_28 ... manylinux_2_17 and manylinux2014. pip
    takes only the tags it is given (no older one), so a torch wheel tagged manylinux2014 is not
    found with manylinux_2_28 alone."""
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", plat)
    if m is None:
        return ["--platform", plat]
    minor, arch = int(m.group(1)), m.group(2)
    out: list[str] = []
    for y in range(minor, 16, -1):
        out += ["--platform", f"manylinux_2_{y}_{arch}"]
        if y in _LEGACY_TAGS:
            out += ["--platform", f"{_LEGACY_TAGS[y]}_{arch}"]
    return out


def wheel_cxx11_abi(torch_dir: Path) -> bool | None:
    """The string ABI an unpacked torch says it was built with (TorchConfig.cmake's
    TORCH_CXX_FLAGS; torch 2.8+ states none: the C++11 ABI), None when unreadable."""
    config = torch_dir / "share" / "cmake" / "Torch" / "TorchConfig.cmake"
    try:
        text = config.read_text(encoding="utf-8")
    except OSError:
        return None
    m = re.search(r'TORCH_CXX_FLAGS "-D_GLIBCXX_USE_CXX11_ABI=([01])"', text)
    return True if m is None else m.group(1) == "1"


@dataclass(frozen=True)
class TargetTorch:
    """An unpacked target torch and the site-packages folder it lives in."""

    version: str
    site: Path  # pip --target folder: torch + its dependencies, for PYTHONPATH under QEMU
    wheel: Path  # the torch wheel it came from (cached)
    wheel_sha256: str

    @property
    def full_version(self) -> str:
        """``torch.__version__`` of the target torch (e.g. ``2.9.1+cpu``), read from its files."""
        namespace: dict[str, object] = {}
        exec((self.torch_dir / "version.py").read_text(), namespace)
        return str(namespace["__version__"])

    @property
    def torch_dir(self) -> Path:
        return self.site / "torch"

    @property
    def include_dirs(self) -> tuple[Path, ...]:
        # The same two folders torch.utils.cpp_extension.include_paths() returns for CPU.
        inc = self.torch_dir / "include"
        return (inc, inc / "torch" / "csrc" / "api" / "include")

    @property
    def lib_dir(self) -> Path:
        return self.torch_dir / "lib"

    def openmp_library(self) -> Path | None:
        """torch's own OpenMP runtime, if the wheel bundles one.

        x86_64 wheels ship ``torch/lib/libgomp.so.1``; the aarch64 ones were repaired by
        auditwheel and carry a hash-renamed ``torch.libs/libgomp-<hash>.so.1.0.0``. An extension
        built with ``-fopenmp`` must link *that* file (same SONAME) so that one OpenMP runtime,
        torch's, is loaded; linking the toolchain's ``libgomp.so.1`` would need a system libgomp
        on the target that manylinux does not promise.
        """
        plain = self.lib_dir / "libgomp.so.1"
        if plain.exists():
            return plain
        mangled = sorted((self.site / "torch.libs").glob("libgomp-*.so*"))
        return mangled[0] if mangled else None


def _pip(args: list[str], what: str, env: Mapping[str, str] | None = None) -> None:
    """pip here; *env* adds to this process's environment (the build's proxies)."""
    full_env = {**os.environ, **(env or {})}
    run = subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, env=full_env
    )
    if run.returncode != 0:
        raise StepFailed(f"{what} failed (pip {' '.join(args)}):\n{run.stderr[-3000:]}")


def target_requirements(wheel: Path, python: TargetPython) -> list[str]:
    """The wheel's ``Requires-Dist`` entries whose markers hold on the target (no extras)."""
    return wheelmeta.target_requirements(wheel, python.arch, python.version)


def download_torch_wheel(
    version: str,
    python: TargetPython,
    cache: Path | None = None,
    platform: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Path:
    """The target torch wheel, downloaded once (``pip download --no-deps``) into the cache."""
    plat = platform or DEFAULT_PLATFORM.format(arch=python.arch)
    folder = cache_root(cache) / "wheels" / f"torch-{version}-{python.python_tag}-{plat}"

    def fill(tmp: Path) -> None:
        _pip(
            [
                "download",
                "--no-deps",
                "--only-binary=:all:",
                *platform_args(plat),
                "--python-version",
                python.version,
                "--implementation",
                "cp",
                "--abi",
                python.python_tag,
                "-d",
                str(tmp),
                f"torch=={version}",
            ],
            f"downloading torch=={version} for {python.python_tag} {plat}",
            env,
        )

    ensure_entry(folder, fill)
    wheels = sorted(folder.glob("torch-*.whl"))
    if len(wheels) != 1:
        raise StepFailed(f"torch wheel cache {folder}: expected one torch-*.whl, found {wheels}")
    return wheels[0]


def ensure_target_torch(
    version: str,
    python: TargetPython,
    cache: Path | None = None,
    platform: str | None = None,
    extra_requirements: tuple[str, ...] = (),
    env: Mapping[str, str] | None = None,
) -> TargetTorch:
    """A cached target site-packages with torch ``version`` and its dependencies for ``python``.

    ``extra_requirements`` (e.g. ``("numpy",)``) are installed alongside and are part of the key.
    """
    plat = platform or DEFAULT_PLATFORM.format(arch=python.arch)
    wheel = download_torch_wheel(version, python, cache, plat, env)
    sha_file = wheel.parent / "sha256"  # hashing 100 MB costs ~0.3 s: once per wheel
    if not sha_file.exists():
        sha_file.write_text(sha256_file(wheel) + "\n")
    digest = sha_file.read_text().strip()
    key = content_key([digest, python.python_tag, plat, *sorted(extra_requirements)])
    site = cache_root(cache) / "sites" / f"torch-{version}-{python.python_tag}-{key}"

    def fill(tmp: Path) -> None:
        common = [
            "install",
            "--quiet",
            "--target",
            str(tmp),
            "--only-binary=:all:",
            *platform_args(plat),
            "--python-version",
            python.version,
            "--implementation",
            "cp",
            "--abi",
            python.python_tag,
            "--no-compile",
        ]
        # pip evaluates environment markers against the *host* even with --platform, so it
        # would pull torch's x86_64-only CUDA requirements; evaluate them for the target here
        # and install torch itself without dependency resolution.
        requirements = [*target_requirements(wheel, python), *extra_requirements]
        if requirements:
            _pip([*common, *requirements], f"installing torch=={version}'s dependencies", env)
        _pip([*common, "--no-deps", str(wheel)], f"installing torch=={version} for {plat}", env)
        precompile(tmp, python.version, shown_as=site)

    ensure_entry(site, fill)
    if not (site / "torch" / "include" / "torch" / "extension.h").exists():
        raise StepFailed(f"target torch in {site} has no torch/include/torch/extension.h")
    return TargetTorch(version=version, site=site, wheel=wheel, wheel_sha256=digest)


#: Requirement names that mark a torch wheel as a CUDA build (it cannot import without them).
_CUDA_PREFIXES = ("nvidia-", "cuda-")


def cuda_requirements(wheel: Path, python: TargetPython) -> list[str]:
    """The CUDA runtime packages ``wheel`` requires on the target (empty: a CPU build).

    Read from the wheel's own metadata, so no table of "which torch is CPU" goes stale.
    """
    names = []
    for req in target_requirements(wheel, python):
        name = Requirement(req).name.lower()
        if name.startswith(_CUDA_PREFIXES):
            names.append(name)
    return names


def require_cpu_torch(
    version: str,
    python: TargetPython,
    cache: Path | None = None,
    env: Mapping[str, str] | None = None,
    platform: str | None = None,
) -> Path:
    """The cached target torch wheel ``version``; :class:`StepFailed` when it is a CUDA build.

    A CUDA torch cannot be imported under QEMU (no CUDA libraries, no GPU), so a wheel built
    against it could not be verified; verifying against another torch instead would prove
    nothing about this cell, so the caller must stop.
    """
    wheel = download_torch_wheel(version, python, cache, platform=platform, env=env)
    cuda = cuda_requirements(wheel, python)
    if cuda:
        raise StepFailed(
            f"torch {version} for {python.arch} on the index is a CUDA build (it requires "
            f"{', '.join(sorted(cuda)[:4])}{', ...' if len(cuda) > 4 else ''}): it cannot be "
            f"imported under qemu-{python.arch}, so a wheel built against it cannot be verified "
            f"here. Build a cell whose {python.arch} torch is a CPU build (e.g. --torch 2.9.1, "
            "TORCH=2.9.1), or build this cell on an aarch64 machine"
        )
    return wheel
