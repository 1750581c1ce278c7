"""PyPI trusted publishing from a CI job that is not GitHub's action: the OIDC exchange.

The CI gives the job an OIDC token (GitLab: ``id_tokens: PYPI_ID_TOKEN: aud: pypi``); PyPI
trades it, at ``/_/oidc/mint-token`` on its upload host, for an API token that lives 15
minutes and may upload only to the projects whose trusted publisher names this pipeline.
twine then uploads with it as ``__token__``. Nothing is stored in the CI's settings. The
exchange URL is derived from the upload URL, as pypa/gh-action-pypi-publish derives it, so no
registry host is written here.

Neither token is ever printed: the caller registers both with the output's redactor.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from urllib.parse import urlsplit, urlunsplit

from builder.errors import StepFailed

#: The variable the emitted GitLab job's ``id_tokens:`` fills (and ``publish
#: --trusted-publishing`` reads).
ID_TOKEN_ENV = "PYPI_ID_TOKEN"
#: The user name PyPI takes with an API token.
TOKEN_USER = "__token__"


def mint_url(upload_url: str) -> str:
    """``<scheme>://<upload host>/_/oidc/mint-token`` for *upload_url* (credentials dropped)."""
    parts = urlsplit(upload_url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, "/_/oidc/mint-token", "", ""))


def _reason(body: bytes) -> str:
    """PyPI's own words from an error answer: ``{"message", "errors": [{"code",
    "description"}]}``; the raw text (cut short) when it is not that."""
    try:
        doc = json.loads(body)
        errors = "; ".join(
            f"{e.get('code')}: {e.get('description')}"
            for e in doc.get("errors", [])
            if isinstance(e, dict)
        )
        return f"{doc.get('message', '')} {errors}".strip() or body[:300].decode(errors="replace")
    except (ValueError, AttributeError):
        return body[:300].decode(errors="replace")


def mint_token(upload_url: str, id_token: str, *, timeout: float = 30.0) -> str:
    """The API token PyPI mints for *id_token*; StepFailed (exit 1) with PyPI's reason."""
    url = mint_url(upload_url)
    request = urllib.request.Request(
        url,
        data=json.dumps({"token": id_token}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        raise StepFailed(
            f"trusted publishing: {url} refused the CI's OIDC token (HTTP "
            f"{exc.code}): {_reason(exc.read())}; check the trusted publisher "
            "configured on the index (namespace, project, pipeline file, "
            "environment) against this job"
        ) from exc
    except (urllib.error.URLError, OSError) as exc:
        raise StepFailed(f"trusted publishing: cannot reach {url}: {exc}") from exc
    try:
        token = json.loads(body)["token"]
    except (ValueError, KeyError, TypeError):
        token = None
    if not isinstance(token, str) or not token:
        raise StepFailed(f"trusted publishing: {url} answered without a token ({_reason(body)})")
    return token
