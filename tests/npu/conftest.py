"""Fixtures for tests that run on the `npu` test device (device/README.md).

`npu_backend` builds (or loads from the cache) and installs the device once per session;
`npu` is the device to put tensors on. Installing renames PrivateUse1 to "npu" and adds
`torch.npu` for the rest of the process: torch allows that once per process, so it is
never undone.
"""
from __future__ import annotations

from typing import Optional

import pytest
import torch
from npu_device import Installed, install

_installed: Optional[Installed] = None


@pytest.fixture(scope="session")
def npu_backend(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    global _installed
    # The cache outside the repository is only an optimisation: where it cannot be
    # written, the build goes to this session's temporary folder instead.
    _installed = install(fallback_root=tmp_path_factory.getbasetemp() / "npu-device")
    return _installed


@pytest.fixture(scope="session")
def npu(npu_backend: Installed) -> torch.device:
    return torch.device("npu", 0)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    # The device's cold build counts against CI's time: say what this session paid.
    if _installed is None:
        return
    how = (
        f"built in {_installed.build_seconds:.1f}s"
        if _installed.built
        else "loaded from the cache"
    )
    terminalreporter.write_line(f"npu test device: {how} ({_installed.path})")
