"""apex.dump's HookerAndDumper (amp/dump.py): one step's per-child inputs, outputs and
gradients in Ascend's HDF5 layout, read back equal to what the model computed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

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
    seen.update(
        fc_out=h.detach(),
        act_out=a.detach(),
        out_out=y.detach(),
        d_h=h.grad,
        d_a=a.grad,
        d_y=y.grad,
    )
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
        assert groups == [
            "0000_Linear",
            "0001_Tanh",
            "0002_Linear",
            "0003_Linear",
            "0004_Tanh",
            "0005_Linear",
        ]
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
    with pytest.raises(TypeError, match=r"must be a torch\.nn\.Module; got str"):
        HookerAndDumper(str(tmp_path)).register_hooks("model", 0, 0)
    monkeypatch.setitem(sys.modules, "h5py", None)  # as if the dump extra were not installed
    with pytest.raises(ImportError, match=r'pip install "ampforge\[dump\]"'):
        HookerAndDumper(str(tmp_path)).register_hooks(Net(), 0, 0)


class ResNetStem(torch.nn.Module):
    """ResNet's first layers: ``bn1`` is followed by ``ReLU(inplace=True)``, which modifies
    bn1's output in place (torch's full backward hooks refuse that)."""

    def __init__(self, inplace: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = torch.nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(4)
        self.relu = torch.nn.ReLU(inplace=inplace)
        self.fc = torch.nn.Linear(4 * 5 * 5, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.relu(self.bn1(self.conv1(x))).flatten(1))


@pytest.mark.filterwarnings("ignore:Full backward hook is firing")  # the reference's conv1
def test_a_module_followed_by_an_inplace_relu_is_dumped(tmp_path: Path):
    x = torch.randn(2, 3, 5, 5)
    # What the gradients should be: torch's full backward hooks, on the same model with an
    # out-of-place ReLU (the same values; only the in-place one makes those hooks raise).
    want: dict[str, tuple] = {}

    def record(name: str) -> Any:
        def hook(module: torch.nn.Module, grad_input: tuple, grad_output: tuple) -> None:
            want[name] = (grad_input, grad_output)

        return hook

    ref = ResNetStem(inplace=False)
    for name, child in ref.named_children():
        child.register_full_backward_hook(record(name))
    ref(x).sum().backward()

    model = ResNetStem()
    with pytest.raises(RuntimeError, match="is a view and is being modified inplace"):
        plain = ResNetStem()
        plain.bn1.register_full_backward_hook(lambda m, gi, go: None)
        plain(x).sum().backward()
    dumper = HookerAndDumper(file_path=str(tmp_path / "stem_"))
    dumper.register_hooks(model, epoch=0, step=0)
    model(x).sum().backward()
    dumper.remove_hooks()
    data = dumper.read_h5py_data()
    # Forward groups 0-3 (conv1, bn1, relu, fc), then backward in gradient order.
    assert sorted({k.split("/")[0] for k in data}) == [
        "0000_Conv2d",
        "0001_BatchNorm2d",
        "0002_ReLU",
        "0003_Linear",
        "0004_Linear",
        "0005_ReLU",
        "0006_BatchNorm2d",
        "0007_Conv2d",
    ]
    for group, name in (
        ("0004_Linear", "fc"),
        ("0005_ReLU", "relu"),
        ("0006_BatchNorm2d", "bn1"),
        ("0007_Conv2d", "conv1"),
    ):
        grad_input, grad_output = want[name]
        torch.testing.assert_close(torch.from_numpy(data[f"{group}/grad_output0"]), grad_output[0])
        if grad_input[0] is None:
            assert data[f"{group}/grad_input0"].shape == (0,)
        else:
            torch.testing.assert_close(
                torch.from_numpy(data[f"{group}/grad_input0"]), grad_input[0]
            )
    # The dump changes nothing in the step itself.
    for got, ref_param in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(got.grad, ref_param.grad)
    assert "_amp_dump_call" not in vars(model.bn1)  # remove_hooks leaves nothing behind
