"""pip over a network that lies: retries, timeouts and what a failure means.

Every download the builder does goes through pip (``fetch``'s ``pip download``, the torch
environments, the builder's own lock), so pip's own ``--retries`` and ``--timeout`` are the
carriers of the builder's network settings (config ``pip.retries`` / ``pip.timeout``,
environment ``BUILDER_PIP_RETRIES`` / ``BUILDER_PIP_TIMEOUT``). They travel as pip's
environment variables, so that they reach a pip running inside a container or in a step
script just as they reach one run here; pip retries a reset or refused connection with an
exponential backoff (urllib3's), and gives up on a stalled one after the timeout.

pip's own messages for these faults mislead: a stalled index reads as "Could not find a
version that satisfies the requirement", a wheel whose bytes do not match the index's hash as
a wall of text. :func:`explain` turns pip's output into one sentence that names the fault,
the file and the setting to change.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Callable, Optional, TextIO

from builder.errors import StepFailed


@dataclass(frozen=True)
class NetworkOptions:
    """The defaults live in builder/config/defaults.yaml (``pip:``)."""

    retries: int
    timeout: float  # seconds pip waits for a connection or the next bytes

    def env(self) -> dict[str, str]:
        """pip's environment form. PIP_DEFAULT_TIMEOUT is pip's other name for --timeout: a
        shell that sets it would otherwise win or lose by the order of os.environ."""
        timeout = f"{self.timeout:g}"
        return {
            "PIP_RETRIES": str(self.retries),
            "PIP_TIMEOUT": timeout,
            "PIP_DEFAULT_TIMEOUT": timeout,
        }

    def describe(self) -> str:
        return f"pip.retries={self.retries}, pip.timeout={self.timeout:g}s"


_HASH_FILE = re.compile(r"^\s+(\S+) from (\S+?)(?:#\S*)?(?: \(from .*\))?:\s*$", re.M)
_EXPECTED = re.compile(r"Expected sha256 ([0-9a-f]{64})")
_GOT = re.compile(r"Got\s+([0-9a-f]{64})")
# urllib3's words, as pip prints them (specific enough not to match a step's other output).
_STALL = ("ReadTimeoutError", "ConnectTimeoutError", "Read timed out.")
_RESET = (
    "ConnectionResetError",
    "Connection reset by peer",
    "RemoteDisconnected",
    "ProtocolError('Connection aborted",
    "NewConnectionError",
    "ProxyError",
    "Max retries exceeded",
)


def explain_hashes(output: str) -> Optional[str]:
    """One sentence for pip's hash refusal in *output* (naming the files), or None."""
    if "DO NOT MATCH THE HASHES" not in output and "HashMismatch" not in output:
        return None
    files = sorted({m.group(2).rsplit("/", 1)[-1] for m in _HASH_FILE.finditer(output)})
    expected, got = _EXPECTED.search(output), _GOT.search(output)
    what = ", ".join(files) or "a downloaded file"
    sums = (
        f" (expected sha256 {expected.group(1)}, got {got.group(1)})"
        if expected and got and len(files) <= 1
        else ""
    )
    return (
        f"hash mismatch: {what} is not the file its sha256 names{sums}; pip refused it "
        "and nothing was installed or kept. The index, a mirror, a proxy or a bundle "
        "holds other bytes: clear the proxy's cache, use another mirror or fetch the "
        "bundle again -- never drop the hash"
    )


def explain(output: str, net: Optional[NetworkOptions] = None) -> Optional[str]:
    """One sentence for a network fault in pip's *output*, or None when it shows none. With
    *net* (the settings pip ran with) it says their values."""
    hashes = explain_hashes(output)
    if hashes:
        return hashes
    if any(s in output for s in _STALL):
        within = f"within {net.timeout:g} s, {net.retries} retries " if net else ""
        return (
            f"the network stalled: no answer {within}(pip.timeout / BUILDER_PIP_TIMEOUT, "
            "pip.retries / BUILDER_PIP_RETRIES); check the proxy and the index, or raise "
            "the timeout for a slow one"
        )
    if any(s in output for s in _RESET):
        after = f"after {net.retries} retries " if net else ""
        return (
            f"connections kept failing {after}with backoff (pip.retries / "
            "BUILDER_PIP_RETRIES): check the proxy and the index, or raise the retries "
            "for a flaky one"
        )
    return None


def run_pip(
    argv: Sequence[str],
    env: Mapping[str, str],
    net: NetworkOptions,
    log: TextIO,
    redact: Callable[[str], str],
    what: str,
) -> str:
    """Run pip (*argv*) with *net*'s retries and timeout; its redacted output, logged to *log*.
    StepFailed naming *what*, the fault (:func:`explain`) and pip's last lines on failure."""
    full_env = {**env, **net.env()}
    log.write(redact("+ " + " ".join(argv)) + "\n")
    proc = subprocess.run(list(argv), env=full_env, capture_output=True, text=True)
    output = redact(proc.stdout + proc.stderr)
    log.write(output + "\n")
    log.flush()
    if proc.returncode != 0:
        hint = explain(output, net)
        tail = "\n".join(output.strip().splitlines()[-15:])
        raise StepFailed(
            f"{what} failed (exit {proc.returncode}"
            f"{'; ' + hint if hint else ''}; full output in {log.name}):\n{tail}"
        )
    return output
