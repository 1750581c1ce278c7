"""No silent multi-GB downloads: before torch comes from an index (no wheelhouse), the build
says how large that is and how to give a CPU wheelhouse instead.

A real index on 127.0.0.1 serves a "torch 2.13.0" and an "nvidia" wheel that are sparse files
of several GB (each with its PEP 658 metadata, so pip resolves without the files themselves);
it answers HEAD with their real size and refuses to send them (403), so nothing large is ever
transferred: the builder must size the download from the index's answers alone.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import html
import http.server
import os
import shutil
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.enginelib import wheelhouse_cp311
from helpers.faultlib import small_disk
from helpers.indexlib import clean_pip_env
from helpers.pipelinelib import CELL, Run, build_argv, dist_state, seed_dist

from builder.backends.downloadsize import (
    LARGE_DOWNLOAD,
    Planned,
    large_download_message,
    planned_download,
)
from builder.config import REPO_ROOT
from builder.engines.base import OutputLog
from builder.engines.host import HostEngine
from builder.incell import STEPS_SCRIPT, parse_result

TORCH_SIZE = 2_600_000_000
NVIDIA_SIZE = 900_000_000
BIG = 100_000_000  # the handler refuses to send files above this


def _sparse(path: Path, size: int) -> Path:
    with path.open("wb") as fh:
        fh.truncate(size)  # no blocks on disk
    return path


def _write_index(root: Path) -> Path:
    """``root/simple/``: torch (needs nvidia-fake-cu12) and nvidia-fake-cu12 as big sparse
    wheels with PEP 658 metadata; setuptools, wheel and their requirements from the test
    wheelhouse."""
    metadata = {
        "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl": (
            TORCH_SIZE,
            "Name: torch\nVersion: 2.13.0\nRequires-Dist: nvidia-fake-cu12\n",
        ),
        "nvidia_fake_cu12-12.8.1-py3-none-manylinux_2_28_x86_64.whl": (
            NVIDIA_SIZE,
            "Name: nvidia-fake-cu12\nVersion: 12.8.1\n",
        ),
    }
    simple = root / "simple"
    pages: dict[str, list[str]] = {}
    for name, (size, meta) in metadata.items():
        project = name.split("-")[0].replace("_", "-")
        folder = simple / project
        folder.mkdir(parents=True)
        _sparse(folder / name, size)
        text = f"Metadata-Version: 2.1\n{meta}\n".encode()
        (folder / f"{name}.metadata").write_bytes(text)
        digest = hashlib.sha256(text).hexdigest()
        pages.setdefault(project, []).append(
            f'<a href="{urllib.parse.quote(name)}" data-dist-info-metadata="sha256={digest}" '
            f'data-core-metadata="sha256={digest}">{html.escape(name)}</a>'
        )
    for wheel in wheelhouse_cp311().glob("*.whl"):
        project = wheel.name.split("-")[0].lower().replace("_", "-")
        if project != "torch":  # the build requirements and what they need (small)
            (simple / project).mkdir(parents=True, exist_ok=True)
            shutil.copyfile(wheel, simple / project / wheel.name)
            digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
            pages.setdefault(project, []).append(
                f'<a href="{urllib.parse.quote(wheel.name)}#sha256={digest}">{wheel.name}</a>'
            )
    for project, anchors in pages.items():
        (simple / project / "index.html").write_text(
            "<!DOCTYPE html><html><body>\n" + "<br>\n".join(anchors) + "\n</body></html>\n"
        )
    return root


@contextlib.contextmanager
def _serve(root: Path) -> Iterator[tuple[str, list[str]]]:
    """The index on 127.0.0.1; yields its URL and the list of big files someone tried to GET."""
    refused: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self) -> None:  # the stdlib's name
            path = Path(self.translate_path(self.path))
            if path.is_file() and path.stat().st_size > BIG:
                refused.append(path.name)
                self.send_error(403, "this test index never sends its big wheels")
                return
            super().do_GET()

        def log_message(self, format: str, *args: object) -> None:  # the stdlib's name
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(root))
    )
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple/", refused
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str]]]:
    with _serve(_write_index(tmp_path_factory.mktemp("big-index"))) as served:
        yield served


def test_pip_sizes_the_download_from_the_index_without_fetching_it(
    index, tmp_path: Path, monkeypatch
) -> None:
    url, refused = index
    # Only this index: none of this host's pip configuration (find-links, extra indexes).
    for k in list(os.environ):
        if k.upper().startswith("PIP_") or k.lower().endswith("_proxy"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    log = OutputLog(log_file=tmp_path / "cell.log")
    with HostEngine().session(env={}, log=log, parent=tmp_path) as session:
        steps = session.copy_in(STEPS_SCRIPT, session.workdir)
        made = parse_result(
            session.run([sys.executable, steps, "venv", f"{session.workdir}/venv"], step="venv")
        )
        planned = planned_download(
            session,
            str(made["python"]),
            steps,
            torch="2.13.0",
            requirements=("setuptools", "wheel"),
            index_url=url,
        )
    assert not planned.unknown, planned
    sizes = {name: size for name, _, size in planned.items}
    assert sizes["torch"] == TORCH_SIZE and sizes["nvidia-fake-cu12"] == NVIDIA_SIZE, sizes
    assert {"setuptools", "wheel"} <= set(sizes) and not planned.unsized
    assert planned.total > TORCH_SIZE + NVIDIA_SIZE
    assert refused == [], "the dry run downloaded a big wheel"
    message = large_download_message(planned, torch="2.13.0", machine="x86_64", cuda_build=True)
    assert message is not None
    assert message.startswith(
        f"installing torch 2.13.0 from the index downloads "
        f"{planned.total / 1e9:.1f} GB (5 files: torch 2.13.0 2.6 GB, "
        "nvidia-fake-cu12 12.8.1 900 MB, 3 smaller)"
    ), message
    assert "a CUDA build with its nvidia packages" in message
    assert "--find-links DIR (make wheel WHEELHOUSE=DIR)" in message


def test_small_or_unknown_downloads() -> None:
    small = Planned(items=(("torch", "2.13.0", 200_000_000), ("sympy", "1.14", 6_000_000)))
    assert large_download_message(small, torch="2.13.0", machine="x86_64", cuda_build=True) is None
    # Unknown size: the support table's CUDA record decides (warned, with the reason).
    unknown = Planned(unknown="pip's dry run exited with code 1")
    said = large_download_message(unknown, torch="2.13.0", machine="x86_64", cuda_build=True)
    assert said is not None and "is a CUDA build, several GB" in said
    assert "could not be read: pip's dry run exited with code 1" in said
    assert (
        large_download_message(unknown, torch="2.9.1", machine="aarch64", cuda_build=False) is None
    )
    assert LARGE_DOWNLOAD == 1_000_000_000


def _build_from_index(tmp_path: Path, url: str, **extra_env: str) -> Run:
    """The host backend builds the cell with torch from *url* only (no wheelhouse)."""
    config = tmp_path / "matrix.yaml"
    config.write_text(
        f"support: {Path(__file__).resolve().parents[3] / 'configs' / 'support.yaml'}\n"
        "matrix:\n  arch: [X86]\n  python: ['3.11']\n  torch: ['2.13.0']\n"
        f"pip:\n  index_url: {url}\n"
    )
    # The host's own pip configuration (find-links, extra indexes) stays out: only this index.
    env = {
        k: v
        for k, v in clean_pip_env(PYTHONPATH=str(REPO_ROOT)).items()
        if not k.startswith("BUILDER_")
    }
    env.update(extra_env)
    argv = ["--backend", "host", "--config", str(config), "--python", "3.11", "--torch", "2.13.0"]
    proc = subprocess.run(
        build_argv(tmp_path, *argv),
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=1200,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr)


def test_a_build_without_wheelhouse_says_so_before_the_download(index, tmp_path: Path) -> None:
    url, refused = index
    before = seed_dist(tmp_path / "dist")
    r = _build_from_index(tmp_path, url)
    assert r.rc == 1, r.err[-3000:]
    said = [
        line
        for line in r.err.splitlines()
        if line.startswith(f"warning: {CELL}: installing torch 2.13.0 from the index downloads ")
    ]
    assert said, r.err[-3000:]
    assert "--find-links DIR" in said[0]
    # Said before the download started (which this index refuses: the cell fails there).
    assert r.err.index(said[0]) < r.err.index("403"), r.err[-3000:]
    assert refused and set(refused) <= {
        "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl",
        "nvidia_fake_cu12-12.8.1-py3-none-manylinux_2_28_x86_64.whl",
    }
    log = (tmp_path / "work" / "logs" / f"{CELL}.log").read_text()
    assert "warning: installing torch 2.13.0 from the index downloads" in log
    assert dist_state(tmp_path / "dist") == before


@pytest.mark.promise(
    promise="a torch download that cannot fit where it is installed fails before it starts, "
    "naming the folder, its free space and what the install takes",
    fault="the builder's cache (where the host backend installs the cell's torch) on a 64 MB "
    "file system, torch from an index whose torch and nvidia wheels are 3.5 GB",
    result="exit 1 naming the torch environment's folder, the 3.5 GB download and its "
    "installed size against what is free; nothing downloaded, dist/ unchanged, no "
    "environment left in the cache",
)
def test_a_download_that_cannot_fit_fails_before_it_starts(index, tmp_path: Path) -> None:
    url, refused = index
    refused.clear()
    before = seed_dist(tmp_path / "dist")
    with small_disk(tmp_path / "cache", "64m") as cache:
        r = _build_from_index(tmp_path, url, AMPFORGE_CACHE=str(cache))
        assert r.rc == 1, r.err[-3000:]
        said = [line for line in r.err.splitlines() if "no space left on device for torch" in line]
        assert said, r.err[-3000:]
        assert "from the index it downloads 3.5 GB (" in said[0], said[0]
        assert f"installed in {cache}/torch-envs/" in said[0], said[0]
        assert "MB is free" in said[0] and "AMPFORGE_CACHE" in said[0], said[0]
        assert not refused, "a download started"  # the index logs every refused transfer
        envs = cache / "torch-envs"
        assert not envs.exists() or not [p for p in envs.iterdir() if p.is_dir()], list(
            envs.iterdir()
        )
    assert dist_state(tmp_path / "dist") == before
