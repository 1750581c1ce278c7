"""A ``torch_npu`` module for the `npu` test device: as much of torch_npu as amp looks up
(amp/ascend/saturation.py): ``torch_npu.npu`` is the device module (npu_module.py), with
``npu.utils.is_support_inf_nan`` and ``npu.clear_npu_overflow_flag`` /
``npu.get_npu_overflow_flag``.

Not put in ``sys.modules`` by installing the device: only tests (and worker processes) that
want amp to find torch_npu do so, for their own duration (tests/npu/conftest.py's
``torch_npu`` fixture)."""

from __future__ import annotations

from types import ModuleType

import npu_module


def make() -> ModuleType:
    module = ModuleType("torch_npu")
    module.__doc__ = "the npu test device's stand-in for torch_npu (tests/npu/torch_npu_standin.py)"
    module.npu = npu_module  # type: ignore[attr-defined]
    return module
