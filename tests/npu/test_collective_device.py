"""Where amp reduces its overflow and master-sync flags under torch.distributed
(amp/_device.py: collective_device): wherever the process group's backend takes the tensor.
A real single-process gloo group on the CPU; backends that take only an accelerator (NCCL,
torch_npu's HCCL) are given by their registered device types."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from amp._device import _backend_device_types, collective_device
from amp.scaler import any_rank_overflowed


def test_gloo_reduces_an_npu_flag_on_the_cpu(npu: torch.device, one_rank_gloo: None) -> None:
    assert collective_device(torch.device("npu", 0)) == torch.device("cpu")
    assert collective_device(torch.device("cpu")) == torch.device("cpu")
    # gloo cannot reduce npu tensors: the flag must travel to the CPU for the all-reduce.
    assert any_rank_overflowed(torch.ones(1, device=npu)) is True
    assert any_rank_overflowed(torch.zeros(1, device=npu)) is False


def test_accelerator_only_backend_gets_its_device(
    npu: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As torch_npu registers "hccl": a backend whose only device type is npu.
    monkeypatch.setitem(dist.Backend.backend_capability, "hccl", ["npu"])
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "hccl")
    try:
        torch.npu.set_device(1)
        assert collective_device(torch.device("cpu")) == torch.device("npu", 1)
        assert collective_device(torch.device("npu", 0)) == torch.device("npu", 1)
    finally:
        torch.npu.set_device(0)


def test_backend_device_types() -> None:
    assert _backend_device_types("cpu:gloo,npu:hccl") == ["cpu", "npu"]
    assert "cpu" in _backend_device_types("gloo")
    assert _backend_device_types("nccl") == ["cuda"]
    assert _backend_device_types("no-such-backend") == []
