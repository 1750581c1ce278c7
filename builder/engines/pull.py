"""Pulling a base image through the engine: the policy, the progress, and what a failure means.

``--pull missing`` (the default) pulls a cell's base image when the engine lacks it, ``always``
pulls it at every build (a moving tag such as ``manylinux_2_28_x86_64:latest`` gets its newest
build), ``never`` pulls nothing (offline builds, air-gapped hosts). The engine's daemon makes the
pull, with *its* environment: a pull that fails on the network is explained by comparing the
daemon's proxy with the user's (:func:`builder.engines.daemon_proxy.diagnose`, the same words
``doctor`` uses) and says the exact fix. A name or tag the registry does not have is said as
such: no proxy change would help there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from builder.config.pins import parse_ref
from builder.config.proxy import ProxySettings
from builder.engines.daemon_proxy import diagnose
from builder.engines.docker import PullError
from builder.errors import StepFailed

if TYPE_CHECKING:
    from builder.engines.docker import DockerEngine

#: Words of the engine's messages (Docker, Podman) when the registry cannot be reached at all.
_NETWORK = (
    "dial tcp",
    "connection refused",
    "i/o timeout",
    "no such host",
    "timeout",
    "tls handshake",
    "proxyconnect",
    "network is unreachable",
    "connection reset",
    "context deadline exceeded",
    "no route to host",
    "server misbehaving",
    "eof",
)
#: ... and when it answered that the repository or tag does not exist (or is not visible).
_NOT_FOUND = (
    "manifest unknown",
    "not found",
    "repository does not exist",
    "name unknown",
    "pull access denied",
    "unauthorized",
)


class PullFailed(StepFailed):
    """A base image could not be pulled (exit 1); the message says why and what to do."""


def needs_pull(policy: str, present: bool) -> bool:
    """Whether the engine pulls an image under *policy* (one of
    :data:`builder.config.load.PULL_POLICIES`), given whether it has it already."""
    return policy == "always" or (policy == "missing" and not present)


def failure_kind(message: str) -> str:
    """``not found`` | ``network`` | ``other``: what the engine's message says went wrong.
    Not-found comes first: "manifest unknown" mentions no network, but some engines wrap a
    404 in text that does ("... GET https://...: not found")."""
    low = message.lower()
    if any(word in low for word in _NOT_FOUND):
        return "not found"
    if any(word in low for word in _NETWORK):
        return "network"
    return "other"


@dataclass
class PullProgress:
    """Turns the engine's events into a few lines: each layer's stages once, and its download
    at every quarter (a pull over a slow link shows it is moving, without a line per chunk)."""

    ref: str
    _seen: set[tuple[str, str]] = field(default_factory=set)
    _quarter: dict[str, int] = field(default_factory=dict)
    layers: set[str] = field(default_factory=set)
    reused: set[str] = field(default_factory=set)
    downloaded: dict[str, int] = field(default_factory=dict)

    def line(self, event: dict[str, Any]) -> str | None:
        status = str(event.get("status") or "").strip()
        layer = str(event.get("id") or "")
        if not status:
            return None
        if not layer or status.startswith(("Pulling from", "Digest:", "Status:")):
            return f"pull {self.ref}: {status}"
        self.layers.add(layer)
        if status == "Already exists":
            self.reused.add(layer)
        if status == "Downloading":
            detail = event.get("progressDetail") or {}
            current, total = int(detail.get("current") or 0), int(detail.get("total") or 0)
            if total <= 0:
                return None
            self.downloaded[layer] = current
            quarter = min(4, current * 4 // total)
            if quarter <= self._quarter.get(layer, 0):
                return None
            self._quarter[layer] = quarter
            return f"pull {self.ref}: layer {layer}: downloading {_mb(current)} of {_mb(total)}"
        if (layer, status) in self._seen or status in (
            "Waiting",
            "Verifying Checksum",
            "Extracting",
        ):
            return None
        self._seen.add((layer, status))
        return f"pull {self.ref}: layer {layer}: {status.lower()}"

    def summary(self) -> str:
        fetched = len(self.layers - self.reused)
        return (
            f"pull {self.ref}: done ({len(self.layers)} layers, {fetched} fetched, "
            f"{len(self.reused)} already here, {_mb(sum(self.downloaded.values()))} "
            "downloaded)"
        )


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def pull_image(
    engine: DockerEngine, ref: str, proxy: ProxySettings, say: Callable[[str], None]
) -> str:
    """Pull *ref*, saying its progress; return its image id. :class:`PullFailed` says why not:
    for a network failure, the engine's proxy against *proxy* and the fix."""
    progress = PullProgress(ref)
    try:
        for event in engine.pull(ref):
            line = progress.line(event)
            if line is not None:
                say(line)
    except PullError as exc:
        raise PullFailed(explain(engine, ref, exc.message, proxy)) from exc
    image = engine.image_id(ref)
    if image is None:
        raise PullFailed(
            f"pull {ref}: the engine reported no error, but has no such image afterwards"
        )
    say(progress.summary())
    return image


def explain(engine: DockerEngine, ref: str, message: str, proxy: ProxySettings) -> str:
    """What a failed pull means, and what to do about it."""
    kind = failure_kind(message)
    head = f"could not pull base image {ref}: {message}"
    local = (
        "or build a base image here instead: python -m builder base-image, then "
        "--base-image local (make wheel BASE_IMAGE=local); or build without a container "
        "on this machine: --backend host (make wheel BACKEND=host)"
    )
    pin = parse_ref(ref)
    if kind == "not found" and pin.digest is not None:
        return (
            f"{head}\n  the registry has no image with digest {pin.digest} in "
            f"{pin.repository}: the pin is wrong (a typo, or copied from another "
            "repository) or that image was deleted. Docker pulls a pinned image by its "
            f"digest alone; `python -m builder update-images` pins what {pin.tagged} "
            "names now and rewrites images.<ARCH>.base in the config "
            f"(`docker images --digests {pin.repository}` shows what the engine has); "
            f"{local}"
        )
    if kind == "not found":
        return (
            f"{head}\n  the registry answered: it has no such image or tag (or does not "
            "show it to you). Expected an image:tag the registry lists -- check the "
            f"spelling (images.<ARCH>.base in the config, or --base-image), `docker login` "
            f"for a private one, {local}"
        )
    if kind == "other":
        return f"{head}\n  {local}"
    try:
        found = diagnose(engine.info(), proxy, engine.is_podman)
    except Exception as exc:  # noqa: BLE001 - the engine answered the pull; be told why not
        return (
            f"{head}\n  the registry did not answer the engine; its proxy could not be "
            f"read to compare with yours ({type(exc).__name__}). {local}"
        )
    if found.same:
        return (
            f"{head}\n  the registry did not answer the engine. The engine's proxy agrees "
            f"with yours ({found.described}), so the proxy settings are not the cause: check "
            "the registry's address and port, that the proxy lets it through (an internal "
            f"registry belongs in NO_PROXY of both), or pull later; {local}"
        )
    return (
        f"{head}\n  the registry did not answer the engine: the pull is made by the "
        "engine's daemon, which does not see this shell's proxy "
        f"({found.described}).\n  fix: {found.fix}\n  `python -m builder doctor` "
        "checks this (engine proxy)."
    )
