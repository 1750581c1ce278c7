"""`torch.npu` for the test device: the device module torch's generic code looks up by
the backend's name (torch.autocast, GradScaler, torch.manual_seed, the generated
`Tensor.npu()`, `torch.get_device_module("npu")`).

The functions mirror the part of torch_npu's `torch.npu` module that device-agnostic code
calls. They are bound to the compiled extension by `npu_device.install()`.

RNG: the device has no generator of its own. Random ops on npu tensors run through the
CPU fallback and draw from torch's CPU default generator, so the seed and RNG-state
functions here act on that generator (seeding "the npu" therefore also seeds the CPU).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from types import ModuleType
from typing import Optional, Union

import torch

_ext: Optional[ModuleType] = None

DeviceLike = Union[int, str, torch.device, None]


def _bind(ext: ModuleType) -> None:
    global _ext
    _ext = ext


def _c() -> ModuleType:
    if _ext is None:
        raise RuntimeError("the npu test device is not installed (npu_device.install())")
    return _ext


def _index(device: DeviceLike) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    dev = torch.device(device)
    if dev.type != "npu":
        raise ValueError(f"expected an npu device, got {dev}")
    return current_device() if dev.index is None else dev.index


def is_available() -> bool:
    return _ext is not None


def is_initialized() -> bool:
    return _ext is not None


def _lazy_init() -> None:
    _c()


def _is_in_bad_fork() -> bool:
    # No device runtime to poison across fork(): the memory is plain host memory.
    return False


def device_count() -> int:
    return int(_c().device_count())


def current_device() -> int:
    return int(_c().current_device())


def set_device(device: DeviceLike) -> None:
    _c().set_device(_index(device))


@contextlib.contextmanager
def device(dev: DeviceLike) -> Iterator[None]:
    """Make `dev` the current npu device inside the block (like torch.cuda.device)."""
    previous = current_device()
    set_device(dev)
    try:
        yield
    finally:
        set_device(previous)


def synchronize(device: DeviceLike = None) -> None:
    # Every op completes before it returns: nothing is ever queued.
    _index(device)


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.float16, torch.bfloat16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


# --- autocast's state for npu --------------------------------------------------------------
# torch.autocast("npu") on torch < 2.4 keeps no state for a PrivateUse1 device itself: it asks
# the backend's module for these four (torch_npu has them), which the device answers from
# torch's own per-device autocast state (device/npu_device.cpp, op_autocast_enabled).


# They are the device's dispatcher ops, so under a TorchDispatchMode (a test's op counter) each
# call would reach the mode, which runs it inside a guard that puts the thread's dispatch keys
# back on return -- taking the autocast switch with them (on torch 2.1 autocast then stayed on
# after the mode ended). Called with Python dispatch off, they go straight to the device.
def is_autocast_enabled() -> bool:
    with torch._C._DisableTorchDispatch():
        return bool(_c().autocast_enabled())


def set_autocast_enabled(enabled: bool) -> None:
    with torch._C._DisableTorchDispatch():
        _c().set_autocast_enabled(bool(enabled))


def get_autocast_dtype() -> torch.dtype:
    with torch._C._DisableTorchDispatch():
        return _c().autocast_dtype().dtype


def set_autocast_dtype(dtype: torch.dtype) -> None:
    with torch._C._DisableTorchDispatch():
        _c().set_autocast_dtype(dtype)


def manual_seed(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


def seed() -> None:
    torch.default_generator.seed()


def seed_all() -> None:
    torch.default_generator.seed()


def initial_seed() -> int:
    return int(torch.default_generator.initial_seed())


def get_rng_state(device: DeviceLike = None) -> torch.Tensor:
    _index(device)
    return torch.default_generator.get_state()


def set_rng_state(new_state: torch.Tensor, device: DeviceLike = None) -> None:
    _index(device)
    torch.default_generator.set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def half_in_fp32_calls() -> int:
    """How many float16 ops the device has computed as float32 arithmetic with float16 results,
    because this torch's CPU has no float16 kernel for them (torch 2.1: matrix products,
    convolutions, softmax, the norms, ...). Always 0 where the CPU has them all."""
    return int(_c().half_in_fp32_calls())


def memory_allocated(device: DeviceLike = None) -> int:
    """Bytes held by live npu tensors (all devices: the test device has one host pool)."""
    _index(device)
    return int(_c().live_bytes())


# --- saturation mode (device/npu_device.cpp) -----------------------------------------------
# Where torch_npu has them: torch_npu.npu.utils.is_support_inf_nan, and
# torch_npu.npu.clear_npu_overflow_flag / get_npu_overflow_flag (torch_npu_standin.py makes a
# `torch_npu` whose `npu` is this module).


def set_saturation_mode(on: bool) -> None:
    """The test device's own switch (torch_npu has none: the hardware decides). On: fp16
    overflow saturates to +-65504 (every float type to its largest value, NaN to 0) and
    raises the overflow flag, as on Ascend hardware without inf/NaN support."""
    _c().set_saturation_mode(bool(on))


def is_support_inf_nan() -> bool:
    return not bool(_c().saturation_mode())


def get_npu_overflow_flag() -> bool:
    return bool(_c().overflow_flag())


def clear_npu_overflow_flag() -> None:
    _c().clear_overflow_flag()


# torch_npu.npu.utils: the submodule torch_npu keeps is_support_inf_nan in.
utils = ModuleType(f"{__name__}.utils")
utils.is_support_inf_nan = is_support_inf_nan  # type: ignore[attr-defined]
utils.get_npu_overflow_flag = get_npu_overflow_flag  # type: ignore[attr-defined]
utils.clear_npu_overflow_flag = clear_npu_overflow_flag  # type: ignore[attr-defined]
