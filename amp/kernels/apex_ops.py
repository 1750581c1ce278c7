"""apex's ``amp_C.multi_tensor_*`` entry points: their conventions, written once.

``amp._C.multi_tensor_*(chunk_size, noop_flag, tensor_lists, *args)`` are the functions below,
whichever binding was built (each binding's module init calls :func:`install`), and they serve
every device: they unpack apex's ``tensor_lists`` and call amp's multi-tensor ops
(``amp.kernels.ops``), which run the compiled kernels on CPU
tensors and amp's pure-torch versions on any other device (CUDA, Ascend's ``npu``), so code
written for apex's ``multi_tensor_applier`` works on the device it was written for. Conventions
kept from apex:

* ``tensor_lists`` is a list of lists (grads, params, ...) in apex's order; how many lists
  each op takes is checked here (``_count``);
* ``noop_flag`` (a one-element tensor) is set to 1 when scale/axpby/l2norm meet a non-finite
  value, never cleared; ``multi_tensor_sgd`` does nothing when it is already set;
* ``multi_tensor_lamb`` clips by ``global_grad_norm / max_grad_norm`` when the norm exceeds it;
* ``chunk_size`` is accepted and ignored: the CPU kernels chunk the work themselves.

Returned norms are float32 tensors on the tensors' device (apex returns them on its device).
Python rather than C++ is the one place because only Python reaches every device: C++ could
serve CPU tensors only, and the other devices would need these rules a second time.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

from . import ops as mt

# typing's generics: a module-level alias is evaluated at import, and Python 3.8's builtins
# and collections.abc classes cannot be subscripted.
Lists = Sequence[Sequence[Tensor]]


def _count(lists: Lists, lo: int, hi: int, op: str) -> None:
    if not lo <= len(lists) <= hi:
        expected = f"{lo}" + (f" or {hi}" if hi > lo else "")
        raise ValueError(f"amp._C.{op}: tensor_lists has {len(lists)} lists; expected {expected}")


def _optional(lists: Lists, i: int) -> Optional[Sequence[Tensor]]:
    return lists[i] if i < len(lists) else None


def _raise_flag(noop_flag: Tensor, overflow: bool) -> None:
    if overflow:  # set, never cleared (apex)
        noop_flag.fill_(1)


def multi_tensor_scale(
    chunk_size: int, noop_flag: Tensor, tensor_lists: Lists, scale: float
) -> None:
    _count(tensor_lists, 2, 2, "multi_tensor_scale")
    _raise_flag(noop_flag, mt.scale(tensor_lists[0], tensor_lists[1], scale))


def multi_tensor_axpby(
    chunk_size: int, noop_flag: Tensor, tensor_lists: Lists, a: float, b: float, arg_to_check: int
) -> None:
    _count(tensor_lists, 3, 3, "multi_tensor_axpby")
    xs, ys, outs = tensor_lists
    _raise_flag(noop_flag, mt.axpby(xs, ys, outs, a, b, arg_to_check))


def _l2norm(
    noop_flag: Tensor, tensor_lists: Lists, scale: float, per_tensor: Optional[bool], op: str
) -> tuple[Tensor, Tensor]:
    _count(tensor_lists, 1, 1, op)
    per = bool(per_tensor)
    total, per_norms, bad = mt.l2norm(tensor_lists[0], scale, per)
    _raise_flag(noop_flag, bad)
    device = tensor_lists[0][0].device
    norm = torch.full((1,), total, dtype=torch.float32, device=device)
    if per and per_norms is not None:
        return norm, per_norms.to(device=device, dtype=torch.float32)
    return norm, torch.empty(0, dtype=torch.float32, device=device)


def multi_tensor_l2norm(
    chunk_size: int, noop_flag: Tensor, tensor_lists: Lists, per_tensor: Optional[bool] = None
) -> tuple[Tensor, Tensor]:
    return _l2norm(noop_flag, tensor_lists, 1.0, per_tensor, "multi_tensor_l2norm")


def multi_tensor_unscale_l2norm(
    chunk_size: int,
    noop_flag: Tensor,
    tensor_lists: Lists,
    inv_scale: Tensor,
    per_tensor: Optional[bool] = None,
) -> tuple[Tensor, Tensor]:
    return _l2norm(
        noop_flag, tensor_lists, float(inv_scale.item()), per_tensor, "multi_tensor_unscale_l2norm"
    )


def multi_tensor_adam(
    chunk_size: int,
    noop_flag: Tensor,
    tensor_lists: Lists,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    step: int,
    mode: int,
    bias_correction: int,
    weight_decay: float,
) -> None:
    _count(tensor_lists, 4, 5, "multi_tensor_adam")
    g, p, m, v = tensor_lists[:4]
    mt.adam(
        g,
        p,
        m,
        v,
        _optional(tensor_lists, 4),
        lr=lr,
        beta1=beta1,
        beta2=beta2,
        eps=eps,
        step=step,
        adam_w_mode=mode == 1,
        bias_correction=bias_correction != 0,
        weight_decay=weight_decay,
    )


def multi_tensor_sgd(
    chunk_size: int,
    noop_flag: Tensor,
    tensor_lists: Lists,
    wd: float,
    momentum: float,
    dampening: float,
    lr: float,
    nesterov: bool,
    first_run: bool,
    wd_after_momentum: bool,
    scale: float = 1.0,
) -> None:
    _count(tensor_lists, 3, 4, "multi_tensor_sgd")
    if float(noop_flag.item()) != 0.0:
        return  # apex's SGD skips the step once an overflow was flagged
    g, p, bufs = tensor_lists[:3]
    mt.sgd(
        g,
        p,
        bufs,
        _optional(tensor_lists, 3),
        lr=lr,
        momentum=momentum,
        dampening=dampening,
        weight_decay=wd,
        nesterov=nesterov,
        wd_after_momentum=wd_after_momentum,
        first_run=first_run,
        grad_scale=scale,
    )


def multi_tensor_lamb(
    chunk_size: int,
    noop_flag: Tensor,
    tensor_lists: Lists,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    step: int,
    bias_correction: int,
    weight_decay: float,
    grad_averaging: int,
    mode: int,
    global_grad_norm: Tensor,
    max_grad_norm: float,
    use_nvlamb: Optional[bool] = None,
) -> None:
    _count(tensor_lists, 4, 5, "multi_tensor_lamb")
    norm = float(global_grad_norm.item())
    # apex clips by global_grad_norm / max_grad_norm when the norm exceeds it.
    clip = norm / max_grad_norm if max_grad_norm > 0 and norm > max_grad_norm else 1.0
    g, p, m, v = tensor_lists[:4]
    mt.lamb(
        g,
        p,
        m,
        v,
        _optional(tensor_lists, 4),
        lr=lr,
        beta1=beta1,
        beta2=beta2,
        eps=eps,
        step=step,
        bias_correction=bias_correction != 0,
        weight_decay=weight_decay,
        grad_averaging=grad_averaging != 0,
        adam_w_mode=mode == 1,
        use_nvlamb=bool(use_nvlamb),
        grad_scale=1.0 / clip,
    )


def multi_tensor_adagrad(
    chunk_size: int,
    noop_flag: Tensor,
    tensor_lists: Lists,
    lr: float,
    eps: float,
    mode: int,
    weight_decay: float,
) -> None:
    _count(tensor_lists, 3, 4, "multi_tensor_adagrad")
    g, p, h = tensor_lists[:3]
    mt.adagrad(
        g,
        p,
        h,
        _optional(tensor_lists, 3),
        lr=lr,
        eps=eps,
        weight_decay=weight_decay,
        w_mode=mode == 1,
    )


def multi_tensor_novograd(
    chunk_size: int,
    noop_flag: Tensor,
    tensor_lists: Lists,
    grad_norms: Tensor,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    step: int,
    bias_correction: int,
    weight_decay: float,
    grad_averaging: int,
    moment_mode: int,
    norm_type: int,
) -> None:
    _count(tensor_lists, 3, 4, "multi_tensor_novograd")
    g, p, m = tensor_lists[:3]
    mt.novograd(
        g,
        p,
        m,
        _optional(tensor_lists, 3),
        grad_norms=grad_norms,
        lr=lr,
        beta1=beta1,
        beta2=beta2,
        eps=eps,
        step=step,
        bias_correction=bias_correction != 0,
        weight_decay=weight_decay,
        grad_averaging=grad_averaging != 0,
        moment_mode=moment_mode,
        norm_type=norm_type,
    )


OPS: dict[str, Callable[..., Any]] = {
    f.__name__: f
    for f in (
        multi_tensor_scale,
        multi_tensor_axpby,
        multi_tensor_l2norm,
        multi_tensor_unscale_l2norm,
        multi_tensor_adam,
        multi_tensor_sgd,
        multi_tensor_lamb,
        multi_tensor_adagrad,
        multi_tensor_novograd,
    )
}


def install(module: ModuleType) -> None:
    """Give amp._C *module* (either binding) apex's entry points, as its own functions: apex
    code reaches them as ``amp_C.multi_tensor_*`` and ``multi_tensor_applier`` takes them."""
    for name, fn in OPS.items():
        setattr(module, name, fn)
