"""apex's user cast registry for O1: ``amp.register_half_function(module, name)``,
``register_float_function``, ``register_promote_function`` (and the decorator forms
``half_function``, ``float_function``, ``promote_function``), plus ``_amp_state.handle``.

O1 here is ``torch.autocast`` around each initialized model's ``forward`` (amp/_casting.py),
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

import contextlib
import contextvars
import functools
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from ._torch_compat import current_accelerator, is_autocast_enabled

logger = logging.getLogger("amp")

__all__ = [
    "AmpHandle",
    "float_function",
    "half_function",
    "promote_function",
    "register_float_function",
    "register_half_function",
    "register_promote_function",
]

KINDS = ("half", "float", "promote")


@dataclass(frozen=True)
class O1Context:
    """What the casters need while an amp O1 forward runs."""

    half_dtype: torch.dtype
    device_type: str
    user_cast_preferred: bool


# Set by the O1 forward (amp/_casting.py) for its duration; None outside any O1 forward.
_O1_FORWARD: contextvars.ContextVar[Optional[O1Context]] = contextvars.ContextVar(
    "amp_o1_forward", default=None)

# (module, name) -> kind, in registration order; consumed by the next O1 amp.initialize.
_REGISTRY: dict[tuple[int, str], tuple[Any, str, str]] = {}


class AmpHandle:
    """apex's ``_amp_state.handle``: the O1 casting of one ``amp.initialize``.

    ``is_active()`` is True from that O1 ``amp.initialize`` until ``_deactivate()``, which
    (as apex's) restores every function the registry wrapped and turns O1 casting off for the
    models initialized with it: their forwards then run without autocast. apex's tests and
    tools call ``_amp_state.handle._deactivate()`` between runs."""

    def __init__(self, active: bool = False, verbose: bool = False) -> None:
        self._active = active
        self._verbose = verbose
        self._wrapped: list[tuple[Any, str, Any]] = []  # (module, name, original)
        self.props: Any = None  # the Properties of the amp.initialize it belongs to

    def is_active(self) -> bool:
        return self._active

    @property
    def verbose(self) -> bool:
        return self._verbose

    @property
    def has_cache(self) -> bool:
        # The cast cache is autocast's (weights cast once per forward, dropped on exit).
        return self._active and torch.is_autocast_cache_enabled()

    def _clear_cache(self) -> None:
        torch.clear_autocast_cache()

    def _save_func(self, module: Any, name: str, original: Any) -> None:
        self._wrapped.append((module, name, original))

    def _deactivate(self) -> None:
        for module, name, original in reversed(self._wrapped):
            setattr(module, name, original)
        self._wrapped = []
        self._active = False

    @contextlib.contextmanager
    def _disable_casts(self) -> Iterator[None]:
        """apex's: no O1 casting inside the block -- autocast off on every device type where
        it is on (also inside an O1 forward, which entered it), registered functions uncast,
        O1 forwards started inside run without autocast."""
        was_active = self._active
        self._active = False
        token = _O1_FORWARD.set(None)
        try:
            with contextlib.ExitStack() as stack:
                for device_type in autocast_device_types():
                    if is_autocast_enabled(device_type):
                        stack.enter_context(torch.autocast(device_type, enabled=False))
                yield
        finally:
            _O1_FORWARD.reset(token)
            self._active = was_active


def autocast_device_types() -> list[str]:
    """The device types autocast may be on for here: the CPU and the current accelerator."""
    current = current_accelerator()
    return ["cpu"] if current is None or current == "cpu" else ["cpu", current]


def _register(module: Any, name: str, kind: str) -> None:
    if not hasattr(module, name):
        raise ValueError(f"No function named {name} in module {module}.")  # apex's message
    from ._amp_state import _amp_state

    if _amp_state.handle.is_active():
        logger.warning("amp: register_%s_function(%s, %r) after amp.initialize takes effect "
                       "at the next O1 amp.initialize (as in apex)", kind,
                       getattr(module, "__name__", module), name)
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
    from ._casting import cast_tensors

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
    from ._amp_state import _amp_state

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


@contextlib.contextmanager
def o1_forward(ctx: O1Context) -> Iterator[None]:
    """The casters cast while this is entered (the O1 forward of an initialized model)."""
    token = _O1_FORWARD.set(ctx)
    try:
        yield
    finally:
        _O1_FORWARD.reset(token)
