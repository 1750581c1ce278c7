"""The runnable examples in amp's docstrings (initialize, scale_loss, LossScaler, init) run as
written."""
from __future__ import annotations

import doctest

import pytest

import amp.frontend
import amp.handle
import amp.legacy_init
import amp.scaler


@pytest.mark.parametrize("module", [amp.frontend, amp.handle, amp.scaler, amp.legacy_init])
def test_docstring_examples_run(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
