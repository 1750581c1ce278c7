"""Helpers for the amp tests: the apex quick-start model and data, and running a helper script
in a fresh Python process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from amp import _torch_compat as compat

REPO_ROOT = Path(__file__).resolve().parents[2]


def cpu_has_float16() -> bool:
    """Whether this torch's CPU has float16 matmul and autocast (torch 2.1's has neither)."""
    return compat.half_matmul_supported("cpu") and compat.autocast_supports("cpu", torch.float16)


def needs_cpu_float16(why_not_on_npu: str) -> pytest.MarkDecorator:
    """For tests that train in float16 on the CPU and cannot run on the npu test device instead
    (the ``half_device`` marker's way, tests/conftest.py), for the reason given: skipped, saying
    both, on a torch whose CPU has no float16."""
    return pytest.mark.skipif(
        not cpu_has_float16(),
        reason=f"torch {torch.__version__}'s CPU has no float16 matmul/autocast, which this test "
        f"trains in; not on the npu test device either: {why_not_on_npu}",
    )


#: Why the tests that train under DistributedDataParallel over gloo stay on the CPU.
GLOO_TAKES_NO_NPU = (
    "DistributedDataParallel all-reduces over gloo, which takes no npu tensors "
    "(the npu test device has no collective backend)"
)


def default_device() -> torch.device:
    """torch's default device in this test: the CPU, or the npu test device for a half_device
    test on a torch whose CPU has no float16 (tests/conftest.py)."""
    return torch.empty(0).device


def make_data(n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g)
    w = torch.randn(10, 1, generator=g)
    return x, x @ w + 0.5


def quickstart_model(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(10, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def run_script(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run tests/amp/<script> in a fresh interpreter with the checkout importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).parent / script), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=str(REPO_ROOT),
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def run_ranks(
    tmp_path: Path, world: int, worker: Path, args_for_rank: Callable[[int], list[str]]
) -> list[dict]:
    """Start *world* processes of ``worker RANK WORLD RENDEZVOUS ARGS...`` (gloo, CPU), wait
    for all of them, return each rank's results: the JSON file named by its second ARG.

    The ranks meet through a file (``file://`` rendezvous), so no TCP port is chosen ahead
    of time. A failure message carries each rank's command line and output: enough to rerun
    it by hand."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    rendezvous = tmp_path / "rendezvous"
    argvs = [
        [sys.executable, str(worker), str(rank), str(world), str(rendezvous), *args_for_rank(rank)]
        for rank in range(world)
    ]
    procs = [
        subprocess.Popen(
            argv,
            env=env,
            cwd=str(REPO_ROOT),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for argv in argvs
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=300)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for argv, proc, output in zip(argvs, procs, outputs):
        assert proc.returncode == 0, (
            f"rank exited {proc.returncode}; rerun with OMP_NUM_THREADS=1 "
            f"PYTHONPATH={REPO_ROOT} {' '.join(argv)}\n{output}"
        )
    return [json.loads(Path(argv[6]).read_text()) for argv in argvs]
