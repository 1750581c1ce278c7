"""Helper for test_distributed.py: one rank of a DDP run on CPU (gloo).

    _ddp_worker.py RANK WORLD_SIZE RENDEZVOUS_FILE OPT_LEVELS OUT.json [STEPS [INJECT_STEPS]]

OPT_LEVELS and INJECT_STEPS are comma-separated. The ranks meet through a file
(``file://`` rendezvous), so no TCP port is chosen ahead of time: a port picked free by the
test and bound later by rank 0 could be taken in between by anything else on the machine.

Trains a small model; at each step of INJECT_STEPS only the last rank gets an inf in one
gradient element after DDP's all-reduce (so only amp's own overflow agreement can tell the
other ranks). Writes per-step loss scales, whether each step changed the parameters, and a
final parameter checksum, per level.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from _gloo_group import gloo_group
from torch.nn.parallel import DistributedDataParallel

import amp

STEPS = 6
INJECT_STEPS = (3,)


def train(level: str, rank: int, world: int, steps: int, inject: tuple[int, ...]) -> dict:
    # Each rank starts from other weights: DDP broadcasts rank 0's, and amp's fp32 masters must
    # follow that broadcast identically on every rank.
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(10, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model, optimizer = amp.initialize(
        model, optimizer, opt_level=level, verbosity=0, dynamic_init_scale=2.0**8
    )
    ddp = DistributedDataParallel(model)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    scales, changed = [], []
    for step in range(steps):
        x = torch.randn(16, 10, generator=g)
        y = x.sum(dim=1, keepdim=True)
        before = [p.detach().clone() for p in amp.master_params(optimizer)]
        optimizer.zero_grad()
        with amp.scale_loss(F.mse_loss(ddp(x), y), optimizer) as scaled_loss:
            scaled_loss.backward()
            if step in inject and rank == world - 1:
                model[0].weight.grad[0, 0] = float("inf")
        optimizer.step()
        scales.append(amp.state_dict()["loss_scaler0"]["loss_scale"])
        after = list(amp.master_params(optimizer))
        changed.append(any(not torch.equal(a, b) for a, b in zip(before, after)))
    checksum = [p.detach().double().sum().item() for p in model.parameters()]
    return {"scales": scales, "changed": changed, "checksum": checksum}


def main() -> None:
    rank, world, rendezvous, levels, out = sys.argv[1:6]
    steps = int(sys.argv[6]) if len(sys.argv) > 6 else STEPS
    inject = tuple(int(s) for s in sys.argv[7].split(",")) if len(sys.argv) > 7 else INJECT_STEPS
    # The group is gone, its threads joined, before this rank exits (_gloo_group.py, #40).
    with gloo_group(int(rank), int(world), rendezvous):
        results = {
            level: train(level, int(rank), int(world), steps, inject) for level in levels.split(",")
        }
        Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
