"""One mixed-precision optimizer step: torch's best CPU sequence vs amp's two fused paths.

Cases (each over ~100 tensors of uneven sizes):
  (a) fp32 model: GradScaler.unscale_ + clip_grad_norm_(foreach=True) + AdamW(fused=True)
      + scaler.update()
  (b) bf16 model, fp32 master (amp O2): copy grads to fp32 + the sequence of (a) +
      _foreach_copy_ back to bf16
against amp's FusedAdam (clipping with max_grad_norm) on its two paths:
  apex-exact (amp's default): the unscale pass amp runs when scale_loss exits writes the
      unscaled grads (in place in (a), fresh fp32 master grads in (b)), checks them and
      measures their norm in one read; the step reads them (_amp_unscaled_step), writing the
      bf16 copy in (b). Gradients are apex's between scale_loss and step.
  deferred (opt-in, defer_unscale=True): a read-only check + norm pass, then the step unscales
      as it reads (_amp_grads_nonfinite + _amp_fused_step); gradients stay scaled in memory.

The machine's memory bandwidth drifts between states, so contenders run interleaved round
by round, and the speed-up is the median of per-round ratios. A STREAM-style triad runs in
every round too; "BW%" is the bytes the ideal (deferred) fused step must move (norm pass +
update pass) / time / triad bandwidth. "exact cost" is apex-exact's time over deferred's.

    python benchmarks/optimizer_step.py [--sizes 1e6 1e7 5e7] [--threads 2] [--rounds N]
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import torch

from amp import _ext
from amp._fused_unscale import unscale_pairs
from amp.optimizers import FusedAdam

LR, WD, MAX_NORM, SCALE = 1e-3, 0.01, 1.0, 2.0**16


def uneven_sizes(total: int, count: int = 100, seed: int = 0) -> list[int]:
    """`count` sizes spread over ~3 decades that sum to `total`."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.exp(torch.randn(count, generator=gen, dtype=torch.float64) * 1.5)
    sizes = [max(1, int(x)) for x in (w / w.sum() * total)]
    sizes[0] += total - sum(sizes)
    return sizes


class Triad:
    """a = b + s*c over arrays far larger than the last-level cache (STREAM counting)."""

    def __init__(self, n: int = 24 * 2**20) -> None:
        self.a, self.b, self.c = (torch.rand(n) for _ in range(3))
        self.bytes = 3 * n * 4

    def __call__(self) -> float:
        t0 = time.perf_counter()
        torch.add(self.b, self.c, alpha=3.0, out=self.a)
        return self.bytes / (time.perf_counter() - t0)


class MinimalScaler:
    """amp's dynamic loss scale update (the fused side's scaler.update())."""

    def __init__(self) -> None:
        self.scale, self.good = SCALE, 0

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.scale, self.good = max(self.scale / 2, 1.0), 0
        else:
            self.good += 1
            if self.good == 2000:
                self.scale, self.good = self.scale * 2, 0


class Phases:
    """Optional per-phase timer (--profile): mark(name) closes the phase since the last mark."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}
        self.on = False
        self._t = 0.0

    def start(self) -> None:
        self._t = time.perf_counter()

    def mark(self, name: str) -> None:
        if self.on:
            now = time.perf_counter()
            self.times.setdefault(name, []).append(now - self._t)
            self._t = now


@dataclass
class Case:
    name: str
    ideal_bytes: int
    torch_step: Callable[[], None]
    fused_step: Callable[[], None]  # deferred
    exact_step: Callable[[], None]  # apex-exact (amp's default)
    reset: Callable[[], None]  # restores the gradients unscaled in place by a previous step
    phases: Phases


def make_case(kind: str, sizes: list[int]) -> Case:
    gen = torch.Generator().manual_seed(1)
    model_dtype = torch.float32 if kind == "a" else torch.bfloat16
    init = [torch.randn(n, generator=gen) for n in sizes]
    grads0 = [(torch.randn(n, generator=gen) * 1e-3 * SCALE).to(model_dtype) for n in sizes]
    n = sum(sizes)

    # --- torch: params carry .grad; GradScaler + clip + fused AdamW -----------------
    t_params = [x.clone().requires_grad_() for x in init]
    if kind == "a":
        t_model, t_masters = t_params, t_params
        for p, g in zip(t_params, grads0):
            p.grad = g.clone()
        t_model_grads = [p.grad for p in t_params]
    else:
        t_model = [x.to(torch.bfloat16) for x in init]
        t_model_grads = [g.clone() for g in grads0]
        t_masters = t_params
        for p in t_masters:
            p.grad = torch.empty_like(p)
    t_opt = torch.optim.AdamW(t_masters, lr=LR, weight_decay=WD, fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
    scaler.scale(torch.ones(()))  # creates the scale tensor, as scaling the loss would
    master_grads = [p.grad for p in t_masters]

    ph = Phases()

    def torch_step() -> None:
        ph.start()
        if kind == "b":
            torch._foreach_copy_(master_grads, t_model_grads)
            ph.mark("torch: grads to fp32")
        scaler.unscale_(t_opt)
        ph.mark("torch: GradScaler.unscale_")
        torch.nn.utils.clip_grad_norm_(t_masters, MAX_NORM, foreach=True)
        ph.mark("torch: clip_grad_norm_")
        scaler.step(t_opt)
        ph.mark("torch: AdamW(fused) step")
        scaler.update()
        ph.mark("torch: scaler.update")
        if kind == "b":
            torch._foreach_copy_(t_model, t_masters)
            ph.mark("torch: masters to bf16")

    # --- fused: gradients read once for the check + norm, once in the update -------
    f_masters = [x.clone() for x in init]
    if kind == "a":
        f_model = f_masters
        for p, g in zip(f_masters, grads0):
            p.grad = g.clone()
    else:
        f_model = [x.to(torch.bfloat16) for x in init]
        for p, g in zip(f_model, grads0):
            p.grad = g.clone()
    f_opt = FusedAdam(f_masters, lr=LR, weight_decay=WD, adam_w_mode=True,
                      max_grad_norm=MAX_NORM)
    f_scaler = MinimalScaler()
    model_groups = [f_model]

    def fused_step() -> None:
        ph.start()
        inv = 1.0 / f_scaler.scale
        found_inf = f_opt._amp_grads_nonfinite(model_groups, inv)
        f_scaler.update(found_inf)
        ph.mark("fused: check + norm pass")
        if not found_inf:
            f_opt._amp_fused_step(model_groups, inv)
        ph.mark("fused: update pass")

    # --- apex-exact: amp's unscale pass writes unscaled grads, the step reads them --------
    e_masters = [x.clone() for x in init]
    e_model = e_masters if kind == "a" else [x.to(torch.bfloat16) for x in init]
    for p, g in zip(e_model, grads0):
        p.grad = g.clone()
    e_model_grads = [p.grad for p in e_model]
    e_opt = FusedAdam(e_masters, lr=LR, weight_decay=WD, adam_w_mode=True,
                      max_grad_norm=MAX_NORM)
    e_scaler = MinimalScaler()
    e_pairs = list(zip(e_model, e_masters))
    e_groups = [e_model]

    def exact_step() -> None:
        ph.start()
        found_inf, norm, grads = unscale_pairs(e_pairs, 1.0 / e_scaler.scale)
        e_scaler.update(found_inf)
        e_opt._amp_note_grad_norm(norm, grads)
        ph.mark("exact: unscale + check + norm pass")
        if not found_inf:
            e_opt._amp_unscaled_step(e_groups)
        if kind == "b":  # as amp after a step: the master grads are dropped
            for p in e_masters:
                p.grad = None
        ph.mark("exact: update pass")

    def reset() -> None:
        torch._foreach_copy_(t_model_grads, grads0)
        torch._foreach_copy_(e_model_grads, grads0)

    # Ideal traffic: norm pass reads g; update reads g, p, m, v and writes p, m, v
    # (+ the bf16 model copy in (b)).
    gb = 4 if kind == "a" else 2
    ideal = n * (gb + gb + 12 + 12 + (2 if kind == "b" else 0))
    name = "(a) fp32" if kind == "a" else "(b) bf16+fp32 master"
    return Case(name, ideal, torch_step, fused_step, exact_step, reset, ph)


def bench(case: Case, triad: Triad, rounds: int) -> dict:
    steps = {"torch": case.torch_step, "fused": case.fused_step, "exact": case.exact_step}
    names = list(steps)
    for _ in range(3):  # warm-up (state allocation, first-touch page faults)
        for who in names:
            case.reset()
            steps[who]()
    times: dict[str, list[float]] = {who: [] for who in names}
    bws = []
    for r in range(rounds):
        bws.append(triad())
        for who in names[r % 3:] + names[:r % 3]:  # rotate the order round by round
            case.reset()
            t0 = time.perf_counter()
            steps[who]()
            times[who].append(time.perf_counter() - t0)
    if case.phases.on:
        for name, ts in case.phases.times.items():
            print(f"        {name:<36} {statistics.median(ts) * 1e3:9.2f} ms")
    bw = statistics.median(bws)
    med = {who: statistics.median(ts) for who, ts in times.items()}

    def ratio(a: str, b: str) -> float:  # median of per-round ratios a/b
        return statistics.median(x / y for x, y in zip(times[a], times[b]))

    return dict(torch_ms=med["torch"] * 1e3, fused_ms=med["fused"] * 1e3,
                exact_ms=med["exact"] * 1e3, speedup=ratio("torch", "fused"),
                exact_speedup=ratio("torch", "exact"), exact_cost=ratio("exact", "fused"),
                fused_bw=case.ideal_bytes / med["fused"] / bw,
                exact_bw=case.ideal_bytes / med["exact"] / bw, triad=bw / 1e9)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7, 5e7])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=0, help="0: 60 / 30 / 15 by size")
    ap.add_argument("--cases", default="ab")
    ap.add_argument("--profile", action="store_true", help="also print per-phase medians")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    mod = _ext.load()
    isa = mod.isa() if mod is not None else "fallback (amp._C unavailable!)"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, amp kernels: {isa}")
    triad = Triad()
    header = (f"{'params':>7} {'case':<22} {'torch ms':>9} {'exact ms':>9} {'defer ms':>9} "
              f"{'exact x':>8} {'defer x':>8} {'exact cost':>10} {'exact BW%':>9} "
              f"{'defer BW%':>9} {'triad GB/s':>10}")
    print(header)
    print("-" * len(header))
    for size in args.sizes:
        total = int(size)
        rounds = args.rounds or (60 if total <= 2_000_000 else 30 if total <= 20_000_000 else 15)
        for kind in args.cases:
            case = make_case(kind, uneven_sizes(total))
            case.phases.on = args.profile
            res = bench(case, triad, rounds)
            print(f"{total / 1e6:>6g}M {case.name:<22} {res['torch_ms']:>9.2f} "
                  f"{res['exact_ms']:>9.2f} {res['fused_ms']:>9.2f} "
                  f"{res['exact_speedup']:>7.2f}x {res['speedup']:>7.2f}x "
                  f"{res['exact_cost']:>9.2f}x {res['exact_bw'] * 100:>8.0f}% "
                  f"{res['fused_bw'] * 100:>8.0f}% {res['triad']:>10.1f}", flush=True)
            del case
            gc.collect()
    return 0


if __name__ == "__main__":
    sys.exit(main())
