"""apex.dump's HookerAndDumper (amp/dump.py): one step's per-child inputs, outputs and
gradients in Ascend's HDF5 layout, read back equal to what the model computed."""
from __future__ import annotations

import sys
from pathlib import Path

import h5py
import pytest
import torch

from amp.dump import HookerAndDumper


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.act = torch.nn.Tanh()
        self.out = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.fc(x)))


def _step(model: torch.nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """One forward/backward, recording what the dump should hold."""
    seen: dict[str, torch.Tensor] = {}
    h = model.fc(x)
    h.retain_grad()
    a = model.act(h)
    a.retain_grad()
    y = model.out(a)
    y.retain_grad()
    y.sum().backward()
    seen.update(fc_out=h.detach(), act_out=a.detach(), out_out=y.detach(),
                d_h=h.grad, d_a=a.grad, d_y=y.grad)
    return seen


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")  # the first layer
def test_dump_holds_ascends_layout_and_the_models_values(tmp_path: Path):
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(5, 4)
    want = _step(model, x)  # the same step without hooks
    model.zero_grad()

    dumper = HookerAndDumper(file_path=str(tmp_path / "run-a_"))
    dumper.register_hooks(model, epoch=1, step=7)
    model(x).sum().backward()
    dumper.remove_hooks()
    assert dumper.file_path == str(tmp_path / "run-a_1-epoch_7-step_dump.hdf5")

    with h5py.File(dumper.file_path, "r") as f:
        groups = list(f)
        # Forward groups in call order, then backward groups in gradient order; one counter.
        assert groups == ["0000_Linear", "0001_Tanh", "0002_Linear",
                          "0003_Linear", "0004_Tanh", "0005_Linear"]
        assert sorted(f["0000_Linear"]) == ["feat_input0", "feat_output"]
        assert sorted(f["0003_Linear"]) == ["grad_input0", "grad_output0"]
        assert f["0000_Linear/feat_input0"].attrs["torch_dtype"] == "torch.float32"
        # The first layer's input needs no gradient: an empty dataset, as Ascend writes None.
        assert f["0005_Linear/grad_input0"].shape == (0,)
        assert f["0005_Linear/grad_input0"].attrs["torch_dtype"] == "None"
    data = dumper.read_h5py_data()
    torch.testing.assert_close(torch.from_numpy(data["0000_Linear/feat_input0"]), x)
    torch.testing.assert_close(torch.from_numpy(data["0000_Linear/feat_output"]), want["fc_out"])
    torch.testing.assert_close(torch.from_numpy(data["0001_Tanh/feat_output"]), want["act_out"])
    torch.testing.assert_close(torch.from_numpy(data["0003_Linear/grad_output0"]), want["d_y"])
    torch.testing.assert_close(torch.from_numpy(data["0003_Linear/grad_input0"]), want["d_a"])
    torch.testing.assert_close(torch.from_numpy(data["0004_Tanh/grad_input0"]), want["d_h"])

    # After remove_hooks nothing more is written; a new registration starts a new file.
    model(x).sum().backward()
    assert len(dumper.read_h5py_data()) == len(data)
    dumper.register_hooks(model, epoch=1, step=8)
    with pytest.raises(RuntimeError, match="remove_hooks"):
        dumper.register_hooks(model, epoch=1, step=9)
    dumper.remove_hooks()
    with h5py.File(dumper.file_path, "r") as f:
        assert list(f) == []


def test_bfloat16_is_stored_as_float32_with_its_dtype(tmp_path: Path):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2)).to(torch.bfloat16)
    dumper = HookerAndDumper(str(tmp_path / "bf16_"))
    dumper.register_hooks(model, 0, 0)
    out = model(torch.ones(1, 2, dtype=torch.bfloat16))
    dumper.remove_hooks()
    with h5py.File(dumper.file_path, "r") as f:
        ds = f["0000_Linear/feat_output"]
        assert ds.dtype == "float32" and ds.attrs["torch_dtype"] == "torch.bfloat16"
        assert torch.equal(torch.from_numpy(ds[()]), out.detach().float())


def test_errors_name_the_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    with pytest.raises(TypeError, match="must be a torch.nn.Module; got str"):
        HookerAndDumper(str(tmp_path)).register_hooks("model", 0, 0)
    monkeypatch.setitem(sys.modules, "h5py", None)  # as if the dump extra were not installed
    with pytest.raises(ImportError, match=r'pip install "ampforge\[dump\]"'):
        HookerAndDumper(str(tmp_path)).register_hooks(Net(), 0, 0)
