"""Apex for Ascend's ``NpuFusedSGD``, ``NpuFusedAdadelta``, ``NpuFusedRMSprop`` (torch.optim's
SGD/Adadelta/RMSprop op for op, once per combined buffer: bit-equal) and
``NpuFusedRMSpropTF`` (TensorFlow's RMSprop as Ascend writes it: no torch counterpart)."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch.optim.optimizer import required

from .. import _ext
from ..kernels import ops as kernel_ops
from .combined_buffers import NpuFusedOptimizer, Run, check_nonnegative, one_pass_ready

# amp's kernel builds whose float arithmetic is torch's, operation for operation, on a CPU where
# torch runs the given capability: the AVX2 / AVX-512 builds fuse a*b+c into one FMA exactly
# where torch's vectorised kernels call vec::fmadd; the generic build rounds twice, as torch's
# DEFAULT (non-vectorised) build does.
_SAME_ROUNDING = {
    ("avx2", "AVX2"),
    ("avx2", "AVX512"),
    ("avx512", "AVX2"),
    ("avx512", "AVX512"),
    ("generic", "DEFAULT"),
}


def sgd_kernel_bit_equal() -> bool:
    """True when amp's compiled SGD kernel gives torch.optim.SGD's bits on this CPU (the
    kernel build in use pairs with torch's CPU capability; tests/optimizers checks it)."""
    isa = _ext.isa()
    get = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    if isa is None or get is None:
        return False
    return (isa, str(get())) in _SAME_ROUNDING


class NpuFusedSGD(NpuFusedOptimizer):
    """SGD with momentum, dampening, Nesterov and L2 weight decay: torch.optim.SGD's operations
    once per buffer (the first step copies the gradient into the momentum buffer, as torch's
    does).

    ``one_pass`` (amp's extension): each CPU buffer is stepped in one pass of amp's compiled SGD
    kernel (``amp.kernels.ops.sgd`` over the one tensor) instead of torch's two to four
    operations. The default, ``None``, takes it where it is bit-equal to torch.optim.SGD (the
    kernel build pairs with torch's CPU capability: ``sgd_kernel_bit_equal()``); ``True``
    takes it on any CPU buffer (then up to a rounding per operation apart on a CPU where the
    pairing fails), ``False`` never.
    """

    counts_steps = False
    one_pass: Optional[bool] = None  # a class default too: optimizers unpickled from before

    def __init__(
        self,
        params: Any,
        lr: float = required,
        momentum: float = 0,
        dampening: float = 0,
        weight_decay: float = 0,
        nesterov: bool = False,
        *,
        one_pass: Optional[bool] = None,
    ) -> None:
        if lr is not required and lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        check_nonnegative(momentum=momentum, weight_decay=weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        # Not a param-group key: state_dict() stays Ascend's.
        self.one_pass = None if one_pass is None else bool(one_pass)
        super().__init__(
            params,
            dict(
                lr=lr,
                momentum=momentum,
                dampening=dampening,
                weight_decay=weight_decay,
                nesterov=nesterov,
            ),
        )

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("nesterov", False)

    def _state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("momentum_buffer",) if group["momentum"] != 0 else ()

    def _one_pass_update(self, group: dict[str, Any], run: Run) -> bool:
        """The update in one kernel pass, when asked for (or bit-equal) and possible; False:
        not taken."""
        if self.one_pass is False or run.whole:
            return False
        momentum = group["momentum"]
        buf = run.states.get("momentum_buffer") if momentum != 0 else None
        bufs = [run.param, run.grad] + ([] if buf is None else [buf])
        if not one_pass_ready(bufs):
            return False
        if self.one_pass is None and not sgd_kernel_bit_equal():
            return False
        kernel_ops.sgd(
            [run.grad],
            [run.param],
            None if buf is None else [buf],
            lr=group["lr"],
            momentum=momentum,
            dampening=group["dampening"],
            weight_decay=group["weight_decay"],
            nesterov=group["nesterov"],
            first_run=run.fresh,
        )
        return True

    def _update(self, group: dict[str, Any], run: Run) -> None:
        if self._one_pass_update(group, run):
            return
        momentum, wd = group["momentum"], group["weight_decay"]
        param, grad = run.param, run.grad
        if wd != 0:
            grad = torch.add(grad, param, alpha=wd, out=run.scratch())
        if momentum != 0:
            buf = run.states["momentum_buffer"]
            if run.fresh:
                buf.copy_(grad)
            else:
                buf.mul_(momentum).add_(grad, alpha=1 - group["dampening"])
            if group["nesterov"]:
                grad = torch.add(grad, buf, alpha=momentum, out=run.scratch(1))
            else:
                grad = buf
        param.add_(grad, alpha=-group["lr"])


class NpuFusedAdadelta(NpuFusedOptimizer):
    """Adadelta: torch.optim.Adadelta's operations once per buffer."""

    def __init__(
        self,
        params: Any,
        lr: float = 1.0,
        rho: float = 0.9,
        eps: float = 1e-6,
        weight_decay: float = 0,
    ) -> None:
        check_nonnegative(lr=lr)
        if not 0.0 <= rho <= 1.0:
            raise ValueError(f"Invalid rho value: {rho}")
        check_nonnegative(eps=eps, weight_decay=weight_decay)
        super().__init__(params, dict(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay))

    def _state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        return ("square_avg", "acc_delta")

    def _update(self, group: dict[str, Any], run: Run) -> None:
        rho, eps, wd = group["rho"], group["eps"], group["weight_decay"]
        param, grad = run.param, run.grad
        square_avg, acc_delta = run.states["square_avg"], run.states["acc_delta"]
        if wd != 0:
            grad = torch.add(grad, param, alpha=wd, out=run.scratch(2))
        square_avg.mul_(rho).addcmul_(grad, grad, value=1 - rho)
        std = torch.add(square_avg, eps, out=run.scratch()).sqrt_()
        delta = torch.add(acc_delta, eps, out=run.scratch(1)).sqrt_().div_(std).mul_(grad)
        acc_delta.mul_(rho).addcmul_(delta, delta, value=1 - rho)
        param.add_(delta, alpha=-group["lr"])


class NpuFusedRMSprop(NpuFusedOptimizer):
    """RMSprop (optionally centered, with momentum): torch.optim.RMSprop's operations once per
    buffer (torch's ``lerp_`` for the centered average, where Ascend's code has
    ``mul_().add_()``: one rounding apart)."""

    def __init__(
        self,
        params: Any,
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0,
        momentum: float = 0,
        centered: bool = False,
    ) -> None:
        check_nonnegative(lr=lr, eps=eps, momentum=momentum, weight_decay=weight_decay, alpha=alpha)
        super().__init__(
            params,
            dict(
                lr=lr,
                momentum=momentum,
                alpha=alpha,
                eps=eps,
                centered=centered,
                weight_decay=weight_decay,
            ),
        )

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for group in self.param_groups:
            group.setdefault("momentum", 0)
            group.setdefault("centered", False)

    def _state_names(self, group: dict[str, Any]) -> tuple[str, ...]:
        names: tuple[str, ...] = ("square_avg",)
        if group["momentum"] > 0:
            names += ("momentum_buffer",)
        if group["centered"]:
            names += ("grad_avg",)
        return names

    def _update(self, group: dict[str, Any], run: Run) -> None:
        alpha, wd, lr = group["alpha"], group["weight_decay"], group["lr"]
        param, grad = run.param, run.grad
        square_avg = run.states["square_avg"]
        if wd != 0:
            grad = torch.add(grad, param, alpha=wd, out=run.scratch(1))
        square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
        if group["centered"]:
            grad_avg = run.states["grad_avg"]
            grad_avg.lerp_(grad, 1 - alpha)
            avg = torch.addcmul(square_avg, grad_avg, grad_avg, value=-1, out=run.scratch()).sqrt_()
        else:
            avg = torch.sqrt(square_avg, out=run.scratch())
        avg = avg.add_(group["eps"])
        if group["momentum"] > 0:
            buf = run.states["momentum_buffer"]
            buf.mul_(group["momentum"]).addcdiv_(grad, avg)
            param.add_(buf, alpha=-lr)
        else:
            param.addcdiv_(grad, avg, value=-lr)


class NpuFusedRMSpropTF(NpuFusedOptimizer):
    """RMSprop in TensorFlow's form (eps inside the square root; the learning rate inside the
    momentum buffer with ``lr_in_momentum``; optional decoupled weight decay), Ascend's
    formulas once per buffer. The squared average starts at zero, as in Ascend."""

    def __init__(
        self,
        params: Any,
        lr: float = 1e-2,
        alpha: float = 0.9,
        eps: float = 1e-10,
        weight_decay: float = 0,
        momentum: float = 0.0,
        centered: bool = False,
        decoupled_decay: bool = False,
        lr_in_momentum: bool = True,
    ) -> None:
        check_nonnegative(lr=lr, eps=eps, momentum=momentum, weight_decay=weight_decay, alpha=alpha)
        super().__init__(
            params,
            dict(
                lr=lr,
                momentum=momentum,
                alpha=alpha,
                eps=eps,
                centered=centered,
                weight_decay=weight_decay,
                decoupled_decay=decoupled_decay,
                lr_in_momentum=lr_in_momentum,
            ),
        )

    __setstate__ = NpuFusedRMSprop.__setstate__
    _state_names = NpuFusedRMSprop._state_names

    def _update(self, group: dict[str, Any], run: Run) -> None:
        wd, lr, eps = group["weight_decay"], group["lr"], group["eps"]
        one_minus_alpha = 1.0 - group["alpha"]
        param, grad = run.param, run.grad
        square_avg = run.states["square_avg"]
        if wd != 0:
            if group.get("decoupled_decay"):
                param.add_(param, alpha=-wd)
            else:
                grad = grad.add(param, alpha=wd)
        square_avg.add_(grad.pow(2) - square_avg, alpha=one_minus_alpha)
        if group["centered"]:
            grad_avg = run.states["grad_avg"]
            grad_avg.add_(grad - grad_avg, alpha=one_minus_alpha)
            avg = square_avg.addcmul(grad_avg, grad_avg, value=-1).add(eps).sqrt_()
        else:
            avg = square_avg.add(eps).sqrt_()
        if group["momentum"] > 0:
            buf = run.states["momentum_buffer"]
            if group.get("lr_in_momentum"):
                buf.mul_(group["momentum"]).addcdiv_(grad, avg, value=lr)
                param.sub_(buf)
            else:
                buf.mul_(group["momentum"]).addcdiv_(grad, avg)
                param.add_(buf, alpha=-lr)
        else:
            param.addcdiv_(grad, avg, value=-lr)
