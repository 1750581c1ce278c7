"""``python -m amp.selftest``: is this installation of amp whole?

Checks, in one process, that the compiled kernels (``amp._C``) load with the torch installed
next to them, that the quick-start loop trains with a fused optimizer at O1, and that the
kernels give what amp's pure-torch reference path gives for the same steps. Prints one line
saying so and exits 0; otherwise says what failed and exits 1.

The builder runs it as this project's ``test-command`` (pyproject.toml,
``[tool.cibuildwheel]``) in every cell's verification environment, so each wheel passes it
before it is published; after ``pip install ampforge`` it answers the same question on the
user's machine.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any, Callable, Optional

#: Steps of the loop; enough for the loss to halve, few enough for an emulated CPU.
STEPS = 20
#: Largest difference allowed between fused and reference parameters after STEPS steps.
TOLERANCE = 1e-5


# torch comes in as an argument: this module imports it only when the checks run.
def _model(torch: Any) -> Any:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))


def _cpu_half(torch: Any, autocast_supports: Callable[[str, Any], bool]) -> Any:
    """The half type O1 runs in on this CPU: fp16 where the CPU's autocast takes it, else
    bfloat16 (torch 2.1's CPU autocast takes nothing else); None where neither multiplies
    matrices the size of the loop's (torch 2.1's aarch64 oneDNN refuses a bfloat16 matmul on a
    CPU without bfloat16 instructions: "could not create a primitive descriptor")."""
    for dtype in (torch.float16, torch.bfloat16):
        if not autocast_supports("cpu", dtype):
            continue
        try:  # the loop's own model, forward and backward (oneDNN picks kernels per shape)
            probe = _model(torch)
            with torch.autocast("cpu", dtype=dtype):
                out = probe(torch.randn(128, 16))
            out.float().sum().backward()
        except RuntimeError:
            continue
        return dtype
    return None


def _train(steps: int) -> tuple[list[float], list]:
    import torch  # noqa: PLC0415

    import amp  # noqa: PLC0415
    import amp.optimizers  # noqa: PLC0415
    from amp._torch_compat import autocast_supports  # noqa: PLC0415

    half = _cpu_half(torch, autocast_supports)
    torch.manual_seed(0)
    model = _model(torch)
    optimizer = amp.optimizers.FusedAdam(model.parameters(), lr=1e-2, weight_decay=0.01)
    if half is None:  # this CPU's torch multiplies no half type: the kernels still get checked
        model, optimizer = amp.initialize(model, optimizer, opt_level="O0", verbosity=0)
    else:
        model, optimizer = amp.initialize(
            model, optimizer, opt_level="O1", half_dtype=half, verbosity=0
        )
    x = torch.randn(128, 16)
    y = x[:, :1] * 2.0 + 0.5
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        with amp.scale_loss(loss, optimizer) as scaled:
            scaled.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses, [p.detach().clone() for p in model.parameters()]


def run(steps: int = STEPS) -> dict:
    """The checks; returns the report, raises SystemExit with the reason on a failure."""
    start = time.monotonic()
    import torch  # noqa: PLC0415

    import amp  # noqa: PLC0415
    from amp import _ext  # noqa: PLC0415

    if not _ext.available():
        raise SystemExit(
            f"amp._C cannot be used with torch {torch.__version__} (see the "
            "warning above); amp would run on its pure-torch fallback"
        )
    import amp._C  # noqa: PLC0415 (the module itself must import)

    losses, fused = _train(steps)
    if not all(math.isfinite(v) for v in losses) or not losses[-1] < losses[0] * 0.5:
        raise SystemExit(f"the quick-start loop did not train: losses {losses[::5]}")
    previous = os.environ.get("AMP_DISABLE_EXTENSION")
    os.environ["AMP_DISABLE_EXTENSION"] = "1"
    _ext.reset()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, reference = _train(steps)
    finally:
        if previous is None:
            del os.environ["AMP_DISABLE_EXTENSION"]
        else:
            os.environ["AMP_DISABLE_EXTENSION"] = previous
        _ext.reset()
    diff = max(float((a - b).abs().max()) for a, b in zip(fused, reference))
    if not diff < TOLERANCE:
        raise SystemExit(
            f"the compiled kernels and the reference path differ by {diff:.3g} "
            f"after {steps} steps (allowed: {TOLERANCE:g})"
        )
    from amp._torch_compat import autocast_supports  # noqa: PLC0415

    half = _cpu_half(torch, autocast_supports)
    return {
        "amp": amp.__version__,
        "torch": torch.__version__,
        "isa": _ext.isa(),
        "opt_level": "O1" if half is not None else "O0 (no half matmul on this CPU)",
        "steps": steps,
        "losses": [losses[0], losses[-1]],
        "max_abs_diff_vs_reference": diff,
        "seconds": round(time.monotonic() - start, 2),
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in args
    try:
        report = run()
    except SystemExit as exc:
        print(f"amp selftest: FAILED: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(report, sort_keys=True))
    else:
        print(
            f"amp selftest: ok -- amp {report['amp']} with torch {report['torch']}, amp._C "
            f"({report['isa']} kernels); FusedAdam {report['opt_level']} loss "
            f"{report['losses'][0]:.4f} -> "
            f"{report['losses'][1]:.4f} in {report['steps']} steps; max |fused - reference| "
            f"{report['max_abs_diff_vs_reference']:.1e}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
