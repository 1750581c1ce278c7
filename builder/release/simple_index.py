"""A PEP 503 "simple" package index, written as static files from a set of wheels.

Layout under *out*::

    out/simple/index.html                      one anchor per project (PEP 503 normalized name)
    out/simple/<project>/index.html            one anchor per file of that project
    out/simple/<project>/<file>.whl            the wheel itself, next to its page
    out/simple/<project>/<file>.whl.metadata   only with metadata=True (``--metadata``): its
                                               METADATA (PEP 658), so pip can resolve without
                                               downloading every wheel

Every file anchor carries ``#sha256=<hex>`` (pip checks it after downloading and refuses a
file that does not match), ``data-requires-python`` (HTML-escaped, from the wheel's
``Requires-Python``) and, with metadata=True, ``data-dist-info-metadata`` /
``data-core-metadata`` with the hash of the ``.metadata`` file. That is off by default: pip 23.0
(the ensurepip of Python 3.11 images, i.e. the build containers') rejects PEP 658 metadata whose
``Name`` is spelled unnormalised ("inconsistent Name: expected 'typing-extensions', but
metadata has 'typing_extensions'"), so an index made for builds must not offer it.
Pages declare ``pypi:repository-version`` 1.0 (PEP 629), which is the
HTML serialisation PEP 691 keeps. Hrefs are relative, so the same folder works as
``file://.../simple`` and behind any static web server.

The whole ``simple/`` folder is rebuilt in a temporary sibling folder and swapped in with
two renames, so a reader sees the old index or the new one, never a page whose file is
missing. Output is a pure function of the input wheels (sorted, no timestamps):
indexing the same wheels twice gives byte-identical pages.

Errors: a path that does not exist or holds no wheels is a usage error (``ConfigError``, exit 2);
a file that is not a readable wheel, or two different files with the same name, is a failed
step naming the file (``StepFailed``, exit 1).
"""

from __future__ import annotations

import contextlib
import email.parser
import hashlib
import html
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from builder.errors import ConfigError, StepFailed
from builder.release.manifest import sha256_file
from builder.wheel.wheelmeta import read_metadata

SIMPLE_DIR = "simple"
_REPOSITORY_VERSION = "1.0"  # PEP 629


def normalize_project(name: str) -> str:
    """PEP 503 normalization: runs of ``-``, ``_``, ``.`` become one ``-``, lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class WheelInfo:
    """What the index needs to know about one wheel, read from the wheel itself."""

    path: Path
    filename: str
    project: str  # PEP 503 normalized
    version: str
    requires_python: str | None
    metadata: bytes  # the .dist-info/METADATA file, served as <file>.metadata
    sha256: str


def read_wheel(path: Path) -> WheelInfo:
    """Open *path* as a wheel and read its name, version and ``Requires-Python``.

    The METADATA must agree with the file name (name and version), otherwise pip would
    install something other than what the index page promises.
    """
    name = path.name
    try:
        dist, version, _build, _tags = parse_wheel_filename(name)
    except InvalidWheelFilename as exc:
        raise StepFailed(
            f"{path}: not a wheel file name ({exc}); expected "
            "<name>-<version>-<python>-<abi>-<platform>.whl"
        ) from exc
    metadata = read_metadata(path, error=StepFailed)
    msg = email.parser.BytesParser().parsebytes(metadata, headersonly=True)
    meta_name, meta_version = msg.get("Name"), msg.get("Version")
    if not meta_name or not meta_version:
        raise StepFailed(f"{path}: METADATA lacks Name or Version")
    try:
        same_version = Version(meta_version) == version  # the file name's is normalized
    except InvalidVersion:
        same_version = False
    if canonicalize_name(meta_name) != dist or not same_version:
        raise StepFailed(
            f"{path}: file name says {dist} {version} but METADATA says {meta_name} {meta_version}"
        )
    requires_python = msg.get("Requires-Python")
    return WheelInfo(
        path=path,
        filename=name,
        project=normalize_project(meta_name),
        version=meta_version.strip(),
        requires_python=requires_python.strip() if requires_python else None,
        metadata=metadata,
        sha256=sha256_file(path),
    )


def collect_wheels(source: Iterable[Path] | Path) -> list[Path]:
    """The wheels to index: every ``*.whl`` directly in a folder, or the paths given."""
    if isinstance(source, (str, Path)):
        folder = Path(source)
        if not folder.is_dir():
            raise ConfigError(
                f"{folder}: no such directory; expected a folder of wheels (such as dist/)"
            )
        paths = sorted(
            p
            for p in folder.iterdir()
            if p.suffix == ".whl" and p.is_file() and not p.name.startswith(".")
        )  # hidden: dist/'s in-flight temp files
        if not paths:
            raise ConfigError(f"{folder}: no *.whl files in it; nothing to index")
        return paths
    paths = [Path(p) for p in source]
    for p in paths:
        if not p.is_file():
            raise ConfigError(f"{p}: no such file; expected a wheel (*.whl)")
    if not paths:
        raise ConfigError("no wheels given; nothing to index")
    return paths


@dataclass(frozen=True)
class IndexResult:
    """The written index: its root folder and what each project page lists."""

    out: Path
    projects: Mapping[str, tuple[WheelInfo, ...]]  # normalized name -> files, sorted

    @property
    def simple(self) -> Path:
        return self.out / SIMPLE_DIR

    @property
    def url(self) -> str:
        """The ``--index-url`` for pip (a ``file://`` URL ending in ``/simple/``)."""
        return self.simple.resolve().as_uri() + "/"

    @property
    def files(self) -> tuple[WheelInfo, ...]:
        return tuple(w for ws in self.projects.values() for w in ws)


def _page(title: str, anchors: Iterable[str]) -> bytes:
    lines = [
        "<!DOCTYPE html>",
        "<html>",
        "  <head>",
        f'    <meta name="pypi:repository-version" content="{_REPOSITORY_VERSION}">',
        f"    <title>{html.escape(title)}</title>",
        "  </head>",
        "  <body>",
        *(f"    {a}<br>" for a in anchors),
        "  </body>",
        "</html>",
        "",
    ]
    return "\n".join(lines).encode("utf-8")


def _file_anchor(w: WheelInfo, metadata: bool) -> str:
    href = f"{quote(w.filename)}#sha256={w.sha256}"
    attrs = [f'href="{html.escape(href, quote=True)}"']
    if w.requires_python:
        attrs.append(f'data-requires-python="{html.escape(w.requires_python, quote=True)}"')
    if metadata:
        meta_hash = f"sha256={_sha256(w.metadata)}"
        # PEP 714 renamed the attribute; pip reads either, older tools only the first.
        attrs.append(f'data-dist-info-metadata="{meta_hash}"')
        attrs.append(f'data-core-metadata="{meta_hash}"')
    return f"<a {' '.join(attrs)}>{html.escape(w.filename)}</a>"


def _place(src: Path, dst: Path, link: bool) -> None:
    if link:
        try:
            os.link(src, dst)
            return
        except OSError:  # another file system, or links not allowed: copy instead
            pass
    shutil.copyfile(src, dst)


def _group(wheels: Iterable[WheelInfo]) -> dict[str, tuple[WheelInfo, ...]]:
    by_name: dict[str, WheelInfo] = {}
    for w in wheels:
        seen = by_name.get(w.filename)
        if seen is not None and seen.sha256 != w.sha256:
            raise StepFailed(
                f"two different files are named {w.filename}: {seen.path} and "
                f"{w.path}; an index can hold only one"
            )
        by_name[w.filename] = w
    projects: dict[str, list[WheelInfo]] = {}
    for w in by_name.values():
        projects.setdefault(w.project, []).append(w)
    return {p: tuple(sorted(ws, key=lambda w: w.filename)) for p, ws in sorted(projects.items())}


def _swap_in(tmp: Path, final: Path) -> None:
    """Replace the folder *final* by *tmp*: rename the old one aside, the new one in."""
    old = None
    if final.exists() or final.is_symlink():
        old = Path(tempfile.mkdtemp(prefix=f".{final.name}.old-", dir=final.parent))
        os.rename(final, old / final.name)
    os.rename(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_simple_index(
    wheels: Iterable[Path] | Path,
    out: Path,
    *,
    link: bool = False,
    metadata: bool = False,
) -> IndexResult:
    """Write a PEP 503 index of *wheels* (a folder of ``*.whl`` or a list of paths) to
    ``out/simple/``, replacing any index there; return what was written.

    ``link=True`` hard-links the wheels into the index instead of copying them (falling back
    to a copy across file systems); the index then shares the files with the source folder.
    ``metadata=True`` also serves each wheel's METADATA (PEP 658; see the module docstring).
    """
    infos = [read_wheel(p) for p in collect_wheels(wheels)]
    projects = _group(infos)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{SIMPLE_DIR}.tmp-", dir=out))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700; a web server must read the index
        (tmp / "index.html").write_bytes(
            _page(
                "Simple index",
                (f'<a href="{p}/">{html.escape(p)}</a>' for p in projects),
            )
        )
        for project, files in projects.items():
            folder = tmp / project
            folder.mkdir()
            for w in files:
                _place(w.path, folder / w.filename, link)
                if metadata:
                    (folder / f"{w.filename}.metadata").write_bytes(w.metadata)
            (folder / "index.html").write_bytes(
                _page(f"Links for {project}", (_file_anchor(w, metadata) for w in files))
            )
        _swap_in(tmp, out / SIMPLE_DIR)
    except BaseException:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
        raise
    return IndexResult(out=out, projects=projects)
