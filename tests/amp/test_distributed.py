"""Under DDP (gloo, CPU processes) an overflow seen on one rank only makes every rank skip the
same step and back off to the same scale."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.distributed as dist
from amp_testlib import GLOO_TAKES_NO_NPU, needs_cpu_float16, run_ranks

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(),
    reason="this torch build has no torch.distributed gloo backend",
)

LEVELS = ["O1", "O2"]
WORKER = Path(__file__).parent / "_ddp_worker.py"


def _run_ranks(tmp_path: Path, world: int, steps: int, inject: list[int]) -> list[dict]:
    return run_ranks(
        tmp_path,
        world,
        WORKER,
        lambda rank: [
            ",".join(LEVELS),
            str(tmp_path / f"rank{rank}.json"),
            str(steps),
            ",".join(map(str, inject)),
        ],
    )


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


@needs_cpu_float16(GLOO_TAKES_NO_NPU)
def test_overflow_on_one_rank_skips_on_every_rank(tmp_path: Path) -> None:
    steps, inject = 6, [3]
    _check(_run_ranks(tmp_path, world=2, steps=steps, inject=inject), steps, inject)


@pytest.mark.slow
@needs_cpu_float16(GLOO_TAKES_NO_NPU)
def test_overflow_agreement_stress_three_ranks(tmp_path: Path) -> None:
    """More steps, several injected overflows, three ranks, both opt levels: a teardown or
    agreement race shows up here before it shows up in the two-rank test."""
    steps, inject = 40, [3, 4, 17, 31]
    _check(_run_ranks(tmp_path, world=3, steps=steps, inject=inject), steps, inject)


@needs_cpu_float16(GLOO_TAKES_NO_NPU)
def test_combine_ddp_averages_like_distributed_data_parallel(tmp_path: Path) -> None:
    """Ascend's combine_ddp (bucketed all-reduce of the combined gradients, no DDP wrapper)
    against DistributedDataParallel itself: the same parameters, bit for bit, on both ranks."""
    worker = Path(__file__).parent / "_combine_ddp_worker.py"
    ranks = run_ranks(
        tmp_path, 2, worker, lambda rank: [",".join(LEVELS), str(tmp_path / f"rank{rank}.json")]
    )
    for level in LEVELS:
        for rank in ranks:
            assert rank[level]["combine_ddp"] == rank[level]["ddp"], level
        assert ranks[0][level] == ranks[1][level], level
