"""Under DDP (gloo, CPU processes) an overflow seen on one rank only makes every rank skip the
same step and back off to the same scale."""
from __future__ import annotations

import json
import os
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
WORKER = Path(__file__).parent / "_ddp_worker.py"


def _run_ranks(tmp_path: Path, world: int, steps: int, inject: list[int]) -> list[dict]:
    """Start *world* worker processes, wait for all of them, return each rank's results.

    A failure message carries each rank's command line and output: enough to rerun it by hand.
    """
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    rendezvous = tmp_path / "rendezvous"  # file:// init: no port to race for
    argvs = [
        [sys.executable, str(WORKER), str(rank), str(world), str(rendezvous), ",".join(LEVELS),
         str(tmp_path / f"rank{rank}.json"), str(steps), ",".join(map(str, inject))]
        for rank in range(world)
    ]
    procs = [
        subprocess.Popen(argv, env=env, cwd=str(REPO_ROOT), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
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
            f"PYTHONPATH={REPO_ROOT} {' '.join(argv)}\n{output}")
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]


def _check(ranks: list[dict], steps: int, inject: list[int]) -> None:
    for level in LEVELS:
        per_rank = [r[level] for r in ranks]
        for result in per_rank:
            # Only the last rank saw the inf, yet every rank skipped the same steps...
            assert result["changed"] == [i not in inject for i in range(steps)], level
            for i in inject:
                # ... and backed off from the same scale.
                assert result["scales"][i] == result["scales"][i - 1] / 2, (level, i)
        first = per_rank[0]
        for other in per_rank[1:]:
            assert other["scales"] == first["scales"], level
            assert other["checksum"] == first["checksum"], level  # replicas stayed identical


def test_overflow_on_one_rank_skips_on_every_rank(tmp_path: Path) -> None:
    steps, inject = 6, [3]
    _check(_run_ranks(tmp_path, world=2, steps=steps, inject=inject), steps, inject)


@pytest.mark.slow
def test_overflow_agreement_stress_three_ranks(tmp_path: Path) -> None:
    """More steps, several injected overflows, three ranks, both opt levels: a teardown or
    agreement race shows up here before it shows up in the two-rank test."""
    steps, inject = 40, [3, 4, 17, 31]
    _check(_run_ranks(tmp_path, world=3, steps=steps, inject=inject), steps, inject)
