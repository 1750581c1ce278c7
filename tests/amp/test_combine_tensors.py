"""amp.combine_tensors (Ascend's apex.contrib.combine_tensors) on the CPU: Ascend's own test
cases (data_ptr arithmetic, computation through the buffer with a mask), plus the edges."""

from __future__ import annotations

import pytest
import torch

from amp.combine_tensors import (
    combine_npu,
    get_aligned_storage_size,
    get_part_combined_tensor,
    is_combined_tensor_valid,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_tensors_move_into_one_buffer_at_aligned_offsets(dtype: torch.dtype) -> None:
    x = torch.zeros((2, 2, 2, 2), dtype=dtype)
    y = torch.zeros((4, 4), dtype=dtype)
    z = torch.zeros((3, 3, 3), dtype=dtype)
    combined = combine_npu([x, y, z])
    assert combined is not None and combined.is_contiguous() and combined.dim() == 1
    assert combined.data_ptr() == x.data_ptr()
    assert x.data_ptr() + get_aligned_storage_size(x) * x.element_size() == y.data_ptr()
    assert y.data_ptr() + get_aligned_storage_size(y) * y.element_size() == z.data_ptr()
    assert combined.numel() == sum(get_aligned_storage_size(t) for t in (x, y, z))
    # Ascend's layout: ceil(numel / 16) * 16 + 32.
    assert [get_aligned_storage_size(t) for t in (x, y, z)] == [48, 48, 64]
    assert (x.shape, y.shape, z.shape) == ((2, 2, 2, 2), (4, 4), (3, 3, 3))


def test_computation_is_shared_both_ways() -> None:
    x, y, z = torch.zeros((2, 2, 2, 2)), torch.zeros((4, 4)), torch.zeros((3, 3, 3))
    combined = combine_npu([x, y, z])
    mask = combine_npu([torch.ones_like(t) for t in (x, y, z)])
    combined += 2  # through the buffer: every part sees it
    assert (x.sum().item(), y.sum().item(), z.sum().item()) == (32, 32, 54)
    for t in (x, y, z):  # through the parts: the buffer sees it
        t.mul_(2)
    assert (combined * mask).sum().item() == 236 == (x.sum() + y.sum() + z.sum()).item()


def test_values_kept_or_not_and_identity_kept() -> None:
    p = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3))
    q = torch.arange(4.0).reshape(2, 2).t()  # non-contiguous: strides are kept
    combine_npu([p, q])
    assert isinstance(p, torch.nn.Parameter) and p.requires_grad
    assert torch.equal(p.detach(), torch.arange(6.0).reshape(2, 3))
    assert q.stride() == (1, 2) and torch.equal(q, torch.arange(4.0).reshape(2, 2).t())
    r = torch.ones(5)
    buffer = combine_npu([r], require_copy_value=False)
    assert r.sum().item() == 0 and buffer is not None and buffer.data_ptr() == r.data_ptr()
    (p * 2).sum().backward()  # autograd still works on the re-pointed parameter
    assert torch.equal(p.grad, torch.full((2, 3), 2.0))


def test_parts_and_validity() -> None:
    a, b = torch.ones(10), torch.ones(20)
    combined = combine_npu([a, b])
    part = get_part_combined_tensor(combined, get_aligned_storage_size(a), 20)
    assert part is not None and part.data_ptr() == b.data_ptr()
    part.fill_(3.0)
    assert b.sum().item() == 60
    assert get_part_combined_tensor(combined, 0, 0) is None
    assert get_part_combined_tensor(None, 0, 4) is None
    with pytest.raises(RuntimeError, match=r"\(index \+ size\)"):
        get_part_combined_tensor(combined, 100, 20)
    assert is_combined_tensor_valid(combined, [a, b])
    assert is_combined_tensor_valid(None, [])
    assert not is_combined_tensor_valid(None, [a])
    assert not is_combined_tensor_valid(combined, [a, torch.ones(20)])  # elsewhere in memory
    assert not is_combined_tensor_valid(combined, [a, None])


def test_bad_input_names_what_was_wrong() -> None:
    assert combine_npu([]) is None
    empty = combine_npu([torch.ones(0)])  # as Ascend: an empty tensor still gets its padding
    assert empty is not None and empty.numel() == 32
    with pytest.raises(RuntimeError, match=r"torch\.float.*int64"):
        combine_npu([torch.ones(3, dtype=torch.int64)])
    with pytest.raises(ValueError, match=r"item 1 is torch\.float16"):
        combine_npu([torch.ones(3), torch.ones(3, dtype=torch.float16)])
    with pytest.raises(TypeError, match="item 0 is a list"):
        combine_npu([[1.0, 2.0]])  # type: ignore[list-item]
