"""Loss and memory, fp32 against amp: apex's quick-start model and a larger MLP.

Each model trains from the same seed, on the same data, once per run:

  fp32       opt_level O0 (the baseline)
  O1 <half>  per-op casting through torch.autocast, fp32 weights
  O2 <half>  a half model with fp32 master weights

with bf16 as the half type on the CPU, and fp16 and bf16 on a CUDA or NPU device. It prints the
loss at every step (one table per model), then one line per run: the bytes of the model's
weights as it trains, the peak memory of the run and the median step time; and writes a PNG
with the loss curves and the memory and time bars.

What "peak" measures:
  cpu        the peak of live tensor bytes during the run (model construction, amp.initialize
             and the first steps): every tensor storage an op creates is counted until it is
             freed, through a TorchDispatchMode (the process's RSS is no measure here: it
             only grows across runs in one process, and it includes the interpreter and torch).
  cuda, npu  the device allocator's peak (max_memory_allocated) over the same span, minus
             what was allocated before the run.

The memory span is measured in its own pass (a fresh model, min(steps, 3) steps): the
CPU's tracker costs time per op, and the peak is reached in the first step (the optimizer's
state is created there). The losses and step times come from a second pass over every step
without the tracker; the step time is the median over the steps after the first.

    python examples/amp_demo.py [--steps 20] [--device auto|cpu|cuda|npu] [--out PNG]
        [--batch 1024] [--width 128] [--depth 4]

Needs matplotlib for the PNG (`pip install "ampforge[demo]"`). `make demo DEMO_ARGS=...`.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

import amp

MEMORY_STEPS = 3


# ------------------------------------------------------------------ runs and models


@dataclass(frozen=True)
class RunSpec:
    label: str  # "fp32", "O1 bf16", ...
    opt_level: str
    half: Optional[torch.dtype]  # None: fp32 (O0)


def runs_for(device: torch.device) -> list[RunSpec]:
    """fp32, then O1 and O2 for each half type the device computes in."""
    halves = [torch.bfloat16] if device.type == "cpu" else [torch.float16, torch.bfloat16]
    runs = [RunSpec("fp32", "O0", None)]
    for level in ("O1", "O2"):
        for half in halves:
            runs.append(RunSpec(f"{level} {_short(half)}", level, half))
    return runs


def _short(dtype: torch.dtype) -> str:
    return {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]


@dataclass(frozen=True)
class ModelSpec:
    name: str
    describe: str
    batch: int
    in_features: int
    build: Callable[[], torch.nn.Module]
    optimizer: Callable[[Any], torch.optim.Optimizer]


def model_specs(batch: int, width: int, depth: int) -> list[ModelSpec]:
    def mlp() -> torch.nn.Module:
        layers: list[torch.nn.Module] = [torch.nn.Linear(64, width), torch.nn.ReLU()]
        for _ in range(depth - 1):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        layers.append(torch.nn.Linear(width, 1))
        return torch.nn.Sequential(*layers)

    return [
        # The README's quick start, as in apex's: Linear(10, 1), SGD, MSE, a batch of 64.
        ModelSpec(
            "quickstart",
            "nn.Linear(10, 1), SGD lr 0.01, batch 64",
            64,
            10,
            lambda: torch.nn.Linear(10, 1),
            lambda params: torch.optim.SGD(params, lr=0.01),
        ),
        ModelSpec(
            "mlp",
            f"MLP 64-{width}x{depth}-1 (ReLU), amp FusedAdam lr 1e-3, batch {batch}",
            batch,
            64,
            mlp,
            lambda params: amp.optimizers.FusedAdam(params, lr=1e-3),
        ),
    ]


def make_data(spec: ModelSpec, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed regression problem: a random linear teacher plus a little noise."""
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(spec.batch, spec.in_features, generator=gen)
    w = torch.randn(spec.in_features, 1, generator=gen) / math.sqrt(spec.in_features)
    y = x @ w + 0.1 * torch.randn(spec.batch, 1, generator=gen)
    return x.to(device), y.to(device)


# ------------------------------------------------------------------ memory


class LiveTensorBytes(TorchDispatchMode):
    """Counts the bytes of every tensor storage created while active, until it is freed.

    Every op (factory functions, autograd's backward ops, the optimizer's) passes through a
    dispatch mode; each storage of its outputs is counted once (views share it) and
    uncounted by a finalizer when torch frees it. ``peak`` is the highest total seen after
    any op."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.current = 0
        self.peak = 0

    def _freed(self, nbytes: int) -> None:
        self.current -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                if storage not in self._seen:
                    nbytes = storage.nbytes()
                    self._seen[storage] = nbytes
                    self.current += nbytes
                    weakref.finalize(storage, self._freed, nbytes)
        self.peak = max(self.peak, self.current)
        return out


@contextmanager
def peak_meter(device: torch.device) -> Iterator[Callable[[], int]]:
    """Yields a function that returns the peak bytes of the span (see the module's doc)."""
    if device.type == "cpu":
        with LiveTensorBytes() as live:
            yield lambda: live.peak
        return
    mod = getattr(torch, device.type)  # torch.cuda, torch.npu: the same allocator API
    mod.synchronize()
    mod.reset_peak_memory_stats()
    base = mod.memory_allocated()
    result: dict[str, int] = {}
    try:
        yield lambda: result["peak"]
    finally:
        mod.synchronize()
        result["peak"] = mod.max_memory_allocated() - base


def _sync(device: torch.device) -> None:
    if device.type != "cpu":
        getattr(torch, device.type).synchronize()


# ------------------------------------------------------------------ training


@dataclass
class RunResult:
    model: str
    run: str
    weights_dtype: str
    weights_bytes: int
    peak_bytes: int
    losses: list[float] = field(default_factory=list)
    step_times: list[float] = field(default_factory=list)

    @property
    def step_ms(self) -> float:
        times = self.step_times[1:] or self.step_times  # the first step warms up
        return statistics.median(times) * 1e3


def _setup(spec: ModelSpec, run: RunSpec, device: torch.device):
    torch.manual_seed(0)
    model = spec.build().to(device)
    optimizer = spec.optimizer(model.parameters())
    kwargs: dict[str, Any] = {"opt_level": run.opt_level, "verbosity": 0}
    if run.half is not None:
        kwargs["half_dtype"] = run.half
    return amp.initialize(model, optimizer, **kwargs)


def _step(model, optimizer, x: torch.Tensor, y: torch.Tensor) -> float:
    optimizer.zero_grad()
    # O2 casts the model's inputs itself; the loss is taken in fp32 (as apex's examples do).
    loss = torch.nn.functional.mse_loss(model(x).float(), y)
    with amp.scale_loss(loss, optimizer) as scaled_loss:
        scaled_loss.backward()
    optimizer.step()
    return float(loss.detach())


def train(spec: ModelSpec, run: RunSpec, device: torch.device, steps: int) -> RunResult:
    x, y = make_data(spec, device)
    # Pass 1: memory, from an empty start through the first steps.
    with peak_meter(device) as peak:
        model, optimizer = _setup(spec, run, device)
        for _ in range(min(steps, MEMORY_STEPS)):
            _step(model, optimizer, x, y)
        del model, optimizer
    # Pass 2: every step, timed, no tracker.
    model, optimizer = _setup(spec, run, device)
    params = list(model.parameters())
    result = RunResult(
        model=spec.name,
        run=run.label,
        weights_dtype=_short(params[0].dtype),
        weights_bytes=sum(p.numel() * p.element_size() for p in params),
        peak_bytes=peak(),
    )
    for _ in range(steps):
        _sync(device)
        start = time.perf_counter()
        loss = _step(model, optimizer, x, y)
        _sync(device)
        result.step_times.append(time.perf_counter() - start)
        result.losses.append(loss)
    return result


# ------------------------------------------------------------------ report


def loss_table(results: list[RunResult]) -> list[str]:
    """One row per step, one column per run of a model."""
    labels = [r.run for r in results]
    width = max(10, *(len(label) for label in labels))
    lines = ["step  " + "  ".join(label.rjust(width) for label in labels)]
    for i in range(len(results[0].losses)):
        lines.append(f"{i + 1:>4}  " + "  ".join(f"{r.losses[i]:>{width}.5f}" for r in results))
    return lines


RUN_HEADER = ("model", "run", "weights", "weights size", "peak", "step ms", "final loss")
UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def human_bytes(n: int) -> str:
    """``44 B``, ``1.50 KiB``, ``3.96 MiB``: exact enough to compare runs of one model."""
    for unit, size in UNITS:
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def run_table(results: list[RunResult]) -> list[str]:
    rows = [RUN_HEADER] + [
        (
            r.model,
            r.run,
            r.weights_dtype,
            human_bytes(r.weights_bytes),
            human_bytes(r.peak_bytes),
            f"{r.step_ms:.2f}",
            f"{r.losses[-1]:.5f}",
        )
        for r in results
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(RUN_HEADER))]
    return [
        "  ".join(
            v.ljust(w) if i < 3 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths))
        ).rstrip()
        for row in rows
    ]


def write_png(
    path: Path,
    results: list[RunResult],
    specs: list[ModelSpec],
    device: torch.device,
    peak_what: str,
) -> None:
    try:
        import matplotlib  # noqa: PLC0415 - only the PNG needs it
    except ImportError:
        raise SystemExit(
            'error: matplotlib is needed for the PNG: pip install "ampforge[demo]" '
            "(or `make setup`, whose dev extra includes it)"
        ) from None
    matplotlib.use("Agg")  # headless: no display is needed or used
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.ticker import MaxNLocator  # noqa: PLC0415

    fig, axes = plt.subplots(len(specs), 3, figsize=(12, 3.4 * len(specs)), dpi=80, squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, spec in zip(axes, specs):
        mine = [r for r in results if r.model == spec.name]
        names = [r.run for r in mine]
        for i, r in enumerate(mine):
            row[0].plot(
                range(1, len(r.losses) + 1), r.losses, label=r.run, color=colors[i % len(colors)]
            )
        row[0].xaxis.set_major_locator(MaxNLocator(integer=True))
        row[0].set_title(f"{spec.name}: loss", fontsize=10)
        row[0].set_xlabel("step")
        row[0].legend(fontsize=8)
        bar_colors = [colors[i % len(colors)] for i in range(len(mine))]
        unit, size = next(
            ((u, n) for u, n in UNITS if max(r.peak_bytes for r in mine) >= n), ("B", 1)
        )
        row[1].bar(names, [r.peak_bytes / size for r in mine], color=bar_colors)
        row[1].set_title(f"{spec.name}: peak memory ({unit}, {peak_what})", fontsize=10)
        row[2].bar(names, [r.step_ms for r in mine], color=bar_colors)
        row[2].set_title(f"{spec.name}: step time (ms, median)", fontsize=10)
        for ax in row[1:]:
            ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(
        f"amp demo on {device.type}: fp32 vs O1/O2 (torch {torch.__version__})", fontsize=11
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    # The numbers also travel inside the PNG (a tEXt chunk), so the picture says what it shows.
    fig.savefig(
        tmp,
        format="png",
        metadata={
            "Software": None,
            "Title": "amp demo: loss, peak memory, step time",
            "Description": "; ".join(
                f"{r.model} {r.run}: peak {r.peak_bytes} B, "
                f"step {r.step_ms:.3f} ms, final loss {r.losses[-1]:.6g}"
                for r in results
            ),
        },
    )
    plt.close(fig)
    tmp.replace(path)  # never a half-written picture at PATH


# ------------------------------------------------------------------ entry point


def pick_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        npu = getattr(torch, "npu", None)  # torch_npu registers torch.npu
        if npu is not None and npu.is_available():
            return torch.device("npu")
        return torch.device("cpu")
    device = torch.device(name)
    if device.type != "cpu":
        mod = getattr(torch, device.type, None)
        if mod is None or not mod.is_available():
            raise SystemExit(
                f"error: --device {name}: no {device.type} device here "
                "(expected auto, cpu, or a device this torch has)"
            )
    return device


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20, help="training steps per run (default 20)")
    p.add_argument(
        "--device",
        default="auto",
        help="auto (cuda, else npu, else cpu; the default), cpu, cuda, npu, cuda:1",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("build/amp_demo.png"),
        help="the PNG to write (default build/amp_demo.png)",
    )
    p.add_argument("--batch", type=int, default=1024, help="the MLP's batch (default 1024)")
    p.add_argument("--width", type=int, default=128, help="the MLP's hidden width (default 128)")
    p.add_argument("--depth", type=int, default=4, help="the MLP's hidden layers (default 4)")
    args = p.parse_args(argv)
    for name in ("steps", "batch", "width", "depth"):
        if getattr(args, name) < 1:
            p.error(f"--{name} {getattr(args, name)}: expected 1 or more")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    device = pick_device(args.device)
    specs = model_specs(args.batch, args.width, args.depth)
    runs = runs_for(device)
    peak_what = "live tensor bytes" if device.type == "cpu" else "max_memory_allocated"
    print(
        f"device: {device} (torch {torch.__version__}, {torch.get_num_threads()} threads); "
        f"runs: {', '.join(r.label for r in runs)}; {args.steps} steps each"
    )
    results: list[RunResult] = []
    for spec in specs:
        mine = [train(spec, run, device, args.steps) for run in runs]
        results += mine
        print()
        print(f"{spec.name}: {spec.describe} -- loss per step")
        for line in loss_table(mine):
            print(line)
    print()
    print(
        f"per run: weights = the model's parameters as it trains; peak = {peak_what} "
        f"over model set-up and the first {min(args.steps, MEMORY_STEPS)} steps; "
        "step = median step time after the first"
    )
    for line in run_table(results):
        print(line)
    write_png(args.out, results, specs, device, peak_what)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
