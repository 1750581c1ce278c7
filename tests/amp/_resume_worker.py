"""Helper for test_resume.py, run in its own process.

    _resume_worker.py full   LEVELS STEPS SAVE_AT DIR OUT.json [DEVICE]  # train, checkpoint
    _resume_worker.py resume LEVELS STEPS SAVE_AT DIR OUT.json [DEVICE]  # load it, finish

Writes {level: {"losses": [...], "scales": [...], "saved_amp": {...}, "device": ...}} to
OUT.json. DEVICE (default cpu) is torch's default device for the run: "npu" installs the npu
test device (tests/npu/npu_device.py) first, as tests/conftest.py does for half_device tests.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import amp


def build(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(10, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
    )
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def batch(step: int):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(32, 10, generator=g)
    return x, x.sum(dim=1, keepdim=True) * 3.0


def run(mode: str, level: str, steps: int, save_at: int, ckpt: Path) -> dict:
    # A fresh run builds from another seed: everything must come from the checkpoint.
    model, optimizer = build(seed=0 if mode == "full" else 123)
    # A high initial scale and a short window make the scaler skip and grow during the run.
    model, optimizer = amp.initialize(
        model, optimizer, opt_level=level, verbosity=0, dynamic_init_scale=2.0**24, scale_window=4
    )
    start = 0
    if mode == "resume":
        checkpoint = torch.load(ckpt, weights_only=False)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        amp.load_state_dict(checkpoint["amp"])
        start = save_at
    result: dict = {"losses": [], "scales": []}
    for step in range(start, steps):
        if mode == "full" and step == save_at:
            torch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "amp": amp.state_dict(),
                },
                ckpt,
            )
            result["saved_amp"] = amp.state_dict()
        x, y = batch(step)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        result["losses"].append(loss.item())
        result["scales"].append(amp.state_dict()["loss_scaler0"]["loss_scale"])
    result["device"] = next(model.parameters()).device.type
    return result


def main() -> None:
    mode, levels, steps, save_at, folder, out = sys.argv[1:7]
    device = sys.argv[7] if len(sys.argv) > 7 else "cpu"
    if device == "npu":
        sys.path.append(str(Path(__file__).resolve().parents[1] / "npu"))
        import npu_device  # noqa: PLC0415 (after its folder is on sys.path)

        npu_device.install_at_collection()  # before this process's first backward pass
        npu_device.session_device()
    torch.use_deterministic_algorithms(True)
    with torch.device(device):
        results = {
            level: run(mode, level, int(steps), int(save_at), Path(folder) / f"{level}.pt")
            for level in levels.split(",")
        }
    Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
