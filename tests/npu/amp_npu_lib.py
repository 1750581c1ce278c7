"""Helpers for the amp-on-npu tests: apex's quick-start loop (``nn.Linear(10, 1)``, SGD, MSE)
run on a given device, recording what the comparison against the CPU needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from amp_state import reset_amp as reset_amp  # the one reset (tests/amp_state.py)

import amp
from amp._amp_state import _amp_state

CPU = torch.device("cpu")


def data(n: int = 32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g)
    return x, x @ torch.randn(10, 1, generator=g) + 0.5


@dataclass
class Run:
    model: torch.nn.Module
    optimizer: Any
    losses: list[float] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)
    inner_dtypes: list[torch.dtype] = field(default_factory=list)  # the Linear's output dtype

    def params(self) -> list[torch.Tensor]:
        return [p.detach().cpu() for p in self.model.parameters()]

    def masters(self) -> list[torch.Tensor]:
        return [p.detach().cpu() for p in amp.master_params(self.optimizer)]


def quickstart(
    device: torch.device,
    opt_level: str,
    half: torch.dtype,
    steps: int = 5,
    inject_inf_at: Optional[int] = None,
    make_opt: Optional[Callable[[Any], Any]] = None,
    **init_kw: Any,
) -> Run:
    """apex's quick start on ``device``: the model is moved there before amp.initialize, the
    data at every step. ``inject_inf_at``: a step whose weight gradient gets an inf after
    backward (inside scale_loss, where a real overflow would appear)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(10, 1).to(device)
    inner_dtypes: list[torch.dtype] = []

    def forward(x: torch.Tensor) -> torch.Tensor:
        # The Linear's own forward, seen from inside amp's wrapper (which may cast the output).
        out = torch.nn.Linear.forward(model, x)
        inner_dtypes.append(out.dtype)
        return out

    model.forward = forward  # type: ignore[method-assign]
    optimizer = (make_opt or (lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)))(
        model.parameters()
    )
    model, optimizer = amp.initialize(
        model, optimizer, opt_level=opt_level, half_dtype=half, verbosity=0, **init_kw
    )
    run = Run(model, optimizer, inner_dtypes=inner_dtypes)
    x, y = data()
    for step in range(steps):
        loss = F.mse_loss(model(x.to(device)), y.to(device))
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
            if step == inject_inf_at:
                model.weight.grad[0, 0] = float("inf")
        optimizer.step()
        run.losses.append(float(loss.detach()))
        run.scales.append(_amp_state.loss_scalers[0].loss_scale())
    return run


def snapshot(run: Run) -> dict[str, Any]:
    """Everything a resumed run needs, through torch.save (as a checkpoint file would)."""
    import io  # noqa: PLC0415

    buf = io.BytesIO()
    torch.save(
        {
            "model": run.model.state_dict(),
            "optimizer": run.optimizer.state_dict(),
            "amp": amp.state_dict(),
        },
        buf,
    )
    buf.seek(0)
    return torch.load(buf)
