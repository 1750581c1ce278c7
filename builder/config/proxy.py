"""Proxy settings: where they come from and how they reach a build.

Proxies reach ``docker build`` only as build arguments. ``HTTP_PROXY``, ``HTTPS_PROXY``,
``NO_PROXY``, ``ALL_PROXY`` (and lower-case forms) are Docker's *predefined* build
arguments: RUN steps see them, and Docker leaves them out of ``docker history`` -- but only
while the Dockerfile does **not** declare them with ``ARG`` (a declared ARG is recorded in
history) and never copies them into ``ENV``. The templates therefore never mention them.

Docker 20.10's classic builder does not predefine ``ALL_PROXY`` (seen here: "build-args
[ALL_PROXY all_proxy] were not consumed", and RUN steps do not see it), and declaring it
would record it in history. So ``all_proxy`` is also used as the value of ``HTTP_PROXY`` /
``HTTPS_PROXY`` when those are unset -- the fallback meaning curl and requests give it --
and is still passed under its own name for builders that predefine it (BuildKit).

Both spellings are passed, because tools disagree on which one they read (curl and apt
read lower-case ``http_proxy`` only; Go tools read upper-case). When the environment has
both spellings with different values, the lower-case one wins, as in Python's urllib.
Anything printed about proxies goes through ``redactor()``.

A proxy written without a scheme (``proxy.corp:3128``, ``user:pw@proxy.corp:3128``) is read
as ``http://`` -- what pip, curl and requests do with it -- and the loader says so once
(``ProxySettings.notes``); apt and Docker need the scheme, so the builder passes it on
with one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from builder.redact import Redactor

PROXY_KEYS = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")


@dataclass(frozen=True)
class ProxySettings:
    """Resolved proxy values (``None``: unset) and where each came from."""

    values: Mapping[str, str | None] = field(default_factory=dict, repr=False)
    origins: Mapping[str, str] = field(default_factory=dict)
    #: what the loader changed, said once (a scheme it added), passwords masked
    notes: tuple[str, ...] = ()

    def get(self, key: str) -> str | None:
        return self.values.get(key)

    def build_args(self) -> dict[str, str]:
        """Build arguments for the engine, both spellings, sorted for determinism."""
        args: dict[str, str] = {}
        fallback = self.values.get("all_proxy")
        for key in PROXY_KEYS:
            value = self.values.get(key)
            if not value and key in ("http_proxy", "https_proxy"):
                value = fallback
            if value:
                args[key.upper()] = value
                args[key] = value
        return dict(sorted(args.items()))

    def redactor(self, extra: Redactor | None = None) -> Redactor:
        """A Redactor that masks the passwords of these proxy URLs in any shape."""
        red = extra or Redactor()
        for key in PROXY_KEYS:
            value = self.values.get(key)
            if value:
                red.add_url(value)
        return red

    def describe(self) -> list[str]:
        """Human-readable, redacted lines: ``HTTPS_PROXY=http://u:***@h:3128 (environment)``."""
        red = self.redactor()
        lines = []
        for key in PROXY_KEYS:
            value = self.values.get(key)
            if value:
                lines.append(f"{key.upper()}={red(value)} ({self.origins.get(key, '?')})")
        return lines

    def __repr__(self) -> str:
        return f"ProxySettings({'; '.join(self.describe()) or 'none'})"


def with_scheme(value: str) -> tuple[str, bool]:
    """``(url, added)``: *value* with ``http://`` in front when it has no scheme."""
    if "://" in value:
        return value, False
    return f"http://{value}", True


def proxies_from_env(env: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """``{key: (value, variable name)}`` for each proxy set (non-empty) in *env*."""
    found: dict[str, tuple[str, str]] = {}
    for key in PROXY_KEYS:
        # Upper first, lower second: lower-case wins when both are set.
        for name in (key.upper(), key):
            value = env.get(name)
            if value:
                found[key] = (value, name)
    return found
