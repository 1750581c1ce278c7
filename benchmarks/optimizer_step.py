"""One mixed-precision optimizer step: torch's best CPU sequence vs amp's two fused paths,
each measured against a limit probe with the step's own memory access pattern.

Cases (each over --tensors tensors of uneven sizes, 100 by default):
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

The limit probe (amp._C._limit_probe) is C loops (OpenMP, the same threads, vectorised, four
accumulators in the reduction) that move exactly the bytes of the ideal two-pass step over the
same tensor list with trivial arithmetic: pass 1 reads the grads, pass 2 reads grads, params
and moments and writes params and moments in place (and the bf16 copy in (b)). "% probe" is
the probe's time over a contender's, median of per-round ratios: 100% = at the memory limit
for that access pattern. A STREAM triad (24 bytes/element counted, write-allocate not) is
shown for reference only.

The machine's memory bandwidth drifts between states, and the dev machine is shared, so
contenders run interleaved round by round (order rotated), and every ratio is the median of
per-round ratios; the load average is printed with the results.

    python benchmarks/optimizer_step.py [--sizes 1e6 1e7 5e7] [--tensors 100] [--threads 2]
        [--rounds N] [--cases ab] [--others] [--profile] [--json FILE|-]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import benchstats as stats  # beside this file: a script's own folder is first on sys.path
import torch

from amp import _ext
from amp.masters.grad_pool import MasterGradPool
from amp.masters.unscale import unscale_one_pass
from amp.optimizers import FusedAdagrad, FusedAdam, FusedMixedPrecisionLamb, FusedNovoGrad

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


Step = Callable[[], Any]


@dataclass
class Case:
    name: str
    size: int
    ideal_bytes: int  # what the ideal two-pass (deferred) step must move
    steps: dict[str, Step]  # contender -> one step; "probe" is the yardstick
    reset: Callable[[], None]  # restores the gradients unscaled in place by a previous step
    phases: Phases
    torch_name: str = "torch"
    # Bytes the probe moves, when its pattern is not the contender's (LAMB's third pass):
    # "% probe" then compares bandwidths, ideal_bytes / time against the probe's.
    probe_bytes: Optional[int] = None
    # --profile: the probe's passes on their own, timed as phases beside the steps' phases.
    probe_passes: dict[str, Step] = field(default_factory=dict)


def _probe_step(
    mod: Any,
    grads: list[torch.Tensor],
    params: list[torch.Tensor],
    states: int,
    half: Optional[list[torch.Tensor]],
    passes: int = 3,
) -> Step:
    """The limit probe over its own copies of params and moments (it overwrites them);
    `passes` 1 or 2: only the read or the update pass (--profile)."""
    p = [x.detach().float().clone() for x in params]
    m = [torch.zeros_like(x) for x in p]
    v = [torch.zeros_like(x) for x in p] if states == 2 else None
    h = None if half is None else [x.detach().clone() for x in half]
    return lambda: mod._limit_probe(grads, p, m, v, h, passes)


def make_case(kind: str, sizes: list[int], mod: Any) -> Case:
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
    f_opt = FusedAdam(f_masters, lr=LR, weight_decay=WD, adam_w_mode=True, max_grad_norm=MAX_NORM)
    f_scaler = MinimalScaler()
    model_groups = [f_model]

    def fused_step() -> None:
        ph.start()
        inv = 1.0 / f_scaler.scale
        found_inf = f_opt._amp_grads_nonfinite(model_groups, inv)
        f_scaler.update(found_inf)
        ph.mark("defer: check + norm pass")
        if not found_inf:
            f_opt._amp_fused_step(model_groups, inv)
        ph.mark("defer: update pass")

    # --- apex-exact: amp's unscale pass writes unscaled grads, the step reads them --------
    e_masters = [x.clone() for x in init]
    e_model = e_masters if kind == "a" else [x.to(torch.bfloat16) for x in init]
    for p, g in zip(e_model, grads0):
        p.grad = g.clone()
    e_model_grads = [p.grad for p in e_model]
    e_opt = FusedAdam(e_masters, lr=LR, weight_decay=WD, adam_w_mode=True, max_grad_norm=MAX_NORM)
    e_scaler = MinimalScaler()
    e_pairs = list(zip(e_model, e_masters))
    e_groups = [e_model]
    e_pool = MasterGradPool()  # as amp's stash keeps one per optimizer (O2's master grads)

    def exact_step() -> None:
        ph.start()
        unscaled = unscale_one_pass(e_pairs, 1.0 / e_scaler.scale, e_pool)
        e_scaler.update(unscaled.nonfinite)
        e_opt._amp_note_grad_norm(unscaled.norm, unscaled.grads)
        ph.mark("exact: unscale + check + norm pass")
        if not unscaled.nonfinite:
            e_opt._amp_unscaled_step(e_groups)
        if kind == "b":  # as amp after a step: the master grads are dropped
            for p in e_masters:
                p.grad = None
        ph.mark("exact: update pass")

    # --- the limit probe: the deferred step's bytes (grads as the model holds them) ----
    probe_args = ([p.grad for p in f_model], init, 2, None if kind == "a" else f_model)
    probe = _probe_step(mod, *probe_args)
    probe_passes = {f"probe: pass {k}": _probe_step(mod, *probe_args, passes=k) for k in (1, 2)}

    def reset() -> None:
        torch._foreach_copy_(t_model_grads, grads0)
        torch._foreach_copy_(e_model_grads, grads0)

    # Ideal traffic: norm pass reads g; update reads g, p, m, v and writes p, m, v
    # (+ the bf16 model copy in (b)).
    gb = 4 if kind == "a" else 2
    ideal = n * (gb + gb + 12 + 12 + (2 if kind == "b" else 0))
    name = "(a) fp32" if kind == "a" else "(b) bf16+fp32 master"
    steps = {"torch": torch_step, "exact": exact_step, "defer": fused_step, "probe": probe}
    return Case(name, n, ideal, steps, reset, ph, probe_passes=probe_passes)


def make_other_case(opt_name: str, sizes: list[int], mod: Any) -> Case:
    """The optimizers beyond Adam, bf16 model + fp32 masters, amp's deferred path (grads
    scaled; a check + norm pass, then the update) -- FusedMixedPrecisionLamb standalone, as
    it is used (its own fp32 masters, a GradScaler handed to step) -- against torch's
    equivalent where torch has one, and the probe for the same access pattern."""
    gen = torch.Generator().manual_seed(2)
    init = [torch.randn(n, generator=gen) for n in sizes]
    grads0 = [(torch.randn(n, generator=gen) * 1e-3 * SCALE).to(torch.bfloat16) for n in sizes]
    n = sum(sizes)
    ph = Phases()
    steps: dict[str, Step] = {}
    model = [x.to(torch.bfloat16) for x in init]
    for p, g in zip(model, grads0):
        p.grad = g.clone()
    torch_name = "-"
    if opt_name == "adagrad":
        masters = [x.clone() for x in init]
        opt: Any = FusedAdagrad(masters, lr=1e-2, weight_decay=WD)
        states, passes_bytes = 1, 2 + 2 + 8 + 8 + 2  # g; g, p, sum read; p, sum, bf16 written
        t_params = [x.clone().requires_grad_() for x in init]
        t_model = [x.to(torch.bfloat16) for x in init]
        for p in t_params:
            p.grad = torch.empty_like(p)
        t_opt = torch.optim.Adagrad(t_params, lr=1e-2, weight_decay=WD, fused=True)
        t_scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
        t_scaler.scale(torch.ones(()))
        t_grads = [p.grad for p in t_params]

        def torch_step() -> None:
            torch._foreach_copy_(t_grads, grads0)
            t_scaler.unscale_(t_opt)
            t_scaler.step(t_opt)
            t_scaler.update()
            torch._foreach_copy_(t_model, t_params)

        steps["torch"] = torch_step
        torch_name = "Adagrad(fused)"
    elif opt_name == "novograd":
        masters = [x.clone() for x in init]
        opt = FusedNovoGrad(masters, lr=1e-3, weight_decay=WD)
        states, passes_bytes = 1, 2 + 2 + 8 + 8 + 2
    elif opt_name == "mplamb":
        opt = FusedMixedPrecisionLamb(
            model, lr=1e-3, weight_decay=WD, reduced_precision_dtype=torch.bfloat16
        )
        # norm pass g; stage 1 reads g, p, m, v and writes m, v; stage 2 reads p, m, v and
        # writes p and the bf16 copy (LAMB needs the per-tensor norms between the two).
        states, passes_bytes = 2, 2 + (2 + 12 + 8) + (12 + 4 + 2)
    else:
        raise ValueError(f"unknown optimizer {opt_name!r}")
    if opt_name == "mplamb":
        scaler = torch.amp.GradScaler("cpu", init_scale=SCALE)
        scaler.scale(torch.ones(()))

        def amp_step() -> None:
            with warnings.catch_warnings():  # torch's notice about this very protocol
                warnings.simplefilter("ignore", FutureWarning)
                scaler.step(opt)  # hands itself to step(): unscaled as the kernel reads
            scaler.update()
    else:
        f_scaler = MinimalScaler()
        groups = [model]

        def amp_step() -> None:
            inv = 1.0 / f_scaler.scale
            found_inf = opt._amp_grads_nonfinite(groups, inv)
            f_scaler.update(found_inf)
            if not found_inf:
                opt._amp_fused_step(groups, inv)

    steps["defer"] = amp_step
    steps["probe"] = _probe_step(mod, [p.grad for p in model], init, states, model)
    probe_bytes = n * (2 + 2 + 4 + 4 * states * 2 + 4 + 2)  # g; g, p, state(s) r+w, p w, bf16
    return Case(
        f"{opt_name} (b) bf16",
        n,
        n * passes_bytes,
        steps,
        lambda: None,
        ph,
        torch_name=torch_name,
        probe_bytes=None if probe_bytes == n * passes_bytes else probe_bytes,
    )


def bench(case: Case, triad: Triad, rounds: int) -> dict[str, Any]:
    steps = case.steps
    names = list(steps)
    for _ in range(3):  # warm-up (state allocation, first-touch page faults)
        for who in names:
            case.reset()
            steps[who]()
    times: dict[str, list[float]] = {who: [] for who in names}
    bws = []
    mon = stats.LoadMonitor().start()
    for r in range(rounds):
        bws.append(triad())
        k = r % len(names)
        for who in names[k:] + names[:k]:  # rotate the order round by round
            case.reset()
            t0 = time.perf_counter()
            steps[who]()
            times[who].append(time.perf_counter() - t0)
        if case.phases.on:
            for name, fn in case.probe_passes.items():
                t0 = time.perf_counter()
                fn()
                case.phases.times.setdefault(name, []).append(time.perf_counter() - t0)
    mon.stop()
    load = mon.unreliable()
    if case.phases.on:
        for name, ts in case.phases.times.items():
            s = stats.spread(ts)
            print(f"        {name:<36} {stats.fmt(s.median * 1e3, s.rel, '9.2f', None)} ms")
    bw = statistics.median(bws)
    figs: dict[str, dict[str, Any]] = {}

    def ratio(a: str, b: str, key: str, scale: float = 1.0) -> float:
        """The median of per-round ratios time(a) / time(b), kept as figure `key`."""
        s = stats.ratio_spread(times[a], times[b])
        figs[key] = stats.figure(s, load, scale)
        return s.median * scale

    res: dict[str, Any] = {
        "case": case.name,
        "params": case.size,
        "rounds": rounds,
        "ideal_bytes": case.ideal_bytes,
        "triad_gbs": bw / 1e9,
        "load": mon.to_json(),
        "load_unreliable": load,
    }
    probe_bytes = case.probe_bytes or case.ideal_bytes
    for who in names:
        s = stats.spread(times[who])
        figs[f"{who}_ms"] = stats.figure(s, load, 1e3)
        res[f"{who}_ms"] = s.median * 1e3
        # The fastest round: on a loaded machine, the closest to an undisturbed step
        # (diagnostics only; every ratio above is a median of per-round ratios).
        res[f"{who}_min_ms"] = min(times[who]) * 1e3
        if who != "probe":  # time ratio, scaled to bandwidths where the patterns differ
            res[f"{who}_pct_probe"] = ratio(
                "probe", who, f"{who}_pct_probe", 100.0 * case.ideal_bytes / probe_bytes
            )
        if who not in ("torch", "probe") and "torch" in names:
            res[f"{who}_speedup"] = ratio("torch", who, f"{who}_speedup")
    res["probe_gbs"] = probe_bytes / statistics.median(times["probe"]) / 1e9
    if "exact" in names and "defer" in names:
        res["exact_cost"] = ratio("exact", "defer", "exact_cost")
    res["figures"] = figs
    return res


def _others(res: dict[str, Any]) -> str:
    """The share of the CPUs other processes used while the case ran ('?': unknown)."""
    share = res["load"]["others_cpu_share"]
    return "?" if share is None else f"{share:.0%}"


def _reasons(res: dict[str, Any], name: str) -> list[str]:
    """'  NAME: key (why), ...' for the unreliable figures of a result (none: [])."""
    bad = [
        f"{key} ({fig['unreliable']})" for key, fig in res["figures"].items() if fig["unreliable"]
    ]
    return [f"  {name}: {', '.join(bad)}"] if bad else []


def _cell(res: dict[str, Any], key: str, spec: str, width: int) -> str:
    """One figure of a result with its spread, in parentheses when unreliable."""
    return stats.fmt_figure(res["figures"].get(key), spec, width)


# Issue 18's targets: (size, case) -> (min speed-up over torch, min % of the probe or None).
TARGETS: dict[tuple[int, str], tuple[float, Optional[float]]] = {
    (50_000_000, "a"): (1.5, 90.0),
    (50_000_000, "b"): (2.5, 90.0),
    (1_000_000, "a"): (3.0, None),
    (1_000_000, "b"): (3.0, None),
}


def machine() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "isa": _ext.isa() or "fallback (amp._C unavailable!)",
        "isas_supported": _ext.supported_isas(),
        "loadavg": [round(x, 2) for x in load],
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--sizes", type=float, nargs="+", default=[1e6, 1e7, 5e7])
    ap.add_argument(
        "--tensors",
        type=int,
        default=100,
        help="tensors per case (uneven sizes summing to each --sizes); e.g. 1000 with 1e5 for "
        "a step where the per-tensor cost outweighs the bytes",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=0, help="0: 60 / 30 / 15 by size")
    ap.add_argument("--cases", default="ab")
    ap.add_argument(
        "--others",
        default="adagrad,novograd,mplamb",
        help="other optimizers, comma-separated ('' for none), at the sizes given",
    )
    ap.add_argument("--profile", action="store_true", help="also print per-phase medians")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON ('-': stdout)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    mod = _ext.load()
    if mod is None:
        print("amp._C is unavailable: nothing to measure against the probe", file=sys.stderr)
        return 1
    info = machine()
    triad = Triad()
    info["triad_gbs"] = statistics.median(triad() for _ in range(5)) / 1e9
    print(
        f"cpu: {info['cpu']} ({info['cpus']} CPUs); amp kernels: {info['isa']} "
        f"(this CPU runs: {', '.join(info['isas_supported'])}); {info['threads']} threads; "
        f"torch {info['torch']}"
    )
    print(
        f"load average at start: {' '.join(map(str, info['loadavg']))}; STREAM triad "
        f"{info['triad_gbs']:.1f} GB/s (24 B/element counted)"
    )
    w = 13  # a figure and its spread: "(123.45 +-12%)"
    header = (
        f"{'params':>7} {'case':<22} {'torch ms':>{w}} {'exact ms':>{w}} "
        f"{'defer ms':>{w}} {'probe ms':>{w}} {'exact x':>{w}} {'defer x':>{w}} "
        f"{'ex/defer':>{w}} {'exact%pr':>{w}} {'defer%pr':>{w}} {'torch%pr':>{w}} "
        f"{'probe GB/s':>10} {'triad GB/s':>10} {'others':>6}"
    )
    print(header)
    print("-" * len(header))
    results: list[dict[str, Any]] = []
    verdicts: list[str] = []
    unreliable: list[str] = []
    for size in args.sizes:
        total = int(size)
        rounds = args.rounds or (60 if total <= 2_000_000 else 30 if total <= 20_000_000 else 15)
        for kind in args.cases:
            case = make_case(kind, uneven_sizes(total, args.tensors), mod)
            case.phases.on = args.profile
            res = bench(case, triad, rounds)
            res["loadavg"] = [round(x, 2) for x in os.getloadavg()]
            results.append(res)
            cells = [
                _cell(res, k, ".2f", w)
                for k in (
                    "torch_ms",
                    "exact_ms",
                    "defer_ms",
                    "probe_ms",
                    "exact_speedup",
                    "defer_speedup",
                    "exact_cost",
                )
            ]
            cells += [
                _cell(res, k, ".0f", w)
                for k in ("exact_pct_probe", "defer_pct_probe", "torch_pct_probe")
            ]
            print(
                f"{total / 1e6:>6g}M {case.name:<22} {' '.join(cells)} "
                f"{res['probe_gbs']:>10.1f} {res['triad_gbs']:>10.1f} "
                f"{_others(res):>6}",
                flush=True,
            )
            unreliable += _reasons(res, f"{total / 1e6:g}M {case.name}")
            target = TARGETS.get((total, kind))
            if target is not None:
                for who in ("defer", "exact"):
                    x, pct = res[f"{who}_speedup"], res[f"{who}_pct_probe"]
                    ok = x >= target[0] and (target[1] is None or pct >= target[1])
                    want = f">= {target[0]}x" + (
                        "" if target[1] is None else f" and >= {target[1]:.0f}% of probe"
                    )
                    figs = [res["figures"][f"{who}_speedup"], res["figures"][f"{who}_pct_probe"]]
                    verdicts.append(
                        stats.check_target(
                            f"{total / 1e6:g}M {case.name} {who}",
                            figs,
                            ok,
                            want,
                            f"{x:.2f}x, {pct:.0f}% of probe",
                        )
                    )
            del case
            gc.collect()
    others = [o for o in args.others.split(",") if o]
    if others:
        print()
        head2 = (
            f"{'params':>7} {'optimizer':<22} {'torch':<15} {'torch ms':>{w}} "
            f"{'amp ms':>{w}} {'probe ms':>{w}} {'amp x':>{w}} {'amp%pr':>{w}} "
            f"{'probe GB/s':>10} {'others':>6}"
        )
        print(head2)
        print("-" * len(head2))
        for size in args.sizes:
            total = int(size)
            rounds = args.rounds or (
                60 if total <= 2_000_000 else 30 if total <= 20_000_000 else 15
            )
            for opt_name in others:
                case = make_other_case(opt_name, uneven_sizes(total, args.tensors), mod)
                res = bench(case, triad, rounds)
                res["loadavg"] = [round(x, 2) for x in os.getloadavg()]
                results.append(res)
                cells = [
                    _cell(res, k, ".2f", w)
                    for k in ("torch_ms", "defer_ms", "probe_ms", "defer_speedup")
                ]
                print(
                    f"{total / 1e6:>6g}M {case.name:<22} {case.torch_name:<15} "
                    f"{' '.join(cells)} {_cell(res, 'defer_pct_probe', '.0f', w)} "
                    f"{res['probe_gbs']:>10.1f} {_others(res):>6}",
                    flush=True,
                )
                unreliable += _reasons(res, f"{total / 1e6:g}M {case.name}")
                del case
                gc.collect()
    stats.print_legend(unreliable, "rounds")
    end_load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\nload average at end: {end_load}")
    if verdicts:
        print(
            "targets (issue 18; median of per-round ratios; not checked on an unreliable figure):"
        )
        print("\n".join(verdicts))
    if args.json:
        stats.write_json({"machine": info, "results": results, "targets": verdicts}, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
