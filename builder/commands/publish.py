"""``publish``: upload the wheels of ``dist/`` to a package repository with twine."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit, urlunsplit

from packaging.utils import parse_wheel_filename

from builder.cli import Context
from builder.config import CliOverrides, load_settings
from builder.errors import ConfigError, StepFailed
from builder.release import local_versions, trusted
from builder.release.distfiles import dist_wheels
from builder.release.manifest import sha256_file
from builder.release.repository import existing_files

NAME = "publish"
HELP = "upload the wheels in dist/ to a package repository (twine)"
DESCRIPTION = """\
Check the wheels in DIST against DIST/manifest.json (when present: every wheel must be
listed with the same sha256), then upload them with twine (python -m twine upload).

Repository URL, first found wins:
  --repository-url URL > --repository pypi|testpypi (twine's own upload URLs) >
  env TWINE_REPOSITORY_URL > config publish.repository_url
Credentials are twine's own: --username or env TWINE_USERNAME, and env TWINE_PASSWORD
(deliberately no --password option: a command line is visible to every process). The
password, and any user:password@ in the URL, are masked (***) in every line printed.

--skip-existing first reads the repository's simple index (--index-url, default
<repository-url>/simple/): files listed there with the same sha256 are skipped, a file
listed with a different sha256 is an error. (twine's own --skip-existing works only for
PyPI and TestPyPI since twine 6, so it is not passed through.)

Before any upload, `twine check --strict` must pass for every wheel (what PyPI checks of
the metadata: a description that renders, its content type).

PyPI and TestPyPI refuse a wheel whose version has a local label (+torch2.13,
+torch2.14.cu130). Publishing to their upload URL, any such wheel in DIST refuses the whole
publish up front (exit 2, each wheel named, nothing uploaded): publish the stable-ABI wheels
(no label) there, with --skip-local-versions to leave the labelled ones out, and the labelled
ones to a per-torch index (`index --per-torch`) or a private repository. Other repositories
are taken to accept local versions; --no-accepts-local-versions says one does not.

--trusted-publishing (a GitLab job with `id_tokens: PYPI_ID_TOKEN: aud: pypi`): no password;
the job's OIDC token (env PYPI_ID_TOKEN) is exchanged at the index's /_/oidc/mint-token for a
short-lived API token, which twine uploads with as __token__ (both masked in all output).

--stage DIR does everything above but the upload: the wheels that would go up are copied into
DIR (new or empty), for an uploader that is not twine -- pypa/gh-action-pypi-publish with
trusted publishing, in the workflow `render --ci github` writes.

Exit codes: 0 uploaded or staged (or nothing left to upload with --skip-existing or
--skip-local-versions); 1 a wheel does not match the manifest or the repository's copy, fails
`twine check --strict`, or the upload failed (twine's message is shown); 2 no repository URL,
or a bad one, DIST holds no wheel, a wheel the repository refuses (local version), or a
--stage folder that is not empty."""

URL_ENV = "TWINE_REPOSITORY_URL"
USER_ENV = "TWINE_USERNAME"
PASSWORD_ENV = "TWINE_PASSWORD"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "dist",
        nargs="?",
        default="dist",
        metavar="DIST",
        help="folder of wheels, usually with manifest.json (default: dist)",
    )
    p.add_argument(
        "--repository-url",
        metavar="URL",
        help=f"upload endpoint, e.g. http://127.0.0.1:8080/ (env {URL_ENV}; config "
        "publish.repository_url)",
    )
    p.add_argument(
        "--repository",
        choices=local_versions.REPOSITORY_NAMES,
        default=None,
        help="upload to PyPI or TestPyPI: twine's own upload URL for that name "
        "(instead of --repository-url)",
    )
    p.add_argument("--username", "-u", metavar="NAME", help=f"user name (env {USER_ENV})")
    p.add_argument(
        "--skip-existing",
        action="store_true",
        help="skip files the repository already lists with the same sha256 (a "
        "different sha256 is an error); read from its simple index, see --index-url",
    )
    p.add_argument(
        "--index-url",
        metavar="URL",
        help="the repository's PEP 503 simple index, read by --skip-existing "
        "(default: <repository-url>/simple/, where pypiserver serves it)",
    )
    p.add_argument(
        "--accepts-local-versions",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="whether the repository takes versions with a local label (+torch2.13): "
        "default no for PyPI and TestPyPI, yes for any other",
    )
    p.add_argument(
        "--skip-local-versions",
        action="store_true",
        help="leave out the wheels whose version has a local label, naming each, "
        "and publish the rest (the stable-ABI wheels, for PyPI)",
    )
    p.add_argument(
        "--stage",
        metavar="DIR",
        default=None,
        help="check as for an upload, then copy the wheels that would go up into "
        "DIR (new or empty) instead of uploading (for another uploader, e.g. "
        "trusted publishing)",
    )
    p.add_argument(
        "--trusted-publishing",
        action="store_true",
        help=f"authenticate with the CI's OIDC token (env {trusted.ID_TOKEN_ENV}) "
        "exchanged for a short-lived API token, instead of a password",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="build configuration YAML for publish.repository_url (default: configs/matrix.yaml)",
    )


def resolve_repository_url(
    cli_value: str | None,
    env: Mapping[str, str],
    config_value: str | None,
    name: str | None = None,
) -> tuple[str, str]:
    """(URL, where it came from); ConfigError (exit 2) when none is given or it is not http(s).
    *name*: ``--repository pypi|testpypi``, twine's URL for it."""
    if cli_value and name:
        raise ConfigError(
            f"give --repository-url or --repository, not both (got {cli_value!r} and {name!r})",
            key="--repository",
        )
    named = local_versions.known_repositories()[name] if name else None
    for value, origin in (
        (cli_value, "--repository-url"),
        (named, f"--repository {name}"),
        (env.get(URL_ENV), URL_ENV),
        (config_value, "config publish.repository_url"),
    ):
        if value:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ConfigError(
                    f"expected an http(s) URL such as http://127.0.0.1:8080/, got {value!r}",
                    key=origin,
                )
            return value, origin
    raise ConfigError(
        f"no repository URL; pass --repository-url URL (or --repository pypi), "
        f"set {URL_ENV}, or set publish.repository_url in the config file"
    )


def _run_twine(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            cmd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            check=False,
        )
    except OSError as exc:
        raise StepFailed(
            f"cannot run twine ({exc}); install the builder extra: pip install -e '.[builder]'"
        ) from exc


def twine_check(wheels: Sequence[Path], env: dict[str, str]) -> None:
    """``twine check --strict`` on *wheels*; StepFailed with twine's findings otherwise."""
    cmd = [
        sys.executable,
        "-m",
        "twine",
        "--no-color",
        "check",
        "--strict",
        *(str(w) for w in wheels),
    ]
    proc = _run_twine(cmd, env)
    if proc.returncode != 0:
        lines = [ln.rstrip() for ln in proc.stdout.splitlines() if ln.strip()]
        raise StepFailed(
            "twine check --strict failed; nothing was uploaded:\n  " + "\n  ".join(lines[-15:])
        )


def twine_command(wheels: Sequence[Path], url: str, *, username: str | None) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "twine",
        "--no-color",
        "upload",
        "--non-interactive",
        "--disable-progress-bar",
        "--repository-url",
        url,
    ]
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
    return (
        urlunsplit(parts._replace(netloc=netloc)),
        (unquote(parts.username or ""), unquote(parts.password or "")),
    )


def already_there(
    wheels: Sequence[Path],
    sha256: Mapping[str, str],
    index_url: str,
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
            notes.append(
                f"{w.name}: already on the repository (its index gives no sha256 "
                "to compare); skipped"
            )
        elif listed[w.name] == sha256[w.name]:
            notes.append(f"{w.name}: already on the repository with the same sha256; skipped")
        else:
            clashes.append(
                f"{w.name}: the repository has sha256 {listed[w.name]}, "
                f"this one is {sha256[w.name]}"
            )
    if clashes:
        raise StepFailed(
            "the repository already holds different files under these names "
            "(a published file must never change; bump the version):\n  " + "\n  ".join(clashes)
        )
    return todo, notes


def without_local_versions(
    wheels: Sequence[Path],
    url: str,
    *,
    declared: bool | None,
    skip: bool,
) -> tuple[list[Path], list[str]]:
    """(wheels to publish, notes). All or nothing: ConfigError (exit 2) naming every labelled
    wheel when the repository refuses local versions and *skip* was not asked for; with
    *skip*, the labelled wheels are left out whatever the repository takes."""
    labelled = local_versions.labelled(wheels)
    if skip:
        notes = [
            f"{w.name}: local version +{local_versions.local_version(w)}; left out "
            "(--skip-local-versions)"
            for w in labelled
        ]
        return [w for w in wheels if w not in labelled], notes
    rule = local_versions.policy(url, declared)
    if labelled and not rule.accepts:
        raise ConfigError(local_versions.refusal(labelled, url, rule.why))
    return list(wheels), []


def check_stage(folder: Path) -> None:
    """ConfigError (exit 2) unless *folder* is new or empty: the uploader that takes it
    uploads everything in it, so a file left from another release would go up too."""
    if folder.is_dir() and any(folder.iterdir()):
        raise ConfigError(
            f"{folder} is not empty; expected a new or empty folder (the uploader "
            "takes everything in it)",
            key="--stage",
        )


def stage(wheels: Sequence[Path], sha256: Mapping[str, str], folder: Path) -> None:
    """Copy *wheels* into *folder* (made if missing; an empty one when nothing is to go up,
    so the step after it finds the folder), each checked against its recorded sha256."""
    check_stage(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for w in wheels:
        copy = Path(shutil.copyfile(w, folder / w.name))
        if sha256_file(copy) != sha256[w.name]:
            raise StepFailed(
                f"{copy}: sha256 differs from {w} after copying; the disk or "
                "another process changed it"
            )


def run(args: argparse.Namespace, ctx: Context) -> int:
    redact = ctx.output.redact
    password = ctx.env.get(PASSWORD_ENV)
    if password:
        redact.add_secret(password)
    id_token = ctx.env.get(trusted.ID_TOKEN_ENV)
    if id_token:
        redact.add_secret(id_token)
    if args.trusted_publishing:
        if args.stage:
            raise ConfigError(
                "--stage uploads nothing, so it takes no credentials; drop "
                "--trusted-publishing (the uploader of the staged folder "
                "authenticates itself)",
                key="--trusted-publishing",
            )
        if not id_token:
            raise ConfigError(
                f"no OIDC token in {trusted.ID_TOKEN_ENV}; a GitLab job gets one "
                f"from `id_tokens: {trusted.ID_TOKEN_ENV}: aud: pypi` (testpypi "
                "for TestPyPI)",
                key="--trusted-publishing",
            )
    env_url = ctx.env.get(URL_ENV)
    if env_url:
        redact.add_url(env_url)
    settings = load_settings(CliOverrides(config=args.config), ctx.env)
    url, origin = resolve_repository_url(
        args.repository_url, ctx.env, settings.config.publish.repository_url, args.repository
    )
    redact.add_url(url)
    if args.stage:
        check_stage(Path(args.stage))
    found = dist_wheels(Path(args.dist))
    for note in found.notes:
        ctx.output.err(f"note: {note}")
    check = "sha256 match manifest.json" if found.checked else "no manifest"
    doing = f"staging in {args.stage} for" if args.stage else "publishing to"
    ctx.output.err(
        f"{len(found.wheels)} wheel(s) from {found.dist} ({check}), {doing} {url} (from {origin})"
    )
    # Before any network read or upload: a refused wheel stops the whole release here.
    wheels, notes = without_local_versions(
        found.wheels, url, declared=args.accepts_local_versions, skip=args.skip_local_versions
    )
    for note in notes:
        ctx.output.err(note)
    if not wheels:
        if args.stage:
            stage([], found.sha256, Path(args.stage))
        ctx.output.err(
            f"nothing to publish: all {len(found.wheels)} wheel(s) have a local "
            "version (the stable-ABI wheels have none: docs/stable-wheels.md)"
        )
        return 0
    username = args.username or ctx.env.get(USER_ENV)
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
            if args.stage:
                stage([], found.sha256, Path(args.stage))
            ctx.output.err(f"nothing to upload: all {len(found.wheels)} wheel(s) are already there")
            return 0
    env = dict(ctx.env)
    # twine would otherwise ask the desktop keyring for a password, which can block or
    # print backend noise on a headless build machine.
    env.setdefault("PYTHON_KEYRING_BACKEND", "keyring.backends.null.Keyring")
    twine_check(wheels, env)
    ctx.output.err(f"twine check --strict: {len(wheels)} wheel(s) passed")
    if args.stage:
        stage(wheels, found.sha256, Path(args.stage))
        for w in wheels:
            ctx.output.out(w.name)
        ctx.output.err(
            f"staged {len(wheels)} wheel(s) in {args.stage} for {url}; nothing was uploaded"
        )
        return 0
    if args.trusted_publishing:
        # Minted last, after every check: the token lives minutes, and is only needed here.
        minted = trusted.mint_token(url, id_token or "")
        redact.add_secret(minted)
        ctx.output.err(
            f"trusted publishing: {trusted.mint_url(url)} minted an upload token for this job"
        )
        username = trusted.TOKEN_USER
        env[PASSWORD_ENV] = minted
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
