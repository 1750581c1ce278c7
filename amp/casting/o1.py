"""amp's O1 state below the cast registry: apex's ``_amp_state.handle`` (``AmpHandle``) and the
O1 forward in progress (``O1Context``, entered with ``o1_forward``), which the registered
casters (amp/casting/registry.py) read to know whether and how to cast."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Optional

import torch

from .._torch_compat import current_accelerator, is_autocast_enabled


@dataclass(frozen=True)
class O1Context:
    """What the casters need while an amp O1 forward runs."""

    half_dtype: torch.dtype
    device_type: str
    user_cast_preferred: bool


# Set by the O1 forward (amp/casting/model.py) for its duration; None outside any O1 forward.
_O1_FORWARD: contextvars.ContextVar[Optional[O1Context]] = contextvars.ContextVar(
    "amp_o1_forward", default=None
)


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


@contextlib.contextmanager
def o1_forward(ctx: O1Context) -> Iterator[None]:
    """The casters cast while this is entered (the O1 forward of an initialized model)."""
    token = _O1_FORWARD.set(ctx)
    try:
        yield
    finally:
        _O1_FORWARD.reset(token)
