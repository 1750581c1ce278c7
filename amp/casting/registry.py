"""apex's user cast registry for O1: ``amp.register_half_function(module, name)``,
``register_float_function``, ``register_promote_function`` (and the decorator forms
``half_function``, ``float_function``, ``promote_function``), and the O1 ``amp.initialize``'s
``_amp_state.handle`` that wraps them (the handle and the O1 forward: amp/casting/o1.py).

O1 here is ``torch.autocast`` around each initialized model's ``forward`` (amp/casting/model.py),
not apex's patching of torch's namespaces. A registered function is still wrapped as apex wraps
it: ``amp.initialize`` at O1 replaces ``module.name`` by a caster *for the process* (as apex
does), and the caster casts only while an amp O1 forward is running, so code outside a model's
forward -- and every call after ``_amp_state.handle._deactivate()`` -- gets the function
unchanged. Wrapping per forward call instead would rebind module attributes on every step,
which is neither thread-safe nor reentrant (nested or concurrent forwards).

The cast: ``half`` casts every floating-point tensor argument to the O1 half type, ``float`` to
float32, ``promote`` to the widest floating type among them. Inside the call autocast still
decides for the ops it knows (a function registered float that autocast lists as
lower-precision, ``torch.mm`` say, still runs in half) -- unless ``amp.initialize(...,
user_cast_preferred=True)``, Apex for Ascend's switch that makes the user's registration win
over the built-in lists: the registered function then runs with autocast off, in the dtype the
user asked for.

As in apex, registrations are made before ``amp.initialize``, which consumes them; one made
later takes effect at the next O1 ``amp.initialize``. A second registration of the same
function replaces the first.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from typing import Any, Callable, Optional

import torch

from .._amp_state import _amp_state
from .o1 import _O1_FORWARD, AmpHandle, O1Context

logger = logging.getLogger("amp")

__all__ = [
    "float_function",
    "half_function",
    "promote_function",
    "register_float_function",
    "register_half_function",
    "register_promote_function",
]

KINDS = ("half", "float", "promote")


# (module, name) -> kind, in registration order; consumed by the next O1 amp.initialize.
_REGISTRY: dict[tuple[int, str], tuple[Any, str, str]] = {}


def _register(module: Any, name: str, kind: str) -> None:
    if not hasattr(module, name):
        raise ValueError(f"No function named {name} in module {module}.")  # apex's message
    if _amp_state.handle.is_active():
        logger.warning(
            "amp: register_%s_function(%s, %r) after amp.initialize takes effect "
            "at the next O1 amp.initialize (as in apex)",
            kind,
            getattr(module, "__name__", module),
            name,
        )
    _REGISTRY[(id(module), name)] = (module, name, kind)


def register_half_function(module: Any, name: str) -> None:
    """Under O1, cast the floating-point tensor arguments of ``module.name`` to half."""
    _register(module, name, "half")


def register_float_function(module: Any, name: str) -> None:
    """Under O1, cast the floating-point tensor arguments of ``module.name`` to float32."""
    _register(module, name, "float")


def register_promote_function(module: Any, name: str) -> None:
    """Under O1, cast the floating-point tensor arguments of ``module.name`` to the widest
    floating type among them."""
    _register(module, name, "promote")


def cast_tensors(value: Any, dtype: torch.dtype) -> Any:
    """Cast every floating-point tensor inside ``value`` (nested tuples, lists, dicts) to ``dtype``;
    anything else passes through unchanged."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(cast_tensors(v, dtype) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(cast_tensors(v, dtype) for v in value)
    if isinstance(value, dict):
        return type(value)((k, cast_tensors(v, dtype)) for k, v in value.items())
    return value


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _target_dtype(kind: str, ctx: O1Context, args: tuple, kwargs: dict) -> Optional[torch.dtype]:
    if kind == "half":
        return ctx.half_dtype
    if kind == "float":
        return torch.float32
    floats = {t.dtype for t in _tensors((args, kwargs)) if t.is_floating_point()}
    if len(floats) < 2:
        return None  # nothing to promote
    return functools.reduce(torch.promote_types, floats)


def make_caster(fn: Callable[..., Any], kind: str) -> Callable[..., Any]:
    """*fn*, casting its arguments as *kind* says while an amp O1 forward runs."""

    @functools.wraps(fn)
    def caster(*args: Any, **kwargs: Any) -> Any:
        ctx = _O1_FORWARD.get()
        if ctx is None:
            return fn(*args, **kwargs)
        dtype = _target_dtype(kind, ctx, args, kwargs)
        if dtype is not None:
            args, kwargs = cast_tensors(args, dtype), cast_tensors(kwargs, dtype)
        if ctx.user_cast_preferred:
            with torch.autocast(device_type=ctx.device_type, enabled=False):
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)

    caster.__amp_cast_kind__ = kind  # type: ignore[attr-defined]
    return caster


def half_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator form of ``register_half_function``."""
    return make_caster(fn, "half")


def float_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator form of ``register_float_function``."""
    return make_caster(fn, "float")


def promote_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator form of ``register_promote_function``."""
    return make_caster(fn, "promote")


def handle_for(props: Any, verbose: bool = False) -> AmpHandle:
    """The active handle of the O1 ``amp.initialize`` whose options are *props*: made by its
    first model (wrapping every registered function; the registry is then empty, as apex's)
    and shared by its other models. It becomes ``_amp_state.handle``."""
    if _amp_state.handle.props is props:
        return _amp_state.handle
    handle = AmpHandle(active=True, verbose=verbose)
    handle.props = props
    wrap_registered(handle)
    _amp_state.handle = handle
    return handle


def wrap_registered(handle: AmpHandle) -> None:
    """Wrap every registered function in its caster, for ``handle`` to restore; the registry
    is then empty (apex's: an O1 initialize, or ``amp.init()``, consumes it)."""
    for module, name, kind in _REGISTRY.values():
        original = getattr(module, name)
        setattr(module, name, make_caster(original, kind))
        handle._save_func(module, name, original)
    _REGISTRY.clear()
