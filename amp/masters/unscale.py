"""Gradients on their way to a step: the one grouper that splits tensors into kernel calls, the
one check that a gradient is dense (every kernel amp calls reads strided memory), and the
unscale passes, which all answer with one result type, ``Unscaled``."""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Callable, Optional, Tuple, TypeVar, Union

import torch
from torch import Tensor

from .._torch_compat import non_finite_check_and_unscale_
from ..kernels import ops as mt
from .grad_pool import MasterGradPool, fresh
from .optimizer_like import DeferredStep

# One message for every path (per-tensor lists, amp's one-pass unscale, combined buffers, the
# fused optimizers' own reads): torch's unscale kernel would fail on a sparse gradient too,
# with a dispatcher dump instead of a reason.
SPARSE_GRADIENTS = "amp: sparse gradients are not supported"

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


def group_by(items: Iterable[T], key: Callable[[T], K]) -> dict[K, list[T]]:
    """``items`` split by ``key``: groups in the order their first item came, items in their
    own order within a group (the order a kernel call then sees them in)."""
    groups: dict[K, list[T]] = {}
    for item in items:
        k = key(item)
        group = groups.get(k)
        if group is None:
            groups[k] = [item]
        else:
            group.append(item)
    return groups


def dense(grad: Tensor) -> Tensor:
    """``grad``, which must be dense (strided); a sparse gradient raises ``SPARSE_GRADIENTS``."""
    if grad.layout is not torch.strided:
        raise RuntimeError(SPARSE_GRADIENTS)
    return grad


# --- unscaling: one result for every path ------------------------------------------------------
#
# Four paths remove the loss scale from a step's gradients, each with its own trade-off (see
# amp/masters/stash.py): per tensor list (any optimizer; GradScaler's kernel, bit-identical to
# GradScaler.unscale_), amp's one pass (fused optimizers: unscale, check and norm in one read),
# the combined buffers (one call per buffer) and the deferred check (read-only; the optimizer's
# kernel unscales as it reads). Each answers with an ``Unscaled``.


# A gradient norm as a pass left it: a number (the CPU kernels') or a float64 0-dim tensor
# on the gradients' device (the device fallback's, not read back yet).
Norm = Union[float, Tensor]


@dataclass
class Unscaled:
    """What an unscale pass found.

    ``flag`` is the found-inf verdict as the pass left it: a 0/1 float tensor where the pass
    computed it on the gradients' device (nothing has waited for the device yet), or a bool
    where the pass itself already read it on the host. ``found_inf()`` gives the tensor
    (what scale_loss combines and agrees on across ranks), ``nonfinite`` the host's answer (a
    synchronisation where ``flag`` is a device tensor). One pass also measures the global L2
    ``norm`` of the unscaled gradients it wrote (``grads``), which a fused optimizer's clipping
    reuses: a number on the CPU kernels' path, a float64 0-dim device tensor (not read back)
    on the device fallback's."""

    flag: Union[Tensor, bool]
    norm: Optional[Norm] = None
    grads: list[Tensor] = field(default_factory=list)

    def found_inf(self) -> Tensor:
        if isinstance(self.flag, Tensor):
            return self.flag
        return torch.tensor([1.0 if self.flag else 0.0])

    @property
    def nonfinite(self) -> bool:
        if isinstance(self.flag, Tensor):
            return bool(self.flag.item() > 0)
        return self.flag


def check_and_unscale_(grads: list[Tensor], inv_scale: float) -> Tensor:
    """``grads *= inv_scale`` in place (one device) with GradScaler's kernel and its reciprocal
    (computed in double, stored as float32); returns the found-inf flag, a 0/1 float tensor on
    that device."""
    device = grads[0].device
    found_inf = torch.zeros(1, dtype=torch.float32, device=device)
    inv = torch.tensor(inv_scale, dtype=torch.float64).float().to(device)
    non_finite_check_and_unscale_(grads, found_inf, inv)
    return found_inf


# typing's generics: a module-level alias is evaluated at import, and Python 3.8's builtins
# and collections.abc classes cannot be subscripted.
Pair = Tuple[Tensor, Tensor, Optional[Tensor]]


def unscale_lists(
    pairs: Sequence[Pair], inv_scale: float, pool: Optional[MasterGradPool] = None
) -> Unscaled:
    """Per tensor list: unscale gradients, checking for non-finite values.

    Each pair is ``(model_param, master_param, stashed_grad)``. The model's gradient times
    ``inv_scale`` becomes the master's gradient (computed in place when they are the same tensor,
    else into a tensor of the master's dtype: a view of ``pool``'s buffer where one is given and
    the masters are fp32 CPU tensors, else a fresh one), plus ``stashed_grad`` (an
    already-unscaled gradient from an earlier loss) when one is given. Uses GradScaler's fused
    kernel, so the result is bit-identical to ``GradScaler.unscale_``.
    """
    written: list[Tensor] = []
    stashed: list[tuple[Tensor, Tensor]] = []
    copies = _copied_grads(pairs, pool)
    for model_param, master, stash in pairs:
        grad = model_param.grad
        if grad is None:
            if stash is not None:
                master.grad = stash
            continue
        dense(grad)
        if model_param is not master:
            grad = copies[id(master)]
            master.grad = grad
        written.append(grad)
        if stash is not None:
            stashed.append((grad, stash))
    flags = [
        check_and_unscale_(grads, inv_scale)
        for grads in group_by(written, lambda g: (g.device, g.dtype)).values()
    ]
    if stashed:
        torch._foreach_add_([g for g, _ in stashed], [s for _, s in stashed])
    if not flags:
        return Unscaled(torch.zeros(1))
    return Unscaled(torch.stack([f.to(flags[0].device) for f in flags]).amax())


def _copied_grads(pairs: Sequence[Pair], pool: Optional[MasterGradPool]) -> dict[int, Tensor]:
    """id(master) -> the model's gradient copied into the master's dtype, for each master with a
    half copy whose model param has a gradient (checked dense), in one copy call into
    ``_master_grads``' tensors (the pool's kept views on the CPU, else fresh ones)."""
    separate = [
        (model, master)
        for model, master, _ in pairs
        if model is not master and model.grad is not None
    ]
    grads = [dense(model.grad).detach() for model, _ in separate]
    masters = [master for _, master in separate]
    outs = _master_grads(masters, pool)
    if masters:
        torch._foreach_copy_(outs, grads)
    return {id(master): out for master, out in zip(masters, outs)}


def _contiguous_grad(param: Tensor) -> Tensor:
    grad = dense(param.grad)
    if not grad.is_contiguous():
        param.grad = grad = grad.contiguous()
    return grad


def unscale_one_pass(
    pairs: Iterable[tuple[Tensor, Tensor]], inv_scale: float, pool: Optional[MasterGradPool] = None
) -> Unscaled:
    """amp's pass for a fused optimizer when ``scale_loss`` exits (the default, as apex): for
    each (model param, master) with a gradient, master.grad = model.grad * inv_scale, in one
    read that also checks for inf/NaN and measures the global norm (in place when the model
    parameter is its own master, into an fp32 master gradient under O2: a view of ``pool``'s
    buffer where one is given, else a fresh tensor). The optimizer is handed that norm, so
    clipping inside its step needs no second read, and its update then reads the unscaled
    gradients with scale 1."""
    pairs = list(pairs)
    one = _one_call(pairs, inv_scale, pool)
    if one is not None:
        return one
    with_grads = [(m, p) for m, p in pairs if m.grad is not None]
    separate = [p for m, p in with_grads if m is not p]
    taken = iter(_master_grads(separate, pool))
    moves: list[tuple[Tensor, Tensor]] = []  # (scaled grad, where it goes unscaled)
    for model_param, master in with_grads:
        grad = _contiguous_grad(model_param)
        if model_param is master:
            out = grad
        else:
            out = next(taken)
            master.grad = out
        moves.append((grad, out))
    norms: list[Norm] = []
    flags: list[Union[Tensor, bool]] = []
    written: list[Tensor] = []
    for kind in group_by(moves, lambda m: (m[0].dtype, m[1].dtype, m[0].device)).values():
        ins, outs = [g for g, _ in kind], [o for _, o in kind]
        if mt.uses_kernels(ins):
            norm, nonfinite = mt.scale_l2norm(ins, outs, inv_scale)
            norms.append(norm)
            flags.append(nonfinite)
        else:  # on a device: nothing read back here (a fixed number of calls, no sync)
            norm_t, flag_t = mt.scale_l2norm_device(ins, outs, inv_scale)
            norms.append(norm_t)
            flags.append(flag_t)
        written.extend(outs)
    total, flag = combine_norms(norms, flags)
    return Unscaled(flag, total, written)


def _master_grads(masters: list[Tensor], pool: Optional[MasterGradPool]) -> list[Tensor]:
    """Contiguous tensors of the masters' dtypes for the gradients of ``masters`` (O2):
    ``pool``'s (checked against the masters), else fresh."""
    if pool is not None and masters:
        return pool.checked_outputs(masters)
    return fresh(masters)


def _one_call(
    pairs: list[tuple[Tensor, Tensor]], inv_scale: float, pool: Optional[MasterGradPool]
) -> Optional[Unscaled]:
    """The common case of ``unscale_one_pass`` in one kernel call, with no per-tensor Python
    but reading the gradients (and, under O2, taking the master gradients): every pair has
    a gradient, and the CPU kernels take them all at once. The kernel checks each tensor (one
    dtype per list, contiguous, dense, on the CPU) before it writes anything, so a refusal
    leaves every gradient as it was and the general path takes over -- it splits the lists,
    makes gradients contiguous, or raises amp's own message. None in that case."""
    grads = [m.grad for m, _ in pairs]
    if not grads or any(g is None for g in grads) or not mt.uses_kernels(grads):
        return None
    if all(m is p for m, p in pairs):
        outs = grads
    elif any(m is p for m, p in pairs):
        return None
    elif pool is None:
        # The masters' own format, which costs a fifth less to ask for than a named one: a
        # non-contiguous master (channels_last) gets a gradient the kernel refuses, and the
        # general path allocates a contiguous one.
        outs = [torch.empty_like(p) for _, p in pairs]
    else:
        outs = pool.outputs([p for _, p in pairs])
    try:
        norm, nonfinite = mt.scale_l2norm(grads, outs, inv_scale)
    except (ValueError, TypeError):
        if pool is not None:
            pool.forget()  # the general path takes outputs for the masters as they are now
        return None
    if outs is not grads:
        try:
            for (_, master), out in zip(pairs, outs):
                master.grad = out
        except RuntimeError:
            # A master no longer has the shape its kept view was made for (its .data was
            # replaced): none keeps a gradient of this call, and the general path runs again.
            for _, master in pairs:
                master.grad = None
            if pool is not None:
                pool.forget()
            return None
    total, flag = combine_norms([norm], [nonfinite])
    return Unscaled(flag, total, outs)


def combine_norms(
    norms: Sequence[Norm], flags: Sequence[Union[Tensor, bool]]
) -> tuple[Norm, Union[Tensor, bool]]:
    """The global norm and found-inf flag of several kernel calls: numbers while every call
    answered with numbers (the CPU), else tensors on the first device tensor's device (one
    combining step, nothing read back)."""
    tensors = [n for n in norms if isinstance(n, Tensor)]
    if not tensors:
        return (math.sqrt(sum(float(n) * float(n) for n in norms)), any(bool(f) for f in flags))
    if len(norms) == 1:
        return norms[0], flags[0]
    device = tensors[0].device
    total = torch.linalg.vector_norm(
        torch.stack(
            [
                n.to(device=device, dtype=torch.float64).reshape(())
                if isinstance(n, Tensor)
                else torch.tensor(float(n), dtype=torch.float64, device=device)
                for n in norms
            ]
        )
    )
    flag = (
        torch.stack(
            [
                f.to(device=device, dtype=torch.float32).reshape(())
                if isinstance(f, Tensor)
                else torch.tensor(1.0 if f else 0.0, device=device)
                for f in flags
            ]
        )
        .amax()
        .reshape(1)
    )
    return total, flag


def check_deferred(
    optimizer: DeferredStep, model_params: list[list[Tensor]], inv_scale: float
) -> Unscaled:
    """The deferred path: the fused optimizer checks the still-scaled gradients read-only
    (``_amp_grads_nonfinite``); its step unscales them as it reads them."""
    found = optimizer._amp_grads_nonfinite(model_params, inv_scale)
    # A device tensor (amp's fused optimizers on a device) stays one until amp reads it.
    return Unscaled(found if isinstance(found, Tensor) else bool(found))
