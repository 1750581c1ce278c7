"""The `npu` test device itself: what torch sees, copies, the CPU fallback, autograd,
autocast, GradScaler, foreach ops, serialization. Every op here runs on the device
through the dispatcher; CPU results of the same ops are the reference.

Exactness: copies, indexing and element-wise ops are compared bit for bit. Where BLAS or
reductions are involved the CPU kernel is the same, but its blocking may depend on the
address alignment of the operands, so those use assert_close.
"""

from __future__ import annotations

import copy
import io
import warnings
from collections.abc import Callable
from typing import Optional

import npu_module
import pytest
import torch
import torch.nn.functional as F
from npu_device import Installed

from amp import _torch_compat as compat

HALF_TYPES = [torch.float16, torch.bfloat16]


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


# ---------------------------------------------------------------- registration


def test_backend_is_registered_as_npu(npu_backend: Installed, npu: torch.device) -> None:
    assert torch._C._get_privateuse1_backend_name() == "npu"
    assert torch.npu is npu_module
    assert compat.get_device_module("npu") is npu_module
    if hasattr(torch, "get_device_module"):  # torch >= 2.3
        assert torch.get_device_module("npu") is npu_module
    assert npu.type == "npu"
    assert torch.device("npu:1").index == 1


def test_device_module_api(npu: torch.device) -> None:
    assert torch.npu.is_available()
    assert torch.npu.is_initialized()
    assert torch.npu.device_count() == 2
    assert torch.npu.current_device() == 0
    assert torch.npu.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    assert torch.npu.is_bf16_supported()
    assert torch.npu._is_in_bad_fork() is False
    torch.npu.synchronize()
    torch.npu.synchronize("npu:1")
    with pytest.raises(ValueError, match="expected an npu device"):
        torch.npu.synchronize("cpu")
    assert compat.current_accelerator() == "npu"
    # torch's device-generic API (torch >= 2.6) sees the device through the registered hooks.
    if hasattr(torch, "accelerator"):
        assert torch.accelerator.is_available()
        assert torch.accelerator.current_accelerator() == torch.device("npu")
        assert torch.accelerator.device_count() == 2
    if hasattr(torch.amp, "is_autocast_available"):  # torch >= 2.4
        assert torch.amp.is_autocast_available("npu")


def test_generated_methods(npu: torch.device) -> None:
    x = _randn(3)
    y = x.npu()
    assert y.device == torch.device("npu:0")
    assert y.is_npu and not x.is_npu
    assert x.npu(1).device == torch.device("npu:1")
    m = torch.nn.Linear(3, 2).npu()
    assert {p.device.type for p in m.parameters()} == {"npu"}
    s = torch.zeros(2).untyped_storage().npu()
    assert s.device.type == "npu" and s.is_npu


# ---------------------------------------------------------------- memory and copies


@pytest.mark.parametrize(
    "dtype",
    [
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.int64,
        torch.uint8,
        torch.bool,
    ],
)
def test_round_trip_is_exact(npu: torch.device, dtype: torch.dtype) -> None:
    src = (_randn(7, 5) * 100).to(dtype)
    on_dev = src.to(npu)
    assert on_dev.device.type == "npu"
    assert on_dev.dtype == dtype
    back = on_dev.cpu()
    assert back.device.type == "cpu"
    assert torch.equal(back, src)
    # A non-contiguous source and a non-contiguous destination take the strided path.
    t = src.t()
    assert torch.equal(t.to(npu).cpu(), t)
    assert torch.equal(on_dev.t().cpu(), t)


def test_copy_converts_dtype_and_broadcasts(npu: torch.device) -> None:
    src = _randn(4, 5)
    dst = torch.empty(4, 5, dtype=torch.float16, device=npu)
    dst.copy_(src)
    assert dst.dtype == torch.float16
    assert torch.equal(dst.cpu(), src.half())
    row = torch.arange(5.0)
    dst2 = torch.empty(3, 5, device=npu)
    dst2.copy_(row.to(npu))
    assert torch.equal(dst2.cpu(), row.expand(3, 5))


def test_copies_between_device_indices(npu: torch.device) -> None:
    src = _randn(6)
    on0 = src.to("npu:0")
    on1 = on0.to("npu:1")
    assert on1.device == torch.device("npu:1")
    assert torch.equal(on1.cpu(), src)
    assert torch.equal(on1.to("npu:0").cpu(), src)
    with pytest.raises(RuntimeError, match="invalid device index"):
        torch.empty(1, device="npu:2")


def test_current_device_selects_allocations(npu: torch.device) -> None:
    try:
        torch.npu.set_device(1)
        assert torch.npu.current_device() == 1
        assert torch.empty(2, device="npu").device == torch.device("npu:1")
        assert _randn(2).npu().device == torch.device("npu:1")
    finally:
        torch.npu.set_device(0)
    with torch.npu.device(1):
        assert torch.zeros(1, device="npu").device == torch.device("npu:1")
    assert torch.npu.current_device() == 0


def test_allocator_owns_device_memory(npu: torch.device, npu_backend: Installed) -> None:
    before = torch.npu.memory_allocated()
    t = torch.empty(1000, dtype=torch.float32, device=npu)
    assert torch.npu.memory_allocated() - before == 4000
    assert t.untyped_storage().device.type == "npu"
    del t
    assert torch.npu.memory_allocated() == before


def test_views_alias_device_storage(npu: torch.device) -> None:
    base = torch.zeros(4, 6, device=npu)
    flat = base.view(-1)
    assert flat.data_ptr() == base.data_ptr()
    flat[7] = 3.0  # an in-place op through the fallback, written back into the view
    assert base[1, 1].item() == 3.0
    col = base[:, 2]
    col.fill_(5.0)
    windows = base.unfold(1, 3, 3)
    assert windows.shape == (4, 2, 3) and windows.data_ptr() == base.data_ptr()
    strided = base.as_strided((2, 2), (6, 1), 1)
    expected = torch.zeros(4, 6)
    expected.view(-1)[7] = 3.0
    expected[:, 2] = 5.0
    assert torch.equal(base.cpu(), expected)
    assert torch.equal(strided.cpu(), expected.as_strided((2, 2), (6, 1), 1))
    assert torch.equal(base.reshape(6, 4).cpu(), expected.reshape(6, 4))


# ---------------------------------------------------------------- ops via the fallback


def test_ops_run_through_the_fallback(npu: torch.device, npu_backend: Installed) -> None:
    a = _randn(3).to(npu)
    before = npu_backend.ops.fallback_calls()
    b = a + a
    assert npu_backend.ops.fallback_calls() > before
    assert b.device.type == "npu"
    # A view is the device's own kernel: no fallback.
    before = npu_backend.ops.fallback_calls()
    a.view(3, 1)
    assert npu_backend.ops.fallback_calls() == before


EXACT_OPS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add": lambda a, b: a + b,
    "mul_scalar": lambda a, b: a * 2.5 - b,
    "where": lambda a, b: torch.where(a > 0, a, b),
    "slice_index": lambda a, b: a[1:3, ::2],
    "bool_mask": lambda a, b: a[a > 0],
    "index_select": lambda a, b: a.index_select(1, torch.tensor([3, 0], device=a.device)),
    "gather": lambda a, b: a.gather(1, torch.zeros(4, 2, dtype=torch.long, device=a.device)),
    "cat": lambda a, b: torch.cat([a, b], 0),
    "stack": lambda a, b: torch.stack([a, b]),
    "clamp": lambda a, b: a.clamp(-0.5, 0.5),
    "abs_neg": lambda a, b: (-a).abs(),
    "isfinite": lambda a, b: torch.isfinite(a / (b - b)),
    "max": lambda a, b: a.max(dim=1).values,
    "argmax": lambda a, b: a.argmax(),
    "transpose_contig": lambda a, b: a.t().contiguous(),
    "half_cast": lambda a, b: a.half() + b.half(),
}

CLOSE_OPS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "matmul": lambda a, b: a @ b.t(),
    "sum": lambda a, b: a.sum(),
    "mean_dim": lambda a, b: a.mean(dim=0),
    "softmax": lambda a, b: torch.softmax(a, dim=1),
    "exp_log": lambda a, b: torch.log(torch.exp(a) + 1),
    "norm": lambda a, b: torch.linalg.vector_norm(a),
}


@pytest.mark.parametrize("name", sorted(EXACT_OPS))
def test_op_matches_cpu_exactly(npu: torch.device, name: str) -> None:
    a, b = _randn(4, 5, seed=1), _randn(4, 5, seed=2)
    got = EXACT_OPS[name](a.to(npu), b.to(npu))
    assert got.device.type == "npu"
    assert torch.equal(got.cpu(), EXACT_OPS[name](a, b))


@pytest.mark.parametrize("name", sorted(CLOSE_OPS))
def test_op_matches_cpu(npu: torch.device, name: str) -> None:
    a, b = _randn(4, 5, seed=1), _randn(4, 5, seed=2)
    got = CLOSE_OPS[name](a.to(npu), b.to(npu))
    assert got.device.type == "npu"
    torch.testing.assert_close(got.cpu(), CLOSE_OPS[name](a, b))


def test_in_place_ops(npu: torch.device) -> None:
    x = _randn(4, 5)
    y = x.to(npu)
    y.add_(1).mul_(2)
    y[0] = 7.0
    y[:, 1].zero_()
    y.masked_fill_(y < 0, -1.0)
    e = x.clone()
    e.add_(1).mul_(2)
    e[0] = 7.0
    e[:, 1].zero_()
    e.masked_fill_(e < 0, -1.0)
    assert torch.equal(y.cpu(), e)


def test_factories_on_device(npu: torch.device) -> None:
    assert torch.equal(torch.zeros(3, device=npu).cpu(), torch.zeros(3))
    assert torch.equal(torch.ones(2, 2, device=npu).cpu(), torch.ones(2, 2))
    assert torch.equal(torch.arange(5, device=npu).cpu(), torch.arange(5))
    assert torch.equal(torch.full((2,), 3.0, device=npu).cpu(), torch.full((2,), 3.0))
    assert torch.equal(torch.eye(3, device=npu).cpu(), torch.eye(3))
    assert torch.equal(torch.tensor([1.5, 2.5], device=npu).cpu(), torch.tensor([1.5, 2.5]))
    assert torch.equal(torch.tril_indices(3, 3, device=npu).cpu(), torch.tril_indices(3, 3))
    assert torch.empty(2, 3, device=npu).device.type == "npu"


def test_item_and_scalar_reads(npu: torch.device) -> None:
    x = torch.tensor([1.0, 2.0, 4.0], device=npu)
    assert x.sum().item() == 7.0
    assert bool((x > 3).any())
    assert x.tolist() == [1.0, 2.0, 4.0]


# ---------------------------------------------------------------- half types the CPU lacks
# Where the CPU has no kernel for an op in float16 (torch 2.1: matrix products, convolutions,
# softmax, the norms, pooling, ...) or bfloat16 (mse_loss), the device computes it as an NPU
# does: float32 arithmetic on the widened inputs, the result rounded once to the half type.
# Where the CPU has the kernel, the device runs it: the result is the CPU's own.

HALF_OPS: dict[str, tuple[Callable[..., torch.Tensor], tuple[tuple[int, ...], ...]]] = {
    "mm": (torch.mm, ((3, 8), (8, 2))),
    "addmm": (torch.addmm, ((3, 2), (3, 8), (8, 2))),
    "bmm": (torch.bmm, ((2, 3, 8), (2, 8, 2))),
    "linear": (F.linear, ((4, 8), (3, 8), (3,))),
    "conv2d": (F.conv2d, ((1, 2, 6, 6), (3, 2, 3, 3))),
    "softmax": (lambda x: F.softmax(x, dim=1), ((3, 8),)),
    "mse_loss": (F.mse_loss, ((3, 8), (3, 8))),
    "cumsum": (lambda x: torch.cumsum(x, 0), ((5, 3),)),
    "max_pool2d": (lambda x: F.max_pool2d(x, 2), ((1, 2, 6, 6),)),
}


def _cpu_result(
    fn: Callable[..., torch.Tensor], args: list[torch.Tensor]
) -> Optional[torch.Tensor]:
    """``fn`` on the CPU, or None where the CPU has no kernel for the arguments' type."""
    try:
        return fn(*args)
    except (RuntimeError, NotImplementedError) as exc:
        if "not implemented for" not in str(exc):
            raise
        return None


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
@pytest.mark.parametrize("name", sorted(HALF_OPS))
def test_half_op_is_the_cpus_or_fp32_arithmetic_rounded_once(
    npu: torch.device, dtype: torch.dtype, name: str
) -> None:
    fn, shapes = HALF_OPS[name]
    args = [_randn(*shape, seed=i).to(dtype) for i, shape in enumerate(shapes)]
    native = _cpu_result(fn, args)
    before = npu_module.half_in_fp32_calls()
    got = fn(*[a.to(npu) for a in args])
    assert got.dtype == dtype and got.device.type == "npu"
    if native is not None:  # the CPU's own kernel ran
        assert torch.equal(got.cpu(), native)
        assert npu_module.half_in_fp32_calls() == before
    else:
        assert torch.equal(got.cpu(), fn(*[a.float() for a in args]).to(dtype))
        assert npu_module.half_in_fp32_calls() > before


def test_float16_matrix_products_accumulate_in_fp32(npu: torch.device) -> None:
    # 4097 ones: an fp16 accumulator stops at 2048 (2048 + 1 rounds back to 2048); an fp32 one
    # reaches 4097, which rounds to 4096 in fp16. Both the device's own float32 path and the
    # CPU's float16 kernel (torch >= 2.2) accumulate in fp32.
    ones = torch.ones(1, 4097, dtype=torch.float16, device=npu)
    assert torch.mm(ones, ones.t()).item() == 4096.0
    grad = torch.ones(1, 4097, dtype=torch.float16, device=npu, requires_grad=True)
    (grad @ torch.ones(4097, 1, dtype=torch.float16, device=npu)).sum().backward()
    assert grad.grad is not None and grad.grad.dtype == torch.float16


def test_batch_norm_updates_the_running_statistics_on_the_device(npu: torch.device) -> None:
    # native_batch_norm writes them in place without its schema saying so.
    torch.manual_seed(0)
    ref = torch.nn.BatchNorm2d(2)
    dev = copy.deepcopy(ref).to(npu)
    x = _randn(4, 2, 3, 3)
    torch.testing.assert_close(dev(x.to(npu)).cpu(), ref(x))
    assert not torch.equal(ref.running_mean, torch.zeros(2))
    torch.testing.assert_close(dev.running_mean.cpu(), ref.running_mean)
    torch.testing.assert_close(dev.running_var.cpu(), ref.running_var)
    assert int(dev.num_batches_tracked) == 1


def test_half_activations_with_fp32_batch_norm_parameters(npu: torch.device) -> None:
    # O2's keep_batchnorm_fp32: float16 activations, float32 weights and running statistics.
    bn = torch.nn.BatchNorm2d(2).to(npu)
    x = _randn(4, 2, 3, 3).half().to(npu).requires_grad_()
    out = bn(x)
    assert out.dtype == torch.float16 and bn.running_mean.dtype == torch.float32
    out.float().sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.float16
    assert bn.weight.grad is not None and bn.weight.grad.dtype == torch.float32
    assert not torch.equal(bn.running_mean.cpu(), torch.zeros(2))


# ---------------------------------------------------------------- autograd and training


def _linear_pair(seed: int = 0) -> tuple[torch.nn.Linear, torch.nn.Linear]:
    torch.manual_seed(seed)
    ref = torch.nn.Linear(5, 3)
    return copy.deepcopy(ref).to("npu"), ref


def test_linear_forward_backward_matches_cpu(npu: torch.device) -> None:
    dev_model, cpu_model = _linear_pair()
    x = _randn(4, 5)
    out = dev_model(x.to(npu))
    out.square().sum().backward()
    ref = cpu_model(x)
    ref.square().sum().backward()
    assert out.device.type == "npu"
    assert dev_model.weight.grad is not None and cpu_model.weight.grad is not None
    assert dev_model.weight.grad.device.type == "npu"
    torch.testing.assert_close(out.cpu(), ref)
    torch.testing.assert_close(dev_model.weight.grad.cpu(), cpu_model.weight.grad)
    torch.testing.assert_close(dev_model.bias.grad.cpu(), cpu_model.bias.grad)


# The device runs torch's fused Adam through the CPU kernel, which torch has from 2.4 on: before,
# there is neither the device's fused step nor the CPU reference to compare it with.
_CPU_FUSED_ADAM = torch._C._dispatch_has_kernel_for_dispatch_key("aten::_fused_adam_", "CPU")


@pytest.mark.parametrize(
    "optimizer",
    [
        "sgd",
        "adam_foreach",
        "adam_for_loop",
        pytest.param(
            "adam_fused",
            marks=pytest.mark.skipif(
                not _CPU_FUSED_ADAM,
                reason=f"torch {torch.__version__} has no CPU kernel for fused Adam "
                "(aten::_fused_adam_, torch >= 2.4): no fused step for the device to run, nor a "
                "CPU one to compare it with",
            ),
        ),
    ],
)
def test_optimizer_steps_match_cpu(npu: torch.device, optimizer: str) -> None:
    dev_model, cpu_model = _linear_pair(seed=3)
    x, y = _randn(8, 5, seed=4), _randn(8, 3, seed=5)
    for model, dev in ((dev_model, npu), (cpu_model, torch.device("cpu"))):
        params = list(model.parameters())
        opt: torch.optim.Optimizer
        if optimizer == "sgd":
            opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
        else:
            # torch counts "npu" (its PrivateUse1 name) among the foreach- and fused-capable
            # devices, so all three Adam paths are reachable on the device.
            opt = torch.optim.Adam(
                params,
                lr=0.01,
                foreach=optimizer == "adam_foreach",
                fused=True if optimizer == "adam_fused" else None,
            )
        for _ in range(3):
            opt.zero_grad()
            F.mse_loss(model(x.to(dev)), y.to(dev)).backward()
            opt.step()
    torch.testing.assert_close(dev_model.weight.detach().cpu(), cpu_model.weight.detach())
    torch.testing.assert_close(dev_model.bias.detach().cpu(), cpu_model.bias.detach())
    assert dev_model.weight.device.type == "npu"


def test_training_step_raises_no_warnings(npu: torch.device) -> None:
    # Ops go to the CPU kernels themselves, not to torch's generic structured kernels
    # (whose out= path makes e.g. mse_loss warn that it resized its output). Tests that
    # count warnings (amp's "one warning" rules) depend on a quiet device.
    dev_model, _ = _linear_pair()
    opt = torch.optim.SGD(dev_model.parameters(), lr=0.1)
    x, y = _randn(4, 5).to(npu), _randn(4, 3, seed=1).to(npu)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for loss_fn in (F.mse_loss, F.l1_loss, F.smooth_l1_loss):
            opt.zero_grad()
            loss_fn(dev_model(x), y).backward()
            opt.step()
        F.cross_entropy(dev_model(x), torch.tensor([0, 1, 2, 0], device=npu)).backward()


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_convolution_forward_backward(npu: torch.device, dims: int) -> None:
    conv_type = {1: torch.nn.Conv1d, 2: torch.nn.Conv2d, 3: torch.nn.Conv3d}[dims]
    torch.manual_seed(0)
    ref = conv_type(2, 3, 3, padding=1)
    dev = copy.deepcopy(ref).to(npu)
    x = _randn(2, 2, *([5] * dims))
    out = dev(x.to(npu))
    out.sum().backward()
    ref(x).sum().backward()
    torch.testing.assert_close(out.cpu(), ref(x))
    assert dev.weight.grad is not None and ref.weight.grad is not None
    torch.testing.assert_close(dev.weight.grad.cpu(), ref.weight.grad)


def test_foreach_ops(npu: torch.device) -> None:
    cpu = [_randn(3, seed=1), _randn(4, seed=2)]
    dev = [t.to(npu) for t in cpu]
    torch._foreach_add_(dev, 1.0)
    torch._foreach_add_(cpu, 1.0)
    for d, c in zip(dev, cpu):
        assert torch.equal(d.cpu(), c)
    scaled = torch._foreach_mul(dev, 3.0)
    assert all(t.device.type == "npu" for t in scaled)
    norms = torch._foreach_norm(dev)
    torch.testing.assert_close(torch.stack(norms).cpu(), torch.stack(torch._foreach_norm(cpu)))


def test_amp_unscale_and_update_scale_ops(npu: torch.device) -> None:
    grads = [torch.tensor([2.0, 4.0], device=npu), torch.tensor([8.0], device=npu)]
    found_inf = torch.zeros((), device=npu)
    inv_scale = torch.full((), 0.5, device=npu)
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
    assert found_inf.item() == 0.0
    assert grads[0].tolist() == [1.0, 2.0] and grads[1].tolist() == [4.0]
    grads[1].fill_(float("inf"))
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
    assert found_inf.item() == 1.0
    scale = torch.full((), 1024.0, device=npu)
    tracker = torch.zeros((), dtype=torch.int32, device=npu)
    torch._amp_update_scale_(scale, tracker, found_inf, 2.0, 0.5, 2000)
    assert scale.item() == 512.0 and scale.device.type == "npu"


# ---------------------------------------------------------------- autocast

LOWER_PRECISION_CALLS: dict[str, Callable[[torch.device], torch.Tensor]] = {
    "linear": lambda d: F.linear(_randn(3, 4).to(d), _randn(2, 4).to(d), _randn(2).to(d)),
    "matmul": lambda d: torch.matmul(_randn(3, 4).to(d), _randn(4, 2).to(d)),
    "mm": lambda d: torch.mm(_randn(3, 4).to(d), _randn(4, 2).to(d)),
    "addmm": lambda d: torch.addmm(_randn(3, 2).to(d), _randn(3, 4).to(d), _randn(4, 2).to(d)),
    "bmm": lambda d: torch.bmm(_randn(2, 3, 4).to(d), _randn(2, 4, 2).to(d)),
    "baddbmm": lambda d: torch.baddbmm(
        _randn(2, 3, 2).to(d), _randn(2, 3, 4).to(d), _randn(2, 4, 2).to(d)
    ),
    "addbmm": lambda d: torch.addbmm(
        _randn(3, 2).to(d), _randn(2, 3, 4).to(d), _randn(2, 4, 2).to(d)
    ),
    "conv1d": lambda d: F.conv1d(_randn(1, 2, 6).to(d), _randn(3, 2, 3).to(d)),
    "conv2d": lambda d: F.conv2d(_randn(1, 2, 6, 6).to(d), _randn(3, 2, 3, 3).to(d)),
    "conv3d": lambda d: F.conv3d(_randn(1, 2, 4, 4, 4).to(d), _randn(3, 2, 3, 3, 3).to(d)),
}

# Given inputs in the autocast dtype: these must come out in fp32 under autocast (and
# stay in the half type outside it: see test_fp32_ops_keep_half_type_outside_autocast).
FP32_CALLS: dict[str, Callable[[torch.device, torch.dtype], torch.Tensor]] = {
    "softmax": lambda d, t: F.softmax(_randn(3, 4).to(d, t), dim=1),
    "log_softmax": lambda d, t: F.log_softmax(_randn(3, 4).to(d, t), dim=1),
    "mse_loss": lambda d, t: F.mse_loss(_randn(3, 4).to(d, t), _randn(3, 4, seed=1).to(d, t)),
    "cross_entropy": lambda d, t: F.cross_entropy(
        _randn(3, 4).to(d, t), torch.tensor([0, 3, 1], device=d)
    ),
    "nll_loss": lambda d, t: F.nll_loss(_randn(3, 4).to(d, t), torch.tensor([0, 3, 1], device=d)),
    "bce_with_logits": lambda d, t: F.binary_cross_entropy_with_logits(
        _randn(3, 4).to(d, t), torch.rand(3, 4).to(d, t)
    ),
    "layer_norm": lambda d, t: F.layer_norm(_randn(3, 4).to(d, t), (4,)),
    "l1_loss": lambda d, t: F.l1_loss(_randn(3, 4).to(d, t), _randn(3, 4, seed=1).to(d, t)),
    "sum": lambda d, t: _randn(3, 4).to(d, t).sum(),
    "exp": lambda d, t: torch.exp(_randn(3, 4).to(d, t)),
}


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
@pytest.mark.parametrize("name", sorted(LOWER_PRECISION_CALLS))
def test_autocast_casts_to_half_type(npu: torch.device, dtype: torch.dtype, name: str) -> None:
    assert LOWER_PRECISION_CALLS[name](npu).dtype == torch.float32  # outside: unchanged
    with torch.autocast("npu", dtype=dtype):
        out = LOWER_PRECISION_CALLS[name](npu)
    assert out.dtype == dtype
    assert out.device.type == "npu"


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
@pytest.mark.parametrize("name", sorted(FP32_CALLS))
def test_autocast_keeps_fp32_ops_in_fp32(npu: torch.device, dtype: torch.dtype, name: str) -> None:
    with torch.autocast("npu", dtype=dtype):
        out = FP32_CALLS[name](npu, dtype)
    assert out.dtype == torch.float32


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
def test_fp32_ops_keep_half_type_outside_autocast(npu: torch.device, dtype: torch.dtype) -> None:
    # The control for the test above: without autocast the same calls stay in `dtype`.
    for name, call in FP32_CALLS.items():
        assert call(npu, dtype).dtype == dtype, name


def _autocast_dtype() -> torch.dtype:
    """npu's autocast dtype: torch's own per-device one (torch >= 2.4), which torch.npu reports
    too; before it, torch.autocast keeps it through torch.npu (as torch_npu has it)."""
    mine = npu_module.get_autocast_dtype()
    if hasattr(torch, "get_autocast_dtype"):
        assert torch.get_autocast_dtype("npu") == mine
    return mine


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
def test_autocast_state_and_scope(npu: torch.device, dtype: torch.dtype) -> None:
    assert not compat.is_autocast_enabled("npu")
    with torch.autocast("npu", dtype=dtype):
        assert compat.is_autocast_enabled("npu")
        assert _autocast_dtype() == dtype
        assert npu_module.is_autocast_enabled()
        # Autocast is per device type: CPU tensors are untouched by npu autocast.
        assert torch.mm(_randn(2, 2), _randn(2, 2)).dtype == torch.float32
        # Ops off the lists run in whatever type they are given.
        a = _randn(2, 2).to(npu)
        assert (a + a).dtype == torch.float32
    assert not compat.is_autocast_enabled("npu")
    assert not npu_module.is_autocast_enabled()


def test_autocast_default_dtype_is_fp16(npu: torch.device) -> None:
    with torch.autocast("npu"):
        assert _autocast_dtype() == torch.float16
        assert torch.mm(_randn(2, 2).to(npu), _randn(2, 2).to(npu)).dtype == torch.float16


@pytest.mark.parametrize("dtype", HALF_TYPES, ids=str)
def test_autocast_matches_explicit_casts(npu: torch.device, dtype: torch.dtype) -> None:
    # What autocast does is exactly "cast the inputs, run the op": compare bit for bit.
    a, b = _randn(3, 4), _randn(4, 2, seed=1)
    with torch.autocast("npu", dtype=dtype):
        got = torch.mm(a.to(npu), b.to(npu))
    assert torch.equal(got, torch.mm(a.to(npu, dtype), b.to(npu, dtype)))
    on_cpu = _cpu_result(torch.mm, [a.to(dtype), b.to(dtype)])  # None: no CPU kernel (2.1)
    if on_cpu is not None:
        assert torch.equal(got.cpu(), on_cpu)


def test_autocast_backward_gives_fp32_grads(npu: torch.device) -> None:
    dev_model, _ = _linear_pair()
    with torch.autocast("npu", dtype=torch.float16):
        out = dev_model(_randn(4, 5).to(npu))
        loss = F.mse_loss(out, torch.zeros(4, 3, device=npu))
    assert out.dtype == torch.float16 and loss.dtype == torch.float32
    loss.backward()
    assert dev_model.weight.grad is not None
    assert dev_model.weight.grad.dtype == torch.float32
    assert dev_model.weight.grad.device.type == "npu"


def test_autocast_refuses_binary_cross_entropy(npu: torch.device) -> None:
    p, t = torch.rand(3).to(npu), torch.rand(3).to(npu)
    F.binary_cross_entropy(p, t)  # fine outside autocast
    with torch.autocast("npu", dtype=torch.float16), pytest.raises(RuntimeError, match="unsafe"):
        F.binary_cross_entropy(p, t)


# ---------------------------------------------------------------- GradScaler


def _scaler_run(device: torch.device, inject_inf_at: int) -> tuple[torch.nn.Linear, list[float]]:
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**8, growth_interval=1)
    scales = []
    x, y = _randn(8, 5, seed=1).to(device), _randn(8, 1, seed=2).to(device)
    for step in range(3):
        opt.zero_grad()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        if step == inject_inf_at:
            assert model.weight.grad is not None
            model.weight.grad[0, 0] = float("inf")
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    return model, scales


def test_grad_scaler_on_device(npu: torch.device) -> None:
    model, scales = _scaler_run(npu, inject_inf_at=1)
    # Growth after a good step, back-off (and a skipped step) after the overflow.
    assert scales == [512.0, 256.0, 512.0]
    ref_model, ref_scales = _scaler_run(torch.device("cpu"), inject_inf_at=1)
    assert ref_scales == scales
    torch.testing.assert_close(model.weight.detach().cpu(), ref_model.weight.detach())


def test_grad_scaler_skips_step_on_overflow(npu: torch.device) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 1).to(npu)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("npu", init_scale=16.0)
    before = model.weight.detach().clone()
    loss = F.mse_loss(model(_randn(2, 5).to(npu)), torch.zeros(2, 1, device=npu))
    scaler.scale(loss).backward()
    assert model.weight.grad is not None
    model.weight.grad[0, 0] = float("nan")
    scaler.step(opt)
    scaler.update()
    assert torch.equal(model.weight.detach().cpu(), before.cpu())
    assert scaler.get_scale() == 8.0
    assert scaler._scale is not None and scaler._scale.device.type == "npu"


# ---------------------------------------------------------------- RNG, copies, files


def test_rng_is_seeded_through_the_device_module(npu: torch.device) -> None:
    torch.npu.manual_seed(7)
    a = torch.randn(5, device=npu)
    torch.npu.manual_seed(7)
    b = torch.randn(5, device=npu)
    assert torch.equal(a.cpu(), b.cpu())
    state = torch.npu.get_rng_state()
    c = torch.rand(4, device=npu)
    torch.npu.set_rng_state(state)
    assert torch.equal(torch.rand(4, device=npu).cpu(), c.cpu())
    # Documented (npu_module): the device draws from the CPU generator.
    torch.manual_seed(11)
    d = torch.randn(5, device=npu)
    torch.manual_seed(11)
    assert torch.equal(d.cpu(), torch.randn(5))
    drop = F.dropout(torch.ones(100, device=npu), 0.5)
    assert drop.device.type == "npu" and 0 < int((drop == 0).sum()) < 100


def test_deepcopy_state_dict_and_save_load(npu: torch.device) -> None:
    x = _randn(3, 4).to(npu)
    y = copy.deepcopy(x)
    assert y.device == x.device and y.data_ptr() != x.data_ptr()
    assert torch.equal(y.cpu(), x.cpu())
    buf = io.BytesIO()
    torch.save({"x": x, "step": 3}, buf)
    buf.seek(0)
    loaded = torch.load(buf)
    assert loaded["x"].device == torch.device("npu:0") and loaded["step"] == 3
    assert torch.equal(loaded["x"].cpu(), x.cpu())
    buf.seek(0)
    assert torch.load(buf, map_location="cpu")["x"].device.type == "cpu"
    src = torch.nn.Linear(4, 2)
    dst = torch.nn.Linear(4, 2).to(npu)
    dst.load_state_dict(src.state_dict())
    assert dst.weight.device.type == "npu"
    assert torch.equal(dst.weight.detach().cpu(), src.weight.detach())


def test_unsupported_features_say_so(npu: torch.device) -> None:
    # Pinning for npu: the device says it has no pinned memory where torch asks the PrivateUse1
    # hooks for a pinned allocator; torch 2.1 asks no hooks and has no _pin_memory kernel for a
    # PrivateUse1 device, and says that.
    with pytest.raises(
        NotImplementedError, match=r"no pinned host memory|Could not run 'aten::_pin_memory'"
    ):
        torch.zeros(2).pin_memory("npu")
    # torch.accelerator's torches pin a CPU tensor for the current accelerator (npu here); torch
    # 2.1 pins it for CUDA whatever accelerator is installed (not the device's to answer).
    if hasattr(torch, "accelerator"):
        with pytest.raises(NotImplementedError, match="no pinned host memory"):
            torch.zeros(2).pin_memory()
    # Where the PrivateUse1 hooks make generators (getNewGenerator) the device says it itself;
    # torch <= 2.6 asks a generator registry instead, and says there is none.
    with pytest.raises(
        (NotImplementedError, RuntimeError),
        match=r"no generator of its own|register a generator to the PrivateUse1",
    ):
        torch.Generator("npu")
    assert not torch.zeros(2, device=npu).is_pinned()


def test_storage_resize(npu: torch.device) -> None:
    storage = torch.arange(4, dtype=torch.float32, device=npu).untyped_storage()
    storage.resize_(64)
    assert storage.nbytes() == 64 and storage.device.type == "npu"
    head = torch.empty(0, device=npu).set_(storage, 0, (4,), (1,))
    assert head.tolist() == [0.0, 1.0, 2.0, 3.0]
