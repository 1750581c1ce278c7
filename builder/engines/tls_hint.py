"""Recognise a TLS verification failure in a failed step's output and say how to fix it.

pip hides an untrusted certificate behind retries and ends with the misleading
``Could not find a version that satisfies the requirement ... (from versions: none)``
(seen behind a TLS-intercepting proxy); the only trace of the cause is an earlier ``SSLError``
line. A build behind an intercepting proxy or against a private HTTPS index needs that CA injected.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Optional

#: What OpenSSL, Python's ssl module and pip print when a certificate is not trusted.
_MARKERS = (
    "CERTIFICATE_VERIFY_FAILED",
    "certificate verify failed",
    "problem confirming the ssl certificate",
)

HINT = (
    "TLS verification failed inside the build: the server's certificate (a private HTTPS "
    "index, or an intercepting proxy) is signed by a CA the build does not trust. Give the "
    "build that CA as a PEM file: --ca-bundle PEM, or BUILDER_CA_BUNDLE=PEM, or ca_bundle: "
    "in the config; it goes into the image's trust store and SSL_CERT_FILE, PIP_CERT and "
    "REQUESTS_CA_BUNDLE."
)


def tls_failure_hint(lines: Iterable[str]) -> Optional[str]:
    """:data:`HINT` when any of *lines* reports an untrusted certificate, else None."""
    for line in lines:
        if any(marker in line for marker in _MARKERS):
            return HINT
    return None
