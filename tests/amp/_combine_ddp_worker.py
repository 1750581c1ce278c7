"""Helper for test_distributed.py: one rank of a combine_ddp run against a DDP run (gloo, CPU).

    _combine_ddp_worker.py RANK WORLD_SIZE RENDEZVOUS_FILE OPT_LEVELS OUT.json

For each opt level, trains the same model twice from this rank's own initial weights and
data: wrapped in DistributedDataParallel (amp without combining), and unwrapped with
amp.initialize(..., combine_grad=True, combine_ddp=True, ddp_replica_count=3). Writes both
runs' final parameters and loss scales.
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

STEPS = 5


def train(level: str, rank: int, combine: bool) -> dict:
    torch.manual_seed(rank)  # different weights per rank: both ways start from rank 0's
    model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model, optimizer = amp.initialize(
        model,
        optimizer,
        opt_level=level,
        verbosity=0,
        dynamic_init_scale=2.0**8,
        combine_grad=combine or None,
        combine_ddp=combine or None,
        ddp_replica_count=3,
    )
    net = model if combine else DistributedDataParallel(model)
    g = torch.Generator().manual_seed(100 + rank)
    scales = []
    for _ in range(STEPS):
        x = torch.randn(16, 10, generator=g)
        optimizer.zero_grad()
        with amp.scale_loss(F.mse_loss(net(x).float(), x.sum(1, keepdim=True)), optimizer) as s:
            s.backward()
        optimizer.step()
        scales.append(amp.state_dict()["loss_scaler0"]["loss_scale"])
    return {
        "params": [p.detach().double().flatten().tolist() for p in model.parameters()],
        "scales": scales,
    }


def main() -> None:
    rank, world, rendezvous, levels, out = sys.argv[1:6]
    # The group is gone, its threads joined, before this rank exits (_gloo_group.py, #40).
    with gloo_group(int(rank), int(world), rendezvous):
        results = {
            level: {
                "ddp": train(level, int(rank), False),
                "combine_ddp": train(level, int(rank), True),
            }
            for level in levels.split(",")
        }
        Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
