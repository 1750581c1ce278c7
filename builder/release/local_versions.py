"""Which repositories take a wheel whose version has a local label (``1.0+torch2.13``).

PEP 440 keeps local versions for private indexes, and PyPI and TestPyPI refuse every upload
that carries one (HTTP 400). Almost every wheel the builder makes is labelled (``+torch2.13``,
``+torch2.14.cu130``); only the stable-ABI wheel is not (docs/stable-wheels.md). So ``publish``
asks here, once, before anything goes up: a release must not be half on PyPI because its
fifth wheel was refused.

This module is the one place that knows which repositories refuse them. PyPI's own upload URLs
are not written here: they are twine's (``twine.utils.DEFAULT_REPOSITORY`` is the URL
``twine upload`` uses when it is given none, ``TEST_REPOSITORY`` TestPyPI's), so they change
when twine's do. Any other repository is taken to accept local versions (pypiserver, devpi,
Artifactory and Nexus do) unless the caller says otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from builder.errors import ConfigError, StepFailed

#: The ``--repository`` names ``publish`` knows, as twine names them.
REPOSITORY_NAMES = ("pypi", "testpypi")


def known_repositories() -> Mapping[str, str]:
    """``pypi`` and ``testpypi`` -> their upload URL, as twine defines them."""
    try:
        # Imported here: twine (and requests under it) is for publish alone, and every other
        # command must start without it.
        from twine.utils import DEFAULT_REPOSITORY, TEST_REPOSITORY  # noqa: PLC0415
    except ImportError as exc:
        raise StepFailed(
            f"cannot import twine ({exc}); install the builder extra: pip install -e '.[builder]'"
        ) from exc
    return {"pypi": DEFAULT_REPOSITORY, "testpypi": TEST_REPOSITORY}


def pypi_name(url: str) -> str | None:
    """``pypi`` / ``testpypi`` when *url* is on that index's upload host, else None.

    By host (and port), not the exact URL: ``.../legacy`` without its slash, a
    ``user:token@`` in front or another path are still PyPI's, and PyPI still refuses the
    local version."""

    def where(u: str) -> tuple[str, int | None]:
        parts = urlsplit(u)
        return (parts.hostname or "").lower(), parts.port

    here = where(url)
    for name, upload in known_repositories().items():
        if here[0] and here == where(upload):
            return name
    return None


@dataclass(frozen=True)
class Policy:
    """Whether the repository takes local versions, and why the builder thinks so."""

    accepts: bool
    why: str


def policy(url: str, declared: bool | None) -> Policy:
    """What the repository at *url* does with a local version. *declared*: the user's
    ``--accepts-local-versions`` / ``--no-accepts-local-versions``, None when not given."""
    name = pypi_name(url)
    if name is not None:
        if declared:
            # PyPI refuses them whatever the command line says: uploading would fail at the
            # first labelled wheel, after the ones before it were published.
            raise ConfigError(
                f"{url} is {name}'s upload URL, which refuses every local "
                "version (PEP 440); drop the option",
                key="--accepts-local-versions",
            )
        return Policy(False, f"{name} refuses local versions (PEP 440)")
    if declared is False:
        return Policy(False, "--no-accepts-local-versions")
    return Policy(
        True, "a repository other than PyPI (--no-accepts-local-versions if it refuses them)"
    )


def local_version(wheel: Path) -> str | None:
    """The local label of *wheel*'s version (``torch2.13``), or None."""
    try:
        version = parse_wheel_filename(wheel.name)[1]
    except InvalidWheelFilename:
        return None  # dist_wheels has refused such a name already; nothing to add here
    return version.local


def labelled(wheels: Iterable[Path]) -> list[Path]:
    """The wheels of *wheels* whose version has a local label, in the order given."""
    return [w for w in wheels if local_version(w) is not None]


def refusal(refused: Iterable[Path], url: str, why: str) -> str:
    """The message for wheels a repository would refuse: each one, and where to take them."""
    names = "\n  ".join(f"{w.name} (local version +{local_version(w)})" for w in refused)
    return (
        f"{url} takes no local versions: {why}; nothing was uploaded. Refused:\n  {names}\n"
        "For PyPI publish the stable-ABI wheels (no +torch label; docs/stable-wheels.md), "
        "e.g. with --skip-local-versions to leave the labelled ones out. The labelled wheels "
        "go to a per-torch index (`python -m builder index DIST --per-torch`, "
        "docs/publishing.md) or a private repository that accepts local versions "
        "(pypiserver, devpi, Artifactory, Nexus)."
    )
