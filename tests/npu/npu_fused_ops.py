"""Device operations per training step, counted at torch's dispatcher (a TorchDispatchMode):
the number Apex for Ascend's combined tensors exist to cut, independent of the machine's
speed. Used by tests/npu/test_npu_fused_on_npu.py and by benchmarks/bench_ascend.py (which
imports this folder by path).

What counts as a launch: an ATen operation that touches a tensor on the counted device,
except views and metadata changes (no kernel: ``view``, ``narrow``, ``set_``, ``detach``,
...) and bare allocations (``empty*``). Reading a value to the host
(``_local_scalar_dense``, i.e. ``.item()``) is counted apart, as a synchronisation."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from typing import Any, Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten
NO_KERNEL = {
    aten.detach.default,
    aten.alias.default,
    aten.lift_fresh.default,
    aten.set_.source_Storage_storage_offset,
    aten.set_.source_Storage,
    aten.set_.source_Tensor,
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.empty_like.default,
    aten._reshape_alias.default,
    aten.resize_.default,
}
SYNC = aten._local_scalar_dense.default


class OpCounter(TorchDispatchMode):
    """Counts launches on ``device_type`` per phase (``with counter.phase("step"): ...``)."""

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type = device_type
        self.current = "other"
        self.launches: collections.Counter[str] = collections.Counter()
        self.syncs: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()  # views etc. included
        self.names: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        previous, self.current = self.current, name
        try:
            yield
        finally:
            self.current = previous

    def _on_device(self, *trees: Any) -> bool:
        for tree in trees:
            for leaf in tree_flatten(tree)[0]:
                if isinstance(leaf, torch.Tensor) and leaf.device.type == self.device_type:
                    return True
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if not self._on_device(args, kwargs, out):
            return out
        self.calls[self.current] += 1
        if func in NO_KERNEL or func.is_view:
            return out
        if func is SYNC:
            self.syncs[self.current] += 1
        else:
            self.launches[self.current] += 1
            self.names[self.current][str(func.overloadpacket.__name__)] += 1
        return out


class ManyParams(nn.Module):
    """``count`` parameters of ``size`` elements each; the loss touches every one."""

    def __init__(self, count: int, size: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.ps = nn.ParameterList(
            nn.Parameter(torch.randn(size, generator=g) * 0.1) for _ in range(count)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = torch.cat([p.reshape(-1) for p in self.ps])
        return (flat.float() * x).square().sum()


PHASES = ("unscale+check", "step", "zero_grad")


def training_step(
    model: nn.Module, opt: Any, x: torch.Tensor, counter: OpCounter | None = None
) -> None:
    """One amp training step; with ``counter``, the optimizer-side phases are counted
    (forward, backward and the loss scaling itself are not: they are the same everywhere)."""
    import amp  # noqa: PLC0415

    def counted(name: str) -> contextlib.AbstractContextManager:
        return counter.phase(name) if counter is not None else contextlib.nullcontext()

    loss = model(x)
    cm = amp.scale_loss(loss, opt)
    scaled = cm.__enter__()
    scaled.backward()
    with counted("unscale+check"):
        cm.__exit__(None, None, None)
    with counted("step"):
        opt.step()
    with counted("zero_grad"):
        opt.zero_grad()


def count_step(
    make_opt: Callable[[Any], Any],
    count: int,
    size: int,
    device: Any,
    warmup: int = 2,
    **init_kw: Any,
) -> OpCounter:
    """The launches of one steady-state step (after ``warmup`` steps: the first ones
    combine buffers and create states)."""
    import amp  # noqa: PLC0415

    model = ManyParams(count, size).to(device)
    opt = make_opt(model.parameters())
    model, opt = amp.initialize(model, opt, verbosity=0, **init_kw)
    x = torch.randn(count * size, generator=torch.Generator().manual_seed(1)).to(device)
    for _ in range(warmup):
        training_step(model, opt, x)
    counter = OpCounter(torch.device(device).type)
    with counter:
        training_step(model, opt, x, counter)
    return counter
