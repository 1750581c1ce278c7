"""Does a build container trust the index's certificate? A one-second TLS probe from inside.

Behind a TLS-intercepting proxy, or with a private HTTPS index, pip inside the build container
fails with a misleading "no matching distribution" unless the build is given the CA
(``--ca-bundle``). The probe runs the base image's own Python with the build's proxies (as
build arguments reach it) and the configured CA bundle, opens the index URL once with a one
second timeout, and reports: ``ok``, ``tls`` (certificate not trusted), ``timeout`` or
``network`` (could not tell), ``no-python``. The index is the config's ``pip.index_url``,
else pip's own default as the image's pip names it (so nothing here names an index).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from builder.engines.docker import DockerEngine

TIMEOUT_S = 1.0

#: Run as ``python -c PROBE URL CAFILE TIMEOUT`` (URL "" = pip's default; CAFILE "" = none).
PROBE = r"""
import json, socket, ssl, sys, urllib.error, urllib.request
url, cafile, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
if not url:
    try:
        from pip._internal.models.index import PyPI
        url = PyPI.simple_url
    except Exception as exc:
        print(json.dumps({"kind": "no-index", "url": None, "error": repr(exc)}))
        sys.exit(0)
ctx = ssl.create_default_context()
if cafile:
    ctx.load_verify_locations(cafile)
opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx))
kind, error = "ok", ""
try:
    opener.open(url, timeout=timeout).read(1)
except urllib.error.HTTPError as exc:
    kind = "ok"  # the server answered over verified TLS; its status does not matter here
except Exception as exc:
    reason = getattr(exc, "reason", exc)
    error = f"{type(reason).__name__}: {reason}"
    if isinstance(reason, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in error:
        kind = "tls"
    elif isinstance(reason, (socket.timeout, TimeoutError)) or "timed out" in error:
        kind = "timeout"
    else:
        kind = "network"
print(json.dumps({"kind": kind, "url": url, "error": error}))
"""

#: The image's Python: a manylinux-shaped image's first CPython, else python3.
_FIND_PYTHON = (
    "for p in /opt/python/cp3*/bin/python3 /usr/local/bin/python3 "
    '/usr/bin/python3; do if [ -x "$p" ]; then exec "$p" -c "$0" "$@"; fi; done; '
    'echo \'{"kind": "no-python", "url": null, "error": "no python3 in the image"}\''
)

CA_DIR = "/tmp/ampforge-doctor"


@dataclass(frozen=True)
class ProbeResult:
    kind: str  # ok | tls | timeout | network | no-index | no-python | failed
    url: Optional[str]
    error: str


def probe_index(
    engine: DockerEngine,
    image: str,
    index_url: Optional[str],
    ca_bundle: Optional[Path],
    env: Mapping[str, str],
    network: Optional[str] = None,
    timeout: float = TIMEOUT_S,
) -> ProbeResult:
    """Open *index_url* (None: pip's default) from a container of *image*; the container is
    removed afterwards (:meth:`DockerEngine.container`)."""
    with engine.container(image, env=dict(env), network_name=network) as session:
        cafile = session.copy_in(ca_bundle, CA_DIR) if ca_bundle is not None else ""
        result = session.run(
            ["sh", "-c", _FIND_PYTHON, PROBE, index_url or "", cafile, str(timeout)],
            check=False,
            step="TLS probe",
        )
    for line in reversed(result.tail):
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                break
            return ProbeResult(str(doc.get("kind")), doc.get("url"), str(doc.get("error", "")))
    return ProbeResult(
        "failed", index_url, " | ".join(result.tail[-3:]) or f"exit code {result.exit_code}"
    )
