"""The TLS hint on in-cell step failures (fast; the real failure is in test_proxy_real.py)."""

from __future__ import annotations

import pytest

from builder.engines.base import RunResult, check_result
from builder.engines.tls_hint import tls_failure_hint
from builder.errors import StepFailed

# pip 23.0.1's output for an index whose certificate the build does not trust (seen in
# test_proxy_real.py's build without --ca-bundle), shortened.
PIP_TLS = (
    "WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) "
    "after connection broken by 'SSLError(SSLCertVerificationError(1, '[SSL: "
    "CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer "
    "certificate (_ssl.c:992)'))': /simple/torch/",
    "ERROR: Could not find a version that satisfies the requirement torch==2.13.0 "
    "(from versions: none)",
    "ERROR: No matching distribution found for torch==2.13.0",
)
PIP_REFUSED = (
    "WARNING: Retrying (Retry(total=0, ...)) after connection broken by "
    "'NewConnectionError(... [Errno 111] Connection refused')': /simple/torch/",
    "ERROR: No matching distribution found for torch==2.13.0",
)


def test_hint_only_for_certificate_failures() -> None:
    hint = tls_failure_hint(PIP_TLS)
    assert hint is not None and "--ca-bundle PEM" in hint and "BUILDER_CA_BUNDLE" in hint
    assert tls_failure_hint(PIP_REFUSED) is None
    assert tls_failure_hint(["problem confirming the ssl certificate: ..."]) is not None


@pytest.mark.parametrize(("tail", "hinted"), [(PIP_TLS, True), (PIP_REFUSED, False)])
def test_step_failure_message_carries_the_hint(tail: tuple[str, ...], hinted: bool) -> None:
    result = RunResult(argv=("python", "steps.py", "install-torch"), exit_code=1, tail=tail)
    with pytest.raises(StepFailed) as info:
        check_result(result, "install torch==2.13.0", "container abc")
    message = info.value.message
    assert "step 'install torch==2.13.0' failed in container abc" in message
    assert ("hint: TLS verification failed inside the build" in message) is hinted
