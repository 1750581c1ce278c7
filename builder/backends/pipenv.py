"""pip's settings for the steps that run pip on this host (the host backend's build and smoke
venvs, the cross path's target-torch downloads), in the form the docker recipe gives them inside
containers (``docker/partials/pip.j2``): the proxies, the index and extra indexes, and the CA
bundle. Without it those steps used whatever pip found configured here."""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path

from builder.atomicfile import atomic_write
from builder.config import BuildConfig

#: Where distributions keep the system trust store, when ``ssl`` names none that exists.
_SYSTEM_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")


def merged_ca_bundle(extra: Path, folder: Path) -> Path:
    """This host's trust store plus *extra*, in *folder*: pointing pip at *extra* alone would
    drop the public CAs (an index behind the proxy and one on the internet both need to verify)."""
    paths = ssl.get_default_verify_paths()
    base = ""
    for candidate in (paths.cafile, paths.openssl_cafile, *_SYSTEM_BUNDLES):
        if candidate and Path(candidate).is_file():
            base = Path(candidate).read_text(encoding="ascii", errors="replace")
            break
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / "ca-bundle.pem"
    text = base.rstrip("\n") + "\n" + extra.read_text(encoding="ascii", errors="replace")
    atomic_write(out, text.encode())
    return out


def pip_env(config: BuildConfig, proxy_env: Mapping[str, str], folder: Path) -> dict[str, str]:
    """Environment variables for pip here: proxies, retries and timeout, indexes (not offline:
    then the wheelhouse is the only source), and the CA bundle merged into *folder*."""
    env = {**proxy_env, **config.pip.network.env()}
    if not config.offline.enabled:
        if config.pip.index_url:
            env["PIP_INDEX_URL"] = config.pip.index_url
        if config.pip.extra_index_urls:
            env["PIP_EXTRA_INDEX_URL"] = " ".join(config.pip.extra_index_urls)
    if config.ca_bundle is not None:
        bundle = str(merged_ca_bundle(config.ca_bundle, folder))
        env.update(PIP_CERT=bundle, SSL_CERT_FILE=bundle, REQUESTS_CA_BUNDLE=bundle)
    return env
