"""Combined tensors (Apex for Ascend's ``apex.contrib.combine_tensors``), on any device.

``combine_npu(tensors)`` allocates one contiguous 1-D buffer and re-points every tensor into it,
at consecutive offsets aligned as Ascend aligns them (``get_aligned_storage_size``), keeping each
tensor's shape, strides and (by default) values. The tensors and the buffer then share memory:
an operation on the buffer is one operation on all of them (``combined.mul_(s)`` scales every
gradient at once), and a write through either side is seen by the other.

Ascend moves the data pointer in C++; here torch's public storage API does the same thing
(``Tensor.set_(storage, offset, size, stride)``), so it works on CPU, CUDA and out-of-tree
devices such as ``npu`` alike. The padding between tensors is zero-filled and stays zero under
the operations amp applies (scaling, zeroing, optimizer updates whose states start at zero).

Example (runs on CPU)::

    >>> import torch
    >>> from amp.combine_tensors import combine_npu, get_aligned_storage_size
    >>> x, y = torch.ones(2, 2), torch.full((3,), 2.0)
    >>> combined = combine_npu([x, y])
    >>> combined.numel() == get_aligned_storage_size(x) + get_aligned_storage_size(y)
    True
    >>> combined.mul_(10.0)[:1]
    tensor([10.])
    >>> x.sum().item(), y.sum().item()
    (40.0, 60.0)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Optional

import torch

__all__ = [
    "change_data_ptr",
    "combine_npu",
    "flatten",
    "get_aligned_storage_size",
    "get_part_combined_tensor",
    "is_combined_tensor_valid",
    "unflatten",
]

# Ascend's layout: every tensor starts on a 16-element boundary and is followed by 32 elements
# of padding (128 bytes for fp32), which its kernels rely on. Kept so that offsets computed by
# code written for Ascend (``data_ptr`` arithmetic) hold here too.
ALIGN = 16
PAD = 32
# Ascend supports float32 and float16; bfloat16 is this project's half type as well.
COMBINABLE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _storage_span(tensor: torch.Tensor) -> int:
    """Elements of storage the tensor addresses (its numel when contiguous), from its offset."""
    if tensor.numel() == 0:
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))


def get_aligned_storage_size(tensor: torch.Tensor, align: int = ALIGN, pad: int = PAD) -> int:
    """The tensor's slot in a combined buffer, in elements: ``ceil(span / align) * align + pad``.

    ``span`` is the storage the tensor addresses (its numel for a contiguous tensor)."""
    if tensor.dtype not in COMBINABLE_DTYPES:
        raise RuntimeError(
            "Fused optimizers only support weights and grads with dtype torch.float, "
            f"torch.float16 or torch.bfloat16; got {tensor.dtype}."
        )
    return math.ceil(_storage_span(tensor) / align) * align + pad


def _check_same_kind(tensors: Sequence[torch.Tensor]) -> None:
    first = tensors[0]
    for i, tensor in enumerate(tensors):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"combine_npu: item {i} is a {type(tensor).__name__}, not a tensor")
        if tensor.dtype != first.dtype or tensor.device != first.device:
            raise ValueError(
                f"combine_npu: all tensors must share one dtype and device; item 0 is "
                f"{first.dtype} on {first.device}, item {i} is {tensor.dtype} on {tensor.device}"
            )


def repoint(
    tensor: torch.Tensor, flat: torch.Tensor, offset: int, like: torch.Tensor, copy: bool
) -> None:
    """Re-point ``tensor`` at ``flat``'s memory from element ``offset``, with ``like``'s shape
    and strides, keeping its values when ``copy``. ``set_`` keeps the tensor object (an
    optimizer or autograd may hold it)."""
    old = tensor.detach().clone() if copy else None
    tensor.set_(flat.untyped_storage(), offset, like.shape, like.stride())
    if old is not None:
        tensor.copy_(old)


@torch.no_grad()
def combine_with_offsets(
    tensors: Sequence[torch.Tensor], require_copy_value: bool = True
) -> tuple[Optional[torch.Tensor], list[int]]:
    """``combine_npu``, also returning where each tensor starts in the buffer (in elements)."""
    tensors = list(tensors)
    if not tensors:
        return None, []
    _check_same_kind(tensors)
    sizes = [get_aligned_storage_size(t) for t in tensors]
    if sum(sizes) == 0:
        return None, []
    first = tensors[0]
    combined = torch.zeros(sum(sizes), dtype=first.dtype, device=first.device)
    offsets, offset = [], 0
    for tensor, size in zip(tensors, sizes):
        repoint(tensor, combined, offset, tensor, require_copy_value)
        offsets.append(offset)
        offset += size
    return combined, offsets


def combine_npu(
    list_of_tensor: Sequence[torch.Tensor], require_copy_value: bool = True
) -> Optional[torch.Tensor]:
    """Move ``list_of_tensor`` into one new contiguous 1-D buffer and return the buffer.

    Each tensor keeps its identity (the same Python object, Parameters included), shape and
    strides; its storage becomes a slot of the buffer, slots following each other at
    ``get_aligned_storage_size`` elements. With ``require_copy_value=False`` the values are not
    copied (the tensors read zeros afterwards): for buffers that are about to be overwritten.
    Returns None when there is nothing to combine (no tensors, or only empty ones)."""
    return combine_with_offsets(list_of_tensor, require_copy_value)[0]


def get_part_combined_tensor(
    combined_tensor: Optional[torch.Tensor], index: int, size: int
) -> Optional[torch.Tensor]:
    """A 1-D view of ``size`` elements of ``combined_tensor`` starting at element ``index``
    (shares its memory); None when there is no buffer or ``size`` is 0."""
    if combined_tensor is None or size == 0:
        return None
    total = combined_tensor.numel()
    if index < 0 or size < 0 or index + size > total:
        raise RuntimeError(
            f"(index + size) ({index + size}) > the combined tensor's storage size ({total})"
        )
    return combined_tensor.view(-1).narrow(0, index, size)


def is_combined_tensor_valid(
    combined_tensor: Optional[torch.Tensor], list_of_tensor: Sequence[Optional[torch.Tensor]]
) -> bool:
    """True when every tensor of the list still lives inside ``combined_tensor``'s memory (an
    empty list is valid; a missing buffer or a tensor that was replaced or moved is not)."""
    if len(list_of_tensor) == 0:
        return True
    if combined_tensor is None:
        return False
    start = combined_tensor.data_ptr()
    end = start + combined_tensor.numel() * combined_tensor.element_size()
    for tensor in list_of_tensor:
        if tensor is None or not start <= tensor.data_ptr() < end:
            return False
    return True


# --- the compiled helpers Ascend's code imports as top-level modules -------------------------
# (``from change_data_ptr import change_data_ptr``, ``import apex_C``: amp/_shim serves both
# names with these functions.)


def change_data_ptr(des: torch.Tensor, src: torch.Tensor, offset: int) -> None:
    """Apex for Ascend's ``change_data_ptr(des, src, offset)``: ``des`` now lives in ``src``'s
    storage, from element ``offset`` of it, keeping its shape, strides and storage offset;
    its values become what is there (nothing is copied). Ascend moves the storage's data
    pointer in C++, so every tensor sharing ``des``'s old storage moves with it; here ``des``
    alone is re-pointed (``Tensor.set_``), which also keeps the old storage alive for them."""
    if not isinstance(des, torch.Tensor) or not isinstance(src, torch.Tensor):
        raise TypeError("change_data_ptr(des, src, offset) takes two tensors and an int")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"change_data_ptr: offset must be an int >= 0; got {offset!r}")
    if des.dtype != src.dtype or des.device != src.device:
        raise ValueError(
            f"change_data_ptr: des and src must share dtype and device; des is {des.dtype} on "
            f"{des.device}, src is {src.dtype} on {src.device}"
        )
    start = offset + des.storage_offset()
    available = src.untyped_storage().nbytes() // src.element_size()
    if start + _storage_span(des) > available:
        raise RuntimeError(
            f"change_data_ptr: des needs elements [{start}, {start + _storage_span(des)}) of "
            f"src's storage, which has {available}"
        )
    with torch.no_grad():
        des.set_(src.untyped_storage(), start, des.shape, des.stride())


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """apex_C's ``flatten``: the tensors' elements one after the other in a new 1-D tensor (one
    tensor: a view of it when it is contiguous, as apex_C's). No alignment or padding, unlike
    ``combine_npu``; the tensors keep their own memory."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("apex_C.flatten: expected a non-empty list of tensors")
    if len(tensors) == 1:
        return tensors[0].contiguous().view(-1)
    return torch.cat([t.contiguous().view(-1) for t in tensors])


def unflatten(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """apex_C's ``unflatten``: views of ``flat`` shaped like ``tensors``, in order (what
    ``flatten(tensors)`` laid out); an empty tensor gets a new empty one."""
    tensors = list(tensors)
    needed = sum(t.numel() for t in tensors)
    if flat.dim() != 1 or flat.numel() != needed:
        raise ValueError(
            f"apex_C.unflatten: flat must be 1-D with {needed} elements (the tensors' total); "
            f"got shape {tuple(flat.shape)}"
        )
    out, offset = [], 0
    for tensor in tensors:
        if tensor.numel() == 0:
            out.append(torch.empty(0, dtype=flat.dtype, device=flat.device))
            continue
        out.append(flat.narrow(0, offset, tensor.numel()).view(tensor.shape))
        offset += tensor.numel()
    return out
