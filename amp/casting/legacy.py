"""NVIDIA apex's old O1 API, ``amp.init()`` and ``amp.disable_casts()``, on torch.autocast.

apex's ``init`` patched torch's namespaces for the whole process so that every call cast per
its op lists, and returned a handle whose ``_deactivate()`` undid it; its tests
(``test_basic_casts``, ``test_promotion``, ``test_rnn``) and older scripts call it instead of
``amp.initialize``. Here ``init`` turns O1 casting on for the *calling thread* (autocast's
state is per thread) -- ``torch.autocast`` entered on the CPU and on the current accelerator,
with ``patch_type`` as its dtype -- until ``handle._deactivate()``. What is cast is then
autocast's lists for that device (CUDA's on an accelerator, the CPU's own on the CPU), not
apex's: on the CPU, softmax, group_norm, pow or sum follow their input's type.

Also as in apex: functions registered with ``amp.register_*_function`` before ``init`` are
wrapped (and restored by ``_deactivate``); ``F.binary_cross_entropy`` on a half input raises
``NotImplementedError`` unless ``allow_banned=True``, which runs it in float32 instead (on
every device, since CUDA's autocast refuses it).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any, Callable, Optional, Union

import torch
import torch.nn.functional as F

from .. import _torch_compat as compat
from .._amp_state import _amp_state
from ..opt_levels import HALF_DTYPES
from .o1 import _O1_FORWARD, AmpHandle, O1Context, autocast_device_types
from .registry import _tensors, cast_tensors, wrap_registered

BANNED_MESSAGE = (
    "amp.init(): F.binary_cross_entropy (torch.nn.BCELoss) is unsafe on a half input, which a "
    "Sigmoid before it produces under O1. Use torch.nn.BCEWithLogitsLoss (Sigmoid and "
    "BCELoss in one, safe in half), or amp.register_float_function(torch, 'sigmoid') before "
    "amp.init(); amp.init(allow_banned=True) runs it in float32 instead."
)


class InitHandle(AmpHandle):
    """The handle ``amp.init()`` returns (and makes ``_amp_state.handle``): autocast entered
    for the calling thread until ``_deactivate()``, which must be called from that thread."""

    def __init__(
        self, dtype: torch.dtype, device_types: list[str], enable_caching: bool, verbose: bool
    ) -> None:
        super().__init__(active=True, verbose=verbose)
        self._caching = enable_caching
        self._stack = contextlib.ExitStack()
        for device_type in device_types:
            self._stack.enter_context(
                torch.autocast(device_type, dtype=dtype, cache_enabled=enable_caching)
            )
        # Registered functions cast while this is set, as inside an O1 forward.
        self._token = _O1_FORWARD.set(O1Context(dtype, device_types[-1], False))

    @property
    def has_cache(self) -> bool:
        return self._active and self._caching

    def _deactivate(self) -> None:
        if not self._active:
            return
        super()._deactivate()
        self._stack.close()  # leaves autocast, innermost first
        try:
            _O1_FORWARD.reset(self._token)
        except ValueError:  # deactivated from another context than init's: just clear it
            _O1_FORWARD.set(None)


class NoOpHandle(AmpHandle):
    """``amp.init(enabled=False)``: nothing is cast."""


def _banned(fn: Callable[..., Any], allow: bool) -> Callable[..., Any]:
    @functools.wraps(fn)
    def binary_cross_entropy(*args: Any, **kwargs: Any) -> Any:
        ctx = _O1_FORWARD.get()
        if ctx is None:
            return fn(*args, **kwargs)
        if not allow:
            if any(t.dtype in HALF_DTYPES for t in _tensors((args, kwargs))):
                raise NotImplementedError(BANNED_MESSAGE)
        else:
            args, kwargs = cast_tensors(args, torch.float32), cast_tensors(kwargs, torch.float32)
        # Outside autocast, as apex computes it (apex had none): the CUDA-like autocast of an
        # accelerator (CUDA's, an NPU's) refuses binary_cross_entropy whatever its inputs.
        with contextlib.ExitStack() as stack:
            for device_type in autocast_device_types():
                stack.enter_context(torch.autocast(device_type, enabled=False))
            return fn(*args, **kwargs)

    return binary_cross_entropy


def _device_types(device_type: Optional[str], patch_type: torch.dtype) -> list[str]:
    """Where init() enters autocast: ``device_type``, else the CPU and the current accelerator,
    less the CPU where its autocast does not take ``patch_type`` (torch 2.1: bfloat16 only),
    so that apex's fp16 default still casts on the accelerator there."""
    wanted = autocast_device_types() if device_type is None else [device_type]
    usable = [t for t in wanted if compat.autocast_supports(t, patch_type)]
    if not usable or (device_type is not None and usable != wanted):
        raise compat.HalfUnsupportedError(
            f"amp.init: torch {torch.__version__} has no autocast to {patch_type} on "
            f"{' or '.join(repr(t) for t in wanted)}. Pass patch_type=torch.bfloat16, or "
            "device_type= the accelerator the model runs on."
        )
    return usable


def init(
    enabled: bool = True,
    loss_scale: Union[str, float] = "dynamic",
    enable_caching: bool = True,
    verbose: bool = False,
    allow_banned: bool = False,
    patch_type: torch.dtype = torch.float16,
    *,
    device_type: Optional[str] = None,
) -> AmpHandle:
    """apex's old ``amp.init()``: O1 casting for this thread until ``handle._deactivate()``.

    ``patch_type`` is the half type (fp16 or bf16); ``device_type`` limits autocast to one
    device type (default: the CPU and the current accelerator; the CPU only where its autocast
    takes ``patch_type``: not float16 on torch 2.1). ``loss_scale`` is accepted
    for apex's signature; loss scaling belongs to ``amp.initialize`` / ``amp.scale_loss``, as
    apex's own old ``handle.scale_loss`` was removed. Prefer ``amp.initialize(..., opt_level=
    "O1")``, which casts each initialized model's forward on any thread.

    Example (runs on CPU)::

        >>> import torch, amp
        >>> handle = amp.init(patch_type=torch.bfloat16, device_type="cpu")
        >>> torch.nn.Linear(4, 4)(torch.randn(2, 4)).dtype
        torch.bfloat16
        >>> with amp.disable_casts():
        ...     torch.nn.Linear(4, 4)(torch.randn(2, 4)).dtype
        torch.float32
        >>> handle._deactivate()
    """
    if patch_type not in HALF_DTYPES:
        raise TypeError(
            f"amp.init: patch_type must be torch.float16 or torch.bfloat16; got {patch_type!r}"
        )
    previous = _amp_state.handle
    if isinstance(previous, InitHandle):
        previous._deactivate()  # a second init replaces the first instead of nesting in it
    if not enabled:
        handle: AmpHandle = NoOpHandle()
        _amp_state.handle = handle
        return handle
    device_types = _device_types(device_type, patch_type)
    handle = InitHandle(patch_type, device_types, enable_caching, verbose)
    wrap_registered(handle)
    original = F.binary_cross_entropy
    F.binary_cross_entropy = _banned(original, allow_banned)
    handle._save_func(F, "binary_cross_entropy", original)
    _amp_state.handle = handle
    return handle


@contextlib.contextmanager
def disable_casts() -> Iterator[None]:
    """apex's ``amp.disable_casts()``: no O1 casting inside the block (autocast off), for
    ``amp.init()``'s casting and inside an O1 ``amp.initialize`` model's forward alike."""
    with _amp_state.handle._disable_casts():
        yield
