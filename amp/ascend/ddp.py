"""Apex for Ascend's ``combine_ddp``: data parallelism without DistributedDataParallel, by
all-reducing each optimizer's combined gradient buffers in a few large buckets.

The model is not wrapped: amp broadcasts rank 0's parameters and buffers when
``amp.initialize`` runs (as DistributedDataParallel does when it is constructed), and after
every backward pass the combined model gradients are divided by the world size and summed
over the default process group, bucket by bucket (``ddp_replica_count`` buckets per buffer,
each between 1 Mi and 24 Mi elements as Ascend sizes them), before amp unscales them -- the
order DistributedDataParallel uses, so the averaged gradients are the same.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from types import ModuleType

import torch
from torch import Tensor, nn

from .._device import collective_device

BUCKET_MIN = 1 << 20
BUCKET_MAX = 24 << 20


def _dist() -> ModuleType:  # torch.distributed
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError(
            "combine_ddp=True all-reduces the combined gradients over torch.distributed's "
            "default process group: call torch.distributed.init_process_group(...) before "
            "amp.initialize (and do not wrap the model in DistributedDataParallel)."
        )
    return dist


def buckets(flat: Tensor, replica_count: int) -> list[Tensor]:
    """``flat`` cut into about ``replica_count`` consecutive views, each within Ascend's
    bucket bounds (the last may be smaller)."""
    n = flat.numel()
    size = min(BUCKET_MAX, max(BUCKET_MIN, math.ceil(n / replica_count)))
    return [flat.narrow(0, start, min(size, n - start)) for start in range(0, n, size)]


@torch.no_grad()
def broadcast_from_rank0(models: Iterable[nn.Module]) -> None:
    """Every rank starts from rank 0's parameters and buffers, as DistributedDataParallel."""
    dist = _dist()
    for model in models:
        for tensor in list(model.parameters()) + list(model.buffers()):
            device = collective_device(tensor.device)
            staged = tensor.detach().to(device)
            dist.broadcast(staged, src=0)
            if staged is not tensor:
                tensor.copy_(staged)


@torch.no_grad()
def all_reduce(flats: Sequence[Tensor], replica_count: int) -> None:
    """Average the buffers over the ranks in place, bucket by bucket (asynchronously)."""
    dist = _dist()
    world = dist.get_world_size()
    pending = []
    for flat in flats:
        device = collective_device(flat.device)
        for bucket in buckets(flat, replica_count):
            staged = bucket if device == bucket.device else bucket.to(device)
            staged.div_(world)
            work = dist.all_reduce(staged, async_op=True)
            pending.append((work, staged, bucket))
    for work, staged, bucket in pending:
        work.wait()
        if staged is not bucket:
            bucket.copy_(staged)
