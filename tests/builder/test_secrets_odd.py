"""Proxy passwords with the characters people really type -- ``@ : / %`` and non-ASCII, escaped
or not -- never appear in what the builder prints or writes: plan's table and JSON record, the
rendered Dockerfiles, a failing build's error. Each output is searched for the password in every
form a tool may print it (as typed, percent-decoded, percent-encoded)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from urllib.parse import quote, unquote

import pytest
from pipelinelib import builder_env

from builder.redact import Redactor

#: (proxy URL, its password as typed)
PROXIES = [
    ("http://releaser:p%40ss%2Fw0rd@proxy.corp.example:3128", "p%40ss%2Fw0rd"),
    ("http://releaser:se:cr@et@proxy.corp.example:3128", "se:cr@et"),
    ("http://releaser:pass/word99@proxy.corp.example:3128", "pass/word99"),  # refused, unnamed
    ("http://releaser:pä$$wörd@proxy.corp.example:3128", "pä$$wörd"),
    ("releaser:plain-secret@proxy.corp.example:3128", "plain-secret"),
]


def _forms(password: str) -> set[str]:
    return {password, unquote(password), quote(unquote(password), safe="")}


@pytest.mark.parametrize(("url", "password"), PROXIES, ids=[p for _, p in PROXIES])
def test_the_redactor_masks_every_form_of_the_password(url: str, password: str) -> None:
    redact = Redactor()
    redact.add_url(url)
    text = redact(f"connecting to {url}\n" + "\n".join(f"password {f}" for f in _forms(password)))
    for form in _forms(password):
        assert form not in text, (form, text)
    assert "proxy.corp.example:3128" in text  # the host stays readable


@pytest.mark.promise(
    promise="a proxy password never appears in what plan, render or a failing build print or "
            "write, whatever characters it holds",
    fault="passwords with '@', ':', '/', '%'-escapes and non-ASCII letters, escaped or typed "
          "raw, given on the command line",
    result="every output searched for the password as typed, percent-decoded and "
           "percent-encoded: none found; the proxy's host is still shown")
@pytest.mark.parametrize(("url", "password"), PROXIES, ids=[p for _, p in PROXIES])
def test_no_output_holds_the_password(tmp_path: Path, url: str, password: str) -> None:
    outputs: list[str] = []

    def run(*argv: str) -> subprocess.CompletedProcess:
        r = subprocess.run([sys.executable, "-m", "builder", *argv, "--http-proxy", url],
                           cwd=tmp_path, env=builder_env(), capture_output=True, text=True,
                           timeout=300)
        outputs.extend([r.stdout, r.stderr])
        return r

    if "/" in password:  # unescaped: a '/' ends the authority, the host would be "releaser"
        r = run("plan", "--arch", "X86", "--python", "3.11")
        assert r.returncode == 2 and "percent-encoded (%2F for '/'" in r.stderr, r.stderr
        for form in _forms(password):
            assert form not in r.stderr
        return
    assert run("plan", "--arch", "X86", "--python", "3.11").returncode == 0
    assert run("plan", "--format", "json", "--arch", "X86", "--python", "3.11").returncode == 0
    assert run("render", "--arch", "X86", "--python", "3.11", "--out", "df").returncode == 0
    outputs += [p.read_text() for p in (tmp_path / "df").rglob("*") if p.is_file()]
    # A build that stops at its pre-flight (an empty wheelhouse, offline): its error and log.
    (tmp_path / "wh").mkdir()
    r = run("build", "--offline", "--find-links", "wh", "--backend", "host", "--arch", "X86",
            "--python", "3.11", "--out", "dist", "--work-dir", "work")
    assert r.returncode == 2, r.stderr
    outputs += [p.read_text(errors="replace") for p in (tmp_path / "work").rglob("*")
                if p.is_file()]
    text = "\n".join(outputs)
    assert "proxy.corp.example" in text
    for form in _forms(password):
        assert form not in text, f"the password {form!r} appears in the output"
