"""Apex for Ascend's combined tensors: device operations per training step, and CPU step time.

Side by side, at amp O2 (half model, fp32 masters) over a model of N parameters (N = 10, 100,
1000 by default, 4096 elements each):

  torch.optim SGD/Adam      amp's per-parameter path; torch's default implementation on the
                            device (foreach) and its single-tensor one (foreach=False)
  ... + combine_grad        the same optimizers with Ascend's combine_grad=True
  amp FusedSGD/FusedAdam    amp.optimizers' fused path
  NpuFusedSGD/NpuFusedAdam  Ascend's optimizers: gradients, masters and states combined

1. **Device operations launched per step** on the `npu` test device (tests/npu), counted at
   torch's dispatcher with a TorchDispatchMode (tests/npu/npu_fused_ops.py says what counts),
   split into the optimizer-side phases: unscale + overflow check (when scale_loss exits,
   with the loss scaler's update), step (with the copy of the masters into the model),
   zero_grad; plus the host synchronisations (``.item()``) and, as "all calls", every
   dispatcher call of those phases on device tensors (views and metadata changes included).
   Forward and backward are not counted, except that the backward pass's own extra under
   combining is shown: gradients accumulate into the buffers (one ``add_`` per parameter)
   instead of being handed over.
   A ``_foreach_*`` call counts as one operation here; on a real device it is one launch per
   chunk of tensors (CUDA) or per tensor (many torch_npu foreach kernels).
2. **CPU step time**: the same three phases on the CPU, median over ``--repeat`` steps, the
   rows' steps interleaved in rotating order (a shared machine drifts).
3. **50M parameters** (``--big``, 100 tensors of 500k): the CPU step of NpuFused + combine vs
   amp's fused path (FusedAdam / FusedSGD on amp._C's kernels).

    python benchmarks/bench_ascend.py [--counts 10 100 1000] [--size 4096] [--repeat 5]
        [--big 5e7] [--no-big]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "npu"))  # the npu test device and the op counter

import npu_fused_ops  # noqa: E402
from npu_device import install  # noqa: E402

import amp  # noqa: E402
import amp.optimizers as O  # noqa: E402
from amp._amp_state import _amp_state  # noqa: E402

Maker = Callable[[Any], Any]
# (label, optimizer factory, extra initialize keywords)
ROWS: list[tuple[str, Maker, dict[str, Any]]] = [
    ("torch SGD (foreach)", lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9), {}),
    ("torch SGD (single-tensor)",
     lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, foreach=False), {}),
    ("torch SGD + combine_grad",
     lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9), {"combine_grad": True}),
    ("amp FusedSGD", lambda ps: O.FusedSGD(ps, lr=0.01, momentum=0.9), {}),
    ("NpuFusedSGD (combined)", lambda ps: O.NpuFusedSGD(ps, lr=0.01, momentum=0.9), {}),
    ("torch Adam (foreach)", lambda ps: torch.optim.Adam(ps, lr=1e-3), {}),
    ("torch Adam (single-tensor)", lambda ps: torch.optim.Adam(ps, lr=1e-3, foreach=False), {}),
    ("torch Adam + combine_grad",
     lambda ps: torch.optim.Adam(ps, lr=1e-3), {"combine_grad": True}),
    ("amp FusedAdam", lambda ps: O.FusedAdam(ps, lr=1e-3), {}),
    ("NpuFusedAdam (combined)", lambda ps: O.NpuFusedAdam(ps, lr=1e-3), {}),
]
INIT = {"opt_level": "O2", "dynamic_init_scale": 2.0**10}


def _reset() -> None:
    _amp_state.opt_properties = None
    _amp_state.loss_scalers = []


def count(make: Maker, n: int, size: int, extra: dict[str, Any]) -> npu_fused_ops.OpCounter:
    _reset()
    return npu_fused_ops.count_step(make, n, size, "npu", **INIT, **extra)


def prepare(make: Maker, n: int, size: int, extra: dict[str, Any]
            ) -> Callable[[], list[float]]:
    """A model and optimizer under amp, two steps taken (combining, states); returns a
    function that takes one more step and gives the seconds of each optimizer-side phase."""
    model = npu_fused_ops.ManyParams(n, size)
    opt = make(model.parameters())
    # Every row shares amp's process-wide properties (O2, the same scaler settings); only
    # combine_grad differs, and amp reads it per optimizer.
    model, opt = amp.initialize(model, opt, verbosity=0, **INIT, **extra)
    x = torch.randn(n * size, generator=torch.Generator().manual_seed(1))

    def one() -> list[float]:
        loss = model(x)
        cm = amp.scale_loss(loss, opt)
        cm.__enter__().backward()
        marks = [time.perf_counter()]
        cm.__exit__(None, None, None)
        marks.append(time.perf_counter())
        opt.step()
        marks.append(time.perf_counter())
        opt.zero_grad()
        marks.append(time.perf_counter())
        return [b - a for a, b in zip(marks, marks[1:])]

    one()
    one()
    return one


def time_rows(rows: list[tuple[str, Maker, dict[str, Any]]], n: int, size: int, repeat: int
              ) -> dict[str, list[float]]:
    """Median seconds per phase (and their sum) of each row, the rows interleaved step by
    step in rotating order, so that a shared machine's drift hits them alike."""
    _reset()
    steps = {label: prepare(make, n, size, extra) for label, make, extra in rows}
    times: dict[str, list[list[float]]] = {label: [] for label in steps}
    labels = list(steps)
    for r in range(repeat):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            times[label].append(steps[label]())
    out = {}
    for label, samples in times.items():
        phases = [statistics.median(s[i] for s in samples) for i in range(3)]
        out[label] = phases + [statistics.median(sum(s) for s in samples)]
    return out


def _print_times(rows: list[tuple[str, Maker, dict[str, Any]]], n: int, size: int,
                 repeat: int) -> None:
    for label, t in time_rows(rows, n, size, repeat).items():
        print(f"{label:28} {n:>6} {_ms(t[0]):>11} {_ms(t[1])} {_ms(t[2]):>9} {_ms(t[3])}")


def _ms(s: float) -> str:
    return f"{s * 1e3:8.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--counts", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--size", type=int, default=4096, help="elements per parameter")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--big", type=float, default=5e7, help="elements for the big CPU step")
    ap.add_argument("--no-big", action="store_true")
    ap.add_argument("--explain", action="store_true",
                    help="list the operations of each phase for the combined rows")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")  # amp's device-fallback notice for amp.optimizers on npu
    install()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load {os.getloadavg()[0]:.2f}; amp O2, {args.size} elements per parameter")
    print("\nDevice operations per step on `npu` (launches; syncs = .item() reads)")
    header = (f"{'optimizer':28} {'params':>6} {'unscale+chk':>11} {'step':>6} {'zero_grad':>9}"
              f" {'total':>6} {'syncs':>5} {'bwd extra':>9} {'all calls':>9}")
    print(header)
    print("-" * len(header))
    plain_backward: dict[int, int] = {}
    for label, make, extra in ROWS:
        for n in args.counts:
            c = count(make, n, args.size, extra)
            phases = [c.launches[p] for p in npu_fused_ops.PHASES]
            other = c.launches["other"]
            plain_backward.setdefault(n, other)
            print(f"{label:28} {n:>6} {phases[0]:>11} {phases[1]:>6} {phases[2]:>9} "
                  f"{sum(phases):>6} {sum(c.syncs.values()):>5} "
                  f"{other - plain_backward[n]:>9} "
                  f"{sum(c.calls[p] for p in npu_fused_ops.PHASES):>9}")
            if args.explain and ("combine" in label or "Npu" in label) and n == args.counts[0]:
                for phase in npu_fused_ops.PHASES:
                    print(f"{'':30}{phase}: {dict(c.names[phase])}")
    print("\nCPU time per step, optimizer-side phases (ms, median of "
          f"{args.repeat}, interleaved)")
    header = f"{'optimizer':28} {'params':>6} {'unscale+chk':>11} {'step':>8} {'zero_grad':>9}" \
             f" {'total':>8}"
    print(header)
    print("-" * len(header))
    for n in args.counts:
        _print_times(ROWS, n, args.size, args.repeat)
    if not args.no_big:
        n, size = 100, int(args.big) // 100
        print(f"\nCPU time per step at {n * size / 1e6:.0f}M parameters ({n} x {size}), "
              f"ms, median of {args.repeat}")
        print(header)
        print("-" * len(header))
        fused = [row for row in ROWS if "Fused" in row[0]]
        for pair in (fused[:2], fused[2:]):  # SGD, then Adam: two models in memory at once
            _print_times(pair, n, size, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
