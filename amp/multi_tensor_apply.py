"""apex's low-level entry point: ``multi_tensor_applier(op, noop_flag, tensor_lists, *args)``
calls ``op(chunk_size, noop_flag, tensor_lists, *args)``, for the ``amp._C.multi_tensor_*``
ops (scale, axpby, l2norm, unscale_l2norm, adam, sgd, lamb, adagrad, novograd), which take
apex's argument order and set ``noop_flag`` to 1 on inf/NaN as apex's do::

    from amp import multi_tensor_applier
    import amp._C as amp_C
    flag = torch.zeros(1, dtype=torch.int)
    multi_tensor_applier(amp_C.multi_tensor_scale, flag, [grads, grads], 1.0 / 128)

The compiled ops take CPU tensors only. When tensors on another device (CUDA, or Ascend's
``npu``) are passed with one of those ops, the call runs amp's pure-torch version of the
same op on that device instead (``amp._apex_ops``: same arguments, same ``noop_flag``
rules; one ``AmpDeviceFallbackWarning`` per device type), as apex code written for its
device expects. Any other callable is called as given.
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Optional

import torch

from . import _apex_ops, _ext
from ._device import KERNEL_DEVICE_TYPE

__all__ = ["MultiTensorApply", "multi_tensor_applier"]


class MultiTensorApply:
    """Callable holding the chunk size handed to every op (the CPU kernels chunk the work
    themselves and ignore it; it is kept for apex's signature). ``available`` tells whether
    the compiled ops (``amp._C``) can be used."""

    def __init__(self, chunk_size: int) -> None:
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(f"MultiTensorApply: chunk_size must be an int >= 1; "
                             f"got {chunk_size!r}")
        self.chunk_size = chunk_size

    @property
    def available(self) -> bool:
        return _ext.available()

    def __call__(self, op: Callable[..., Any], noop_flag_buffer: Any, tensor_lists: Any,
                 *args: Any) -> Any:
        if not callable(op):
            raise TypeError(f"multi_tensor_applier: op must be callable (e.g. "
                            f"amp._C.multi_tensor_scale); got {type(op).__name__}")
        return _for_device(op, tensor_lists)(self.chunk_size, noop_flag_buffer, tensor_lists,
                                             *args)


def _first_device(tensor_lists: Any) -> Optional[torch.device]:
    for tensors in tensor_lists if isinstance(tensor_lists, (list, tuple)) else ():
        for t in tensors if isinstance(tensors, (list, tuple)) else ():
            if isinstance(t, torch.Tensor):
                return t.device
    return None


def _for_device(op: Callable[..., Any], tensor_lists: Any) -> Callable[..., Any]:
    """``op`` itself, or, for one of amp._C's apex ops given non-CPU tensors, its pure-torch
    twin (the compiled op would refuse them)."""
    device = _first_device(tensor_lists)
    if device is None or device.type == KERNEL_DEVICE_TYPE:
        return op
    name = getattr(op, "__name__", "")
    # Only amp._C's own ops (whether or not amp._ext would load the module now).
    compiled = sys.modules.get("amp._C")
    twin = _apex_ops.OPS.get(name)
    if twin is None or compiled is None or getattr(compiled, name, None) is not op:
        return op
    return twin


multi_tensor_applier = MultiTensorApply(2048 * 32)  # apex's default chunk size
