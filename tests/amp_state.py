"""amp keeps process-wide state, as apex does (the opt properties, loss scalers, O1's handle):
the one reset of it, for tests/conftest.py's fixture (before and after every test) and the
tests that reset amp between two runs inside one test (tests/npu/amp_npu_lib.py)."""

from __future__ import annotations

from amp._amp_state import _amp_state


def reset_amp() -> None:
    _amp_state.opt_properties = None
    _amp_state.loss_scalers = []
    _amp_state.verbosity = 1
    _amp_state.handle._deactivate()  # O1's registered casts and autocast off
