"""What a CA bundle must be before the builder copies it into images and hands it to pip.

A CA bundle is read from a path the person gave (``--ca-bundle``, ``BUILDER_CA_BUNDLE``, the
config file's ``ca_bundle``) and goes into every base image and every build's trust store. A
wrong file there is found here, in one line that names it -- and never quotes it: a file given
by mistake may be a key, a netrc or a token file, and the error line lands in CI logs.

The file must be a regular file of at most :data:`MAX_BYTES`, hold at least one
``-----BEGIN CERTIFICATE-----`` block, every block closed by its ``-----END ...-----`` line and
holding only base64 text, and no private key (a key in a CA bundle would be copied into every
image). Text around the blocks (``# Issuer:`` comments, as in the system bundles) is allowed.
The certificates' DER is not parsed: the trust-store tools check that, and say so.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Optional

from builder.config.yamlfile import brief

#: No system bundle comes near this (Debian's is about 220 kB); anything bigger is not one.
MAX_BYTES = 16 * 10**6

_BEGIN = re.compile(r"^-----BEGIN ([A-Z0-9 ]+)-----\s*$")
_END = re.compile(r"^-----END ([A-Z0-9 ]+)-----\s*$")
_BASE64 = re.compile(r"[A-Za-z0-9+/=]*")
_CONTROL = re.compile(rb"[\x00-\x08\x0e-\x1f\x7f]")


def ca_bundle_problem(path: Path) -> Optional[str]:
    """Why *path* is not a usable PEM CA bundle (a phrase naming the file and the line, never
    its content), or None."""
    shown = brief(str(path))  # a name of thousands of characters is shortened
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"CA bundle {shown} does not exist; expected a PEM file"
    except OSError as exc:
        return f"cannot read CA bundle {shown}: {exc.strerror or exc}; expected a readable PEM file"
    if not stat.S_ISREG(st.st_mode):
        return (
            f"CA bundle {shown} is not a regular file (a folder, FIFO or device); "
            "expected a PEM file"
        )
    if st.st_size > MAX_BYTES:
        return (
            f"CA bundle {shown} is {st.st_size} bytes, more than any CA bundle "
            f"({MAX_BYTES} at most); expected a PEM file of certificates"
        )
    try:
        # O_NONBLOCK: a file that became a FIFO since stat is not waited on.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        return f"cannot read CA bundle {shown}: {exc.strerror or exc}; expected a readable PEM file"
    text = data.decode("utf-8", errors="replace")
    if "-----BEGIN " not in text and _binary(data):
        return (
            f"{shown} is a binary file (DER or PKCS#12?), not PEM; expected a PEM file "
            "with '-----BEGIN CERTIFICATE-----' blocks (openssl x509 -inform der "
            "-in FILE -out FILE.pem converts a DER certificate)"
        )
    return _pem_problem(text, shown)


def _binary(data: bytes) -> bool:
    """Control bytes other than whitespace, or bytes that are not UTF-8 (a DER certificate
    starts with 0x30 0x82)."""
    if _CONTROL.search(data):
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _pem_problem(text: str, shown: str) -> Optional[str]:
    certificates = 0
    label: Optional[str] = None
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        begin, end = _BEGIN.match(line), _END.match(line)
        if label is None:
            if end is not None:
                return (
                    f"{shown} line {number}: an END line without its BEGIN line; "
                    "expected a PEM file of certificates"
                )
            if begin is None:
                continue
            label, start = begin.group(1), number
            if "PRIVATE KEY" in label:
                return (
                    f"{shown} line {number} begins a private key ({label}), which a CA "
                    "bundle must not hold (it would be copied into every image); "
                    "expected certificates only"
                )
            continue
        if begin is not None:
            return (
                f"{shown} line {number}: a BEGIN line inside the {label} block begun on "
                f"line {start}; expected its END line first"
            )
        if end is not None:
            if end.group(1) != label:
                return (
                    f"{shown} line {number}: END {end.group(1)} closes the {label} block "
                    f"begun on line {start}"
                )
            certificates += label == "CERTIFICATE"
            label = None
            continue
        if not _BASE64.fullmatch(line.strip()):
            return (
                f"{shown} line {number}: the {label} block begun on line {start} holds "
                "something other than base64; expected a PEM file (is it damaged?)"
            )
    if label is not None:
        return (
            f"{shown}: the {label} block begun on line {start} never ends (no "
            f"'-----END {label}-----' line); is the file cut short?"
        )
    if certificates == 0:
        return (
            f"{shown} holds no certificate; expected a PEM file with '-----BEGIN CERTIFICATE-----'"
        )
    return None
