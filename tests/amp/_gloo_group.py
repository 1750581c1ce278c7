"""For the rank helpers (_ddp_worker.py, _combine_ddp_worker.py): the default gloo process
group of one rank, set up and torn down so that none of its threads outlive the rank's work.

Issue #40: a rank that had done its work sometimes aborted at exit ("terminate called without
an active exception", SIGABRT). ``destroy_process_group()`` did not destroy the group: the
ranks' first ``torch.optim`` optimizer (and DistributedDataParallel) make torch import
``torch._dynamo``, which imports ``torch.distributed.nn.functional``, whose ten collectives
take ``group=group.WORLD`` as a default argument -- evaluated at import time, so when the
import comes after ``init_process_group`` each default holds the default ProcessGroup. The
group, with its gloo threads (two ``pt_gloo_runloop`` workers and the ``gloo_tcp_loop``
device loop), then lived on until the interpreter's last garbage collection freed those
functions and ran the group's destructor in the middle of interpreter shutdown, unsynchronised
with the peer rank, which may already have closed its end.

Importing ``torch.distributed.nn`` before any group exists makes those defaults ``None``;
after the barrier, ``destroy_process_group()`` then drops the last reference and the group's
destructor joins its threads right there. ``gloo_group`` checks that it did: a new holder
of the group fails the rank at once, not one exit in ten.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  (before any process group exists: see above)

#: How long the rank lets the group's worker threads run (GIL released) before destroying it.
GIL_FREE_BEFORE_DESTROY_S = 0.05


class GroupOutlivedDestroy(RuntimeError):
    """Something still references the default process group after destroy_process_group."""


@contextmanager
def gloo_group(rank: int, world: int, rendezvous: str) -> Iterator[None]:
    """The default gloo group for the body; on success a barrier (no rank closes its
    connections while a peer is still in its last collective), then the group destroyed
    and checked to be gone. The ranks meet through a file (``file://`` rendezvous)."""
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    group = weakref.ref(dist.group.WORLD)
    try:
        yield
        dist.barrier()
        # Torch < 2.8 destroys the group with the GIL held while joining its worker threads; a
        # worker still dropping an earlier collective's tensors (ones only C++ holds by now)
        # needs the GIL to free them, and the join never returns. The barrier alone left that
        # window open with two ranks (its work ran on the other worker thread: torch 2.1.0, a
        # rank hung in ~ProcessGroupGloo, gdb); a moment with the GIL released closes it.
        time.sleep(GIL_FREE_BEFORE_DESTROY_S)
    finally:
        dist.destroy_process_group()
    # Checked on success only: after a failure the body's own exception is the news.
    if group() is not None:
        raise GroupOutlivedDestroy(
            "the default process group is still referenced after destroy_process_group(); "
            "its gloo threads would be torn down during interpreter shutdown (issue #40)"
        )
