"""The container engine's own proxy, against the user's: why a pull times out.

``docker pull`` is done by the daemon, a separate process (started by systemd, or rootless, or
Podman's service) that never sees the shell's ``HTTPS_PROXY``. Builds do not depend on it (the
builder passes the proxies to every container as build arguments), but anything the daemon
fetches itself does: a shell with a proxy and a daemon without one is the classic "pull times
out" (the first FAQ of the upstream build guide). :func:`daemon_proxy` reads what the engine
reports (``docker info``'s HTTP/HTTPS/No proxy fields), :func:`compare` says whether it
matches the user's, and :func:`fix_text` writes the exact change for this engine -- the
systemd drop-in for Docker, its user unit when rootless, ``containers.conf`` for Podman --
with passwords masked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from builder.config.proxy import ProxySettings
from builder.redact import redact_url_credentials

DROP_IN = "/etc/systemd/system/docker.service.d/http-proxy.conf"
ROOTLESS_DROP_IN = "~/.config/systemd/user/docker.service.d/http-proxy.conf"
PODMAN_CONF = "/etc/containers/containers.conf"  # rootless: ~/.config/containers/containers.conf

_NAMES = (("http_proxy", "HTTP_PROXY"), ("https_proxy", "HTTPS_PROXY"), ("no_proxy", "NO_PROXY"))


@dataclass(frozen=True)
class DaemonProxy:
    """What the engine reports (``None``: unset)."""

    http_proxy: Optional[str]
    https_proxy: Optional[str]
    no_proxy: Optional[str]
    rootless: bool = False
    podman: bool = False

    def get(self, key: str) -> Optional[str]:
        return getattr(self, key)


def daemon_proxy(info: dict[str, Any], podman: bool = False) -> DaemonProxy:
    """From ``engine.api.info()`` (the Docker API's ``/info``: ``HttpProxy``, ``HttpsProxy``,
    ``NoProxy``; ``SecurityOptions`` says ``name=rootless`` for a rootless daemon)."""
    rootless = any("rootless" in str(o) for o in info.get("SecurityOptions") or ())
    return DaemonProxy(
        http_proxy=info.get("HttpProxy") or None,
        https_proxy=info.get("HttpsProxy") or None,
        no_proxy=info.get("NoProxy") or None,
        rootless=rootless,
        podman=podman,
    )


def _user_value(user: ProxySettings, key: str) -> Optional[str]:
    # ALL_PROXY stands in for an unset HTTP(S)_PROXY, as in ProxySettings.build_args.
    value = user.get(key)
    if not value and key in ("http_proxy", "https_proxy"):
        value = user.get("all_proxy")
    return value or None


def compare(daemon: DaemonProxy, user: ProxySettings) -> tuple[bool, str]:
    """``(same, description)``: the HTTP/HTTPS proxies of the engine and the user's, masked.

    Docker may report a password already masked (``xxxxx``), so only scheme, host and port are
    compared."""
    parts, same = [], True
    for key, name in _NAMES[:2]:
        mine, theirs = _user_value(user, key), daemon.get(key)
        if _endpoint(mine) != _endpoint(theirs):
            same = False
        parts.append(f"{name}: yours {_show(mine)}, the engine's {_show(theirs)}")
    return same, "; ".join(parts)


def _endpoint(url: Optional[str]) -> Optional[str]:
    if not url:
        return None
    rest = url.split("://", 1)[-1]
    return rest.rsplit("@", 1)[-1].rstrip("/").lower()


def _show(url: Optional[str]) -> str:
    return redact_url_credentials(url) if url else "none"


@dataclass(frozen=True)
class Diagnosis:
    """The engine's proxy against the user's: what ``doctor`` shows and a failed pull says."""

    same: bool
    described: str  # both sides, masked
    fix: str  # empty when they agree


def diagnose(info: dict[str, Any], user: ProxySettings, podman: bool = False) -> Diagnosis:
    """From the engine's ``/info``: do its proxies match *user*'s, and if not, the fix."""
    found = daemon_proxy(info, podman)
    same, described = compare(found, user)
    return Diagnosis(same, described, "" if same else fix_text(user, found))


def fix_text(user: ProxySettings, daemon: DaemonProxy) -> str:
    """The lines that give the engine the user's proxies (passwords masked: put yours where
    ``***`` stands)."""
    values = [
        (name, redact_url_credentials(v)) for key, name in _NAMES if (v := _user_value(user, key))
    ]
    if not values:
        return (
            "the engine has a proxy and this shell has none: if the engine needs it, "
            "export the same HTTP_PROXY/HTTPS_PROXY here (or --http-proxy/--https-proxy)"
        )
    if daemon.podman:
        env = ", ".join(f'"{n}={v}"' for n, v in values)
        return (
            f"Podman's service pulls with its own environment: add to {PODMAN_CONF} "
            "(rootless: ~/.config/containers/containers.conf)\n"
            f"  [engine]\n  env = [{env}]\n"
            "then restart the service (`podman system service`, or "
            "`systemctl restart podman.socket`)"
        )
    path, ctl = (
        (ROOTLESS_DROP_IN, "systemctl --user") if daemon.rootless else (DROP_IN, "sudo systemctl")
    )
    env_lines = "\n".join(f'  Environment="{n}={v}"' for n, v in values)
    return (
        f"the Docker daemon does not see this shell's proxy; give it the same in {path}:\n"
        f"  [Service]\n{env_lines}\n"
        f"then: {ctl} daemon-reload && {ctl} restart docker   (put your password where "
        "*** stands)"
    )
