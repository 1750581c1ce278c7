"""The runnable examples in amp's docstrings (initialize, scale_loss, LossScaler, init) run as
written."""
from __future__ import annotations

import doctest

import pytest
from amp_testlib import needs_cpu_float16

import amp.frontend
import amp.handle
import amp.legacy_init
import amp.scaler


@pytest.mark.parametrize("module", [pytest.param(amp.frontend, marks=needs_cpu_float16),
                                    pytest.param(amp.handle, marks=needs_cpu_float16),
                                    amp.scaler, amp.legacy_init])
def test_docstring_examples_run(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
