"""The runnable examples in amp's docstrings (initialize, scale_loss, LossScaler, init) run as
written."""

from __future__ import annotations

import doctest

import pytest

import amp.casting.legacy
import amp.frontend
import amp.handle
import amp.scaler


# frontend's and handle's examples train in float16 on torch's default device (half_device).
@pytest.mark.parametrize(
    "module",
    [
        pytest.param(amp.frontend, marks=pytest.mark.half_device),
        pytest.param(amp.handle, marks=pytest.mark.half_device),
        amp.scaler,
        amp.casting.legacy,
    ],
)
def test_docstring_examples_run(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
