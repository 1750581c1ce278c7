"""Helper for test_saturation.py: one rank of a gloo group training on the `npu` test device in
saturation mode (fp16 overflow saturates and raises the device's overflow flag).

    _saturation_worker.py RANK WORLD_SIZE RENDEZVOUS_FILE OPT_LEVELS OUT.json

At step SATURATE only the last rank gets inputs large enough to overflow its fp16 gradients:
they saturate (finite), so only its device flag knows, and only amp's agreement on the verdict
can tell the other ranks. Per opt level (OPT_LEVELS is comma-separated), two fp16 runs:
"alone" (each rank its own model, no averaging: gloo cannot reduce npu tensors for
DistributedDataParallel) and "combine_ddp" (NpuFusedSGD with combine_grad/combine_ddp, whose
all-reduce stages the buffers through the CPU: after it every rank's gradients hold the
saturated rank's share, still finite). Writes, per run and step: the loss scale, whether
the masters changed, whether this rank's own device flag was raised and whether its
gradients were finite.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "amp"))  # _gloo_group: the ranks' group, torn down whole

import npu_device  # noqa: E402
import npu_module  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import torch_npu_standin  # noqa: E402
from _gloo_group import gloo_group  # noqa: E402

STEPS = 5
SATURATE = 2


def train(level: str, rank: int, world: int, combine: bool) -> dict:
    import amp  # noqa: PLC0415
    import amp.optimizers  # noqa: PLC0415
    from amp._amp_state import _amp_state  # noqa: PLC0415

    _amp_state.opt_properties = None
    _amp_state.loss_scalers = []
    npu = torch.device("npu", 0)
    torch.manual_seed(rank)  # combine_ddp broadcasts rank 0's weights at initialize
    model = torch.nn.Linear(10, 1).to(npu)
    make = amp.optimizers.NpuFusedSGD if combine else torch.optim.SGD
    optimizer = make(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = amp.initialize(
        model,
        optimizer,
        opt_level=level,
        verbosity=0,
        dynamic_init_scale=2.0**12,
        combine_grad=combine or None,
        combine_ddp=combine or None,
    )
    assert _amp_state.loss_scalers[0].mode == "saturation"
    g = torch.Generator().manual_seed(100 + rank)
    out: dict[str, list] = {"scales": [], "changed": [], "own_flag": [], "grads_finite": []}
    for step in range(STEPS):
        x = torch.randn(32, 10, generator=g)
        if step == SATURATE and rank == world - 1:
            x = x * 300.0  # fp16 gradients beyond 65504 on this rank only
        y = x.sum(dim=1, keepdim=True)
        before = [p.detach().clone() for p in amp.master_params(optimizer)]
        optimizer.zero_grad()
        with amp.scale_loss(F.mse_loss(model(x.to(npu)), y.to(npu)), optimizer) as scaled:
            scaled.backward()
            own_flag = npu_module.get_npu_overflow_flag()  # before amp reads it at exit
        grads = [p.grad for p in amp.master_params(optimizer) if p.grad is not None]
        out["grads_finite"].append(all(bool(torch.isfinite(t).all()) for t in grads))
        out["own_flag"].append(own_flag)
        optimizer.step()
        out["scales"].append(_amp_state.loss_scalers[0].loss_scale())
        after = list(amp.master_params(optimizer))
        out["changed"].append(any(not torch.equal(a, b) for a, b in zip(before, after)))
    out["checksum"] = [p.detach().double().sum().item() for p in model.parameters()]
    return out


def main() -> None:
    rank, world, rendezvous, levels, out = sys.argv[1:6]
    npu_device.install(fallback_root=Path(tempfile.gettempdir()) / "ampforge-npu-device")
    sys.modules["torch_npu"] = torch_npu_standin.make()
    npu_module.set_saturation_mode(True)
    # The group is gone, its threads joined, before this rank exits (tests/amp/_gloo_group.py:
    # a group outliving destroy_process_group aborted ranks at exit, #40).
    with gloo_group(int(rank), int(world), rendezvous):
        results = {
            level: {
                "alone": train(level, int(rank), int(world), False),
                "combine_ddp": train(level, int(rank), int(world), True),
            }
            for level in levels.split(",")
        }
        Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
