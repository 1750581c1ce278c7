"""Python face of the multi-tensor kernels (apex's ``amp_C`` family).

Each function takes lists of tensors (one entry per model tensor) and applies one
operation to all of them in a single call. CPU tensors go to the compiled kernels in
``amp._C``; tensors on any other device (CUDA, or an out-of-tree device such as Ascend's
``npu``: the kernels refuse them), or a missing / mismatched extension (see ``amp._ext``),
use the pure-torch (``torch._foreach_*``) implementation below, on the tensors' own
device, which computes the same float32 arithmetic in the same order, so both agree to
rounding. The first call on a non-CPU device type warns once (``amp._device``).

Lists must be non-empty, of equal length, element-wise equal in size, contiguous, and
each list must share one dtype among float32, float16 and bfloat16; ``params`` must be
float32 whenever a separate half ``model_params`` copy is written.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Optional, Sequence, Union

import torch
from torch import Tensor

from .. import _ext
from .. import _torch_compat as compat
from .._device import KERNEL_DEVICE_TYPE, kernel_device_ok

__all__ = [
    "scale",
    "axpby",
    "l2norm",
    "l2norm_device",
    "l2norm_total_device",
    "scale_l2norm",
    "scale_l2norm_device",
    "adam",
    "sgd",
    "lamb",
    "adagrad",
    "novograd",
    "nonfinite_flag",
    "uses_kernels",
]

# typing's generics: a module-level alias is evaluated at import, and Python 3.8's builtins
# and collections.abc classes cannot be subscripted.
TensorSeq = Sequence[Tensor]
_FLOAT_TYPES = (torch.float32, torch.float16, torch.bfloat16)


def uses_kernels(tensors: TensorSeq) -> bool:
    """True when a call on these tensors runs the compiled kernels."""
    return (
        bool(tensors) and tensors[0].device.type == KERNEL_DEVICE_TYPE and _ext.load() is not None
    )


def _kernels(first: TensorSeq) -> Optional[ModuleType]:
    # Routed by the first tensor's device: the kernels check every tensor themselves and
    # refuse a non-CPU one, so a mixed list still fails with their message.
    if first and kernel_device_ok(first[0].device):
        return _ext.load()
    return None


# --- validation for the fallback (the kernels validate in C++) -------------------
# The messages keep this module's former name, amp.multi_tensor: error messages are part of
# amp's interface.
def _check(
    name: str, ts: TensorSeq, like: Optional[TensorSeq] = None, fp32_only: bool = False
) -> None:
    if len(ts) == 0:
        raise ValueError(f"amp.multi_tensor: {name} is an empty list")
    if like is not None and len(ts) != len(like):
        raise ValueError(
            f"amp.multi_tensor: {name} has {len(ts)} tensors; expected "
            f"{len(like)} (one per tensor of the first list)"
        )
    dtype, device = ts[0].dtype, ts[0].device
    # The common case in one pass over the list; the loop below only runs to name the
    # first offending tensor (a step's lists hold thousands of tensors).
    if (
        dtype in _FLOAT_TYPES
        and (not fp32_only or dtype == torch.float32)
        and all(t.dtype == dtype and t.device == device and t.is_contiguous() for t in ts)
        and (
            like is None
            or all(t.device == o.device and t.numel() == o.numel() for t, o in zip(ts, like))
        )
    ):
        return
    for i, t in enumerate(ts):
        where = f"amp.multi_tensor: {name}[{i}]"
        if t.dtype not in _FLOAT_TYPES:
            raise TypeError(f"{where} has dtype {t.dtype}; expected float32, float16 or bfloat16")
        if t.dtype != dtype:
            raise TypeError(
                f"{where} has dtype {t.dtype} but {name}[0] has {dtype}; "
                "one list must share one dtype"
            )
        if fp32_only and t.dtype != torch.float32:
            raise TypeError(f"{where} must be float32 when a half model copy is written")
        if t.device != device or (like is not None and t.device != like[i].device):
            raise ValueError(f"{where} is on {t.device}; all tensors must share one device")
        if not t.is_contiguous():
            raise ValueError(f"{where} is not contiguous")
        if like is not None and t.numel() != like[i].numel():
            raise ValueError(
                f"{where} has {t.numel()} elements; expected {like[i].numel()} "
                "to match the first list"
            )


def _check_lists(half_copy: bool = False, **lists: Optional[TensorSeq]) -> None:
    """The fallback's checks of one op's lists, named as the op names them: the first list
    must be non-empty, each further one (None: not passed) must match it tensor for tensor;
    ``params`` must be float32 where a half copy (``model_params``) is written."""
    names = iter(lists)
    first_name = next(names)
    first = lists[first_name]
    assert first is not None
    _check(first_name, first)
    for name in names:
        ts = lists[name]
        if ts is not None:
            _check(name, ts, first, fp32_only=half_copy and name == "params")


# --- the fallback's building blocks: whole lists per call, results left on the device --
# Each helper issues a fixed number of torch calls whatever the number of tensors
# (torch._foreach_* take the whole list), and none reads a value back to the host: a flag
# or a norm stays a device tensor until a caller needs its value.
def _f32(ts: TensorSeq) -> list[Tensor]:
    """The tensors as float32: fp32 ones as themselves (in-place ops update them directly),
    others as fresh fp32 copies, made in one call."""
    out = list(ts)
    idx = [i for i, t in enumerate(out) if t.dtype != torch.float32]
    if idx:
        copies = [torch.empty_like(out[i], dtype=torch.float32) for i in idx]
        torch._foreach_copy_(copies, [out[i] for i in idx])
        for i, c in zip(idx, copies):
            out[i] = c
    return out


def _write_back(dst: TensorSeq, src: list[Tensor]) -> None:
    pairs = [(d, s) for d, s in zip(dst, src) if d is not s]
    if pairs:
        torch._foreach_copy_([d for d, _ in pairs], [s for _, s in pairs])


def _norms64(ts: Sequence[Tensor]) -> Tensor:
    """Each tensor's L2 norm, accumulated and returned in float64 (the kernels' accumulator:
    a float32 sum of squares could overflow), as one 1-D tensor on the tensors' device."""
    if compat.foreach_norm_takes_dtype():
        norms = torch._foreach_norm(list(ts), 2, dtype=torch.float64)
    else:
        # torch < 2.3: no dtype argument. float64 copies (exact) keep the accumulator and
        # the fixed number of calls; they cost twice the gradients' float32 size, for the
        # length of this call (a norm per tensor would cost a call per tensor instead).
        wide = [torch.empty_like(t, dtype=torch.float64) for t in ts]
        torch._foreach_copy_(wide, list(ts))
        norms = torch._foreach_norm(wide, 2)
    return torch.stack(list(norms))


def _total(norms: Tensor) -> Tensor:
    """The L2 norm of all tensors from their norms (float64, 0-dim). Non-finite exactly when
    some element of the tensors is: float64 squares of float32 values cannot overflow."""
    return torch.linalg.vector_norm(norms)


def nonfinite_flag(total: Tensor) -> Tensor:
    """amp's found-inf flag (float32 0/1, shape [1], on ``total``'s device) from a total norm,
    in two calls: total * 0 is 0 for a finite total, NaN for inf or NaN (torch.isfinite
    would take five)."""
    flag = torch.empty(1, dtype=torch.float32, device=total.device)
    return torch.ne(torch.mul(total.reshape(1), 0.0), 0.0, out=flag)


# A gradient scale: a number, or a 0-dim tensor on the gradients' device (a clip factor
# computed there, not read back to the host).
GradScale = Union[float, Tensor]


def _scaled_f32(grads: TensorSeq, grad_scale: GradScale) -> list[Tensor]:
    """float32 gradients times ``grad_scale``, for reading only: the gradients themselves when
    they are float32 and the scale is 1 (x * 1.0 == x exactly), else fresh tensors."""
    if isinstance(grad_scale, Tensor):
        # A no-op where the scale already is float32 on the gradients' device (the clip
        # factors are made so); a group's other device gets its own copy.
        scale: Union[float, Tensor] = grad_scale.to(device=grads[0].device, dtype=torch.float32)
    else:
        scale = float(grad_scale)
        if scale == 1.0:
            return _f32(grads)
    if grads and grads[0].dtype != torch.float32:
        g = _f32(grads)  # fresh copies: scale them in place
        torch._foreach_mul_(g, scale)
        return g
    return list(torch._foreach_mul(list(grads), scale))


def _host_scale(grad_scale: GradScale) -> float:
    # The compiled kernels take a number; their tensors are CPU ones, so no device waits.
    return float(grad_scale)


# --- scale -----------------------------------------------------------------------
def _any_nonfinite(ts: list[Tensor]) -> bool:
    # One reduction over all tensors and one read, whatever their number.
    return bool(torch.ne(torch.mul(_total(_norms64(ts)), 0.0), 0.0).item())


def scale(inputs: TensorSeq, outputs: TensorSeq, scale: float) -> bool:
    """outputs[i] = inputs[i] * scale (cast to outputs' dtype).

    Returns True if any result is non-finite; outputs are written regardless (the
    caller skips the step), like apex's multi_tensor_scale."""
    mod = _kernels(inputs)
    if mod is not None:
        return mod.scale(list(inputs), list(outputs), float(scale))
    _check_lists(inputs=inputs, outputs=outputs)
    vals = _scale_into(inputs, outputs, float(scale))
    return _any_nonfinite(vals)


def _scale_into(inputs: TensorSeq, outputs: TensorSeq, scale: float) -> list[Tensor]:
    """outputs[i] = inputs[i] * scale, computed in float32; returns the float32 results (the
    outputs themselves when they are float32)."""
    outs = list(outputs)
    if all(o.dtype == torch.float32 for o in outs):
        if any(o is not i for o, i in zip(outs, inputs)):
            torch._foreach_copy_(outs, list(inputs))  # float32 exactly, as _f32 would
        torch._foreach_mul_(outs, scale)
        return outs
    vals = list(torch._foreach_mul(_f32(inputs), scale))
    torch._foreach_copy_(outs, vals)
    return vals


def axpby(
    xs: TensorSeq, ys: TensorSeq, outputs: TensorSeq, a: float, b: float, arg_to_check: int = -1
) -> bool:
    """outputs[i] = a*xs[i] + b*ys[i]; True if a checked input (-1 both, 0 xs, 1 ys)
    holds a non-finite value."""
    if arg_to_check not in (-1, 0, 1):
        raise ValueError("amp.multi_tensor.axpby: arg_to_check must be -1 (both), 0 (x) or 1 (y)")
    mod = _kernels(xs)
    if mod is not None:
        return mod.axpby(list(xs), list(ys), list(outputs), float(a), float(b), arg_to_check)
    _check_lists(xs=xs, ys=ys, outputs=outputs)
    fx, fy = _f32(xs), _f32(ys)
    checked = ([] if arg_to_check == 1 else fx) + ([] if arg_to_check == 0 else fy)
    bad = _any_nonfinite(checked)
    vals = torch._foreach_mul(fx, float(a))
    torch._foreach_add_(vals, torch._foreach_mul(fy, float(b)))
    torch._foreach_copy_(list(outputs), list(vals))
    return bad


def l2norm(
    tensors: TensorSeq, scale: float = 1.0, per_tensor: bool = False
) -> tuple[float, Optional[Tensor], bool]:
    """(L2 norm of all tensors*scale, float64 tensor of per-tensor norms or None,
    True if any tensor*scale is non-finite). Read-only."""
    mod = _kernels(tensors)
    if mod is not None:
        return mod.l2norm(list(tensors), float(scale), bool(per_tensor))
    _check_lists(tensors=tensors)
    norms = _norms64(_scaled_f32(tensors, float(scale)))
    total = float(_total(norms).item())  # the one read: non-finite iff a value is
    return total, (norms.cpu() if per_tensor else None), not math.isfinite(total)


def l2norm_device(tensors: TensorSeq, scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """``l2norm`` without reading anything back: (the total norm, a float64 0-dim tensor;
    the found-inf flag, float32 shape [1]), both on the tensors' device. On the CPU kernels'
    path the numbers are wrapped as CPU tensors."""
    mod = _kernels(tensors)
    if mod is not None:
        total, _, bad = mod.l2norm(list(tensors), float(scale), False)
        return (
            torch.tensor(float(total), dtype=torch.float64),
            torch.tensor([1.0 if bad else 0.0]),
        )
    total_t = l2norm_total_device(tensors, scale)
    return total_t, nonfinite_flag(total_t)


def l2norm_total_device(tensors: TensorSeq, scale: float = 1.0) -> Tensor:
    """The total of ``l2norm_device`` alone (no flag: a clip needs only the norm), for
    tensors off the CPU kernels' path."""
    _check_lists(tensors=tensors)
    return _total(_norms64(_scaled_f32(tensors, float(scale))))


# --- optimizers ------------------------------------------------------------------
def _check_step(name: str, step: int) -> None:
    if step < 1:
        raise ValueError(f"amp.multi_tensor.{name}: step must be >= 1")


def _model_list(model_params: Optional[TensorSeq]) -> Optional[list[Tensor]]:
    return None if model_params is None else list(model_params)


def adam(
    grads: TensorSeq,
    params: TensorSeq,
    exp_avgs: TensorSeq,
    exp_avg_sqs: TensorSeq,
    model_params: Optional[TensorSeq] = None,
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    step: int,
    adam_w_mode: bool,
    bias_correction: bool = True,
    weight_decay: float = 0.0,
    grad_scale: GradScale = 1.0,
) -> None:
    """One Adam/AdamW step (torch.optim.Adam/AdamW arithmetic) on every tensor.

    Gradients are multiplied by ``grad_scale`` (inverse loss scale x clip coefficient; on
    the fallback also a 0-dim tensor on the gradients' device) as they are read and never
    written. When ``model_params`` is given, the updated fp32 params are also written,
    cast, into it in the same pass."""
    mod = _kernels(grads)
    if mod is not None:
        mod.adam(
            list(grads),
            list(params),
            list(exp_avgs),
            list(exp_avg_sqs),
            _model_list(model_params),
            float(lr),
            float(beta1),
            float(beta2),
            float(eps),
            int(step),
            bool(adam_w_mode),
            bool(bias_correction),
            float(weight_decay),
            _host_scale(grad_scale),
        )
        return
    _check_step("adam", step)
    _check_lists(
        model_params is not None,
        grads=grads,
        params=params,
        exp_avgs=exp_avgs,
        exp_avg_sqs=exp_avg_sqs,
        model_params=model_params,
    )
    bc1 = 1.0 - beta1**step if bias_correction else 1.0
    bc2 = 1.0 - beta2**step if bias_correction else 1.0
    g = _scaled_f32(grads, grad_scale)
    p, m, v = _f32(params), _f32(exp_avgs), _f32(exp_avg_sqs)
    if adam_w_mode:
        torch._foreach_mul_(p, 1.0 - lr * weight_decay)
    elif weight_decay != 0:
        g = list(torch._foreach_add(g, p, alpha=weight_decay))
    torch._foreach_lerp_(m, g, 1.0 - beta1)
    torch._foreach_mul_(v, beta2)
    torch._foreach_addcmul_(v, g, g, 1.0 - beta2)
    denom = torch._foreach_sqrt(v)
    torch._foreach_div_(denom, math.sqrt(bc2))
    torch._foreach_add_(denom, eps)
    torch._foreach_addcdiv_(p, m, denom, -lr / bc1)
    _write_back(params, p)
    _write_back(exp_avgs, m)
    _write_back(exp_avg_sqs, v)
    if model_params is not None:
        _write_back(model_params, p)


def sgd(
    grads: TensorSeq,
    params: TensorSeq,
    momentum_buffers: Optional[TensorSeq] = None,
    model_params: Optional[TensorSeq] = None,
    *,
    lr: float,
    momentum: float = 0.0,
    dampening: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
    wd_after_momentum: bool = False,
    first_run: bool = False,
    grad_scale: GradScale = 1.0,
) -> None:
    """One SGD step (torch.optim.SGD arithmetic; apex's ``wd_after_momentum``).

    With ``first_run`` the momentum buffers are initialised to the gradient (their
    old contents are ignored), as torch does on a parameter's first step."""
    mod = _kernels(grads)
    if mod is not None:
        mod.sgd(
            list(grads),
            list(params),
            None if momentum_buffers is None else list(momentum_buffers),
            _model_list(model_params),
            float(lr),
            float(momentum),
            float(dampening),
            float(weight_decay),
            bool(nesterov),
            bool(wd_after_momentum),
            bool(first_run),
            _host_scale(grad_scale),
        )
        return
    if momentum != 0 and momentum_buffers is None:
        raise ValueError("amp.multi_tensor.sgd: momentum != 0 needs momentum_buffers")
    _check_lists(
        model_params is not None,
        grads=grads,
        params=params,
        momentum_buffers=momentum_buffers if momentum != 0 else None,
        model_params=model_params,
    )
    d = _scaled_f32(grads, grad_scale)
    p = _f32(params)
    if weight_decay != 0 and not wd_after_momentum:
        d = list(torch._foreach_add(d, p, alpha=weight_decay))
    if momentum != 0:
        assert momentum_buffers is not None
        b = _f32(momentum_buffers)
        if first_run:
            torch._foreach_copy_(b, d)
        else:
            torch._foreach_mul_(b, momentum)
            torch._foreach_add_(b, d, alpha=1.0 - dampening)
        d = list(torch._foreach_add(d, b, alpha=momentum)) if nesterov else b
        _write_back(momentum_buffers, b)
    if weight_decay != 0 and wd_after_momentum:
        d = list(torch._foreach_add(d, p, alpha=weight_decay))
    torch._foreach_add_(p, d, alpha=-lr)
    _write_back(params, p)
    if model_params is not None:
        _write_back(model_params, p)


def _f32_constant(x: float) -> float:
    # The kernels round these host-side constants to float32; so does the fallback.
    return float(torch.tensor(x, dtype=torch.float32))


def lamb(
    grads: TensorSeq,
    params: TensorSeq,
    exp_avgs: TensorSeq,
    exp_avg_sqs: TensorSeq,
    model_params: Optional[TensorSeq] = None,
    *,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    step: int,
    bias_correction: bool = True,
    weight_decay: float = 0.0,
    grad_averaging: bool = True,
    adam_w_mode: bool = True,
    use_nvlamb: bool = False,
    grad_scale: GradScale = 1.0,
) -> Tensor:
    """One LAMB step (apex's multi_tensor_lamb); ``grad_scale`` folds in the inverse
    loss scale and the global-norm clip ratio. Returns the per-tensor step sizes
    (lr x trust ratio) that were applied (float32; on the fallback on the tensors' device,
    computed there: no value is read back)."""
    mod = _kernels(grads)
    if mod is not None:
        return mod.lamb(
            list(grads),
            list(params),
            list(exp_avgs),
            list(exp_avg_sqs),
            _model_list(model_params),
            float(lr),
            float(beta1),
            float(beta2),
            float(eps),
            int(step),
            bool(bias_correction),
            float(weight_decay),
            bool(grad_averaging),
            bool(adam_w_mode),
            bool(use_nvlamb),
            _host_scale(grad_scale),
        )
    _check_step("lamb", step)
    _check_lists(
        model_params is not None,
        grads=grads,
        params=params,
        exp_avgs=exp_avgs,
        exp_avg_sqs=exp_avg_sqs,
        model_params=model_params,
    )
    beta3 = _f32_constant(1.0 - beta1) if grad_averaging else 1.0
    bc1 = _f32_constant(1.0 - beta1**step) if bias_correction else 1.0
    bc2 = _f32_constant(1.0 - beta2**step) if bias_correction else 1.0
    g = _scaled_f32(grads, grad_scale)
    p, m, v = _f32(params), _f32(exp_avgs), _f32(exp_avg_sqs)
    if not adam_w_mode and weight_decay != 0:
        g = list(torch._foreach_add(g, p, alpha=weight_decay))
    torch._foreach_mul_(m, beta1)
    torch._foreach_add_(m, g, alpha=beta3)
    torch._foreach_mul_(v, beta2)
    torch._foreach_addcmul_(v, g, g, 1.0 - beta2)
    denom = torch._foreach_div(v, bc2)
    torch._foreach_sqrt_(denom)
    torch._foreach_add_(denom, eps)
    upd = torch._foreach_div(m, bc1)
    torch._foreach_div_(upd, denom)
    if adam_w_mode and weight_decay != 0:
        torch._foreach_add_(upd, p, alpha=weight_decay)
    device, count = p[0].device, len(p)
    r = torch.empty(count, dtype=torch.float32, device=device)
    if use_nvlamb or weight_decay != 0:
        # The trust ratio lr * |p| / |update| per tensor (lr where either norm is 0), in
        # float64 as the kernel computes it, rounded to float32 as it is stored (out=). Both
        # lists' norms in one call; pn * un is 0 exactly where one is (float64 products of
        # float32 norms neither underflow nor overflow).
        norms = _norms64(list(p) + list(upd))
        pn, un = norms[:count], norms[count:]
        ratio = torch.div(pn, un).masked_fill_(torch.mul(pn, un) == 0, 1.0)
        torch.mul(ratio, lr, out=r)
    else:
        r.fill_(lr)
    # p - r_i * update_i, the product rounded first as in p.sub_(update * r_i).
    torch._foreach_addcmul_(p, upd, list(r.unbind()), value=-1.0)
    _write_back(params, p)
    _write_back(exp_avgs, m)
    _write_back(exp_avg_sqs, v)
    if model_params is not None:
        _write_back(model_params, p)
    return r


def scale_l2norm(inputs: TensorSeq, outputs: TensorSeq, scale: float) -> tuple[float, bool]:
    """outputs[i] = inputs[i] * scale (outputs may be the inputs: in place); returns (L2 norm of
    the outputs, True if any is non-finite). One read of the inputs does both."""
    mod = _kernels(inputs)
    if mod is not None:
        norm, bad = mod.scale_l2norm(list(inputs), list(outputs), float(scale))
        return float(norm), bool(bad)
    total_t, _ = scale_l2norm_device(inputs, outputs, scale)
    total = float(total_t.item())  # the one read: non-finite iff a value is
    return total, not math.isfinite(total)


def scale_l2norm_device(
    inputs: TensorSeq, outputs: TensorSeq, scale: float
) -> tuple[Tensor, Tensor]:
    """``scale_l2norm`` without reading anything back: (the L2 norm of the outputs, float64
    0-dim; the found-inf flag, float32 shape [1]) on the tensors' device, after a fixed number
    of calls whatever the number of tensors. On the CPU kernels' path the kernel's numbers
    are wrapped as CPU tensors."""
    mod = _kernels(inputs)
    if mod is not None:
        norm, bad = mod.scale_l2norm(list(inputs), list(outputs), float(scale))
        return (torch.tensor(float(norm), dtype=torch.float64), torch.tensor([1.0 if bad else 0.0]))
    _check_lists(inputs=inputs, outputs=outputs)
    total = _total(_norms64(_scale_into(inputs, outputs, float(scale))))
    return total, nonfinite_flag(total)


def adagrad(
    grads: TensorSeq,
    params: TensorSeq,
    sums: TensorSeq,
    model_params: Optional[TensorSeq] = None,
    *,
    lr: float,
    eps: float,
    weight_decay: float = 0.0,
    w_mode: bool = False,
    grad_scale: GradScale = 1.0,
) -> None:
    """One Adagrad step (torch.optim.Adagrad's arithmetic with ``w_mode=False``; apex's
    decoupled decay with ``w_mode=True``), writing the half ``model_params`` copy if given."""
    mod = _kernels(grads)
    if mod is not None:
        mod.adagrad(
            list(grads),
            list(params),
            list(sums),
            _model_list(model_params),
            float(lr),
            float(eps),
            float(weight_decay),
            bool(w_mode),
            _host_scale(grad_scale),
        )
        return
    _check_lists(
        model_params is not None, grads=grads, params=params, sums=sums, model_params=model_params
    )
    g = _scaled_f32(grads, grad_scale)
    p, h = _f32(params), _f32(sums)
    if not w_mode and weight_decay != 0:
        g = list(torch._foreach_add(g, p, alpha=weight_decay))
    torch._foreach_addcmul_(h, g, g)
    std = torch._foreach_sqrt(h)
    torch._foreach_add_(std, eps)
    if w_mode:
        upd = torch._foreach_div(g, std)
        torch._foreach_add_(upd, p, alpha=weight_decay)
        torch._foreach_add_(p, upd, alpha=-lr)
    else:
        torch._foreach_addcdiv_(p, g, std, -lr)
    _write_back(params, p)
    _write_back(sums, h)
    if model_params is not None:
        _write_back(model_params, p)


def novograd(
    grads: TensorSeq,
    params: TensorSeq,
    exp_avgs: TensorSeq,
    model_params: Optional[TensorSeq] = None,
    *,
    grad_norms: Tensor,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    step: int,
    bias_correction: bool = True,
    weight_decay: float = 0.0,
    grad_averaging: bool = True,
    moment_mode: int = 1,
    norm_type: int = 2,
    init_norms: bool = False,
    grad_scale: GradScale = 1.0,
) -> None:
    """One NovoGrad step (apex's multi_tensor_novograd). ``grad_norms`` (float32, one per
    tensor) holds the blended per-tensor gradient norms and is updated in place; with
    ``init_norms`` it is set to this step's norms. ``moment_mode`` 0 regularises inside the
    moment, 1 decouples the weight decay; ``norm_type`` 2 is L2, 0 the max norm."""
    mod = _kernels(grads)
    if mod is not None:
        mod.novograd(
            list(grads),
            list(params),
            list(exp_avgs),
            _model_list(model_params),
            grad_norms,
            float(lr),
            float(beta1),
            float(beta2),
            float(eps),
            int(step),
            bool(bias_correction),
            float(weight_decay),
            bool(grad_averaging),
            int(moment_mode),
            int(norm_type),
            bool(init_norms),
            _host_scale(grad_scale),
        )
        return
    _check_step("novograd", step)
    if norm_type not in (0, 2):
        raise ValueError(
            f"amp.multi_tensor.novograd: norm_type must be 2 (L2) or 0 (max); got {norm_type}"
        )
    if moment_mode not in (0, 1):
        raise ValueError("amp.multi_tensor.novograd: moment_mode must be 0 or 1")
    _check_lists(
        model_params is not None,
        grads=grads,
        params=params,
        exp_avgs=exp_avgs,
        model_params=model_params,
    )
    g = _scaled_f32(grads, grad_scale)
    p, m = _f32(params), _f32(exp_avgs)
    bc1 = 1.0 - beta1**step if bias_correction else 1.0
    bc2 = math.sqrt(1.0 - beta2**step) if bias_correction else 1.0
    beta3 = 1.0 - beta1 if grad_averaging else 1.0
    # This step's norms, blended with the old ones in float64, kept in float32 (grad_norms);
    # the denominators from the kept norms, rounded to float32: the kernel's arithmetic.
    if norm_type == 2:
        n = _norms64(g)
    elif all(t.numel() for t in g):
        n = torch.stack(list(torch._foreach_norm(g, float("inf")))).to(torch.float64)
    else:  # the max norm has no identity: an empty tensor's is 0 here, as the kernel's
        n = torch.stack([t.abs().max() if t.numel() else t.new_zeros(()) for t in g]).to(
            torch.float64
        )
    if not init_norms:
        # beta2 * old * old + (1 - beta2) * n * n, in that order (addcmul: self + v * a * b)
        old = grad_norms.to(torch.float64)
        if norm_type == 2:
            n = torch.sqrt(torch.addcmul(torch.mul(old, beta2).mul_(old), n, n, value=1 - beta2))
        else:
            n = torch.add(torch.mul(old, beta2), n, alpha=1 - beta2)
    grad_norms.copy_(n)
    denom = torch.empty_like(grad_norms, dtype=torch.float32)
    torch.add(grad_norms.to(torch.float64) / bc2, eps, out=denom)  # rounded to float32
    denoms = list(denom.unbind())
    if moment_mode == 0:
        g = list(torch._foreach_div(g, denoms))
        torch._foreach_add_(g, p, alpha=weight_decay)
        torch._foreach_mul_(m, beta1)
        torch._foreach_add_(m, torch._foreach_mul(g, beta3))
        upd = torch._foreach_div(m, bc1)
    else:
        torch._foreach_mul_(m, beta1)
        torch._foreach_add_(m, torch._foreach_mul(g, beta3))
        upd = torch._foreach_div(m, bc1)
        torch._foreach_div_(upd, denoms)
        torch._foreach_add_(upd, p, alpha=weight_decay)
    torch._foreach_sub_(p, upd, alpha=lr)
    _write_back(params, p)
    _write_back(exp_avgs, m)
    if model_params is not None:
        _write_back(model_params, p)
