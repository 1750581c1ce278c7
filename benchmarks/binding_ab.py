"""amp._C against another build of it, op by op, in one process: e.g. the stable-ABI binding
(kernels/bindings_stable.cpp) against the pybind11 one (kernels/bindings.cpp) or an older build.

Both modules run the same kernels on the same tensors (~100 of uneven sizes, as
benchmarks/optimizer_step.py), interleaved round by round with the order alternated, so machine
drift (a shared machine's load) hits both alike; each ratio is the median of per-round ratios.
The time of one call is the kernel's plus the binding's per-call and per-tensor cost (argument
conversion: pybind11's casters, or torch's dispatcher boxing for the stable ops), so small
sizes show the binding and large ones the kernels.

    python benchmarks/binding_ab.py --baseline path/to/_C.cpython-311-x86_64-linux-gnu.so
        [--sizes 1e4 1e6 1e7] [--rounds 30] [--tensors 100] [--threads 2] [--json FILE|-]

Every figure is printed with its spread over the rounds (benchmarks/benchstats.py), in
parentheses when the spread or the machine's load makes it unreliable.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import amp._C as current
import benchstats as stats  # beside this file: a script's own folder is first on sys.path
import torch


def _load(path: Path) -> Any:
    """The amp._C at *path* as a second module (its init function is PyInit__C: the module's
    name must end in `_C`)."""
    pkg = Path(tempfile.mkdtemp(prefix="amp-baseline-")) / "baseline_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / path.name).symlink_to(path.resolve())
    sys.path.insert(0, str(pkg.parent))
    spec = importlib.util.find_spec("baseline_pkg._C")
    assert spec is not None, path
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _sizes(total: int, count: int) -> list[int]:
    gen = torch.Generator().manual_seed(0)
    w = torch.exp(torch.randn(count, generator=gen, dtype=torch.float64) * 1.5)
    sizes = [max(1, int(x)) for x in (w / w.sum() * total)]
    sizes[0] += total - sum(sizes)
    return sizes


def _ops(total: int, count: int) -> dict[str, Callable[[Any], Any]]:
    sizes = _sizes(total, count)
    g = [torch.randn(n) for n in sizes]
    p = [torch.randn(n) for n in sizes]
    m = [torch.zeros(n) for n in sizes]
    v = [torch.zeros(n) for n in sizes]
    out = [torch.empty(n) for n in sizes]
    return {
        "adam": lambda C: C.adam(g, p, m, v, None, 1e-3, 0.9, 0.999, 1e-8, 1, True, True, 0.0, 1.0),
        "sgd": lambda C: C.sgd(g, p, m, None, 1e-3, 0.9, 0.0, 0.0, False, False, False, 1.0),
        "scale_l2norm": lambda C: C.scale_l2norm(g, out, 0.5),
    }


def _time(f: Callable[[], Any], reps: int) -> float:
    start = time.perf_counter()
    for _ in range(reps):
        f()
    return (time.perf_counter() - start) / reps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, required=True, help="another amp._C build (.so)")
    ap.add_argument("--sizes", type=float, nargs="+", default=[1e4, 1e6, 1e7])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--tensors", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON ('-': stdout)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    base = _load(args.baseline)
    for mod in (base, current):
        mod.set_isa("auto")
    print(f"current:  {current.__file__} ({getattr(current, '__torch_abi__', 'unstable')})")
    print(f"baseline: {args.baseline} ({getattr(base, '__torch_abi__', 'unstable')})")
    print(
        f"torch {torch.__version__}, {args.threads} threads, {args.tensors} tensors, "
        f"kernels {current.isa()}; load average at start: "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    w = 14
    print(
        f"{'elements':>10} {'op':<13} {'baseline us':>{w}} {'current us':>{w}} "
        f"{'current/base':>{w}} {'others':>6}"
    )
    results: list[dict[str, Any]] = []
    unreliable: list[str] = []
    for total in (int(s) for s in args.sizes):
        for name, op in _ops(total, args.tensors).items():
            reps = max(2, int(2e6 // max(total, 1)))
            for mod in (base, current):  # warm up
                op(mod)
            tb, tc = [], []
            mon = stats.LoadMonitor().start()
            for r in range(args.rounds):
                order = (base, current) if r % 2 == 0 else (current, base)
                got = {id(mod): _time(lambda mod=mod, op=op: op(mod), reps) for mod in order}
                tb.append(got[id(base)])
                tc.append(got[id(current)])
            mon.stop()
            load = mon.unreliable()
            figs = {
                "baseline_us": stats.figure(stats.spread(tb), load, 1e6),
                "current_us": stats.figure(stats.spread(tc), load, 1e6),
                "ratio": stats.figure(stats.ratio_spread(tc, tb), load),
            }
            share = "?" if mon.others is None else f"{mon.others:.0%}"
            print(
                f"{total:>10} {name:<13} {stats.fmt_figure(figs['baseline_us'], '.1f', w)} "
                f"{stats.fmt_figure(figs['current_us'], '.1f', w)} "
                f"{stats.fmt_figure(figs['ratio'], '.3f', w - 1)}x {share:>6}",
                flush=True,
            )
            results.append(
                {
                    "elements": total,
                    "op": name,
                    "tensors": args.tensors,
                    "load": mon.to_json(),
                    **figs,
                }
            )
            bad = [f"{k} ({f['unreliable']})" for k, f in figs.items() if f["unreliable"]]
            if bad:
                unreliable.append(f"  {total} {name}: {', '.join(bad)}")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    stats.print_legend(unreliable, "rounds")
    if args.json:
        stats.write_json(
            {
                "current": str(current.__file__),
                "baseline": str(args.baseline),
                "torch": torch.__version__,
                "threads": args.threads,
                "results": results,
            },
            args.json,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
