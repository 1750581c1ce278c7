"""``amp.initialize`` and amp's own ``state_dict``/``load_state_dict``."""

from __future__ import annotations

import itertools
import math
import warnings
from collections import OrderedDict
from typing import Any, Optional

import torch
from torch import nn

from ._amp_state import _amp_state, maybe_log
from ._torch_compat import check_half_support
from .ascend import ddp
from .ascend.combined import zero_grads_in_place
from .casting.model import (
    check_params_fp32,
    convert_network,
    register_fp32_state_dict,
    wrap_forward,
)
from .masters.optimizer_like import check_optimizer_like
from .masters.patching import process_optimizer
from .masters.stash import combining
from .opt_levels import (
    HALF_DTYPES,
    MODEL_DTYPES,
    Properties,
    apply_overrides,
    check_cast_model_type,
    check_dtype,
    check_opt_level,
    check_optional_bool,
    level_defaults,
    parse_keep_batchnorm_fp32,
    parse_loss_scale,
)
from .scaler import LossScaler


def _positive_number(name: str, value: object, allow_inf: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a positive number; got {value!r} ({type(value).__name__})")
    number = float(value)
    if math.isnan(number) or number <= 0 or (math.isinf(number) and not allow_inf):
        kind = "positive" if allow_inf else "positive finite"
        raise ValueError(f"{name} must be a {kind} number; got {value!r}")
    return number


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1; got {value!r}")
    return value


def _as_list(name: str, value: Any, kind: Optional[type]) -> tuple[list[Any], bool]:
    """``value`` as a list of ``kind`` (optimizer-like objects when ``kind`` is None) and whether
    it was passed as a single object."""
    single = not isinstance(value, (list, tuple))
    items = [value] if single else list(value)
    if not items:
        raise ValueError(f"amp.initialize: {name} must not be an empty list")
    for item in items:
        if kind is None:
            check_optimizer_like(f"amp.initialize: {name}", item)
        elif not isinstance(item, kind):
            raise TypeError(
                f"amp.initialize: {name} must be a {kind.__module__}.{kind.__qualname__} or a list "
                f"of them; got {type(item).__name__}"
            )
    return items, single


def _check_scaler_knobs(
    min_loss_scale: Any,
    max_loss_scale: Any,
    dynamic_init_scale: Any,
    scale_growth_factor: Any,
    scale_backoff_factor: Any,
    scale_window: Any,
) -> None:
    max_scale = _positive_number("max_loss_scale", max_loss_scale, allow_inf=True)
    if min_loss_scale is not None:
        min_scale = _positive_number("min_loss_scale", min_loss_scale)
        if min_scale > max_scale:
            raise ValueError(
                f"min_loss_scale ({min_loss_scale}) must not exceed "
                f"max_loss_scale ({max_loss_scale})"
            )
    _positive_number("dynamic_init_scale", dynamic_init_scale)
    if _positive_number("scale_growth_factor", scale_growth_factor) <= 1.0:
        raise ValueError(f"scale_growth_factor must be > 1.0; got {scale_growth_factor!r}")
    if _positive_number("scale_backoff_factor", scale_backoff_factor) >= 1.0:
        raise ValueError(f"scale_backoff_factor must be in (0, 1); got {scale_backoff_factor!r}")
    _positive_int("scale_window", scale_window)


def _resolve_half_dtype(half_dtype: Any, cast_model_type: Any) -> torch.dtype:
    half = check_dtype("half_dtype", half_dtype, HALF_DTYPES)
    if cast_model_type in HALF_DTYPES:
        if half is not None and half != cast_model_type:
            raise ValueError(
                f"half_dtype={half} contradicts cast_model_type={cast_model_type}; pass only one "
                "(half_dtype=torch.bfloat16 selects bf16 at every opt level)"
            )
        return cast_model_type
    return torch.float16 if half is None else half


def initialize(
    models: Any,
    optimizers: Any = None,
    enabled: bool = True,
    opt_level: str = "O1",
    cast_model_type: Any = None,
    patch_torch_functions: Optional[bool] = None,
    keep_batchnorm_fp32: Any = None,
    master_weights: Optional[bool] = None,
    loss_scale: Any = None,
    cast_model_outputs: Optional[torch.dtype] = None,
    num_losses: int = 1,
    verbosity: int = 1,
    min_loss_scale: Optional[float] = None,
    max_loss_scale: float = 2.0**24,
    dynamic_init_scale: float = 2.0**16,
    scale_growth_factor: float = 2.0,
    scale_backoff_factor: float = 0.5,
    scale_window: int = 2000,
    half_dtype: Optional[torch.dtype] = None,
    defer_unscale: bool = False,
    combine_grad: Optional[bool] = None,
    combine_ddp: Optional[bool] = None,
    ddp_replica_count: int = 4,
    user_cast_preferred: Optional[bool] = None,
    check_combined_tensors: Optional[bool] = None,
) -> Any:
    """Prepare models and optimizers for mixed precision at ``opt_level`` (apex's semantics).

    Opt levels (a non-None keyword overrides the level's default):

    ====  ===================  ======================  ===============  ==============  ==========
    O     cast_model_type      patch_torch_functions   keep_bn_fp32     master_weights  loss_scale
    ====  ===================  ======================  ===============  ==============  ==========
    O0    float32              False                   None             False           1.0
    O1    None                 True (torch.autocast)   None             None            "dynamic"
    O2    half                 False                   True             True            "dynamic"
    O3    half                 False                   False            False           1.0
    ====  ===================  ======================  ===============  ==============  ==========

    Spellings apex accepts are accepted: ``cast_model_type=False`` (do not cast the model, at any
    level), ``keep_batchnorm_fp32`` as "True"/"False", ``loss_scale`` as "dynamic", a number or a
    numeric string such as "128.0". Optimizers may be ``torch.optim`` optimizers or
    optimizer-like objects (``param_groups``, ``state``, ``step``, ``zero_grad``,
    ``state_dict``, ``load_state_dict``), such as ``amp.parallel.LARC``.

    Gradients are unscaled when ``scale_loss`` exits, as in apex, also with the fused optimizers
    of ``amp.optimizers`` (the fp32 master gradients are filled under O2), so clipping
    ``amp.master_params(optimizer)`` before ``step()`` works. ``defer_unscale=True`` (this
    project's opt-in) lets fused optimizers keep gradients scaled until their update kernel
    reads them: one write pass less, but gradients read between ``scale_loss`` and ``step``
    are then scaled (and None for the fp32 masters under O2). Under O2/O3 ``model.state_dict()``
    returns float32 tensors, as in apex.

    "half" is ``half_dtype``: float16 by default. **bf16**: pass ``half_dtype=torch.bfloat16`` --
    one keyword that works at every level (O1's autocast dtype; O2/O3's model type). At O2/O3
    apex's ``cast_model_type=torch.bfloat16`` means the same.

    Illegal (``RuntimeError``): O1 with a non-float32 ``cast_model_type``;
    ``patch_torch_functions=True`` outside O1; ``keep_batchnorm_fp32`` or ``master_weights``
    under O1. ``keep_batchnorm_fp32`` also takes "True"/"False"; ``loss_scale`` takes "dynamic"
    or a positive number. The dynamic scale starts at ``min(max_loss_scale, dynamic_init_scale)``,
    grows by ``scale_growth_factor`` after ``scale_window`` clean steps, backs off by
    ``scale_backoff_factor`` on overflow (the step is skipped), and stays in
    ``[min_loss_scale, max_loss_scale]``. ``num_losses`` gives one scaler per loss (see
    ``scale_loss``'s ``loss_id``). ``enabled=False`` returns the inputs untouched.

    Apex for Ascend's keywords, with its defaults: ``combine_grad`` (gradients -- and under O2
    the fp32 master gradients -- in one combined buffer per dtype, so unscale, the overflow
    check, ``zero_grad`` and clipping are one operation per buffer; see
    ``optimizer.get_model_combined_grads()`` and ``clip_optimizer_grad_norm_fused``),
    ``check_combined_tensors`` (before each use, check that the gradients still live in their
    buffer and combine them again when not), ``combine_ddp`` with ``ddp_replica_count``
    (all-reduce the combined gradients in buckets instead of wrapping the model in
    DistributedDataParallel), ``user_cast_preferred`` (under O1, the casts registered with
    ``amp.register_half_function`` / ``register_float_function`` /
    ``register_promote_function`` win over autocast's own choice).

    Returns the models (and optimizers, when given) in the shape passed: object or list. Call it
    before wrapping the model in ``DistributedDataParallel``.

    Example (runs on CPU)::

        >>> import torch, amp
        >>> model = torch.nn.Linear(10, 1)
        >>> optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        >>> model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
        >>> model.weight.dtype, next(amp.master_params(optimizer)).dtype
        (torch.float16, torch.float32)
        >>> loss = torch.nn.functional.mse_loss(model(torch.randn(4, 10)), torch.randn(4, 1))
        >>> with amp.scale_loss(loss, optimizer) as scaled_loss:
        ...     scaled_loss.backward()
        >>> optimizer.step()
    """
    # --- validate everything before touching the models -----------------------------------
    model_list, _ = _as_list("models", models, nn.Module)
    opt_list: list[torch.optim.Optimizer] = []
    if optimizers is not None:
        opt_list, _ = _as_list("optimizers", optimizers, None)
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be True or False; got {enabled!r}")
    if not isinstance(defer_unscale, bool):
        raise TypeError(f"defer_unscale must be True or False; got {defer_unscale!r}")
    ascend = {
        name: bool(check_optional_bool(name, value))
        for name, value in (
            ("combine_grad", combine_grad),
            ("combine_ddp", combine_ddp),
            ("user_cast_preferred", user_cast_preferred),
            ("check_combined_tensors", check_combined_tensors),
        )
    }
    _positive_int("ddp_replica_count", ddp_replica_count)
    level = check_opt_level(opt_level)
    cast_model_type = check_cast_model_type(cast_model_type)
    cast_model_outputs = check_dtype("cast_model_outputs", cast_model_outputs, MODEL_DTYPES)
    patch_torch_functions = check_optional_bool("patch_torch_functions", patch_torch_functions)
    master_weights = check_optional_bool("master_weights", master_weights)
    keep_bn = parse_keep_batchnorm_fp32(keep_batchnorm_fp32)
    scale = None if loss_scale is None else parse_loss_scale(loss_scale)
    _positive_int("num_losses", num_losses)
    if isinstance(verbosity, bool) or not isinstance(verbosity, int) or verbosity < 0:
        raise ValueError(f"verbosity must be an int >= 0; got {verbosity!r}")
    _check_scaler_knobs(
        min_loss_scale,
        max_loss_scale,
        dynamic_init_scale,
        scale_growth_factor,
        scale_backoff_factor,
        scale_window,
    )
    half = _resolve_half_dtype(half_dtype, cast_model_type)
    for model in model_list:
        if isinstance(model, nn.parallel.DistributedDataParallel):
            raise RuntimeError(
                "amp.initialize got a DistributedDataParallel model: wrap the model(s) in "
                "DistributedDataParallel AFTER amp.initialize has returned them."
            )
        if getattr(model, "_amp_initialized", False):
            raise RuntimeError(
                "this model already went through amp.initialize; pass a fresh model (amp casts "
                "and wraps a model once)."
            )

    _amp_state.verbosity = verbosity
    _amp_state.min_loss_scale = min_loss_scale
    _amp_state.max_loss_scale = max_loss_scale
    if not enabled:
        # enabled=False: scale_loss passes the loss through untouched.
        _amp_state.opt_properties = Properties()
        _amp_state.loss_scalers = []
        return _shaped(models, optimizers)

    props = apply_overrides(
        level_defaults(level, half),
        cast_model_type=cast_model_type,
        patch_torch_functions=patch_torch_functions,
        keep_batchnorm_fp32=keep_bn,
        master_weights=master_weights,
        loss_scale=scale,
    )
    props.defer_unscale = defer_unscale
    for name, value in ascend.items():
        setattr(props, name, value)
    props.ddp_replica_count = ddp_replica_count
    if (props.combine_grad or props.check_combined_tensors) and level not in ("O1", "O2"):
        raise RuntimeError(
            "Currently, combine_grad=True or check_combined_tensors=True should only be set by "
            "selecting opt_level='O1' or opt_level='O2'."
        )
    if props.combine_ddp and not props.combine_grad:
        # combine_ddp all-reduces the combined gradient buffers: without combine_grad there
        # would be none for the plain optimizers, and the ranks would silently drift apart.
        raise RuntimeError(
            "Combine_grad should be True when combine_ddp using: pass combine_grad=True "
            "together with combine_ddp=True (combine_ddp all-reduces the combined gradient "
            "buffers), or wrap the model in DistributedDataParallel instead."
        )
    for opt in opt_list:
        if hasattr(opt, "_amp_stash"):
            raise RuntimeError(
                "An optimizer may be passed through amp.initialize only once; create a new "
                "optimizer for a new amp.initialize call."
            )
    maybe_log(f"amp: selected optimization level {level}; options after overrides:\n{props!r}")

    # --- models: remember fp32 weights (future masters), cast, wrap forward ------------------
    for model in model_list:
        bad = check_params_fp32(model)
        if bad is not None:
            warnings.warn(
                f"amp.initialize: found {bad} where float32 was expected; amp.initialize does the "
                "casting itself, so pass the model in float32 (do not call .half() on it).",
                stacklevel=2,
            )
    fp32_sources: dict[int, torch.Tensor] = {}
    if props.cast_model_type:  # None or False: the model keeps its types
        if props.master_weights and props.cast_model_type in HALF_DTYPES:
            for model in model_list:
                for param in model.parameters():
                    if param.dtype == torch.float32:
                        fp32_sources[id(param)] = param.detach().clone()
        for model in model_list:
            convert_network(model, props.cast_model_type, bool(props.keep_batchnorm_fp32))
            if props.cast_model_type in HALF_DTYPES:
                register_fp32_state_dict(model)  # checkpoints stay float32, as apex's
    for model in model_list:
        wrap_forward(model, props, cast_model_outputs)
        model._amp_initialized = True

    # --- optimizers and scalers --------------------------------------------------------------
    for opt in opt_list:
        process_optimizer(opt, props, fp32_sources)
    if any(combining(opt) for opt in opt_list):
        for model in model_list:
            zero_grads_in_place(model)
    if props.combine_ddp:
        ddp.broadcast_from_rank0(model_list)
    # After every option and optimizer rule has had its say (they name what to change first),
    # before any state is kept: the model's device must compute the half type asked for.
    for model in model_list:
        check_half_support(
            _device_type([model]) or "cpu",
            props.half_dtype,
            autocast=bool(props.patch_torch_functions),
            matmul=props.cast_model_type in HALF_DTYPES,
        )
    _amp_state.opt_properties = props
    _amp_state.loss_scalers = [
        LossScaler(
            props.loss_scale,
            init_scale=dynamic_init_scale,
            growth_factor=scale_growth_factor,
            backoff_factor=scale_backoff_factor,
            scale_window=scale_window,
            min_loss_scale=min_loss_scale,
            max_loss_scale=max_loss_scale,
            device_type=_device_type(model_list),
        )
        for _ in range(num_losses)
    ]
    return _shaped(models, optimizers)


def _device_type(models: list[nn.Module]) -> Optional[str]:
    """Where the models live (their first tensor's device type), for the scalers' overflow
    mode; None for models without parameters or buffers."""
    for model in models:
        for tensor in itertools.chain(model.parameters(), model.buffers()):
            return tensor.device.type
    return None


def _shaped(models: Any, optimizers: Any) -> Any:
    return models if optimizers is None else (models, optimizers)


def state_dict(destination: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The loss scalers' state: ``{"loss_scaler0": {"loss_scale": s, "unskipped": n}, ...}``."""
    if destination is None:
        destination = OrderedDict()
    for i, scaler in enumerate(_amp_state.loss_scalers):
        destination[f"loss_scaler{i}"] = scaler.state_dict()
    return destination


def load_state_dict(state_dict: dict[str, Any]) -> None:
    """Restore the loss scalers saved by ``amp.state_dict()`` (call after ``amp.initialize``)."""
    if not isinstance(state_dict, dict):
        raise TypeError(f"amp.load_state_dict expects a dict; got {type(state_dict).__name__}")
    scalers = _amp_state.loss_scalers
    expected = [f"loss_scaler{i}" for i in range(len(scalers))]
    if sorted(state_dict) != sorted(expected):
        raise ValueError(
            f"amp.load_state_dict: the state has entries {sorted(state_dict)}, but the current "
            f"amp.initialize(num_losses={len(scalers)}) uses {expected}; call amp.initialize with "
            "the same num_losses before loading."
        )
    for key, scaler in zip(expected, scalers):
        scaler.load_state_dict(state_dict[key])
