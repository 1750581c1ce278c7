"""``amp.initialize`` first, then ``DistributedDataParallel`` (ModelZoo's order), with combined
gradients: what ``ddp_model.zero_grad()`` costs per training step.

``DistributedDataParallel`` is a new module around the initialized one, so its ``zero_grad``
is torch's own: since torch 2.0 it sets every gradient to None (``set_to_none=True``), which
takes each gradient out of amp's combined buffers. Apex for Ascend patches
``torch.nn.Module.zero_grad`` for every module in the process so that the buffers stay. amp
instead takes the gradients back into their buffers when the next ``scale_loss`` begins
(amp/ascend/combined.py, ``CombinedGrads.reclaim``); before that, it combined them again after
every backward pass.

Per row, over ``--steps`` steady-state steps (after two warm-up steps) of a CPU model of
``--count`` parameters (``--size`` elements each) at O2, in a one-process gloo group:

  recombined   how many times amp combined the buffers again during those steps
  ops/step     ATen operations per step (zero_grad, forward, backward, unscale, step),
               counted at the dispatcher (tests/npu/npu_fused_ops.py's rules: views,
               metadata changes and bare allocations are not operations)
  ms/step      median CPU time of one step, without the counter (``--threads`` torch
               threads, 1 by default: on a shared machine more threads mostly add noise)

    python benchmarks/zero_grad_ddp.py [--count 100] [--size 1024] [--steps 20] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "npu"))  # the op counter

import npu_fused_ops  # noqa: E402

import amp  # noqa: E402
import amp.optimizers as O  # noqa: E402
from amp._amp_state import _amp_state  # noqa: E402

Maker = Callable[[Any], Any]
ROWS: list[tuple[str, Maker, dict[str, Any]]] = [
    (
        "SGD + combine_grad",
        lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9),
        {"combine_grad": True},
    ),
    ("NpuFusedSGD", lambda ps: O.NpuFusedSGD(ps, lr=0.01, momentum=0.9), {}),
    ("NpuFusedAdam", lambda ps: O.NpuFusedAdam(ps, lr=1e-3), {}),
]


def _step(ddp: torch.nn.Module, opt: Any, x: torch.Tensor) -> None:
    ddp.zero_grad()  # torch's Module.zero_grad: set_to_none=True
    with amp.scale_loss(ddp(x), opt) as scaled:
        scaled.backward()
    opt.step()


def _row(
    make: Maker, extra: dict[str, Any], count: int, size: int, steps: int
) -> tuple[int, float, float]:
    _amp_state.opt_properties = None
    _amp_state.loss_scalers = []
    model = npu_fused_ops.ManyParams(count, size)
    opt = make(model.parameters())
    model, opt = amp.initialize(
        model, opt, opt_level="O2", verbosity=0, dynamic_init_scale=2.0**10, **extra
    )
    ddp = DistributedDataParallel(model)
    x = torch.randn(count * size, generator=torch.Generator().manual_seed(1))
    for _ in range(2):
        _step(ddp, opt, x)
    generation = opt._amp_stash.combined.generation
    counter = npu_fused_ops.OpCounter("cpu")
    with counter:
        for _ in range(steps):
            _step(ddp, opt, x)
    recombined = opt._amp_stash.combined.generation - generation
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        _step(ddp, opt, x)
        times.append(time.perf_counter() - start)
    ops = sum(counter.launches.values()) / steps
    return recombined, ops, statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")  # the fused optimizers' one-time notices
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        print(
            f"torch {torch.__version__}, {args.threads} thread(s), {args.count} parameters x "
            f"{args.size}, O2, {args.steps} steps after 2 warm-up steps, "
            "ddp_model.zero_grad() each step"
        )
        print(f"{'optimizer':22} {'recombined':>10} {'ops/step':>9} {'ms/step':>8}")
        for label, make, extra in ROWS:
            recombined, ops, ms = _row(make, extra, args.count, args.size, args.steps)
            print(f"{label:22} {recombined:>10} {ops:>9.0f} {ms:>8.2f}")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
