"""amp keeps process-wide state (like apex): reset it around every test."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _fresh_amp_state():
    """amp keeps process-wide state (like apex): reset it around every test."""
    from amp._amp_state import _amp_state  # noqa: PLC0415

    yield
    _amp_state.opt_properties = None
    _amp_state.loss_scalers = []
    _amp_state.verbosity = 1
    _amp_state.handle._deactivate()  # O1's registered casts and autocast off
