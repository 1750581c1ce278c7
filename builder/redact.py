"""Redaction of credentials in anything the builder prints, logs or records.

Proxy URLs such as ``http://user:pass@host:3128`` become ``http://user:***@host:3128``.
``Redactor`` also replaces known secret values verbatim (e.g. a password taken from the
environment), so a secret that reaches a log line in another shape is still hidden.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import quote, unquote

MASK = "***"

# scheme://user:password@  -- the password is whatever sits between the user's ':' and the
# last '@' of the same word: a password typed without percent-encoding may hold ':', '/' and
# '@' itself (pip and curl take the last '@' as the end of the credentials too), so masking
# stops only at whitespace; a URL with an '@' in its path is masked too far, never too short.
# The user name ends at its first ':' and may hold a raw '@' (``me@corp:pw@proxy``: urllib,
# pip and curl read user ``me@corp``, password ``pw``).
_URL_CREDENTIALS = re.compile(
    r"(?P<prefix>[A-Za-z][A-Za-z0-9+.\-]*://[^:/\s]*:)(?P<pw>\S+)@(?=[^@\s]*(?:\s|$))"
)


def redact_url_credentials(text: str) -> str:
    """Mask the password part of every ``scheme://user:password@`` in *text*."""
    return _URL_CREDENTIALS.sub(lambda m: f"{m.group('prefix')}{MASK}@", text)


class Redactor:
    """Masks URL credentials and a set of known secret strings."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: set[str] = set()
        for s in secrets:
            self.add_secret(s)

    def add_secret(self, secret: str) -> None:
        # Very short values would mask innocent text everywhere; they are still caught
        # by the URL rule when they appear as a URL password.
        if secret and len(secret) >= 4:
            self._secrets.add(secret)

    def add_url(self, url: str) -> None:
        """Remember the password inside a proxy URL, so it is masked in any form."""
        # A proxy without a scheme (user:pw@proxy.corp:3128) is read as http:// by the
        # builder, pip and curl: its password is a secret all the same.
        m = _URL_CREDENTIALS.search(url if "://" in url else f"http://{url}")
        if m:
            password = m.group("pw")
            # As typed, and as tools print it: percent-decoded (pip's messages) or encoded.
            for form in {password, unquote(password), quote(unquote(password), safe="")}:
                self.add_secret(form)

    def __call__(self, text: str) -> str:
        # Known secrets first, longest first (a secret containing another is masked whole):
        # the URL rule could otherwise mask part of one that looks like a URL (a token
        # holding "://" and "@") and leave the rest, which no longer matches, in the clear.
        for s in sorted(self._secrets, key=len, reverse=True):
            text = text.replace(s, MASK)
        return redact_url_credentials(text)
