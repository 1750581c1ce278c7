"""The base of apex's fused optimizers (``FusedAdam``, ``FusedLAMB``, ...): steps over lists of
tensors, grouped into kernel calls (``quick_buckets``, ``make_buckets``), with amp's seam (the
Protocols of amp/masters/optimizer_like.py: apex-exact ``UnscaledStep`` and ``GradNormNote``;
deferred ``DeferredStep``), and the step counter kept per param group but saved per parameter,
as torch.optim does. (Ascend's ``NpuFused*`` step over combined buffers instead:
``combined_buffers``.)"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

import torch
from torch import Tensor

from .. import _torch_compat as compat
from ..kernels import ops as mt
from ..masters.optimizer_like import ParamGroups
from ..masters.unscale import Norm, combine_norms, dense, group_by


def closure_loss(closure: Optional[Callable[[], Any]]) -> Any:
    """torch.optim's closure contract: re-evaluate the loss with gradients enabled (``step``
    itself runs under ``no_grad``); None without a closure."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


@dataclass
class Bucket:
    """Tensors of one param group that one kernel call can take together (same dtypes)."""

    params: list[Tensor] = field(default_factory=list)
    grads: list[Tensor] = field(default_factory=list)
    models: list[Tensor] = field(default_factory=list)  # distinct half model copies (O2)
    # False for ``quick_buckets``': the lists' dtypes, devices and layouts are left to the
    # kernel to check (``run_buckets``).
    checked: bool = True

    @property
    def model_params(self) -> Optional[list[Tensor]]:
        return self.models or None


def _dense(g: Tensor) -> Tensor:
    """The slow path of gradient access, off the per-tensor hot loop."""
    # Kernels read gradients only, so a contiguous copy is a safe fallback.
    return dense(g).contiguous()


def _present(grads: Iterable[Optional[Tensor]]) -> list[Tensor]:
    """The gradients there are, each contiguous (a copy where one is not)."""
    return [g if g.is_contiguous() else _dense(g) for g in grads if g is not None]


def make_buckets(
    params: list[Tensor],
    models: list[Tensor],
    extra_key: Optional[Callable[[Tensor], Any]] = None,
    grads_on_params: bool = False,
    grad_sources: Optional[list[Tensor]] = None,
    grads: Optional[list[Optional[Tensor]]] = None,
) -> list[Bucket]:
    """Pair params with their gradients -- the model tensors' (amp's deferred path) or, with
    ``grads_on_params``, their own (standalone, or amp's unscaled fp32 master grads) --
    or the tensors named in ``grad_sources``, or *grads* as given (``.grad`` of one of those,
    read already) -- skipping params without a grad, and split them by (grad dtype, param
    dtype, model-copy dtype, device, extra key)."""
    if len(params) != len(models):
        raise ValueError(
            f"amp.optimizers: a param group has {len(params)} params but "
            f"{len(models)} model params were given for it"
        )
    if grads is None:
        sources = (
            grad_sources if grad_sources is not None else params if grads_on_params else models
        )
        grads = [t.grad for t in sources]
    one = _one_bucket(params, models, grads, extra_key)
    if one is not None:
        return one
    triples: list[tuple[Tensor, Tensor, Optional[Tensor]]] = []  # (param, grad, half copy)
    for p, mp, g in zip(params, models, grads):
        if g is None:
            continue
        if not g.is_contiguous():
            g = _dense(g)
        if mp is not p and mp.shape != p.shape:
            raise ValueError(
                "amp.optimizers: model param and optimizer param differ in shape "
                f"({tuple(mp.shape)} vs {tuple(p.shape)})"
            )
        triples.append((p, g, None if mp is p else mp))

    def kind(t: tuple[Tensor, Tensor, Optional[Tensor]]) -> tuple:
        p, g, half = t
        return (
            g.dtype,
            p.dtype,
            None if half is None else half.dtype,
            p.device,
            extra_key(p) if extra_key else None,
        )

    return [
        Bucket([p for p, _, _ in ts], [g for _, g, _ in ts], [h for _, _, h in ts if h is not None])
        for ts in group_by(triples, kind).values()
    ]


def _one_bucket(
    params: list[Tensor],
    models: list[Tensor],
    grads: list[Optional[Tensor]],
    extra_key: Optional[Callable[[Tensor], Any]],
) -> Optional[list[Bucket]]:
    """The common case of ``make_buckets`` -- every param has a contiguous gradient, and one
    kernel call takes the whole group (one dtype per list, one device, one extra key) -- checked
    attribute by attribute over the whole lists instead of per tensor: a model's step runs this
    for every tensor, and per-tensor Python was a third of a 1M-parameter step. It is
    ``quick_buckets``' single bucket with what the kernel would check checked here. None where
    the general path must split the group (or raise its message)."""
    quick = quick_buckets(params, models, grads, extra_key)
    if quick is None or len(quick) != 1:
        return None
    (b,) = quick
    if not all(g.is_contiguous() for g in b.grads):
        return None
    if any(len({t.dtype for t in ts}) != 1 for ts in (b.grads, b.params, b.models) if ts):
        return None
    if len({p.device for p in b.params}) != 1:
        return None
    b.checked = True
    return [b]


def quick_buckets(
    params: list[Tensor],
    models: list[Tensor],
    grads: list[Optional[Tensor]],
    extra_key: Optional[Callable[[Tensor], Any]] = None,
) -> Optional[list[Bucket]]:
    """A param group as one kernel call -- two under O2 where some params are their own
    masters (``keep_batchnorm_fp32``): those with a half copy, then the rest -- without the
    per-tensor checks of ``make_buckets``. Only what no kernel can see is checked here (every
    param has a gradient, all share one ``extra_key``; a model copy is its param, or a
    distinct tensor of the same shape). The dtypes, devices and layouts are the kernel's to
    check, which it does for every list before it writes anything (``run_buckets``). None
    where ``make_buckets`` is needed."""
    if not grads or any(g is None for g in grads):
        return None
    present: list[Tensor] = grads  # None ruled out above
    if extra_key is not None and len({extra_key(p) for p in params}) != 1:
        return None
    if models is params:
        return [Bucket(list(params), present, [], checked=False)]
    own = [mp is p for mp, p in zip(models, params)]
    if all(own):
        return [Bucket(list(params), present, [], checked=False)]
    copied = [i for i, o in enumerate(own) if not o]
    if [models[i].shape for i in copied] != [params[i].shape for i in copied]:
        return None  # make_buckets names the pair
    if len(copied) == len(own):
        return [Bucket(list(params), present, list(models), checked=False)]
    kept = [i for i, o in enumerate(own) if o]
    return [
        Bucket(
            [params[i] for i in copied],
            [present[i] for i in copied],
            [models[i] for i in copied],
            checked=False,
        ),
        Bucket([params[i] for i in kept], [present[i] for i in kept], [], checked=False),
    ]


def run_buckets(
    buckets: list[Bucket],
    run: Callable[[Bucket], None],
    extra_key: Optional[Callable[[Tensor], Any]] = None,
    refused: Optional[Callable[[], None]] = None,
) -> None:
    """``run(b)`` for each bucket. A ``quick_buckets`` bucket the kernel refuses (two dtypes
    in a list, a tensor on another device, a non-contiguous gradient: ValueError or TypeError,
    raised before anything is written) is split by ``make_buckets`` and run again, and
    ``refused()`` is told, so that the caller can go to ``make_buckets`` directly next time.
    ``run`` must leave nothing behind when its kernel call raises (zeroed state it may keep,
    since it would make the same again)."""
    for b in buckets:
        if b.checked:
            run(b)
            continue
        try:
            run(b)
            continue
        except (ValueError, TypeError):
            if refused is not None:
                refused()
        for part in make_buckets(b.params, b.models or b.params, extra_key, grads=b.grads):
            run(part)


def grads_of(sources: Iterable[Iterable[Tensor]]) -> list[Tensor]:
    grads = [t.grad for group in sources for t in group]
    if not any(g is None for g in grads) and all(g.is_contiguous() for g in grads):
        return grads  # the common case, without a call per tensor
    return _present(grads)


def grads_signature(grads: list[Tensor]) -> Optional[tuple]:
    """Identity and in-place version of each gradient: a cached norm is reused only while this
    is unchanged (clip_grad_norm_ on the grads between backward and step bumps the versions).
    None, and nothing is reused, where the grads' device's in-place foreach ops leave the
    versions alone (torch 2.1 on an accelerator: clip_grad_norm_ would go unseen)."""
    # is_cpu first: a set of every grad's device type costs more than the signature itself.
    types = {"cpu"} if all(g.is_cpu for g in grads) else {g.device.type for g in grads}
    if not all(compat.foreach_bumps_versions(t) for t in types):
        return None
    # Two lists of ints (compared in C), not a tuple of pairs: this runs twice a step.
    return (list(map(id, grads)), [g._version for g in grads])


def grad_norm(
    all_grads: list[Tensor], inv_scale: float, check: bool = True
) -> tuple[Norm, Union[bool, Tensor]]:
    """(global L2 norm of *all_grads* (``grads_of``'s list) * inv_scale, any non-finite) in one
    read pass: numbers on the CPU kernels, device tensors (a float64 0-dim norm, a float32 [1]
    flag; not read back) for grads on a device. Without ``check`` the flag is not computed
    there (False). The caller gathers the gradients once, for the signature of the norm too."""
    if all_grads and mt.uses_kernels(all_grads):
        # The common case in one kernel call, without a key per tensor: the kernel takes one
        # dtype on the CPU per list and checks every tensor before it reads, so a list it
        # refuses (two dtypes, another device) is split below as before.
        try:
            norm, _, nonfinite = mt.l2norm(all_grads, inv_scale)
        except (ValueError, TypeError):
            pass
        else:
            return combine_norms([norm], [nonfinite])
    norms: list[Norm] = []
    flags: list[Union[bool, Tensor]] = []
    for grads in group_by(all_grads, lambda g: (g.dtype, g.device)).values():
        if mt.uses_kernels(grads):
            norm, _, nonfinite = mt.l2norm(grads, inv_scale)
            norms.append(norm)
            flags.append(nonfinite)
        elif check:
            norm_t, flag_t = mt.l2norm_device(grads, inv_scale)
            norms.append(norm_t)
            flags.append(flag_t)
        else:
            norms.append(mt.l2norm_total_device(grads, inv_scale))
            flags.append(False)
    if not norms:
        return 0.0, False
    return combine_norms(norms, flags)


def check_betas(betas: Sequence[float], owner: Optional[str] = None) -> None:
    """The beta checks of every optimizer here, each beta in [0, 1): worded as amp's fused
    optimizers word them (``FusedAdam: invalid beta at index 0: ...``, *owner* given) or as
    torch.optim and Ascend's NpuFused* / Lamb do (``Invalid beta parameter at index 0: ...``)."""
    for i, b in enumerate(betas):
        if not 0.0 <= b < 1.0:
            if owner is None:
                raise ValueError(f"Invalid beta parameter at index {i}: {b}")
            raise ValueError(f"{owner}: invalid beta at index {i}: {b}")


class FusedOptimizer(torch.optim.Optimizer):
    """Base: subclasses implement ``_update(model_params, inv_scale)``."""

    # Per-group step counter (one kernel call serves a whole bucket, so one step count).
    _group_step = True
    # Optimizer-wide gradient clipping (FusedAdam/FusedSGD keyword; 0 = off). FusedLAMB
    # clips per group instead, as apex does.
    max_grad_norm: float = 0.0

    def __init__(self, params: Any, defaults: dict, set_grad_none: bool) -> None:
        super().__init__(params, defaults)
        self.set_grad_none = set_grad_none
        # (inv_scale, grads_signature, norm) of the last measured gradients, reused by clipping.
        self._amp_cached_norm: Optional[tuple[float, Optional[tuple], Norm]] = None
        # id() of the param groups whose quick_buckets a kernel refused: make_buckets for them.
        self._amp_refused: set[int] = set()

    # --- amp seam (amp/masters/optimizer_like.py: UnscaledStep, GradNormNote, DeferredStep) -----
    def _clips(self) -> bool:
        """Whether a step reads the gradients' global norm (clipping): only then is the norm
        amp's pass measured kept, with the gradients' signature (a pass over every gradient)."""
        return self.max_grad_norm > 0

    def _amp_note_grad_norm(self, norm: Norm, grads: list[Tensor]) -> None:
        """amp's unscale pass measured the norm of the unscaled grads it wrote (a device
        tensor is kept as one: read only if clipping needs it on the host)."""
        if not self._clips():
            self._amp_cached_norm = None
            return
        self._amp_cached_norm = (
            1.0,
            grads_signature(grads),
            norm if isinstance(norm, Tensor) else float(norm),
        )

    @torch.no_grad()
    def _amp_unscaled_step(self, model_params: ParamGroups) -> None:
        """The step after amp's unscale pass: grads are unscaled on the params (the fp32
        masters under O2); the half model copies in ``model_params`` are written in the
        same pass as the update."""
        if len(model_params) != len(self.param_groups):
            raise ValueError(
                f"amp.optimizers: got model params for {len(model_params)} groups; "
                f"the optimizer has {len(self.param_groups)}"
            )
        try:
            self._update([list(g) for g in model_params], 1.0, grads_on_params=True)
        finally:
            self._amp_cached_norm = None

    def _amp_grads_nonfinite(
        self, model_params: ParamGroups, inv_scale: float
    ) -> Union[bool, Tensor]:
        grads = grads_of(model_params)
        norm, bad = grad_norm(grads, inv_scale)
        clips = self._clips()
        self._amp_cached_norm = (float(inv_scale), grads_signature(grads), norm) if clips else None
        return bad

    @torch.no_grad()
    def _amp_fused_step(self, model_params: ParamGroups, inv_scale: float) -> None:
        if len(model_params) != len(self.param_groups):
            raise ValueError(
                f"amp.optimizers: got model params for {len(model_params)} groups; "
                f"the optimizer has {len(self.param_groups)}"
            )
        try:
            self._update([list(g) for g in model_params], float(inv_scale))
        finally:
            self._amp_cached_norm = None

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Standalone step: reads each param's .grad (inverse scale 1)."""
        loss = closure_loss(closure)
        self._amp_cached_norm = None
        params = [list(g["params"]) for g in self.param_groups]
        self._update(params, 1.0, grads_on_params=True)
        return loss

    def _grad_sources(self, model_params: ParamGroups, grads_on_params: bool) -> ParamGroups:
        return [list(g["params"]) for g in self.param_groups] if grads_on_params else model_params

    def _raw_grads(
        self, model_params: ParamGroups, grads_on_params: bool
    ) -> list[list[Optional[Tensor]]]:
        """Each group's ``.grad`` of its sources, as they are (None included): gathered once a
        step for the norm's signature and ``quick_buckets``."""
        return [[t.grad for t in s] for s in self._grad_sources(model_params, grads_on_params)]

    def _group_plan(
        self,
        group: dict[str, Any],
        models: list[Tensor],
        grads: list[Optional[Tensor]],
        grads_on_params: bool,
        extra_key: Optional[Callable[[Tensor], Any]] = None,
    ) -> list[Bucket]:
        """The group's buckets: ``quick_buckets`` unless a kernel refused one of this group
        before, or the group needs ``make_buckets``."""
        if id(group) not in self._amp_refused:
            quick = quick_buckets(group["params"], models, grads, extra_key)
            if quick is not None:
                return quick
        return make_buckets(group["params"], models, extra_key, grads_on_params, grads=grads)

    def _run_group(
        self,
        group: dict[str, Any],
        buckets: list[Bucket],
        run: Callable[[Bucket], None],
        extra_key: Optional[Callable[[Tensor], Any]] = None,
    ) -> None:
        run_buckets(buckets, run, extra_key, lambda: self._amp_refused.add(id(group)))

    def _global_norm(
        self,
        model_params: ParamGroups,
        inv_scale: float,
        grads_on_params: bool = False,
        raw: Optional[list[list[Optional[Tensor]]]] = None,
    ) -> float:
        """The grad norm measured by amp's pass for these very grads and scale, else computed.
        *raw*: each group's ``.grad`` of its sources, where the caller has gathered them."""
        if raw is None:
            raw = self._raw_grads(model_params, grads_on_params)
        flat = [g for gs in raw for g in gs]
        # The grads as they are where none is missing: the measured ones were contiguous (the
        # kernel took them), so identity and versions decide, without a layout check.
        complete = not any(g is None for g in flat)
        grads: list[Tensor] = flat if complete else _present(flat)
        cached = self._amp_cached_norm
        if (
            cached is not None
            and cached[0] == inv_scale
            and cached[1] is not None
            and cached[1] == grads_signature(grads)
        ):
            return cached[2]
        # _present has made them contiguous already where some were missing.
        return grad_norm(_present(grads) if complete else grads, inv_scale, check=False)[0]

    def _clipped_grad_scale(
        self,
        model_params: ParamGroups,
        inv_scale: float,
        grads_on_params: bool = False,
        raw: Optional[list[list[Optional[Tensor]]]] = None,
    ) -> mt.GradScale:
        """inv_scale times the clip coefficient of the optional ``max_grad_norm`` (Adam, SGD):
        both are applied as the kernels read the gradients, which are not rewritten. For
        grads on a device, a 0-dim tensor there (computed there, not read back)."""
        if self.max_grad_norm <= 0:
            return inv_scale
        norm = self._global_norm(model_params, inv_scale, grads_on_params, raw)
        if isinstance(norm, Tensor):
            # The host formula's float64 arithmetic, on the device (a true division, not
            # scalar / tensor, which torch computes as a reciprocal times the scalar).
            coef = torch.div(norm.new_full((), self.max_grad_norm), norm + 1e-6)
            # min(1.0, coef) as Python's min answers it (1.0 for a NaN coefficient).
            return torch.where(coef < 1.0, coef, 1.0) * inv_scale
        return inv_scale * min(1.0, self.max_grad_norm / (norm + 1e-6))

    def _update(
        self, model_params: ParamGroups, inv_scale: float, grads_on_params: bool = False
    ) -> None:
        """One step of every group: the gradients gathered once (for the norm's signature and
        the groups' buckets), the scale with the optional clipping applied, then
        ``_update_group`` for each group."""
        raw = self._raw_grads(model_params, grads_on_params)
        grad_scale = self._clipped_grad_scale(model_params, inv_scale, grads_on_params, raw)
        for group, models, grads in zip(self.param_groups, model_params, raw):
            self._update_group(group, models, grads, grads_on_params, grad_scale)

    def _update_group(
        self,
        group: dict[str, Any],
        models: list[Tensor],
        grads: list[Optional[Tensor]],
        grads_on_params: bool,
        grad_scale: mt.GradScale,
    ) -> None:
        raise NotImplementedError

    def _adam_moments(self, params: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        """The first and second moment buffers of *params* (torch.optim's 'exp_avg' and
        'exp_avg_sq'), created as zeros on first use; shared by Adam and LAMB."""
        exp_avgs, exp_avg_sqs = [], []
        for p in params:
            st = self.state[p]
            if "exp_avg" not in st:
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            exp_avgs.append(st["exp_avg"])
            exp_avg_sqs.append(st["exp_avg_sq"])
        return exp_avgs, exp_avg_sqs

    def zero_grad(self, set_to_none: Optional[bool] = None) -> None:
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)

    # --- state_dict compatible with torch.optim (per-parameter 'step' tensors) ---------
    def _torch_group_keys(self) -> dict:
        """Group keys torch.optim's matching optimizer needs to read our state the same way
        (its __setstate__ fills missing keys with defaults that may mean something else)."""
        return {}

    def state_dict(self) -> dict:
        sd = super().state_dict()
        for gsd in sd["param_groups"]:
            for key, value in self._torch_group_keys().items():
                gsd.setdefault(key, value)
        if not self._group_step:
            return sd
        for gsd, group in zip(sd["param_groups"], self.param_groups):
            step = torch.tensor(float(group.get("step", 0)), dtype=torch.float32)
            for i in gsd["params"]:
                st = sd["state"].get(i)
                if st:  # copy: torch's state_dict shares the live per-param dicts
                    sd["state"][i] = dict(st, step=step.clone())
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        # Deep copy: torch's loader keeps tensors that need no cast as they are, so a live
        # optimizer's state_dict() would otherwise share moment buffers with this one.
        super().load_state_dict(copy.deepcopy(state_dict))
        for group in self.param_groups:
            for key, value in self.defaults.items():
                group.setdefault(key, value)
            if not self._group_step:
                continue
            steps = []
            for p in group["params"]:
                st = self.state.get(p)
                if st and "step" in st:
                    s = st.pop("step")
                    steps.append(float(s.item() if torch.is_tensor(s) else s))
            group["step"] = int(round(max(steps))) if steps else int(group.get("step", 0))
