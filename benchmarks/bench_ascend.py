"""Apex for Ascend's combined tensors: device operations per training step, and CPU step time.

Side by side, at amp O2 (half model, fp32 masters) over a model of N parameters (N = 10, 100,
1000 by default, 10k elements each):

  torch.optim SGD/Adam      amp's per-parameter path; torch's default implementation on the
                            device (foreach) and its single-tensor one (foreach=False)
  ... + combine_grad        the same optimizers with Ascend's combine_grad=True
  amp FusedSGD/FusedAdam    amp.optimizers' fused path
  NpuFusedSGD/NpuFusedAdam  Ascend's optimizers: gradients, masters and states combined
                            (SGD: amp's one-pass kernel where it is bit-equal, the default;
                            "torch ops": one_pass=False; Adam: torch's ops, the bit-equal
                            default; "one-pass": one_pass=True, amp's kernel)

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
   rows' steps interleaved in rotating order (a shared machine drifts; SGD's rows in one
   run, Adam's in another, so that fewer models are in memory at once), with the spread; and
   each amp and NpuFused row against torch's best row of the same optimizer (the median of
   per-round ratios), checked at 1000 parameters against the target of 1.5x (set at 10k
   elements per parameter, the default size).
3. **50M parameters** (``--big``, 100 tensors of 500k): the CPU step of NpuFused + combine vs
   amp's fused path (FusedAdam / FusedSGD on amp._C's kernels).

    python benchmarks/bench_ascend.py [--counts 10 100 1000] [--size 10000] [--repeat 7]
        [--big 5e7] [--no-big] [--explain] [--json FILE|-]

Every time is printed with its spread over the steps (benchmarks/benchstats.py), in
parentheses when the spread or the machine's load makes it unreliable.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "npu"))  # the npu test device and the op counter

import benchstats as stats  # noqa: E402  (beside this file)
import npu_fused_ops  # noqa: E402
from npu_device import install  # noqa: E402

import amp  # noqa: E402
import amp.optimizers as O  # noqa: E402
from amp._amp_state import _amp_state  # noqa: E402

Maker = Callable[[Any], Any]
# (label, optimizer factory, extra initialize keywords)
ROWS: list[tuple[str, Maker, dict[str, Any]]] = [
    ("torch SGD (foreach)", lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9), {}),
    (
        "torch SGD (single-tensor)",
        lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, foreach=False),
        {},
    ),
    (
        "torch SGD + combine_grad",
        lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9),
        {"combine_grad": True},
    ),
    ("amp FusedSGD", lambda ps: O.FusedSGD(ps, lr=0.01, momentum=0.9), {}),
    ("NpuFusedSGD (combined)", lambda ps: O.NpuFusedSGD(ps, lr=0.01, momentum=0.9), {}),
    (
        "NpuFusedSGD (torch ops)",
        lambda ps: O.NpuFusedSGD(ps, lr=0.01, momentum=0.9, one_pass=False),
        {},
    ),
    ("torch Adam (foreach)", lambda ps: torch.optim.Adam(ps, lr=1e-3), {}),
    ("torch Adam (single-tensor)", lambda ps: torch.optim.Adam(ps, lr=1e-3, foreach=False), {}),
    ("torch Adam + combine_grad", lambda ps: torch.optim.Adam(ps, lr=1e-3), {"combine_grad": True}),
    ("amp FusedAdam", lambda ps: O.FusedAdam(ps, lr=1e-3), {}),
    ("NpuFusedAdam (combined)", lambda ps: O.NpuFusedAdam(ps, lr=1e-3), {}),
    ("NpuFusedAdam (one-pass)", lambda ps: O.NpuFusedAdam(ps, lr=1e-3, one_pass=True), {}),
]
INIT = {"opt_level": "O2", "dynamic_init_scale": 2.0**10}


def _reset() -> None:
    _amp_state.opt_properties = None
    _amp_state.loss_scalers = []


def count(make: Maker, n: int, size: int, extra: dict[str, Any]) -> npu_fused_ops.OpCounter:
    _reset()
    return npu_fused_ops.count_step(make, n, size, "npu", **INIT, **extra)


def prepare(make: Maker, n: int, size: int, extra: dict[str, Any]) -> Callable[[], list[float]]:
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


def time_rows(
    rows: list[tuple[str, Maker, dict[str, Any]]], n: int, size: int, repeat: int
) -> tuple[dict[str, dict[str, Any]], dict[str, list[float]], Optional[str]]:
    """Each row's optimizer-side phases (and their sum) over `repeat` steps, the rows
    interleaved step by step in rotating order, so that a shared machine's drift hits them
    alike: (label -> {phase: stats.figure (ms, its spread, why it is unreliable)}, label ->
    each round's total in seconds, the load's reason to distrust the run or None)."""
    _reset()
    steps = {label: prepare(make, n, size, extra) for label, make, extra in rows}
    times: dict[str, list[list[float]]] = {label: [] for label in steps}
    labels = list(steps)
    mon = stats.LoadMonitor().start()
    for r in range(repeat):
        for label in labels[r % len(labels) :] + labels[: r % len(labels)]:
            times[label].append(steps[label]())
    mon.stop()
    load = mon.unreliable()
    out: dict[str, dict[str, Any]] = {}
    for label, samples in times.items():
        columns = [[s[i] for s in samples] for i in range(3)] + [[sum(s) for s in samples]]
        out[label] = {
            name: stats.figure(stats.spread(col), load, 1e3)
            for name, col in zip(TIME_COLUMNS, columns)
        }
        out[label]["others_cpu_share"] = mon.others
    totals = {label: [sum(s) for s in samples] for label, samples in times.items()}
    return out, totals, load


# Part 6 of the issue these rows answer: amp's step at 1000 parameters of 10k elements against
# torch's best, on the CPU.
TARGET_PARAMS, TARGET_SIZE, TARGET_SPEEDUP = 1000, 10_000, 1.5


def speedups(totals: dict[str, list[float]], load: Optional[str]) -> dict[str, dict[str, Any]]:
    """Each amp or NpuFused row against torch's best of the same optimizer in the same run:
    per round, the fastest torch row's total over this row's (rounds are paired as the rows
    were interleaved), then the median of those ratios with its spread."""
    out: dict[str, dict[str, Any]] = {}
    for kind in KINDS:
        torch_rows = [t for label, t in totals.items() if label.startswith(f"torch {kind}")]
        if not torch_rows:
            continue
        best = [min(r) for r in zip(*torch_rows)]
        for label, t in totals.items():
            if kind in label and not label.startswith("torch"):
                out[label] = stats.figure(stats.ratio_spread(best, t), load)
    return out


TIME_COLUMNS = ("unscale+chk", "step", "zero_grad", "total")
KINDS = ("SGD", "Adam")  # the optimizers the rows compare, each timed in a run of its own
W = 13  # a figure and its spread: "(123.45 +-12%)"


def _print_times(
    rows: list[tuple[str, Maker, dict[str, Any]]],
    n: int,
    size: int,
    repeat: int,
    doc: dict[str, Any],
    unreliable: list[str],
) -> None:
    figures, totals, load = time_rows(rows, n, size, repeat)
    for label, figs in figures.items():
        cells = " ".join(stats.fmt_figure(figs[c], ".2f", W) for c in TIME_COLUMNS)
        share = figs["others_cpu_share"]
        print(
            f"{label:28} {n:>6} {cells} {'?' if share is None else f'{share:.0%}':>6}", flush=True
        )
        doc["times"].append(
            {"optimizer": label, "params": n, "elements": size, "repeat": repeat, **figs}
        )
        bad = [f"{c} ({figs[c]['unreliable']})" for c in TIME_COLUMNS if figs[c]["unreliable"]]
        if bad:
            unreliable.append(f"  {label}, {n} params: {', '.join(bad)}")
    ratios = speedups(totals, load)
    if not ratios:
        return
    print(f"{'':28} {'':>6} x torch's best row of the same optimizer (per-round ratios):")
    for label, fig in ratios.items():
        print(f"{label:28} {n:>6} {stats.fmt_figure(fig, '.2f', W)}")
        doc["speedups"].append({"optimizer": label, "params": n, "elements": size, **fig})
    if n == TARGET_PARAMS:
        for label, fig in ratios.items():
            if label.startswith("amp "):
                where = "" if size == TARGET_SIZE else f"; the target is set at {TARGET_SIZE}"
                doc["targets"].append(
                    stats.check_target(
                        f"{label}, {n} params x {size}{where}",
                        [fig],
                        fig["value"] >= TARGET_SPEEDUP,
                        f">= {TARGET_SPEEDUP}x torch's best",
                        f"{fig['value']:.2f}x",
                    )
                )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--counts", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument(
        "--size", type=int, default=TARGET_SIZE, help="elements per parameter (CPU times)"
    )
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--big", type=float, default=5e7, help="elements for the big CPU step")
    ap.add_argument("--no-big", action="store_true")
    ap.add_argument(
        "--explain",
        action="store_true",
        help="list the operations of each phase for the combined rows",
    )
    ap.add_argument(
        "--json", metavar="FILE", help="also write the counts and times as JSON ('-': stdout)"
    )
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")  # amp's device-fallback notice for amp.optimizers on npu
    install()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"load {os.getloadavg()[0]:.2f}; amp O2, {args.size} elements per parameter"
    )
    print("\nDevice operations per step on `npu` (launches; syncs = .item() reads)")
    header = (
        f"{'optimizer':28} {'params':>6} {'unscale+chk':>11} {'step':>6} {'zero_grad':>9}"
        f" {'total':>6} {'syncs':>5} {'bwd extra':>9} {'all calls':>9}"
    )
    print(header)
    print("-" * len(header))
    plain_backward: dict[int, int] = {}
    doc: dict[str, Any] = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "loadavg_start": list(os.getloadavg()),
        "elements": args.size,
        "counts": [],
        "times": [],
        "speedups": [],
        "targets": [],
    }
    for label, make, extra in ROWS:
        for n in args.counts:
            c = count(make, n, args.size, extra)
            phases = [c.launches[p] for p in npu_fused_ops.PHASES]
            other = c.launches["other"]
            plain_backward.setdefault(n, other)
            print(
                f"{label:28} {n:>6} {phases[0]:>11} {phases[1]:>6} {phases[2]:>9} "
                f"{sum(phases):>6} {sum(c.syncs.values()):>5} "
                f"{other - plain_backward[n]:>9} "
                f"{sum(c.calls[p] for p in npu_fused_ops.PHASES):>9}"
            )
            # counts are deterministic: no spread
            doc["counts"].append(
                {
                    "optimizer": label,
                    "params": n,
                    **dict(zip(npu_fused_ops.PHASES, phases)),
                    "total": sum(phases),
                    "syncs": sum(c.syncs.values()),
                    "backward_extra": other - plain_backward[n],
                    "all_calls": sum(c.calls[p] for p in npu_fused_ops.PHASES),
                }
            )
            if args.explain and ("combine" in label or "Npu" in label) and n == args.counts[0]:
                for phase in npu_fused_ops.PHASES:
                    print(f"{'':30}{phase}: {dict(c.names[phase])}")
    print(
        "\nCPU time per step, optimizer-side phases (ms, median of "
        f"{args.repeat} +- interquartile range over the median, interleaved)"
    )
    header = (
        f"{'optimizer':28} {'params':>6} "
        + " ".join(f"{c:>{W}}" for c in TIME_COLUMNS)
        + f" {'others':>6}"
    )
    print(header)
    print("-" * len(header))
    unreliable: list[str] = []
    for n in args.counts:
        # One optimizer's rows at a time (SGD's, then Adam's), as for the big step below: a
        # training process holds one model, not twelve, and each row is compared with torch's
        # rows of its own optimizer only.
        for kind in KINDS:
            _print_times(
                [row for row in ROWS if kind in row[0]], n, args.size, args.repeat, doc, unreliable
            )
    if not args.no_big:
        n, size = 100, int(args.big) // 100
        print(
            f"\nCPU time per step at {n * size / 1e6:.0f}M parameters ({n} x {size}), "
            f"ms, median of {args.repeat}"
        )
        print(header)
        print("-" * len(header))
        fused = [row for row in ROWS if "Fused" in row[0]]
        for kind in KINDS:  # SGD's models, then Adam's: fewer in memory at once
            _print_times(
                [row for row in fused if kind in row[0]], n, size, args.repeat, doc, unreliable
            )
    if doc["targets"]:
        print("\ntargets (median of per-round ratios):")
        print("\n".join(doc["targets"]))
    stats.print_legend(unreliable, "steps")
    if args.json:
        stats.write_json(doc, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
