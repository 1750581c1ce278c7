"""Under DDP (gloo, 2 CPU processes) an overflow seen on one rank only makes every rank skip the
same step and back off to the same scale."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist
from amp_testlib import REPO_ROOT

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(),
    reason="this torch build has no torch.distributed gloo backend",
)


LEVELS = ["O1", "O2"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_overflow_on_one_rank_skips_on_every_rank(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    port = str(_free_port())
    worker = Path(__file__).parent / "_ddp_worker.py"
    procs = [
        subprocess.Popen(
            [sys.executable, str(worker), str(rank), "2", port, ",".join(LEVELS),
             str(tmp_path / f"rank{rank}.json")],
            env=env, cwd=str(REPO_ROOT), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=180)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    for proc, output in zip(procs, outputs):
        assert proc.returncode == 0, output
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]

    inject_step = 3
    for level in LEVELS:
        r0, r1 = (r[level] for r in ranks)
        for result in (r0, r1):
            # Rank 0's own gradients were finite, yet it skipped the same step as rank 1.
            assert result["changed"] == [i != inject_step for i in range(6)], level
            assert result["scales"][inject_step] == result["scales"][inject_step - 1] / 2
        assert r0["scales"] == r1["scales"]
        assert r0["checksum"] == r1["checksum"]  # the replicas stayed identical
