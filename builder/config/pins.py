"""Base images pinned by tag and digest: what a pin is, and rewriting one in a config file.

A pin is one image reference with both parts, ``quay.io/pypa/manylinux_2_28_x86_64:2025.08.15-1@
sha256:6f42...``, the spelling Docker, hadolint (DL3006) and cibuildwheel use. The two parts do
different jobs: the **digest** decides which image is used (Docker ignores the tag of a reference
that has both, and an image already in the engine under that digest needs no network), the
**tag** is what ``python -m builder update-images`` follows to find a newer digest. A reference
without a digest is unpinned: the same config builds on another image once the tag moves.

:func:`rewrite_scalar` changes one value in a YAML file line by line, so comments, quoting and
every other byte stay as they were (a YAML round trip through a parser would drop comments).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Optional

DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class ImageRef:
    """``repository[:tag][@digest]`` taken apart; :meth:`__str__` puts it back together."""

    repository: str  # [registry[:port]/]path
    tag: Optional[str] = None
    digest: Optional[str] = None  # "sha256:<64 hex>"

    @property
    def pinned(self) -> bool:
        """Tag and digest both named: the image is fixed and update-images can follow it."""
        return self.tag is not None and self.digest is not None

    @property
    def tagged(self) -> str:
        """``repository:tag`` (``latest`` when no tag is named, as Docker reads it)."""
        return f"{self.repository}:{self.tag or 'latest'}"

    def with_digest(self, digest: str) -> ImageRef:
        return replace(self, digest=digest)

    def __str__(self) -> str:
        return (
            self.repository
            + (f":{self.tag}" if self.tag else "")
            + (f"@{self.digest}" if self.digest else "")
        )


def parse_ref(text: str) -> ImageRef:
    """*text* taken apart; ValueError for a digest that is not ``sha256:`` + 64 hex digits
    (the rest of the grammar is :func:`builder.config.values.image_ref`'s)."""
    name, at, digest = text.partition("@")
    if at and not DIGEST.fullmatch(digest):
        raise ValueError(
            f"{text!r}: the digest {digest!r} is not sha256: followed by 64 "
            "lower-case hex digits; expected e.g. "
            f"{name}@sha256:{'0' * 12}... as `docker images --digests` shows it"
        )
    head, colon, tag = name.rpartition(":")
    if colon and "/" not in tag:
        return ImageRef(head, tag, digest or None)
    return ImageRef(name, None, digest or None)


def config_pin(text: str) -> str:
    """A config file's ``images.<ARCH>.base``: a digest comes with its tag (update-images
    follows the tag; a bare digest cannot be updated, and says nothing to a reader)."""
    ref = parse_ref(text)
    if ref.digest is not None and ref.tag is None:
        raise ValueError(
            f"{text!r} names a digest but no tag; expected "
            f"{ref.repository}:TAG@{ref.digest} (the tag is what "
            "`python -m builder update-images` follows)"
        )
    return text


def unpinned_reason(text: str) -> Optional[str]:
    """Why *text* is not pinned (None when it is): said by doctor and plan."""
    ref = parse_ref(text)
    if ref.digest is not None:
        return None
    what = f"tag {ref.tag}" if ref.tag else "no tag (Docker reads it as latest)"
    return (
        f"{text} is not pinned by digest ({what}): it builds on whatever the tag names on "
        "the day; `python -m builder update-images` pins it"
    )


def repo_digest(repository: str, repo_digests: list[str]) -> Optional[str]:
    """The digest *repository* has in an image's ``RepoDigests`` (``name@sha256:...``).
    Docker writes Docker Hub names short (``debian``, not ``docker.io/library/debian``)."""

    def short(name: str) -> str:
        for prefix in ("docker.io/library/", "docker.io/", "library/"):
            if name.startswith(prefix):
                return name[len(prefix) :]
        return name

    for entry in repo_digests:
        name, _, digest = entry.partition("@")
        if short(name) == short(repository) and DIGEST.fullmatch(digest):
            return digest
    return None


# ------------------------------------------------------------------ rewriting the file

_SCALAR = re.compile(
    r"""(?P<head>\s*(?:-\s+)?["']?[A-Za-z0-9_.-]+["']?\s*:\s*)"""
    r"""(?P<quote>["']?)(?P<value>[^"'#\s]+)(?P=quote)(?P<tail>\s*(?:#.*)?)"""
)


def rewrite_scalar(text: str, line: int, old: str, new: str) -> str:
    """*text* with the value *old* on (1-based) *line* replaced by *new*: key, quotes,
    indentation and a trailing comment kept, every other line untouched. ValueError when the
    line does not hold ``key: old`` (a value spread over lines, an anchor): rewrite it by
    hand then."""
    lines = text.splitlines(keepends=True)
    body = lines[line - 1]
    ending = body[len(body.rstrip("\r\n")) :]
    found = _SCALAR.fullmatch(body.rstrip("\r\n"))
    if found is None or found.group("value") != old:
        raise ValueError(f"line {line} does not read `key: {old}`")
    q = found.group("quote")
    lines[line - 1] = f"{found.group('head')}{q}{new}{q}{found.group('tail')}{ending}"
    return "".join(lines)
