"""Bad input gives a clear Python exception naming the list and the problem, on every
backend, and never a crash or a silent wrong result."""

from __future__ import annotations

import pytest
import torch

from amp.kernels import ops as mt


def _adam(grads, params, m=None, v=None, models=None):
    m = m if m is not None else [torch.zeros_like(p) for p in params]
    v = v if v is not None else [torch.zeros_like(p) for p in params]
    mt.adam(
        grads,
        params,
        m,
        v,
        models,
        lr=1e-3,
        beta1=0.9,
        beta2=0.999,
        eps=1e-8,
        step=1,
        adam_w_mode=True,
    )


def test_empty_lists(backend):
    with pytest.raises(ValueError, match="inputs is an empty list"):
        mt.scale([], [], 1.0)
    with pytest.raises(ValueError, match="grads is an empty list"):
        _adam([], [])


def test_length_mismatch(backend):
    with pytest.raises(ValueError, match=r"outputs has 1 tensors; expected 2"):
        mt.scale([torch.ones(3), torch.ones(4)], [torch.ones(3)], 1.0)
    with pytest.raises(ValueError, match=r"params has 1 tensors; expected 2"):
        _adam([torch.ones(3), torch.ones(4)], [torch.ones(3)], m=[], v=[])


def test_size_mismatch(backend):
    with pytest.raises(ValueError, match=r"outputs\[1\] has 5 elements; expected 4"):
        mt.scale([torch.ones(3), torch.ones(4)], [torch.ones(3), torch.ones(5)], 1.0)


def test_mixed_dtypes_in_one_list(backend):
    with pytest.raises(TypeError, match=r"inputs\[1\] has dtype .*one list must share one dtype"):
        mt.scale([torch.ones(3), torch.ones(3, dtype=torch.float16)], [torch.ones(3)] * 2, 1.0)


def test_unsupported_dtype(backend):
    with pytest.raises(TypeError, match=r"tensors\[0\] has dtype .*expected float32"):
        mt.l2norm([torch.ones(3, dtype=torch.float64)])
    with pytest.raises(TypeError, match=r"inputs\[0\] has dtype"):
        mt.scale([torch.ones(3, dtype=torch.int32)], [torch.ones(3)], 1.0)


def test_non_contiguous(backend):
    t = torch.ones(4, 6).t()
    with pytest.raises(ValueError, match=r"params\[0\] is not contiguous"):
        _adam([torch.ones(24)], [t])


def test_mixed_devices(backend):
    with pytest.raises(ValueError, match=r"inputs\[1\] is on meta"):
        mt.scale([torch.ones(3), torch.ones(3, device="meta")], [torch.ones(3)] * 2, 1.0)


def test_half_model_copy_needs_fp32_master(backend):
    p = [torch.ones(3, dtype=torch.bfloat16)]
    with pytest.raises(TypeError, match=r"params\[0\].*"):
        _adam([torch.ones(3)], p, models=[torch.ones(3, dtype=torch.bfloat16)])


def test_bad_step_and_arg(backend):
    with pytest.raises(ValueError, match="step must be >= 1"):
        mt.adam(
            [torch.ones(1)],
            [torch.ones(1)],
            [torch.ones(1)],
            [torch.ones(1)],
            lr=1.0,
            beta1=0.9,
            beta2=0.9,
            eps=1e-8,
            step=0,
            adam_w_mode=True,
        )
    with pytest.raises(ValueError, match="arg_to_check"):
        mt.axpby([torch.ones(1)], [torch.ones(1)], [torch.ones(1)], 1.0, 1.0, 2)
    with pytest.raises(ValueError, match="momentum_buffers"):
        mt.sgd([torch.ones(1)], [torch.ones(1)], None, lr=0.1, momentum=0.9)


def test_nothing_written_on_error(backend):
    params = [torch.ones(3), torch.ones(4)]
    with pytest.raises(ValueError):
        _adam([torch.ones(3), torch.ones(4)], params, v=[torch.zeros(3)])
    assert all(bool((p == 1).all()) for p in params)


def test_l2norm_flag_is_exact_when_squares_overflow(backend):
    # 1e30**2 overflows float32 although every value is finite: no false overflow report.
    xs = [torch.tensor([1e30, 1.0, -2.0]), torch.ones(1000)]
    _, _, found = mt.l2norm(xs, 1.0)
    assert found is False
    xs[1][999] = float("nan")
    assert mt.l2norm(xs, 1.0)[2] is True
