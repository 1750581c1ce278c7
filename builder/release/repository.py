"""What a package repository already holds, read from its PEP 503 simple index.

``publish --skip-existing`` needs this: twine >= 6 accepts ``--skip-existing`` only for PyPI
and TestPyPI and refuses it up front for any other repository (``UnsupportedConfiguration``),
which is exactly where release engineers publish (pypiserver, devpi, Nexus, Artifactory).
So the builder looks first: a file the repository already lists with the *same* sha256 is
skipped; one it lists with a *different* sha256 is an error (a release must not silently
differ from what users already download under that name).
"""

from __future__ import annotations

import base64
import html.parser
import urllib.error
import urllib.request
from collections.abc import Iterable
from pathlib import PurePosixPath
from urllib.parse import unquote, urljoin, urlsplit

from builder.errors import StepFailed
from builder.release.simple_index import normalize_project


class _Anchors(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.hrefs.append(href)


def _get(url: str, auth: tuple[str, str] | None, timeout: float) -> str | None:
    """The page at *url*, or None when the repository answers 404 (project unknown)."""
    request = urllib.request.Request(url, headers={"Accept": "text/html"})
    if auth is not None:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise StepFailed(
            f"cannot read {url} to see what the repository already has: HTTP "
            f"{exc.code} {exc.reason}"
        ) from exc
    except (urllib.error.URLError, OSError) as exc:
        raise StepFailed(
            f"cannot read {url} to see what the repository already has: {exc}"
        ) from exc


def existing_files(
    index_url: str,
    projects: Iterable[str],
    *,
    auth: tuple[str, str] | None = None,
    timeout: float = 30.0,
) -> dict[str, str | None]:
    """File name -> sha256 (None when the page gives no hash) of every file the index at
    *index_url* (``.../simple/``) lists for *projects*."""
    base = index_url if index_url.endswith("/") else index_url + "/"
    found: dict[str, str | None] = {}
    for project in sorted({normalize_project(p) for p in projects}):
        page_url = urljoin(base, f"{project}/")
        page = _get(page_url, auth, timeout)
        if page is None:
            continue
        parser = _Anchors()
        parser.feed(page)
        for href in parser.hrefs:
            parts = urlsplit(urljoin(page_url, href))
            name = unquote(PurePosixPath(parts.path).name)
            digest = None
            if parts.fragment.startswith("sha256="):
                digest = parts.fragment[len("sha256=") :].lower()
            found[name] = digest
    return found
