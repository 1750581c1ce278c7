"""The pinned uv of the ``build[uv]`` and ``uv`` frontends: ``configs/uv.txt``, its one place.

The file is a pip requirements file of one requirement (``uv==X``) with a ``--hash`` per
machine's wheel, so that pip installs it with ``--require-hashes`` and ``fetch`` downloads the
same bytes; the in-cell step gets the requirement and the hashes as arguments and writes them
back into a requirements file inside the build environment (which cannot read this one: it
may be a container).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from builder.config.roots import REPO_ROOT
from builder.errors import ConfigError

_REQ = re.compile(r"^uv==([0-9][0-9A-Za-z.+-]*)$")
_HASH = re.compile(r"^--hash=(sha256:[0-9a-f]{64})$")


@dataclass(frozen=True)
class UvPin:
    version: str
    hashes: tuple[str, ...]  # "sha256:<hex>", one per machine's wheel

    @property
    def requirement(self) -> str:
        return f"uv=={self.version}"

    def requirements_line(self) -> str:
        """The line pip's ``--require-hashes`` takes: ``uv==X --hash=sha256:... ...``."""
        return " ".join([self.requirement, *(f"--hash={h}" for h in self.hashes)])


def pin_file() -> Path:
    return REPO_ROOT / "configs" / "uv.txt"


def parse_pin(text: str, shown: str) -> UvPin:
    """The pin in *text* (a requirements file's content); ConfigError naming *shown*."""
    logical = re.sub(r"\\\n", " ", text)
    lines = [line.split("#", 1)[0].strip() for line in logical.splitlines()]
    lines = [line for line in lines if line]
    if len(lines) != 1:
        raise ConfigError(
            f"expected exactly one requirement line, found {len(lines)}; "
            "expected 'uv==X --hash=sha256:...'",
            file=shown,
        )
    words = lines[0].split()
    found = _REQ.match(words[0])
    hashes = [_HASH.match(w) for w in words[1:]]
    if found is None or not hashes or not all(hashes):
        raise ConfigError(
            f"{lines[0][:80]!r} is not a pin; expected 'uv==X' followed by "
            "one --hash=sha256:<64 hex> per machine's wheel",
            file=shown,
        )
    return UvPin(found.group(1), tuple(h.group(1) for h in hashes if h))


@functools.lru_cache(maxsize=None)
def _load(path: Path) -> UvPin:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(
            f"cannot read the uv pin: {exc.strerror or exc}; expected the "
            "repository's configs/uv.txt",
            file=str(path),
        ) from None
    return parse_pin(text, str(path))


def uv_pin(path: Optional[Path] = None) -> UvPin:
    """The pin (read once per file)."""
    return _load(path or pin_file())
