"""apex's low-level entry point: ``multi_tensor_applier(op, noop_flag, tensor_lists, *args)``
calls ``op(chunk_size, noop_flag, tensor_lists, *args)``, for the ``amp._C.multi_tensor_*``
ops (scale, axpby, l2norm, unscale_l2norm, adam, sgd, lamb, adagrad, novograd), which take
apex's argument order and set ``noop_flag`` to 1 on inf/NaN as apex's do::

    from amp import multi_tensor_applier
    import amp._C as amp_C
    flag = torch.zeros(1, dtype=torch.int)
    multi_tensor_applier(amp_C.multi_tensor_scale, flag, [grads, grads], 1.0 / 128)

Those ops serve every device (``amp.kernels.apex_ops``, apex's conventions written once): CPU
tensors run the compiled kernels, tensors on another device (CUDA, or Ascend's ``npu``) amp's
pure-torch version of the same op on that device (one ``AmpDeviceFallbackWarning`` per device
type), as apex code written for its device expects. Any other callable is called as given.
"""

from __future__ import annotations

from typing import Any, Callable

from . import _ext

__all__ = ["MultiTensorApply", "multi_tensor_applier"]


class MultiTensorApply:
    """Callable holding the chunk size handed to every op (the CPU kernels chunk the work
    themselves and ignore it; it is kept for apex's signature). ``available`` tells whether
    the compiled ops (``amp._C``) can be used."""

    def __init__(self, chunk_size: int) -> None:
        if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
            raise ValueError(
                f"MultiTensorApply: chunk_size must be an int >= 1; got {chunk_size!r}"
            )
        self.chunk_size = chunk_size

    @property
    def available(self) -> bool:
        return _ext.available()

    def __call__(
        self, op: Callable[..., Any], noop_flag_buffer: Any, tensor_lists: Any, *args: Any
    ) -> Any:
        if not callable(op):
            raise TypeError(
                f"multi_tensor_applier: op must be callable (e.g. "
                f"amp._C.multi_tensor_scale); got {type(op).__name__}"
            )
        return op(self.chunk_size, noop_flag_buffer, tensor_lists, *args)


multi_tensor_applier = MultiTensorApply(2048 * 32)  # apex's default chunk size
