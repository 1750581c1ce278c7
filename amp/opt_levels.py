"""The opt-level table (O0-O3) and the rules that merge user overrides into it.

Mirrors apex.amp's ``Properties``: each level fills in defaults, then every keyword the user
passed that is not ``None`` overrides its default. The four combinations apex rejects are rejected
here too, with a ``RuntimeError`` that says what to do instead.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Union

import torch

OPT_LEVELS = ("O0", "O1", "O2", "O3")
HALF_DTYPES = (torch.float16, torch.bfloat16)
MODEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

LossScale = Union[float, str]


class Properties:
    """The resolved options of one ``amp.initialize`` call (apex's option names and meanings).

    ``half_dtype`` is this project's addition: the half type used by the level (fp16 by default,
    ``torch.bfloat16`` for bf16 at any level).
    """

    def __init__(self) -> None:
        self.enabled: bool = False
        self.opt_level: Optional[str] = None
        self.cast_model_type: Optional[torch.dtype] = None
        self.patch_torch_functions: bool = False
        self.keep_batchnorm_fp32: Optional[bool] = None
        self.master_weights: Optional[bool] = None
        self.loss_scale: LossScale = 1.0
        self.half_dtype: torch.dtype = torch.float16
        # This project's opt-in: fused optimizers keep gradients scaled until their step.
        self.defer_unscale: bool = False
        # Apex for Ascend's additions (amp.initialize's keywords of the same names).
        self.combine_grad: bool = False
        self.check_combined_tensors: bool = False
        self.combine_ddp: bool = False
        self.ddp_replica_count: int = 4
        self.user_cast_preferred: bool = False

    def options(self) -> dict[str, Any]:
        return dict(vars(self))

    def __repr__(self) -> str:
        body = "\n".join(f"  {k:22} : {v}" for k, v in self.options().items())
        return f"Properties(\n{body}\n)"


def level_defaults(opt_level: str, half_dtype: torch.dtype) -> Properties:
    """Apex's defaults for ``opt_level`` (validated), with fp16 replaced by ``half_dtype``."""
    p = Properties()
    p.enabled = True
    p.opt_level = opt_level
    p.half_dtype = half_dtype
    if opt_level == "O0":  # pure fp32 training: a baseline
        p.cast_model_type = torch.float32
        p.master_weights = False
        p.loss_scale = 1.0
    elif opt_level == "O1":  # fp32 weights, per-op casting through torch.autocast
        p.patch_torch_functions = True
        p.loss_scale = "dynamic"
    elif opt_level == "O2":  # half model, fp32 batch-norm, fp32 master weights
        p.cast_model_type = half_dtype
        p.keep_batchnorm_fp32 = True
        p.master_weights = True
        p.loss_scale = "dynamic"
    else:  # O3: pure half, a speed-of-light baseline
        p.cast_model_type = half_dtype
        p.keep_batchnorm_fp32 = False
        p.master_weights = False
        p.loss_scale = 1.0
    return p


def check_opt_level(opt_level: object) -> str:
    if not isinstance(opt_level, str):
        raise TypeError(
            f"opt_level must be one of the strings {', '.join(OPT_LEVELS)}; "
            f"got {opt_level!r} ({type(opt_level).__name__})"
        )
    if opt_level not in OPT_LEVELS:
        raise RuntimeError(
            f"Unexpected optimization level {opt_level!r}. Options are 'O0', 'O1', 'O2', 'O3'. "
            "Note that in 'O0', 'O1', etc., the prefix O is the letter O, not the number zero."
        )
    return opt_level


def check_optional_bool(name: str, value: object) -> Optional[bool]:
    if value is None or isinstance(value, bool):
        return value
    raise TypeError(f"{name} must be True, False or None; got {value!r} ({type(value).__name__})")


def parse_keep_batchnorm_fp32(value: object) -> Optional[bool]:
    """Apex accepts the strings "True"/"False" (from command lines) as well as booleans."""
    if value == "True":
        return True
    if value == "False":
        return False
    if value is None or isinstance(value, bool):
        return value
    raise TypeError(
        "keep_batchnorm_fp32 must be a boolean, the string 'True' or 'False', or None; "
        f"got {value!r}"
    )


def parse_loss_scale(value: object) -> LossScale:
    """``"dynamic"`` or a positive finite number (numeric strings accepted, as apex does)."""
    if value == "dynamic":
        return "dynamic"
    number: Optional[float] = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    if number is None:
        raise TypeError(f"loss_scale must be 'dynamic' or a positive number; got {value!r}")
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"loss_scale must be 'dynamic' or a positive finite number; got {value!r}")
    return number


def check_dtype(name: str, value: object, allowed: tuple) -> Optional[torch.dtype]:
    if value is None:
        return None
    if not isinstance(value, torch.dtype) or value not in allowed:
        names = ", ".join(str(d) for d in allowed)
        raise TypeError(f"{name} must be None or one of {names}; got {value!r}")
    return value


ModelType = Union[torch.dtype, bool, None]


def check_cast_model_type(value: object) -> ModelType:
    """A dtype, None (the level's default) or False: apex's "do not cast the model"."""
    if value is False:
        return False
    if value is True:
        raise TypeError(
            "cast_model_type must be None, False (do not cast) or one of "
            f"{', '.join(str(d) for d in MODEL_DTYPES)}; got True"
        )
    try:
        return check_dtype("cast_model_type", value, MODEL_DTYPES)
    except TypeError:
        raise TypeError(
            "cast_model_type must be None, False (do not cast) or one of "
            f"{', '.join(str(d) for d in MODEL_DTYPES)}; got {value!r}"
        ) from None


def apply_overrides(
    props: Properties,
    *,
    cast_model_type: ModelType,
    patch_torch_functions: Optional[bool],
    keep_batchnorm_fp32: Optional[bool],
    master_weights: Optional[bool],
    loss_scale: Optional[LossScale],
) -> Properties:
    """Apex's override rules: a non-None keyword replaces the level's default.

    The four combinations apex refuses raise ``RuntimeError`` naming the fix.
    """
    o1 = props.opt_level == "O1"
    if cast_model_type is not None:
        if o1 and cast_model_type is not False and cast_model_type is not torch.float32:
            raise RuntimeError(
                "O1 inserts casts around torch operations (torch.autocast) rather than casting the "
                "model weights, so with O1 the model weights themselves must stay float32. To cast "
                "the model to another type use opt_level='O2' or 'O3'; to run O1's autocast in "
                f"bfloat16 pass half_dtype=torch.bfloat16. cast_model_type was {cast_model_type}."
            )
        props.cast_model_type = cast_model_type
    if patch_torch_functions is not None:
        if not o1 and patch_torch_functions:
            raise RuntimeError(
                "patch_torch_functions=True (per-op casting through torch.autocast) is only "
                f"available with opt_level='O1'; it was requested with {props.opt_level}. "
                "Select opt_level='O1' instead."
            )
        props.patch_torch_functions = patch_torch_functions
    if keep_batchnorm_fp32 is not None:
        if o1:
            raise RuntimeError(
                "With opt_level O1, batch-norm already runs in float32 under torch.autocast, so "
                "keep_batchnorm_fp32 must be left as None. keep_batchnorm_fp32 was "
                f"{keep_batchnorm_fp32}."
            )
        props.keep_batchnorm_fp32 = keep_batchnorm_fp32
    if master_weights is not None:
        if o1:
            raise RuntimeError(
                "master_weights makes no sense with opt_level O1: O1 keeps the model weights "
                "themselves in float32. Leave master_weights as None, or use opt_level='O2'."
            )
        props.master_weights = master_weights
    if loss_scale is not None:
        props.loss_scale = loss_scale
    return props
