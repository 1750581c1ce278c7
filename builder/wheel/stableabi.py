"""Whether a wheel is what a stable-ABI wheel must be, by two independent tools.

A wheel that serves many cells (builder.plan.builds) is only as good as the claim that its
extensions use nothing but torch's stable C ABI and CPython's limited API; a single unstable
symbol and it crashes or refuses to import under another torch or Python. Two checks, on the
wheel's bytes, before it may enter ``dist/``:

* ``torch-abi-audit --json`` on its extension modules: every one that uses torch must be
  ``stable`` with a ``min_torch_version`` no newer than the declared minimum, and CPython-abi3
  compliant;
* ``abi3audit --strict`` on the wheel: no symbol outside the limited API of the version its
  ``cpXY-abi3`` tag claims.

:func:`stable_report` also serves ``--project`` builds that declared nothing: it says whether the
first wheel already is a stable one (``plan`` and the manifest then say so).
Both tools run with the builder's own interpreter; neither imports torch.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from builder.errors import StepFailed


@dataclass(frozen=True)
class StableReport:
    stable: bool  # every torch-using extension is on the stable ABI and abi3
    min_torch: Optional[str]  # the newest of their minimum torches ("2.10.0")
    modules: tuple[str, ...]  # the extension modules looked at
    problems: tuple[str, ...]  # why not stable, per module


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split(".")[:2])


def _run(args: list[str], what: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StepFailed(
            f"{what} could not run ({exc}); it is a builder dependency "
            "(pip install torch-abi-audit abi3audit)"
        ) from None


def stable_report(wheel: Path) -> StableReport:
    """torch-abi-audit's verdict on the extension modules in *wheel*."""
    with tempfile.TemporaryDirectory(prefix="stable-abi-") as tmp:
        with zipfile.ZipFile(wheel) as zf:
            names = [n for n in zf.namelist() if n.endswith(".so") or ".so." in n]
            for n in names:
                zf.extract(n, tmp)
        if not names:
            return StableReport(False, None, (), ("no extension modules",))
        proc = _run([sys.executable, "-m", "torch_abi_audit.cli", "--json", tmp], "torch-abi-audit")
        try:
            doc = json.loads(proc.stdout)
        except json.JSONDecodeError:
            raise StepFailed(
                f"{wheel.name}: torch-abi-audit gave no JSON (exit {proc.returncode}):"
                f" {(proc.stderr or proc.stdout).strip()[-400:]}"
            ) from None
    problems: list[str] = []
    floors: list[str] = []
    modules: list[str] = []
    for ext in doc.get("extensions") or []:
        name = Path(str(ext.get("path", "?"))).name
        modules.append(name)
        torch, cpython = ext.get("torch") or {}, ext.get("cpython") or {}
        if ext.get("error"):
            problems.append(f"{name}: {ext['error']}")
            continue
        if not torch.get("uses_torch"):
            continue
        if not torch.get("stable"):
            bad = torch.get("unstable_symbols") or []
            problems.append(
                f"{name}: uses {len(bad)} symbol(s) outside torch's stable ABI "
                f"(e.g. {', '.join(map(str, bad[:3]))})"
            )
        elif torch.get("min_torch_version"):
            floors.append(str(torch["min_torch_version"]))
        if not cpython.get("compliant"):
            bad = cpython.get("violations") or []
            problems.append(f"{name}: not abi3 (uses {', '.join(map(str, bad[:3])) or '?'})")
    floor = max(floors, key=_key) if floors else None
    return StableReport(not problems and bool(modules), floor, tuple(modules), tuple(problems))


def check_stable_wheel(wheel: Path, min_torch: str) -> StableReport:
    """Both audits on a wheel that must serve every torch >= *min_torch* ("2.10"); StepFailed
    naming the wheel and each problem otherwise."""
    if "-abi3-" not in wheel.name:
        raise StepFailed(
            f"{wheel.name}: a stable-ABI wheel must be tagged cpXY-abi3 (the "
            "project's build did not use py_limited_api)"
        )
    report = stable_report(wheel)
    problems = list(report.problems)
    if report.min_torch is not None and _key(report.min_torch) > _key(min_torch):
        problems.append(
            f"torch-abi-audit says it needs torch >= {report.min_torch}, newer than "
            f"the declared {min_torch}"
        )
    proc = _run([sys.executable, "-m", "abi3audit", "--strict", str(wheel)], "abi3audit")
    if proc.returncode != 0:
        problems.append("abi3audit --strict: " + (proc.stdout + proc.stderr).strip()[-600:])
    if problems:
        raise StepFailed(
            f"{wheel.name} is not a stable-ABI wheel for torch >= {min_torch}: "
            + "; ".join(problems)
        )
    return report
