"""Model-side casting: converting a model's weights (O0/O2/O3) and wrapping its ``forward`` so that
inputs, per-op precision (O1, through ``torch.autocast``) and outputs are handled for the user.

Nothing in torch is monkey-patched: only the given model instances get a wrapped ``forward``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch
from torch import nn

from ..opt_levels import Properties
from .o1 import O1Context, o1_forward
from .registry import cast_tensors, handle_for


def _cast_module_tensors(module: nn.Module, dtype: torch.dtype) -> None:
    """Cast one module's own floating-point parameters and buffers in place (not its children).

    ``param.data`` is replaced so the Parameter objects — which the optimizer holds — stay the same.
    """
    for param in module.parameters(recurse=False):
        if param.is_floating_point():
            param.data = param.data.to(dtype)
            if param.grad is not None:
                param.grad = param.grad.to(dtype)
    for name, buf in module.named_buffers(recurse=False):
        if buf is not None and buf.is_floating_point():
            module._buffers[name] = buf.to(dtype)


# torch_npu's batch-norm layers (torch_npu.contrib.module), which Apex for Ascend keeps in
# float32 too. Known by class name: torch_npu cannot be imported off an NPU machine.
NPU_BATCHNORMS = frozenset(
    {"FastBatchNorm1d", "FastBatchNorm2d", "FastBatchNorm3d", "FastSyncBatchNorm"}
)


def is_batchnorm(module: nn.Module) -> bool:
    """An affine batch-norm layer: torch's, or one of torch_npu's (or a subclass of either)."""
    if not getattr(module, "affine", False):
        return False
    if isinstance(module, nn.modules.batchnorm._BatchNorm):
        return True
    return any(cls.__name__ in NPU_BATCHNORMS for cls in type(module).__mro__)


def convert_network(model: nn.Module, dtype: torch.dtype, keep_batchnorm_fp32: bool) -> None:
    """Cast ``model`` to ``dtype``, leaving affine batch-norm layers in float32 when asked (their
    statistics need the range; torch's batch-norm accepts half input with float32 weights)."""
    for module in model.modules():
        is_bn = is_batchnorm(module)
        if keep_batchnorm_fp32 and is_bn:
            _cast_module_tensors(module, torch.float32)
        else:
            _cast_module_tensors(module, dtype)


def _model_device_type(model: nn.Module, args: tuple, kwargs: dict) -> str:
    for tensor in model.parameters():
        return tensor.device.type
    for tensor in model.buffers():
        return tensor.device.type
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value.device.type
    return "cpu"


def wrap_forward(
    model: nn.Module, props: Properties, cast_model_outputs: Optional[torch.dtype]
) -> None:
    """Replace ``model.forward`` (on this instance only) by one that casts inputs to
    ``props.cast_model_type``, runs under ``torch.autocast`` when ``props.patch_torch_functions``
    (O1), and casts outputs to ``cast_model_outputs``.

    Outputs default to float32 whenever inputs are cast or autocast is used: apex does so for a cast
    model, and under apex's O1 the loss functions computed outside the model ran in float32 too,
    which autocast limited to ``forward`` cannot do for them."""
    input_type = props.cast_model_type or None  # False: apex's "do not cast"
    autocast_dtype = props.half_dtype if props.patch_torch_functions else None
    output_type = cast_model_outputs
    if output_type is None and (input_type is not None or autocast_dtype is not None):
        output_type = torch.float32
    if input_type is None and output_type is None and autocast_dtype is None:
        return
    old_forward: Callable[..., Any] = model.forward
    # O1: apex's handle (its _deactivate() turns this model's autocast off) and the functions
    # registered with amp.register_*_function, cast while this forward runs.
    handle = handle_for(props) if autocast_dtype is not None else None
    preferred = bool(props.user_cast_preferred)

    @functools.wraps(old_forward)
    def forward(*args: Any, **kwargs: Any) -> Any:
        if input_type is not None:
            args, kwargs = cast_tensors(args, input_type), cast_tensors(kwargs, input_type)
        if autocast_dtype is not None and handle is not None and handle.is_active():
            device_type = _model_device_type(model, args, kwargs)
            ctx = O1Context(autocast_dtype, device_type, preferred)
            with o1_forward(ctx), torch.autocast(device_type=device_type, dtype=autocast_dtype):
                output = old_forward(*args, **kwargs)
        else:
            output = old_forward(*args, **kwargs)
        return output if output_type is None else cast_tensors(output, output_type)

    model.forward = forward


def check_params_fp32(model: nn.Module) -> Optional[str]:
    """Name the first floating-point parameter or buffer that is not float32 (None if all are)."""
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if tensor.is_floating_point() and tensor.dtype != torch.float32:
            return f"{name} ({tensor.dtype})"
    return None


def _fp32_state_dict_hook(
    module: nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any
) -> None:
    # Only this module's entries: it may itself be a child of a larger model.
    for key, value in list(state_dict.items()):
        if (
            key.startswith(prefix)
            and isinstance(value, torch.Tensor)
            and value.dtype in (torch.float16, torch.bfloat16)
        ):
            state_dict[key] = value.detach().to(torch.float32)


def register_fp32_state_dict(model: nn.Module) -> None:
    """Make ``model.state_dict()`` return float32 where the model holds half tensors (apex
    registers the same hook at O2/O3): checkpoints load into an fp32 model, and loading them
    back into the half model casts each value back exactly."""
    model._register_state_dict_hook(_fp32_state_dict_hook)
