"""``publish``: upload the wheels of ``dist/`` to a package repository with twine."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

from packaging.utils import parse_wheel_filename

from builder.cli import Context
from builder.config import CliOverrides, load_settings
from builder.errors import ConfigError, StepFailed
from builder.release.distfiles import dist_wheels
from builder.release.repository import existing_files

NAME = "publish"
HELP = "upload the wheels in dist/ to a package repository (twine)"
DESCRIPTION = """\
Check the wheels in DIST against DIST/manifest.json (when present: every wheel must be
listed with the same sha256), then upload them with twine (python -m twine upload).

Repository URL, first found wins:
  --repository-url URL > env TWINE_REPOSITORY_URL > config publish.repository_url
Credentials are twine's own: --username or env TWINE_USERNAME, and env TWINE_PASSWORD
(deliberately no --password option: a command line is visible to every process). The
password, and any user:password@ in the URL, are masked (***) in every line printed.

--skip-existing first reads the repository's simple index (--index-url, default
<repository-url>/simple/): files listed there with the same sha256 are skipped, a file
listed with a different sha256 is an error. (twine's own --skip-existing works only for
PyPI and TestPyPI since twine 6, so it is not passed through.)

Before any upload, `twine check --strict` must pass for every wheel (what PyPI checks of
the metadata: a description that renders, its content type). A wheel with a local version
(+torchX.Y) is refused by PyPI itself: publish those to your own index (`index --per-torch`),
and the stable-ABI wheels (no label, torch>=2.10) to PyPI.

Exit codes: 0 uploaded (or all already there with --skip-existing); 1 a wheel does not
match the manifest or the repository's copy, fails `twine check --strict`, or the upload
failed (twine's message is shown); 2 no repository URL, or a bad one, or DIST holds no wheel."""

URL_ENV = "TWINE_REPOSITORY_URL"
USER_ENV = "TWINE_USERNAME"
PASSWORD_ENV = "TWINE_PASSWORD"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dist", nargs="?", default="dist", metavar="DIST",
                   help="folder of wheels, usually with manifest.json (default: dist)")
    p.add_argument("--repository-url", metavar="URL",
                   help=f"upload endpoint, e.g. http://127.0.0.1:8080/ (env {URL_ENV}; config "
                   "publish.repository_url)")
    p.add_argument("--username", "-u", metavar="NAME", help=f"user name (env {USER_ENV})")
    p.add_argument("--skip-existing", action="store_true",
                   help="skip files the repository already lists with the same sha256 (a "
                   "different sha256 is an error); read from its simple index, see --index-url")
    p.add_argument("--index-url", metavar="URL",
                   help="the repository's PEP 503 simple index, read by --skip-existing "
                   "(default: <repository-url>/simple/, where pypiserver serves it)")
    p.add_argument("--config", metavar="FILE",
                   help="build configuration YAML for publish.repository_url "
                   "(default: configs/matrix.yaml)")


def resolve_repository_url(
    cli_value: str | None, env: Mapping[str, str], config_value: str | None
) -> tuple[str, str]:
    """(URL, where it came from); ConfigError (exit 2) when none is given or it is not http(s)."""
    for value, origin in ((cli_value, "--repository-url"), (env.get(URL_ENV), URL_ENV),
                          (config_value, "config publish.repository_url")):
        if value:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError("expected an http(s) URL such as http://127.0.0.1:8080/, got "
                                  f"{value!r}", key=origin)
            return value, origin
    raise ConfigError(f"no repository URL; pass --repository-url URL, set {URL_ENV}, or set "
                      "publish.repository_url in the config file")


def _run_twine(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, errors="replace", check=False)
    except OSError as exc:
        raise StepFailed(f"cannot run twine ({exc}); install the builder extra: "
                         "pip install -e '.[builder]'") from exc


def twine_check(wheels: Sequence[Path], env: dict[str, str]) -> None:
    """``twine check --strict`` on *wheels*; StepFailed with twine's findings otherwise."""
    cmd = [sys.executable, "-m", "twine", "--no-color", "check", "--strict",
           *(str(w) for w in wheels)]
    proc = _run_twine(cmd, env)
    if proc.returncode != 0:
        lines = [ln.rstrip() for ln in proc.stdout.splitlines() if ln.strip()]
        raise StepFailed("twine check --strict failed; nothing was uploaded:\n  "
                         + "\n  ".join(lines[-15:]))


def twine_command(wheels: Sequence[Path], url: str, *, username: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "twine", "--no-color", "upload", "--non-interactive",
           "--disable-progress-bar", "--repository-url", url]
    if username:
        cmd += ["--username", username]
    return cmd + [str(w) for w in wheels]


def _split_credentials(url: str) -> tuple[str, tuple[str, str] | None]:
    """(URL without user:password@, (user, password) or None)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, None
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return (urlunsplit(parts._replace(netloc=netloc)),
            (unquote(parts.username or ""), unquote(parts.password or "")))


def already_there(
    wheels: Sequence[Path], sha256: Mapping[str, str], index_url: str,
    auth: tuple[str, str] | None,
) -> tuple[list[Path], list[str]]:
    """(wheels still to upload, notes); StepFailed when the repository holds a file of the
    same name with other content."""
    projects = [parse_wheel_filename(w.name)[0] for w in wheels]
    listed = existing_files(index_url, projects, auth=auth)
    todo, notes, clashes = [], [], []
    for w in wheels:
        if w.name not in listed:
            todo.append(w)
        elif listed[w.name] is None:
            notes.append(f"{w.name}: already on the repository (its index gives no sha256 "
                         "to compare); skipped")
        elif listed[w.name] == sha256[w.name]:
            notes.append(f"{w.name}: already on the repository with the same sha256; skipped")
        else:
            clashes.append(f"{w.name}: the repository has sha256 {listed[w.name]}, "
                           f"this one is {sha256[w.name]}")
    if clashes:
        raise StepFailed("the repository already holds different files under these names "
                         "(a published file must never change; bump the version):\n  "
                         + "\n  ".join(clashes))
    return todo, notes


def run(args: argparse.Namespace, ctx: Context) -> int:
    redact = ctx.output.redact
    password = ctx.env.get(PASSWORD_ENV)
    if password:
        redact.add_secret(password)
    env_url = ctx.env.get(URL_ENV)
    if env_url:
        redact.add_url(env_url)
    settings = load_settings(CliOverrides(config=args.config), ctx.env)
    url, origin = resolve_repository_url(args.repository_url, ctx.env,
                                         settings.config.publish.repository_url)
    redact.add_url(url)
    found = dist_wheels(Path(args.dist))
    for note in found.notes:
        ctx.output.err(f"note: {note}")
    check = "sha256 match manifest.json" if found.checked else "no manifest"
    ctx.output.err(f"publishing {len(found.wheels)} wheel(s) from {found.dist} ({check}) to "
                   f"{url} (from {origin})")
    username = args.username or ctx.env.get(USER_ENV)
    wheels = list(found.wheels)
    if args.skip_existing:
        plain_url, auth = _split_credentials(url)
        if auth is None and username and password:
            auth = (username, password)
        index_url = args.index_url or urljoin(plain_url.rstrip("/") + "/", "simple/")
        redact.add_url(index_url)
        wheels, notes = already_there(wheels, found.sha256, index_url, auth)
        for note in notes:
            ctx.output.err(note)
        if not wheels:
            ctx.output.err(f"nothing to upload: all {len(found.wheels)} wheel(s) are "
                           "already there")
            return 0
    env = dict(ctx.env)
    # twine would otherwise ask the desktop keyring for a password, which can block or
    # print backend noise on a headless build machine.
    env.setdefault("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")
    twine_check(wheels, env)
    ctx.output.err(f"twine check --strict: {len(wheels)} wheel(s) passed")
    cmd = twine_command(wheels, url, username=username)
    proc = _run_twine(cmd, env)
    lines = [ln.rstrip() for ln in proc.stdout.splitlines() if ln.strip()]
    if proc.returncode != 0:
        if any(ln.startswith("Traceback (most recent call last)") for ln in lines):
            # twine lets some errors (connection refused, DNS) escape as a traceback: keep
            # what it said before it and the exception line, not forty frames.
            first = next(i for i, ln in enumerate(lines) if ln.startswith("Traceback"))
            lines = lines[:first] + lines[-1:]
        tail = "\n  ".join(lines[-15:]) or "(no output)"
        raise StepFailed(f"twine upload to {url} failed (exit {proc.returncode}):\n  {tail}")
    for line in lines:
        ctx.output.err(f"twine: {line}")
    for w in wheels:
        ctx.output.out(w.name)
    ctx.output.err(f"published {len(wheels)} wheel(s) to {url}")
    return 0

