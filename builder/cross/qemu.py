"""Run a cross-built wheel on its target CPU: the target CPython under QEMU user emulation.

``qemu-aarch64 -L <sysroot> <sysroot>/usr/bin/python3.X`` with ``PYTHONPATH`` = the wheel's
install folder + the target torch's site-packages. Nothing is installed into the sysroot or the
cached torch site; each verification installs the wheel into its own scratch folder.

Cost (2 shared cores): the interpreter starts in ~1-2 s, ``import torch`` 2.9.1 takes ~30-45 s
of CPU under emulation (libtorch_cpu relocation + torch's Python), so callers should run all
their checks in one process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import parse_wheel_filename

from builder.cross.sysroot import TargetPython
from builder.cross.target_torch import TargetTorch
from builder.cross.toolchain import find_qemu
from builder.errors import StepFailed


@dataclass(frozen=True)
class QemuRun:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def run_target_python(python: TargetPython, args: Sequence[str], *,
                      pythonpath: Sequence[Path] = (), cwd: Path | None = None,
                      timeout: float = 900, env: dict[str, str] | None = None) -> QemuRun:
    """Run the target interpreter with ``args`` under QEMU and capture its output."""
    qemu = find_qemu(python.arch)
    run_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "LANG": "C.UTF-8",
        "PYTHONPATH": os.pathsep.join(str(p) for p in pythonpath),
        "PYTHONNOUSERSITE": "1",
        # Two threads, like the CI machine: emulated OpenMP threads are real host threads.
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
    }
    run_env.update(env or {})
    cmd = [str(qemu), "-L", str(python.sysroot), str(python.executable), *args]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=run_env,
                              cwd=cwd or tempfile.gettempdir(), timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise StepFailed(f"{python.arch} Python under QEMU did not finish in {timeout:.0f} s: "
                         f"{' '.join(args)[:200]}") from exc
    return QemuRun(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - start)


def install_for_target(wheel: Path, dest: Path, python: TargetPython) -> Path:
    """Install ``wheel`` (no dependencies) into ``dest`` for the target, with the host's pip.

    pip checks the wheel's tags against the target platform, so a misnamed wheel fails here.
    """
    _, _, _, tags = parse_wheel_filename(wheel.name)
    plats = sorted({t.platform for t in tags})
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile",
           "--target", str(dest), "--only-binary=:all:", "--python-version", python.version,
           "--implementation", "cp", "--abi", python.python_tag]
    for plat in plats:
        cmd += ["--platform", plat]
    run = subprocess.run([*cmd, str(wheel)], capture_output=True, text=True)
    if run.returncode != 0:
        raise StepFailed(f"installing {wheel.name} for {python.python_tag} {plats} failed:\n"
                         f"{run.stderr[-2000:]}")
    return dest


def run_wheel_under_qemu(wheel: Path, python: TargetPython, torch: TargetTorch, script: str,
                         *, timeout: float = 900) -> QemuRun:
    """Install ``wheel`` into a scratch folder and run ``script`` with it on the target.

    Raises :class:`StepFailed` (with the script's output) when the script exits non-zero.
    """
    with tempfile.TemporaryDirectory(prefix="ampforge-qemu-") as tmp:
        site = install_for_target(wheel, Path(tmp) / "site", python)
        # Run from an empty folder so the wheel, never a source tree, is imported.
        result = run_target_python(python, ["-c", script], pythonpath=[site, torch.site],
                                   cwd=Path(tmp), timeout=timeout)
    if result.returncode != 0:
        raise StepFailed(
            f"verification of {wheel.name} under qemu-{python.arch} failed (exit "
            f"{result.returncode}):\n{result.stdout[-1500:]}\n{result.stderr[-3000:]}"
        )
    return result


#: The quick-start check for this project's wheel: amp._C must load on the target, a few steps
#: of the quick-start loop with FusedAdam must train, and the compiled kernels must agree with
#: amp's pure-torch reference path on the same steps. Prints one "AMP-VERIFY {json}" line.
AMP_VERIFY_SCRIPT = r"""
import json, os, time
t0 = time.time()
import torch
t_torch = time.time() - t0
import amp
import amp.optimizers
from amp import _ext
if not _ext.available():
    raise SystemExit("amp._C is in the wheel but unusable with torch " + torch.__version__)
import amp._C  # noqa: F401  (explicit: the module itself must import)

def run(steps=5):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = amp.optimizers.FusedAdam(model.parameters(), lr=1e-2, weight_decay=0.01)
    model, opt = amp.initialize(model, opt, opt_level="O1", verbosity=0)
    x = torch.randn(64, 16)
    y = x[:, :1] * 2.0 + 0.5
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        with amp.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
        losses.append(float(loss))
    return losses, [p.detach().clone() for p in model.parameters()]

t1 = time.time()
losses, fused = run()
os.environ["AMP_DISABLE_EXTENSION"] = "1"
_ext.reset()
import warnings
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    ref_losses, ref = run()
diff = max(float((a - b).abs().max()) for a, b in zip(fused, ref))
ok = all(l == l for l in losses) and losses[-1] < losses[0] and diff < 1e-5
print("AMP-VERIFY " + json.dumps({"torch": torch.__version__, "losses": losses,
      "max_abs_diff_vs_reference": diff, "import_torch_s": t_torch,
      "steps_s": time.time() - t1, "ok": ok}))
raise SystemExit(0 if ok else 1)
"""


def verify_amp_wheel(wheel: Path, python: TargetPython, torch: TargetTorch,
                     timeout: float = 900) -> dict:
    """Run :data:`AMP_VERIFY_SCRIPT` for ``wheel`` under QEMU; return its report dict."""
    import json

    result = run_wheel_under_qemu(wheel, python, torch, AMP_VERIFY_SCRIPT, timeout=timeout)
    for line in result.stdout.splitlines():
        if line.startswith("AMP-VERIFY "):
            report = json.loads(line[len("AMP-VERIFY "):])
            report["qemu_wall_s"] = result.seconds
            return report
    raise StepFailed(f"verification of {wheel.name}: no report line in output:\n"
                     f"{result.stdout[-1500:]}")


def extension_modules(wheel: Path) -> list[str]:
    """Dotted names of the compiled modules in ``wheel`` (grafted libraries excluded)."""
    import zipfile

    names = []
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.endswith(".so") and ".libs/" not in name and "/" in name:
                names.append(name[: -len(".so")].split(".")[0].replace("/", "."))
    return sorted(set(names))


def verify_wheel(wheel: Path, python: TargetPython, torch: TargetTorch,
                 timeout: float = 900) -> dict:
    """Verify any cross-built torch-extension wheel on the emulated target.

    This project's wheel (it has ``amp._C``) gets :data:`AMP_VERIFY_SCRIPT`; any other project
    (``--project PATH``) gets an import of torch and every compiled module it ships.
    """
    import json

    modules = extension_modules(wheel)
    if "amp._C" in modules:
        return verify_amp_wheel(wheel, python, torch, timeout)
    script = ("import json, torch\n" + "".join(f"import {m}\n" for m in modules)
              + f"print('IMPORT-VERIFY ' + json.dumps({{'modules': {modules!r}, 'ok': True}}))\n")
    result = run_wheel_under_qemu(wheel, python, torch, script, timeout=timeout)
    report = json.loads(result.stdout.split("IMPORT-VERIFY ", 1)[1].splitlines()[0])
    report["qemu_wall_s"] = result.seconds
    return report
