"""Helper for test_distributed.py: one rank of a 2-process DDP run on CPU (gloo, env://).

    _ddp_worker.py RANK WORLD_SIZE PORT OPT_LEVELS OUT.json   (OPT_LEVELS: comma-separated)

Trains a small model; at step INJECT_STEP only rank 1 gets an inf in one gradient element after
DDP's all-reduce (so only amp's own overflow agreement can tell rank 0). Writes per-step loss
scales, whether each step changed the parameters, and a final parameter checksum, per level.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import amp

INJECT_STEP = 3
STEPS = 6


def train(level: str, rank: int) -> dict:
    # Each rank starts from other weights: DDP broadcasts rank 0's, and amp's fp32 masters must
    # follow that broadcast identically on every rank.
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(10, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model, optimizer = amp.initialize(model, optimizer, opt_level=level, verbosity=0,
                                      dynamic_init_scale=2.0**8)
    ddp = DistributedDataParallel(model)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    scales, changed = [], []
    for step in range(STEPS):
        x = torch.randn(16, 10, generator=g)
        y = x.sum(dim=1, keepdim=True)
        before = [p.detach().clone() for p in amp.master_params(optimizer)]
        optimizer.zero_grad()
        with amp.scale_loss(F.mse_loss(ddp(x), y), optimizer) as scaled_loss:
            scaled_loss.backward()
            if step == INJECT_STEP and rank == 1:
                model[0].weight.grad[0, 0] = float("inf")
        optimizer.step()
        scales.append(amp.state_dict()["loss_scaler0"]["loss_scale"])
        after = list(amp.master_params(optimizer))
        changed.append(any(not torch.equal(a, b) for a, b in zip(before, after)))
    checksum = [p.detach().double().sum().item() for p in model.parameters()]
    return {"scales": scales, "changed": changed, "checksum": checksum}


def main() -> None:
    rank, world, port, levels, out = sys.argv[1:6]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=rank, WORLD_SIZE=world)
    dist.init_process_group("gloo", init_method="env://")
    results = {level: train(level, int(rank)) for level in levels.split(",")}
    Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
