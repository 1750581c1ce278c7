"""``python -m builder publish``: twine uploads to a real pypiserver on 127.0.0.1.

The server runs as a subprocess with an htpasswd file (uploads need the password,
downloads do not), started once for the module. Every upload goes through the real
command (twine as a subprocess); what was uploaded is fetched back with the real pip.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import json
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.indexlib import clean_pip_env, make_wheel, pip_in
from passlib.apache import HtpasswdFile

from builder.cli import main
from builder.config import REPO_ROOT
from builder.release.manifest import ManifestEntry, record_wheel

USER = "releaser"
PASSWORD = "S3ntinel-pw-4f9c2a"  # must never appear in any output


@dataclass(frozen=True)
class Server:
    url: str  # upload endpoint
    packages: Path  # where pypiserver stores uploads
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def running_server(root: Path, authenticate: str) -> Iterator[Server]:
    """pypiserver on a free 127.0.0.1 port; *authenticate*: the actions that need the
    password (pypiserver's -a: "update", or "update,download,list" for a private one)."""
    packages = root / "packages"
    packages.mkdir(parents=True)
    htpasswd = HtpasswdFile(str(root / "htpasswd"), new=True, default_scheme="apr_md5_crypt")
    htpasswd.set_password(USER, PASSWORD)
    htpasswd.save()
    port = _free_port()
    log = root / "server.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pypiserver",
                "run",
                "-i",
                "127.0.0.1",
                "-p",
                str(port),
                "-P",
                str(root / "htpasswd"),
                "-a",
                authenticate,
                "--disable-fallback",
                str(packages),
            ],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=clean_pip_env(),
        )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url + "health", timeout=2):
                    break
            except urllib.error.HTTPError:
                break  # it answers (an older pypiserver without /health, or 401)
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"pypiserver did not start:\n{log.read_text()}")
                time.sleep(0.2)
        yield Server(url=url, packages=packages, log=log)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Uploads need the password, reading the index does not."""
    with running_server(tmp_path_factory.mktemp("pypiserver"), "update") as srv:
        yield srv


def _record(dist: Path, wheel: Path) -> None:
    record_wheel(
        dist,
        ManifestEntry.for_wheel(
            wheel,
            cell=f"test-{wheel.name}",
            torch="2.13.0",
            python="3.11",
            base_image="none",
            compiler="none",
            builder_version="test",
            started_at="2026-01-01T00:00:00Z",
            finished_at="2026-01-01T00:00:00Z",
        ),
    )


def _dist(tmp: Path, name: str, version: str = "1.0") -> Path:
    dist = tmp / "dist"
    _record(dist, make_wheel(dist, name, version, requires_python=">=3.8"))
    return dist


def cap_lines(output: str, suffix: str) -> list[str]:
    """The lines of *output* that are just a file name ending in *suffix* (stdout's list)."""
    return [ln for ln in output.splitlines() if ln.endswith(suffix) and " " not in ln]


def _publish(
    capsys: pytest.CaptureFixture[str], *args: str, password: str = PASSWORD, **env: str
) -> tuple[int, str]:
    full_env = clean_pip_env(TWINE_USERNAME=USER, TWINE_PASSWORD=password, **env)
    rc = main(["publish", *args], env=full_env)
    cap = capsys.readouterr()
    return rc, cap.out + cap.err


def test_upload_then_install_from_the_server(
    tmp_path: Path, server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    dist = _dist(tmp_path, "pubdemo")
    wheel = next(dist.glob("*.whl"))
    rc, output = _publish(capsys, str(dist), "--repository-url", server.url)
    assert rc == 0, output
    assert PASSWORD not in output
    assert "sha256 match manifest.json" in output
    assert (server.packages / wheel.name).read_bytes() == wheel.read_bytes()

    # What pip fetches from the server is the very file that was built.
    got = tmp_path / "got"
    r = pip_in(
        Path(sys.executable),
        "download",
        "--no-deps",
        "--no-cache-dir",
        "-d",
        str(got),
        "--index-url",
        server.url + "simple/",
        "pubdemo==1.0",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    fetched = got / wheel.name
    assert (
        hashlib.sha256(fetched.read_bytes()).hexdigest()
        == hashlib.sha256(wheel.read_bytes()).hexdigest()
    )

    # The server refuses to overwrite (exit 1, twine's reason shown); --skip-existing passes.
    rc, output = _publish(capsys, str(dist), "--repository-url", server.url)
    assert rc == 1
    # pypiserver answers 400 (PyPI would say 400 or 409); either way twine's line is shown
    assert "twine upload to" in output and "HTTPError: 400" in output, output
    rc, output = _publish(capsys, str(dist), "--repository-url", server.url, "--skip-existing")
    assert rc == 0, output
    assert f"{wheel.name}: already on the repository with the same sha256; skipped" in output
    assert PASSWORD not in output

    # One new wheel next to the published one: only the new one goes up.
    new = make_wheel(dist, "pubdemo", "1.1")
    _record(dist, new)
    rc, output = _publish(capsys, str(dist), "--repository-url", server.url, "--skip-existing")
    assert rc == 0, output
    assert cap_lines(output, ".whl") == [new.name]
    assert (server.packages / new.name).exists()

    # Same name, other bytes: --skip-existing must not hide that the release differs.
    other = make_wheel(tmp_path / "rebuilt", "pubdemo", "1.0", requires_python=">=3.9")
    changed = tmp_path / "changed"
    changed.mkdir()
    _record(changed, Path(shutil.copy(other, changed / other.name)))
    rc, output = _publish(capsys, str(changed), "--repository-url", server.url, "--skip-existing")
    assert rc == 1
    assert f"{other.name}: the repository has sha256" in output, output
    assert (server.packages / wheel.name).read_bytes() == wheel.read_bytes()


def test_wrong_password_fails_and_is_never_printed(
    tmp_path: Path, server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    dist = _dist(tmp_path, "pubwrong")
    wrong = "Wr0ng-pass-77d1e0"
    rc, output = _publish(capsys, str(dist), "--repository-url", server.url, password=wrong)
    assert rc == 1
    assert "failed" in output and ("403" in output or "401" in output), output
    assert wrong not in output and PASSWORD not in output
    assert not (server.packages / next(dist.glob("*.whl")).name).exists()

    # Credentials inside the URL are masked too (twine echoes the URL it uploads to).
    url = server.url.replace("http://", f"http://{USER}:{wrong}@")
    rc, output = _publish(capsys, str(dist), "--repository-url", url, password=wrong)
    assert rc == 1
    assert wrong not in output


def test_url_from_environment_or_config(
    tmp_path: Path, server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    dist = _dist(tmp_path, "pubenv")
    rc, output = _publish(capsys, str(dist), TWINE_REPOSITORY_URL=server.url)
    assert rc == 0, output
    assert "from TWINE_REPOSITORY_URL" in output

    config = tmp_path / "matrix.yaml"
    text = (REPO_ROOT / "configs" / "matrix.yaml").read_text()
    # the support table is named relative to the config file: point at the repository's
    text = re.sub(
        r"^support:.*$", f"support: {REPO_ROOT / 'configs' / 'support.yaml'}", text, flags=re.M
    )
    config.write_text(text + f"\npublish:\n  repository_url: {server.url}\n")
    dist2 = _dist(tmp_path / "two", "pubconfig")
    rc, output = _publish(capsys, str(dist2), "--config", str(config))
    assert rc == 0, output
    assert "from config publish.repository_url" in output
    assert (server.packages / next(dist2.glob("*.whl")).name).exists()


def test_bad_url_or_tampered_dist_exit_before_uploading(
    tmp_path: Path, server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    dist = _dist(tmp_path, "pubbad")
    rc, output = _publish(capsys, str(dist))
    assert rc == 2
    assert "no repository URL" in output and "--repository-url" in output
    rc, output = _publish(capsys, str(dist), "--repository-url", "ftp://127.0.0.1/")
    assert rc == 2 and "expected an http(s) URL" in output

    # Nobody listening: twine's traceback is cut down to its exception line.
    rc, output = _publish(
        capsys, str(dist), "--repository-url", f"http://127.0.0.1:{_free_port()}/"
    )
    assert rc == 1 and "Connection refused" in output
    assert "Traceback" not in output and 'File "' not in output

    wheel = next(dist.glob("*.whl"))
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    rc, output = _publish(capsys, str(dist), "--repository-url", server.url)
    assert rc == 1
    assert f"{wheel.name}: sha256" in output and "refusing to release" in output
    assert not (server.packages / wheel.name).exists()


def test_skip_existing_on_a_private_repository(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Reading the index needs the password too: --skip-existing must send it."""
    with running_server(tmp_path / "private", "update,download,list") as private:
        dist = _dist(tmp_path, "pubprivate")
        wheel = next(dist.glob("*.whl"))
        rc, output = _publish(capsys, str(dist), "--repository-url", private.url, "--skip-existing")
        assert rc == 0, output
        assert (private.packages / wheel.name).exists()
        rc, output = _publish(capsys, str(dist), "--repository-url", private.url, "--skip-existing")
        assert rc == 0, output
        assert "already on the repository with the same sha256" in output
        assert PASSWORD not in output
        # without the password the index cannot be read: a clear failure, not a re-upload
        rc, output = _publish(
            capsys, str(dist), "--repository-url", private.url, "--skip-existing", password=""
        )
        assert rc == 1 and "HTTP 401" in output, output


# --- local versions: PyPI and TestPyPI refuse them, checked before anything goes up ---------


def _mixed_dist(tmp: Path, name: str) -> tuple[Path, Path, list[Path]]:
    """A release like the builder's: one stable-ABI wheel (no label), two labelled ones."""
    dist = tmp / "dist"
    stable = make_wheel(dist, name, "1.0", tag="cp311-abi3-manylinux_2_28_x86_64")
    labelled = [
        make_wheel(dist, name, "1.0+torch2.13", tag="cp311-cp311-manylinux_2_28_x86_64"),
        make_wheel(dist, name, "1.0+torch2.14.cu130", tag="cp311-cp311-manylinux_2_28_x86_64"),
    ]
    for w in (stable, *labelled):
        _record(dist, w)
    return dist, stable, labelled


def _on_server(srv: Server, project: str) -> list[str]:
    """The files of *project* the (module-wide) server holds."""
    return sorted(p.name for p in srv.packages.iterdir() if p.name.startswith(project + "-"))


@pytest.fixture
def server_as_pypi(server: Server, monkeypatch: pytest.MonkeyPatch) -> Server:
    """The local server standing in for PyPI: twine's own default upload URL (the one place
    the builder learns PyPI's) pointed at it, so what would reach PyPI reaches it instead."""
    import twine.utils  # noqa: PLC0415 -- only these tests patch it

    monkeypatch.setattr(twine.utils, "DEFAULT_REPOSITORY", server.url)
    return server


def test_pypi_refuses_every_local_version_before_anything_is_uploaded(
    tmp_path: Path, server_as_pypi: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    srv = server_as_pypi
    dist, stable, labelled = _mixed_dist(tmp_path, "publocal")
    for args in (("--repository", "pypi"), ("--repository-url", srv.url)):
        rc, output = _publish(capsys, str(dist), *args)
        assert rc == 2, output
        assert "pypi refuses local versions" in output and "nothing was uploaded" in output
        for w in labelled:  # each one named, with its label
            assert w.name in output, output
        assert "(local version +torch2.14.cu130)" in output
        # which way to go: the stable-ABI wheel for PyPI, a per-torch or private index for the rest
        assert "stable-ABI" in output and "docs/stable-wheels.md" in output
        assert "--per-torch" in output and "accepts local versions" in output
        assert "twine check" not in output  # refused before twine ran at all
        assert _on_server(srv, "publocal") == []  # all or nothing: not even the stable one
    # Saying PyPI takes them is refused too: it never does.
    rc, output = _publish(capsys, str(dist), "--repository", "pypi", "--accepts-local-versions")
    assert rc == 2 and "--accepts-local-versions" in output, output
    assert _on_server(srv, "publocal") == []

    # --skip-local-versions: the stable wheel goes up, the labelled ones are named and stay.
    rc, output = _publish(capsys, str(dist), "--repository", "pypi", "--skip-local-versions")
    assert rc == 0, output
    assert cap_lines(output, ".whl") == [stable.name]
    for w in labelled:
        assert f"{w.name}: local version" in output and "left out" in output
    assert _on_server(srv, "publocal") == [stable.name]
    assert PASSWORD not in output


def test_another_repository_takes_local_versions_unless_told_otherwise(
    tmp_path: Path, server: Server, capsys: pytest.CaptureFixture[str]
) -> None:
    dist, stable, labelled = _mixed_dist(tmp_path, "pubprivlocal")
    rc, output = _publish(
        capsys, str(dist), "--repository-url", server.url, "--no-accepts-local-versions"
    )
    assert rc == 2, output
    assert "--no-accepts-local-versions" in output and labelled[0].name in output
    assert _on_server(server, "pubprivlocal") == []
    rc, output = _publish(capsys, str(dist), "--repository-url", server.url)
    assert rc == 0, output
    assert sorted(cap_lines(output, ".whl")) == sorted(w.name for w in (stable, *labelled))
    for w in (stable, *labelled):
        assert (server.packages / w.name).read_bytes() == w.read_bytes()


def test_stage_checks_as_for_pypi_and_copies_only_what_pypi_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the emitted trusted-publishing job runs: no upload, no credentials, no network."""
    dist, stable, labelled = _mixed_dist(tmp_path, "pubstage")
    out = tmp_path / "pypi-dist"
    rc, output = _publish(
        capsys, str(dist), "--repository", "pypi", "--stage", str(out), password=""
    )
    assert rc == 2 and labelled[0].name in output, output
    assert not out.exists()
    rc, output = _publish(
        capsys,
        str(dist),
        "--repository",
        "pypi",
        "--skip-local-versions",
        "--stage",
        str(out),
        password="",
    )
    assert rc == 0, output
    assert "twine check --strict: 1 wheel(s) passed" in output
    assert [p.name for p in out.iterdir()] == [stable.name]
    assert (out / stable.name).read_bytes() == stable.read_bytes()
    # The uploader takes everything in the folder: one left over from before is refused.
    rc, output = _publish(
        capsys,
        str(dist),
        "--repository",
        "pypi",
        "--skip-local-versions",
        "--stage",
        str(out),
        password="",
    )
    assert rc == 2 and "--stage" in output and "not empty" in output, output
    # Only labelled wheels: an empty folder, and it says so (a project with no stable wheel).
    only = tmp_path / "only"
    _record(only, make_wheel(only, "pubstage", "2.0+torch2.9"))
    empty = tmp_path / "empty-stage"
    rc, output = _publish(
        capsys,
        str(only),
        "--repository",
        "pypi",
        "--skip-local-versions",
        "--stage",
        str(empty),
        password="",
    )
    assert rc == 0, output
    assert empty.is_dir() and list(empty.iterdir()) == []
    assert "nothing to publish" in output


def test_repository_name_and_url_together_are_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dist = _dist(tmp_path, "pubboth")
    rc, output = _publish(
        capsys, str(dist), "--repository", "pypi", "--repository-url", "http://127.0.0.1:9/"
    )
    assert rc == 2 and "--repository-url or --repository, not both" in output, output


# --- trusted publishing (GitLab): the CI's OIDC token exchanged for an upload token -----------

ID_TOKEN = "eyJ-oidc-S3cret-7a1b"  # what GitLab's id_tokens would put in PYPI_ID_TOKEN
MINTED = "pypi-Minted-S3cret-c0ffee"  # what the index mints for it; both never printed


class _FakeIndex(http.server.BaseHTTPRequestHandler):
    """PyPI's two endpoints trusted publishing needs: the exchange, and the upload that takes
    only the minted token (the file name is kept from the multipart body)."""

    uploads: list[str]
    minted_for: list[str]

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, code: int, doc: dict) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.path == "/_/oidc/mint-token":
            token = json.loads(body).get("token")
            self.minted_for.append(token)
            if token != ID_TOKEN:
                self._answer(
                    422,
                    {
                        "message": "Token request failed",
                        "errors": [
                            {
                                "code": "invalid-publisher",
                                "description": "valid token, but no corresponding publisher",
                            }
                        ],
                    },
                )
                return
            self._answer(200, {"success": True, "token": MINTED})
            return
        auth = base64.b64encode(f"__token__:{MINTED}".encode()).decode()
        if self.path != "/legacy/" or self.headers.get("Authorization") != f"Basic {auth}":
            self._answer(403, {"message": "Invalid or non-existent authentication"})
            return
        self.uploads += re.findall(rb'filename="([^"]+)"', body)
        self._answer(200, {})


@pytest.fixture
def fake_pypi(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_FakeIndex]]:
    handler = type("Handler", (_FakeIndex,), {"uploads": [], "minted_for": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    import twine.utils  # noqa: PLC0415 -- only these tests patch it

    monkeypatch.setattr(
        twine.utils, "DEFAULT_REPOSITORY", f"http://127.0.0.1:{httpd.server_address[1]}/legacy/"
    )
    try:
        yield handler
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_trusted_publishing_exchanges_the_oidc_token_and_uploads_what_pypi_takes(
    tmp_path: Path, fake_pypi: type[_FakeIndex], capsys: pytest.CaptureFixture[str]
) -> None:
    dist, stable, labelled = _mixed_dist(tmp_path, "pubtrusted")
    args = (str(dist), "--repository", "pypi", "--skip-local-versions", "--trusted-publishing")
    # No token in the job: a usage error naming what the job needs, nothing exchanged.
    rc, output = _publish(capsys, *args, password="")
    assert rc == 2 and "PYPI_ID_TOKEN" in output and "id_tokens" in output, output
    assert fake_pypi.minted_for == []
    # A token no publisher matches: the index's reason, nothing uploaded, the token unprinted.
    rc, output = _publish(capsys, *args, password="", PYPI_ID_TOKEN="eyJ-other-S3cret-99")
    assert rc == 1 and "invalid-publisher" in output and "HTTP 422" in output, output
    assert "eyJ-other-S3cret-99" not in output and fake_pypi.uploads == []
    # The job's token: minted, and the upload authenticates with the minted one only.
    rc, output = _publish(capsys, *args, password="", PYPI_ID_TOKEN=ID_TOKEN)
    assert rc == 0, output
    assert fake_pypi.minted_for[-1] == ID_TOKEN
    assert fake_pypi.uploads == [stable.name.encode()]
    assert cap_lines(output, ".whl") == [stable.name]
    assert ID_TOKEN not in output and MINTED not in output
    assert "minted an upload token" in output
    # Still all or nothing for local versions: without the skip, refused before any exchange.
    before = len(fake_pypi.minted_for)
    rc, output = _publish(
        capsys,
        str(dist),
        "--repository",
        "pypi",
        "--trusted-publishing",
        password="",
        PYPI_ID_TOKEN=ID_TOKEN,
    )
    assert rc == 2 and labelled[0].name in output, output
    assert len(fake_pypi.minted_for) == before
