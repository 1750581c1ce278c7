"""Helpers for the amp tests: the apex quick-start model and data, and running a helper script
in a fresh Python process."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]


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
        capture_output=True, text=True, env=env, timeout=timeout, cwd=str(REPO_ROOT),
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc
