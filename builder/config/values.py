"""Strict parsers for every configuration value that can reach a Dockerfile or a shell.

Rendering quotes what it writes, but the first defence is here: versions, image
references, platform tags, paths and URLs must match a narrow grammar, so a value with a
newline, a quote, ``$(...)`` or a backtick is refused with a message saying what was
expected. Each parser raises ``ValueError`` with that message; the config layer adds the
file, line and key.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from packaging.version import InvalidVersion, Version

from builder.config.pins import config_pin, parse_ref
from builder.config.proxy import with_scheme
from builder.config.yamlfile import brief

PYTHON_VERSION = re.compile(r"3\.(?:[0-9]|[1-9][0-9])")
# Up to six digits a part: a version is compared as numbers, and Python reads no more than
# 4300 digits as one.
_PART = r"(?:0|[1-9][0-9]{0,5})"
TORCH_VERSION = re.compile(rf"{_PART}\.{_PART}\.{_PART}")
CUDA_VERSION = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}")
# Docker image reference: [registry[:port]/]path[:tag][@sha256:digest]
_IMAGE_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
IMAGE_REF = re.compile(
    rf"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[0-9]+)?/)?"
    rf"{_IMAGE_COMPONENT}(?:/{_IMAGE_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)
PLAT = re.compile(r"(?:manylinux_[0-9]+_[0-9]+|manylinux2014|linux)_(?:x86_64|aarch64)")
CONTAINER_PATH = re.compile(r"/[A-Za-z0-9._+/{}-]*")
LIB_PATTERN = re.compile(r"[A-Za-z0-9._+*?\[\]-]+")
CFLAG = re.compile(r"-[A-Za-z0-9_=.,+:/-]+")
# Characters allowed in a URL that is written into a recipe: no quotes, backslash,
# whitespace, '$', '`' or control characters.
_URL_SAFE = re.compile(r"[A-Za-z0-9._~:/?#\[\]@!%&()*+,;=-]+")
NO_PROXY = re.compile(r"[A-Za-z0-9.*,:/_\[\] -]*")


def python_version(value: str) -> str:
    """``"3.11"``; rejects ``"3.9.x"``, ``"3.11.4"``, ``"cp311"``."""
    if not PYTHON_VERSION.fullmatch(value):
        raise ValueError(
            f'{brief(value)} is not a Python version; expected major.minor like "3.11"'
        )
    return value


def python_key(value: str) -> tuple[int, int]:
    major, minor = value.split(".")
    return int(major), int(minor)


def cp_tag(value: str) -> str:
    """``"3.11"`` -> ``"cp311"``."""
    major, minor = python_key(value)
    return f"cp{major}{minor}"


def torch_version(value: str) -> str:
    """A full torch release ``"2.13.0"``; rejects ``"2.13"``, ``"2.13.0+cpu"``, ``"2.x"``."""
    if not TORCH_VERSION.fullmatch(value):
        hint = ""
        if re.fullmatch(r"[0-9]{1,6}\.[0-9]{1,6}", value):
            hint = f' (write "{value}.0")'
        raise ValueError(
            f'{brief(value)} is not a torch release; expected major.minor.patch like "2.13.0"{hint}'
        )
    return value


def cuda_version(value: str) -> str:
    """A cell's CUDA: ``"cpu"`` (no CUDA compile) or a CUDA version ``"13.0"``; ``"cu130"`` is
    read as ``"13.0"`` (the spelling of identifiers), ``"13"`` and ``"13.0.2"`` are refused."""
    m = re.fullmatch(r"cu([0-9]{1,3})([0-9])", value)
    if m:
        return f"{m.group(1)}.{m.group(2)}"
    if value == "cpu" or CUDA_VERSION.fullmatch(value):
        return value
    raise ValueError(
        f'{brief(value)} is not a CUDA axis value; expected "cpu" or a CUDA version '
        'like "13.0" (or cu130)'
    )


def cuda_key(value: str) -> tuple[int, int]:
    """cpu first, then CUDA versions in order."""
    return (-1, -1) if value == "cpu" else (int(value.split(".")[0]), int(value.split(".")[1]))


def torch_key(value: str) -> Version:
    try:
        return Version(value)
    except InvalidVersion:  # pragma: no cover - torch_version() ran first
        raise ValueError(f"{value!r} is not a version") from None


def image_ref(value: str) -> str:
    parse_ref(value)  # a malformed digest is said as such, not as a malformed reference
    if not IMAGE_REF.fullmatch(value):
        raise ValueError(
            f"{brief(value)} is not an image reference; expected [registry/]name[:tag]"
            "[@sha256:digest]"
            " in lower case, e.g. quay.io/pypa/manylinux_2_28_x86_64"
        )
    return value


def image_pin(value: str) -> str:
    """A config file's base image: a reference whose digest, if any, comes with its tag."""
    return config_pin(image_ref(value))


def plat(value: str, machine: str) -> str:
    if not PLAT.fullmatch(value):
        raise ValueError(
            f"{brief(value)} is not a platform tag; expected e.g. manylinux_2_28_{machine}"
        )
    if not value.endswith("_" + machine):
        raise ValueError(
            f"{brief(value)} does not match the arch; expected a tag ending in _{machine}"
        )
    return value


def python_path(value: str) -> str:
    """Interpreter path template with optional ``{cp}`` / ``{version}`` placeholders."""
    if not CONTAINER_PATH.fullmatch(value):
        raise ValueError(
            f"{brief(value)} is not an absolute path of letters, digits and ._+-/; "
            "expected e.g. /opt/python/{cp}-{cp}/bin/python"
        )
    leftover = value.replace("{cp}", "").replace("{version}", "")
    if "{" in leftover or "}" in leftover:
        raise ValueError(
            f"{brief(value)}: the only placeholders allowed are {{cp}} and "
            "{version}; expected e.g. /opt/python/{cp}-{cp}/bin/python"
        )
    return value


def lib_pattern(value: str) -> str:
    if not LIB_PATTERN.fullmatch(value):
        raise ValueError(
            f"{brief(value)} is not a library name or wildcard; expected e.g. libtorch*.so"
        )
    return value


def cflag(value: str) -> str:
    if not CFLAG.fullmatch(value):
        raise ValueError(
            f"{brief(value)} is not a single compiler flag; expected one '-flag' per list item "
            "without spaces or quotes"
        )
    if value in ("-march=native", "-mtune=native", "-mcpu=native"):
        raise ValueError(f"{value!r} makes the wheel unportable; expected portable flags only")
    return value


def index_url(value: str) -> str:
    """A package index URL written into the image's pip configuration."""
    if not _URL_SAFE.fullmatch(value):
        raise ValueError(
            f"{brief(value)} contains characters not allowed in a URL here "
            "(whitespace, quotes, backslash, '$' or '`'); expected a plain URL"
        )
    try:
        parts = urlsplit(value)
        hostname = parts.hostname
    except ValueError as exc:  # "Invalid IPv6 URL": an unclosed '['
        raise ValueError(
            f"{brief(value)} is not a URL ({exc}); expected e.g. https://host/simple"
        ) from None
    if parts.scheme not in ("http", "https", "file") or (parts.scheme != "file" and not hostname):
        raise ValueError(f"{brief(value)} is not an http(s) URL; expected e.g. https://host/simple")
    if parts.password is not None or parts.username is not None:
        raise ValueError(
            "index URL contains credentials, which would be written into the image; "
            "expected a URL without user:password (pass credentials at build time instead)"
        )
    return value


def proxy_url(value: str) -> str:
    """A proxy URL, returned with ``http://`` in front when it has no scheme (as pip and curl
    read ``proxy.corp:3128``); may carry credentials (they never reach a recipe, only build
    args)."""
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(
            "proxy URL contains whitespace or control characters; expected scheme://host:port"
        )
    value, _ = with_scheme(value)
    try:
        parts = urlsplit(value)
    except ValueError:
        # urllib's message repeats the netloc, which may hold a password: not said here.
        raise ValueError(
            "proxy URL is malformed (an unclosed '[' of an IPv6 address, or a host "
            "whose characters change under Unicode normalization); expected "
            "scheme://host:port"
        ) from None
    if parts.scheme not in ("http", "https", "socks4", "socks4a", "socks5", "socks5h"):
        raise ValueError(
            "proxy URL has no supported scheme; expected http://, https://, socks5:// or socks5h://"
        )
    rest = value.split("://", 1)[1]
    if "/" in rest.rpartition("@")[0]:
        # user:pa/ss@host -- a '/' ends the authority, so the host would be "user" and the
        # rest a path: pip and curl would send the password elsewhere (or in the clear).
        raise ValueError(
            "proxy URL has a '/' in its user or password; expected it "
            "percent-encoded (%2F for '/', %40 for '@', %3A for ':')"
        )
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValueError(
            "proxy URL has an invalid port; expected scheme://host:port (a "
            "password holding '/', '@' or ':' must be percent-encoded)"
        ) from None
    if not parts.hostname:
        raise ValueError("proxy URL has no host; expected scheme://host:port")
    return value


def file_path(value: str) -> str:
    """A file or folder named in a config file: any text but a NUL byte, which no path holds."""
    if "\x00" in value:
        raise ValueError(
            f"{brief(value)} holds a NUL character, which no path can; expected the "
            "path of a file or folder"
        )
    return value


def no_proxy(value: str) -> str:
    if not NO_PROXY.fullmatch(value):
        raise ValueError(
            "no_proxy has characters other than host names, addresses, '*', '.', ',', ':' and '/'"
            "; expected e.g. localhost,127.0.0.1,.internal"
        )
    return value
