"""``python -m builder index``: a PEP 503 index that real pip installs from.

Every install runs the real pip (``pip --python <fresh venv>``, no machine-wide pip
configuration) against the index as a ``file://`` URL or served by ``http.server`` on
127.0.0.1; wheels are small pure-Python ones (tests/builder/helpers/indexlib.py), so nothing
compiles.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import html
import http.server
import importlib.metadata
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.indexlib import fresh_venv, installed_version, make_wheel, pip_in
from packaging.version import Version

from builder.cli import main
from builder.errors import StepFailed
from builder.release.manifest import ManifestEntry, record_wheel
from builder.release.simple_index import normalize_project, read_wheel, write_simple_index
from builder.wheel.localversion import add_local_version


def _tree(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _dist(tmp: Path) -> Path:
    """Three versions of one project; 0.3 claims Python < 3, so pip must skip it."""
    dist = tmp / "dist"
    make_wheel(dist, "Demo.Pkg", "0.1", requires_python=">=3.8")
    make_wheel(dist, "Demo.Pkg", "0.2", requires_python=">=3.8,<4")
    make_wheel(dist, "Demo.Pkg", "0.3", requires_python="<3")
    make_wheel(dist, "other_thing", "1.0")
    return dist


@contextlib.contextmanager
def serve(root: Path) -> Iterator[str]:
    """*root* over HTTP on 127.0.0.1 (a free port) for the duration; yields the base URL."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(root))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_normalization_follows_pep503() -> None:
    assert normalize_project("Demo.Pkg") == "demo-pkg"
    assert normalize_project("foo__bar-.Baz") == "foo-bar-baz"


def test_pages_hashes_requires_python_and_idempotence(tmp_path: Path) -> None:
    dist = _dist(tmp_path)
    out = tmp_path / "index"
    result = write_simple_index(dist, out, metadata=True)
    root = (out / "simple" / "index.html").read_text()
    assert re.findall(r'href="([^"]+)"', root) == ["demo-pkg/", "other-thing/"]
    page = (out / "simple" / "demo-pkg" / "index.html").read_text()
    anchors = re.findall(r"<a ([^>]*)>([^<]*)</a>", page)
    assert [text for _, text in anchors] == [f"demo_pkg-0.{i}-py3-none-any.whl" for i in (1, 2, 3)]
    for attrs, filename in anchors:
        href = re.search(r'href="([^"#]+)#sha256=([0-9a-f]{64})"', attrs)
        assert href and href.group(1) == filename
        served = out / "simple" / "demo-pkg" / filename
        assert hashlib.sha256(served.read_bytes()).hexdigest() == href.group(2)
        assert served.read_bytes() == (dist / filename).read_bytes()
        meta = re.search(r'data-core-metadata="sha256=([0-9a-f]{64})"', attrs)
        meta_file = served.with_name(filename + ".metadata")
        assert meta and hashlib.sha256(meta_file.read_bytes()).hexdigest() == meta.group(1)
    # '<' and '>' escaped in the attribute (PEP 503), unescaping gives the metadata value
    rp = [re.search(r'data-requires-python="([^"]*)"', a).group(1) for a, _ in anchors]
    assert rp == ["&gt;=3.8", "&gt;=3.8,&lt;4", "&lt;3"]
    assert html.unescape(rp[1]) == ">=3.8,<4"
    other = (out / "simple" / "other-thing" / "index.html").read_text()
    assert "data-requires-python" not in other  # absent in METADATA -> absent on the page
    assert result.url == (out / "simple").resolve().as_uri() + "/"

    before = _tree(out)
    write_simple_index(dist, out, metadata=True)
    assert _tree(out) == before  # byte-identical, and no temporary folders left behind
    assert sorted(p.name for p in out.iterdir()) == ["simple"]


def test_reindex_replaces_the_old_index(tmp_path: Path) -> None:
    out = tmp_path / "index"
    write_simple_index(_dist(tmp_path), out)
    only = tmp_path / "only"
    make_wheel(only, "fresh", "2.0")
    write_simple_index(only, out, link=True)
    assert sorted(p.name for p in (out / "simple").iterdir()) == ["fresh", "index.html"]
    served = out / "simple" / "fresh" / "fresh-2.0-py3-none-any.whl"
    assert served.stat().st_ino == (only / served.name).stat().st_ino  # --link: same file


def test_pep658_metadata_is_opt_in(tmp_path: Path) -> None:
    """Off by default: pip 23.0 in the build containers rejects it for unnormalised names."""
    out = tmp_path / "index"
    write_simple_index(_dist(tmp_path), out)
    page = (out / "simple" / "demo-pkg" / "index.html").read_text()
    assert "#sha256=" in page and "metadata" not in page
    assert not list(out.rglob("*.metadata"))


@pytest.mark.starts_from("fresh venv")
def test_pip_installs_from_file_url_and_honours_requires_python(tmp_path: Path) -> None:
    result = write_simple_index(_dist(tmp_path), tmp_path / "index")
    python = fresh_venv(tmp_path / "venv")
    r = pip_in(python, "install", "--index-url", result.url, "demo.pkg")
    assert r.returncode == 0, r.stdout + r.stderr
    # 0.3 is newer but its data-requires-python (<3) excludes this interpreter
    assert installed_version(python, "demo.pkg") == "0.2"


@pytest.mark.starts_from("fresh venv")
def test_pip_installs_over_http_and_refuses_a_tampered_file(tmp_path: Path) -> None:
    result = write_simple_index(_dist(tmp_path), tmp_path / "index")
    with serve(result.out) as base:
        url = f"{base}/simple/"
        good = fresh_venv(tmp_path / "good")
        r = pip_in(good, "install", "--no-cache-dir", "--index-url", url, "Demo_Pkg==0.1")
        assert r.returncode == 0, r.stdout + r.stderr
        assert installed_version(good, "demo.pkg") == "0.1"

        # Change the served 0.2 wheel after indexing: the page's #sha256 no longer matches.
        served = result.out / "simple" / "demo-pkg" / "demo_pkg-0.2-py3-none-any.whl"
        served.write_bytes(served.read_bytes() + b"\0")
        bad = fresh_venv(tmp_path / "bad")
        r = pip_in(bad, "install", "--no-cache-dir", "--index-url", url, "demo-pkg==0.2")
        assert r.returncode != 0
        assert "HASHES" in (r.stdout + r.stderr).upper(), r.stdout + r.stderr
        assert pip_in(bad, "show", "demo-pkg").returncode != 0  # nothing was installed


# ------------------------------------------------------------ the wheel for this torch


def _torch_wheels(tmp: Path, labels: list[str], *, pinned: bool) -> Path:
    """``tpkg 0.1+<label>`` for each label; pinned ones carry Requires-Dist torch==X.Y.*
    (builder.wheel.localversion's pin), unpinned ones only the label."""
    dist = tmp / ("pinned" if pinned else "unpinned")
    if pinned:
        base = make_wheel(tmp / "base", "tpkg", "0.1")
        dist.mkdir(parents=True)
        for label in labels:
            add_local_version(base, label, dist)
    else:
        for label in labels:
            make_wheel(dist, "tpkg", f"0.1+{label}")
    return dist


@pytest.fixture(scope="module")
def torch_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv that sees this environment's real torch (installed once, not copied)."""
    return fresh_venv(tmp_path_factory.mktemp("torchvenv") / "venv", see_outer_packages=True)


def _labels() -> tuple[str, str, str]:
    v = Version(importlib.metadata.version("torch"))
    return (
        f"torch{v.major}.{v.minor - 4}",
        f"torch{v.major}.{v.minor}",
        f"torch{v.major}.{v.minor + 1}",
    )


def _install(venv: Path, dist: Path, out: Path) -> tuple[str, str]:
    url = write_simple_index(dist, out).url
    pip_in(venv, "uninstall", "-y", "tpkg")
    r = pip_in(venv, "install", "--index-url", url, "tpkg")
    assert r.returncode == 0, r.stdout + r.stderr
    return installed_version(venv, "tpkg"), r.stdout + r.stderr


def test_pip_picks_the_wheel_built_for_the_installed_torch(
    tmp_path: Path, torch_venv: Path
) -> None:
    older, running, newer = _labels()
    r = pip_in(torch_venv, "show", "torch")
    assert r.returncode == 0 and "Name: torch" in r.stdout, "the venv must see the real torch"
    pinned = read_wheel(
        _torch_wheels(tmp_path, [running], pinned=True) / f"tpkg-0.1+{running}-py3-none-any.whl"
    )
    assert f"Requires-Dist: torch=={running[len('torch') :]}.*" in pinned.metadata.decode()

    # Older torch alongside: +torchX.(Y-4) sorts lower anyway, the pin keeps it out too.
    version, _ = _install(
        torch_venv, _torch_wheels(tmp_path / "a", [older, running], pinned=True), tmp_path / "ia"
    )
    assert version == f"0.1+{running}"

    # A newer torch's wheel sorts higher (local versions compare segment by segment):
    # without the pin pip takes it -- the wrong wheel for the torch that is installed ...
    assert Version(f"0.1+{newer}") > Version(f"0.1+{running}")
    version, _ = _install(
        torch_venv, _torch_wheels(tmp_path / "b", [running, newer], pinned=False), tmp_path / "ib"
    )
    assert version == f"0.1+{newer}"
    # ... with the pin, torch==X.(Y+1).* is not satisfiable (not installed, not on the
    # index), so pip backtracks to the wheel for the running torch.
    version, log = _install(
        torch_venv, _torch_wheels(tmp_path / "c", [running, newer], pinned=True), tmp_path / "ic"
    )
    assert version == f"0.1+{running}", log
    assert f"tpkg-0.1+{newer}" in log  # it did consider the newer wheel first
    r = pip_in(torch_venv, "show", "torch")
    assert f"Version: {importlib.metadata.version('torch')}" in r.stdout  # torch untouched


# ------------------------------------------------------------------ the command


def _record(dist: Path) -> None:
    for wheel in sorted(dist.glob("*.whl")):
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


def test_command_checks_the_manifest_and_prints_the_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dist = _dist(tmp_path)
    _record(dist)
    out = tmp_path / "index"
    assert main(["index", str(dist), "--out", str(out)], env={}) == 0
    cap = capsys.readouterr()
    assert cap.out.strip() == (out / "simple").resolve().as_uri() + "/"
    assert "sha256 checked against manifest.json" in cap.err

    # A wheel changed after it was recorded: refused by name, the old index stays.
    before = _tree(out)
    changed = dist / "demo_pkg-0.1-py3-none-any.whl"
    changed.write_bytes(changed.read_bytes() + b"\0")
    make_wheel(dist, "stray", "1.0")
    assert main(["index", str(dist), "--out", str(out)], env={}) == 1
    err = capsys.readouterr().err
    assert f"{changed.name}: sha256 " in err and "records" in err
    assert "stray-1.0-py3-none-any.whl: not listed in manifest.json" in err
    assert _tree(out) == before


def test_command_errors_name_the_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere"
    assert main(["index", str(missing), "--out", str(tmp_path / "o")], env={}) == 2
    assert f"DIST: {missing} does not exist; expected an existing folder" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["index", str(empty), "--out", str(tmp_path / "o")], env={}) == 2
    err = capsys.readouterr().err
    assert "no *.whl files" in err and f"`make wheel OUT={empty}`" in err, err
    broken = tmp_path / "broken"
    make_wheel(broken, "fine", "1.0")
    (broken / "junk-1.0-py3-none-any.whl").write_bytes(b"not a zip")
    assert main(["index", str(broken), "--out", str(tmp_path / "o")], env={}) == 1
    err = capsys.readouterr().err
    assert "junk-1.0-py3-none-any.whl: not a readable zip" in err
    assert not (tmp_path / "o" / "simple").exists()


def test_a_wheel_whose_metadata_disagrees_with_its_name_is_refused(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "w", "realname", "1.0")
    renamed = wheel.rename(wheel.with_name("othername-1.0-py3-none-any.whl"))
    with pytest.raises(
        StepFailed,
        match=r"file name says othername 1\.0 but METADATA says "
        r"realname 1\.0",
    ):
        write_simple_index([renamed], tmp_path / "out")
    assert not (tmp_path / "out" / "simple").exists()


# ------------------------------------------------------------------ one index per torch


@pytest.mark.starts_from("fresh venv")
def test_per_torch_indexes_keep_the_users_torch_with_extra_index_url(tmp_path: Path) -> None:
    """The README's old advice, reproduced with real pip and real indexes: the user's torch
    index (here serving torch 2.9.1 and 2.13.0, tiny stand-ins) plus ours with
    ``--extra-index-url``. One index holding both series makes pip take the ``+torch2.13`` wheel
    and replace the installed torch 2.9.1; the ``torch2.9`` page of ``index --per-torch`` offers
    only what fits the torch that is there."""
    users = tmp_path / "users-torch"
    for version in ("2.9.1", "2.13.0"):
        make_wheel(users / "wheels", "torch", version)
    users_url = write_simple_index(users / "wheels", users / "index").url
    dist = tmp_path / "dist"
    base = make_wheel(tmp_path / "base", "tpkg", "0.1")
    dist.mkdir()
    for label in ("torch2.9", "torch2.13"):
        add_local_version(base, label, dist)
    make_wheel(dist, "tpkg-data", "1.0")  # no torch pin: listed on every page

    def fresh_with_torch_2_9(name: str) -> Path:
        venv = fresh_venv(tmp_path / name)
        r = pip_in(venv, "install", "--index-url", users_url, "torch==2.9.1")
        assert r.returncode == 0, r.stderr
        return venv

    # Control: one index with both series, added as an extra index.
    single = write_simple_index(dist, tmp_path / "single").url
    venv = fresh_with_torch_2_9("venv-single")
    r = pip_in(venv, "install", "--index-url", users_url, "--extra-index-url", single, "tpkg")
    assert r.returncode == 0, r.stderr
    assert installed_version(venv, "tpkg") == "0.1+torch2.13"
    assert installed_version(venv, "torch") == "2.13.0"  # the user's torch was replaced

    # One index per series: stdout is one URL a line, the series' page has only its wheels.
    out = tmp_path / "per-torch"
    assert main(["index", str(dist), "--out", str(out), "--per-torch"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["torch2.13", "torch2.9"]
    page = (out / "torch2.9" / "simple" / "tpkg" / "index.html").read_text()
    assert "tpkg-0.1+torch2.9-" in page and "torch2.13" not in page
    assert (out / "torch2.13" / "simple" / "tpkg-data" / "index.html").is_file()
    venv = fresh_with_torch_2_9("venv-per-torch")
    r = pip_in(
        venv,
        "install",
        "--index-url",
        users_url,
        "--extra-index-url",
        (out / "torch2.9" / "simple").resolve().as_uri() + "/",
        "tpkg",
    )
    assert r.returncode == 0, r.stderr
    assert installed_version(venv, "tpkg") == "0.1+torch2.9"
    assert installed_version(venv, "torch") == "2.9.1"  # untouched


def test_per_torch_needs_pinned_wheels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_wheel(tmp_path / "dist", "plain", "1.0")
    assert main(["index", str(tmp_path / "dist"), "--out", str(tmp_path / "o"), "--per-torch"]) == 2
    assert "no wheel pins a torch series" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() or not list((tmp_path / "o").iterdir())
