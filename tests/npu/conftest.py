"""Fixtures for tests that run on the `npu` test device (device/README.md).

`npu_backend` is the installed device, `npu` the device to put tensors on.

The device is installed when collection ends, before any test runs, whenever a selected
test uses these fixtures. Not later: autograd sizes its per-device worker threads once per
process, at the first backward pass, from the devices registered then; a device that
appears after that (say, after the tests of tests/amp have run backward) cannot run
backward at all. A build failure there is kept and raised by the fixture, so only the
tests that need the device fail.

Installing renames PrivateUse1 to "npu" and adds `torch.npu` for the rest of the process:
torch allows that once per process, so it is never undone.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import ModuleType

import npu_device
import npu_module
import pytest
import torch
import torch_npu_standin
from npu_device import Installed

_FIXTURES = ("npu_backend", "npu", "torch_npu", "saturating_npu")


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    if any(name in getattr(item, "fixturenames", ()) for item in items for name in _FIXTURES):
        npu_device.install_at_collection()


@pytest.fixture(scope="session")
def npu_backend() -> Installed:
    return npu_device.session_device()


@pytest.fixture(scope="session")
def npu(npu_backend: Installed) -> torch.device:
    return torch.device("npu", 0)


@pytest.fixture
def torch_npu(npu: torch.device, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """``import torch_npu`` finds the device's stand-in (torch_npu_standin.py) during the test:
    amp then asks it which overflow mode the device runs in. The device itself is in inf/NaN
    mode unless the test (or ``saturating_npu``) switches saturation on."""
    module = torch_npu_standin.make()
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    yield module
    npu_module.set_saturation_mode(False)
    npu_module.clear_npu_overflow_flag()


@pytest.fixture
def saturating_npu(torch_npu: ModuleType, npu: torch.device) -> torch.device:
    """The npu device in saturation mode (fp16 overflow gives +-65504 and raises the device's
    overflow flag), with torch_npu saying so; back to inf/NaN mode after the test."""
    npu_module.set_saturation_mode(True)
    npu_module.clear_npu_overflow_flag()
    return npu


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    # The device's cold build counts against CI's time: say what this session paid.
    installed = npu_device.installed()
    if installed is None:
        return
    how = f"built in {installed.build_seconds:.1f}s" if installed.built else "loaded from the cache"
    terminalreporter.write_line(f"npu test device: {how} ({installed.path})")
