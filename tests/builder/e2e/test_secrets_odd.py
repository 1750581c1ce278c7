"""Secrets in odd places never appear in what the builder prints or writes.

* Proxy passwords with the characters people really type -- ``@ : / %`` and non-ASCII, escaped
  or not, a raw ``@`` in the user name: plan's table and JSON record, the rendered Dockerfiles,
  a failing build's error. Each output is searched for the password in every form a tool may
  print it (as typed, percent-decoded, percent-encoded).
* A CA bundle that is not PEM (DER, a key, a netrc, a damaged block, a FIFO): refused, exit 2,
  one line naming the file -- never quoting it (a file given by mistake may be a secret).
* A token passed with ``environment-pass``: its value, echoed by the project's own build,
  before-build and test-command, never reaches a log, the manifest, ``dist/``, a rendered
  Dockerfile or an error message.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from urllib.parse import quote, unquote

import pytest
from helpers.builder_testlib import BASE_CONFIG
from helpers.enginelib import wheelhouse_cp311, write_tiny_extension
from helpers.pipelinelib import builder_env

from builder.redact import Redactor

#: (proxy URL, its password as typed)
PROXIES = [
    ("http://releaser:p%40ss%2Fw0rd@proxy.corp.example:3128", "p%40ss%2Fw0rd"),
    ("http://releaser:se:cr@et@proxy.corp.example:3128", "se:cr@et"),
    ("http://releaser:pass/word99@proxy.corp.example:3128", "pass/word99"),  # refused, unnamed
    ("http://releaser:pä$$wörd@proxy.corp.example:3128", "pä$$wörd"),
    ("releaser:plain-secret@proxy.corp.example:3128", "plain-secret"),
    # A raw '@' in the user name: urllib, pip and curl read user "me@corp", password after ':'.
    ("http://me@corp:at-in-user-9@proxy.corp.example:3128", "at-in-user-9"),
    # Non-ASCII and '@ : /' percent-encoded in user and password alike, lower-case escapes.
    ("http://r%c3%a9l:p%c3%a4ss%3aw%2fd%40x@proxy.corp.example:3128", "p%c3%a4ss%3aw%2fd%40x"),
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
    "percent-encoded: none found; the proxy's host is still shown",
)
@pytest.mark.parametrize(("url", "password"), PROXIES, ids=[p for _, p in PROXIES])
def test_no_output_holds_the_password(tmp_path: Path, url: str, password: str) -> None:
    outputs: list[str] = []

    def run(*argv: str) -> subprocess.CompletedProcess:
        r = subprocess.run(
            [sys.executable, "-m", "builder", *argv, "--http-proxy", url],
            cwd=tmp_path,
            env=builder_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
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
    r = run(
        "build",
        "--offline",
        "--find-links",
        "wh",
        "--backend",
        "host",
        "--arch",
        "X86",
        "--python",
        "3.11",
        "--out",
        "dist",
        "--work-dir",
        "work",
    )
    assert r.returncode == 2, r.stderr
    outputs += [
        p.read_text(errors="replace") for p in (tmp_path / "work").rglob("*") if p.is_file()
    ]
    text = "\n".join(outputs)
    assert "proxy.corp.example" in text
    for form in _forms(password):
        assert form not in text, f"the password {form!r} appears in the output"


# ------------------------------------------------------------------ CA bundles that are not PEM

#: Text a file given by mistake as the CA bundle holds; no error line may quote it.
CA_SECRET = "ca-secret-7d41b2-never-echoed"


def _real_certificate() -> str:
    """One genuine CA certificate, PEM (from pip's vendored certifi)."""
    from pip._vendor import certifi  # noqa: PLC0415

    text = Path(certifi.where()).read_text()
    start = text.index("-----BEGIN CERTIFICATE-----")
    end = text.index("-----END CERTIFICATE-----", start) + len("-----END CERTIFICATE-----")
    return text[start:end] + "\n"


def _der_certificate() -> bytes:
    """That certificate as DER (what `openssl x509 -outform der` writes)."""
    body = _real_certificate().split("-----BEGIN CERTIFICATE-----")[1].split("-----END")[0]
    return base64.b64decode("".join(body.split()))


def _not_pem(folder: Path, case: str) -> Path:
    path = folder / f"{case}.pem"
    good = _real_certificate()
    if case == "der":
        path.write_bytes(_der_certificate() + CA_SECRET.encode())
    elif case == "netrc":
        path.write_text(f"machine pkgs.corp.example login ci password {CA_SECRET}\n")
    elif case == "private-key":  # a real bundle with a key pasted after it
        path.write_text(
            good + f"-----BEGIN PRIVATE KEY-----\n{CA_SECRET}\n-----END PRIVATE KEY-----\n"
        )
    elif case == "damaged-block":
        path.write_text(
            f"-----BEGIN CERTIFICATE-----\nMIIB{CA_SECRET}!\n-----END CERTIFICATE-----\n"
        )
    elif case == "cut-short":
        path.write_text(good[: len(good) // 2])
    elif case == "fifo":
        os.mkfifo(path)
    elif case == "huge":
        with path.open("w") as fh:  # a certificate, then 20 MB of it again: not a bundle
            fh.write(good)
            fh.truncate(20 * 10**6)
    else:
        raise ValueError(case)
    return path


#: case -> what the error line says (after "error: <origin>: '<file>'")
NOT_PEM = {
    "der": "is a binary file (DER or PKCS#12?), not PEM",
    "netrc": "holds no certificate; expected a PEM file",
    "private-key": "begins a private key (PRIVATE KEY), which a CA bundle must not hold",
    "damaged-block": "line 2: the CERTIFICATE block begun on line 1 holds something other "
    "than base64",
    "cut-short": "the CERTIFICATE block begun on line 1 never ends",
    "fifo": "is not a regular file",
    "huge": "more than any CA bundle",
}


@pytest.mark.promise(
    promise="a CA bundle that is not PEM is refused before anything runs, in one line naming "
    "the file and where it was given, never quoting what it holds",
    fault="a DER certificate, a netrc, a real bundle with a private key pasted in, a damaged "
    "certificate block, a bundle cut short, a FIFO, a 20 MB file; given on the command "
    "line, in BUILDER_CA_BUNDLE and in the config file",
    result="exit 2, one error line naming the file, the origin (and the config file's line) "
    "and the defect; the file's secret text is in no output; a real CA certificate passes",
)
@pytest.mark.parametrize("case", sorted(NOT_PEM))
def test_a_ca_bundle_that_is_not_pem_is_refused_without_quoting_it(
    tmp_path: Path, case: str
) -> None:
    bad = _not_pem(tmp_path, case)
    config = tmp_path / "matrix.yaml"
    config.write_text(BASE_CONFIG + f"ca_bundle: {bad.name}\n")

    def plan(*extra: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "builder", "plan", "--arch", "X86", "--python", "3.11", *extra],
            cwd=tmp_path,
            env=builder_env(**env),
            capture_output=True,
            text=True,
            timeout=120,
        )

    for run, origin in (
        (plan("--ca-bundle", str(bad)), "command line --ca-bundle"),
        (plan(BUILDER_CA_BUNDLE=str(bad)), "environment BUILDER_CA_BUNDLE"),
        (plan("--config", str(config)), f"{config}:6: ca_bundle"),
    ):
        assert run.returncode == 2, (origin, run.stderr)
        errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in run.stderr, run.stderr
        shown = repr(str(bad))
        assert errors[0].startswith(f"error: {origin}: "), errors
        assert shown in errors[0] and NOT_PEM[case] in errors[0], errors[0]
        assert CA_SECRET not in run.stdout + run.stderr
    real = tmp_path / "real-ca.pem"
    real.write_text("# Issuer: a comment, as the system bundles have\n" + _real_certificate())
    good = plan("--ca-bundle", str(real))
    assert good.returncode == 0 and f"CA:      {real}" in good.stdout, good.stderr


# ------------------------------------------------------------------ environment-pass

#: A token with the characters that trip quoting and escaping, and a unique tail.
TOKEN = "tök@n:/%41-5e0b9c-passed-never-printed"
TOKEN_VAR = "AMPFORGE_TEST_TOKEN"

#: The tiny extension's setup.py, first printing the token the way careless builds do.
LOUD_SETUP = (
    "import os, sys\n"
    f'print("setup.py sees", os.environ["{TOKEN_VAR}"], flush=True)\n'
    f'print("stderr too", os.environ.get("TOKEN_COPY"), file=sys.stderr)\n'
)


def _outputs_of(folder: Path) -> list[str]:
    """Every file under *folder*, wheels as their members' text."""
    texts = []
    for path in sorted(folder.rglob("*")) if folder.exists() else []:
        if path.is_file() and path.suffix == ".whl":
            with zipfile.ZipFile(path) as zf:
                texts += [zf.read(n).decode("utf-8", "replace") for n in zf.namelist()]
        elif path.is_file():
            texts.append(path.read_bytes().decode("utf-8", "replace"))
    return texts


@pytest.mark.slow
@pytest.mark.promise(
    promise="a variable passed with environment-pass reaches the build, and its value appears "
    "in no log, record, manifest, rendered Dockerfile, dist/ file or error message",
    fault="a token holding '@ : / %' and non-ASCII, printed by the project's setup.py, by "
    "before-build, by the test-command, copied by `environment`, and echoed by a "
    "before-build that then fails",
    result="the build saw it (the masked lines are in the log); the value is found in none of "
    "plan's table or JSON, build --dry-run, render's files, stdout, stderr, the cell "
    "logs, the manifest, dist/ (wheel members included), nor the failing build's error",
)
def test_a_passed_token_is_never_printed_or_recorded(tmp_path: Path) -> None:
    project = write_tiny_extension(tmp_path / "tinyext")
    setup = project / "setup.py"
    setup.write_text(LOUD_SETUP + setup.read_text())
    env = builder_env(**{TOKEN_VAR: TOKEN})
    outputs: list[str] = []
    options = ["--environment-pass", TOKEN_VAR, "--environment", f"TOKEN_COPY=${TOKEN_VAR}"]
    test = [
        "--test-command",  # build only
        f"python -c \"import os; print('test sees', os.environ['{TOKEN_VAR}'])\"",
    ]
    cell = ["--arch", "X86", "--python", "3.11", "--project", str(project)]

    def run(*argv: str) -> subprocess.CompletedProcess:
        r = subprocess.run(
            [sys.executable, "-m", "builder", *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        outputs.extend([r.stdout, r.stderr])
        return r

    assert run("plan", *cell, *options).returncode == 0
    assert run("plan", "--format", "json", *cell, *options).returncode == 0
    assert run("render", "--arch", "X86", "--python", "3.11", "--out", "df").returncode == 0
    build = ["build", "--backend", "host", *cell, "--wheelhouse", str(wheelhouse_cp311()), *test]
    assert run(*build, "--dry-run", *options).returncode == 0
    ok = run(
        *build,
        *options,
        "--before-build",
        f'echo "before-build sees ${TOKEN_VAR}"',
        "--out",
        "dist",
        "--work-dir",
        "work",
    )
    assert ok.returncode == 0, ok.stderr[-3000:]
    log = "\n".join(_outputs_of(tmp_path / "work" / "logs"))
    # The build got the token (its lines are there, the value masked).
    for line in ("before-build sees ***", "test sees ***"):
        assert line in log, line
    # Failing builds quote their output in the error: a before-build, and a setup.py (pip
    # shows a failed build's output) that print the token first.
    failing = run(
        *build,
        *options,
        "--before-build",
        f'echo "failing with ${TOKEN_VAR}"; exit 3',
        "--out",
        "dist-f1",
        "--work-dir",
        "work-f1",
    )
    assert failing.returncode == 1 and "before-build failed with exit code 3" in failing.stderr
    assert "failing with ***" in failing.stderr, failing.stderr[-3000:]
    broken = write_tiny_extension(tmp_path / "broken")
    (broken / "setup.py").write_text(LOUD_SETUP + 'raise SystemExit("setup.py gives up")\n')
    failing = run(
        "build",
        "--backend",
        "host",
        "--arch",
        "X86",
        "--python",
        "3.11",
        "--project",
        str(broken),
        "--wheelhouse",
        str(wheelhouse_cp311()),
        *options,
        "--out",
        "dist-f2",
        "--work-dir",
        "work-f2",
    )
    assert failing.returncode == 1 and "setup.py gives up" in failing.stderr + "\n".join(
        _outputs_of(tmp_path / "work-f2")
    ), failing.stderr[-3000:]
    assert "setup.py sees ***" in "\n".join(_outputs_of(tmp_path / "work-f2"))
    for folder in ("df", "dist", "work", "dist-f1", "work-f1", "dist-f2", "work-f2"):
        outputs += _outputs_of(tmp_path / folder)
    text = "\n".join(outputs)
    assert TOKEN_VAR in text  # named (plan's build options), never its value
    for form in {
        TOKEN,
        quote(TOKEN, safe=""),
        TOKEN.encode("unicode_escape").decode(),
        json.dumps(TOKEN)[1:-1],
    }:
        assert form not in text, f"the token appears as {form!r}"


def test_a_secret_shaped_like_a_url_is_masked_whole() -> None:
    """Known secrets are masked before the URL rule runs: a token that looks like URL
    credentials would otherwise be masked in part, the rest left in the clear."""
    token = "ghp://ci:t0k3n@x-5e0b9c"
    redact = Redactor([token])
    assert redact(f"echo {token} done") == "echo *** done"
