"""The proxy and index settings reach every backend, not only docker (issue 11).

test_proxy_real.py proves it for the docker backend (a container on a Docker ``--internal``
network). Here the same real tinyproxy (basic auth, a sentinel password) and the same PEP 503
index of the cp311 wheelhouse serve the backends that run pip on this machine:

* host -- a whole ``python -m builder build --backend host`` of the tiny extension, with the proxy
  given as ``--http-proxy`` and the index as the config file's ``pip.index_url``;
* cross -- the target torch download (``require_cpu_torch``, what CrossBackend runs first), with
  the proxy from the config file's ``proxy:`` section, into a fresh cache;
* the seams no real run above crosses: the pipeline hands the proxies (and the index) to
  CrossBackend's downloads, and the emulated backend's containers get them as docker's do.

"An index only the proxy can reach": the builder runs in a network namespace whose one link
leads to the proxy (tests/builder/helpers/netnslib.py); the index listens on this machine's
loopback.
Each real run has a control without the proxy that fails at pip.

Cost: one host build of the tiny extension (``--jobs 1``; torch, ~200 MB, moves through the
proxy), one failed host build (pip's retries, seconds), one torch download (~100 MB) and
one failed one; the seam tests take a second.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import urllib.parse
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
from helpers.enginelib import wheelhouse_cp311, write_tiny_extension
from helpers.netnslib import Netns, isolated_netns
from helpers.pipelinelib import CELL, Run, build_argv, builder_env, manifest
from helpers.proxylib import PROXY_USER, SENTINEL, Index, Proxy, serve_index, tinyproxy, write_index

from builder.backends import registry
from builder.backends.base import Host, PipelineOptions
from builder.config import CliOverrides, Settings, load_settings
from builder.config.proxy import PROXY_KEYS
from builder.cross.sysroot import TargetPython
from builder.cross.target_torch import download_torch_wheel
from builder.errors import StepFailed
from builder.images.render import render_recipe
from builder.pipeline import build_cell
from builder.plan.resolve import resolve
from builder.redact import Redactor
from builder.release.manifest import sha256_file

#: The sentinel as it could leak: the password itself, and the Proxy-Authorization token.
LEAKS = (SENTINEL.encode(), base64.b64encode(f"{PROXY_USER}:{SENTINEL}".encode()))

#: What the builder must not inherit from this machine: proxies (a NO_PROXY naming 127.0.0.1 would
#: send pip straight to the index) and pip's own settings (PIP_FIND_LINKS, PIP_INDEX_URL, ...).
CLEARED = {n for k in PROXY_KEYS for n in (k, k.upper())}


def isolated_env() -> dict[str, str]:
    """The builder's environment in the namespace: the test's settings and nothing of this
    machine's pip configuration. A pip.conf with find-links or extra indexes (local mirrors
    are common on build machines, and this one has them) would give pip torch without the
    index, and a build without the proxy would succeed; pip reads no configuration file when
    PIP_CONFIG_FILE is the null device."""
    env = {k: v for k, v in builder_env().items() if k not in CLEARED and not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


#: The aarch64 torch the cross path builds ARM/Python 3.11 cells against: the newest one on the
#: index that is a CPU build (configs/support.yaml; 2.13.0's aarch64 wheel is a CUDA build).
ARM_TORCH = "2.9.1"
ARM_CELL = f"cp311-manylinux_aarch64-torch{ARM_TORCH}"


@dataclass
class Lab:
    netns: Netns
    proxy: Proxy
    index: Index  # the cp311 wheelhouse, on this machine's 127.0.0.1
    project: Path
    folder: Path

    def masked(self) -> str:
        return f"http://{PROXY_USER}:***@{self.proxy.host}:{self.proxy.port}"

    def run_in_netns(self, argv: list[str], cwd: Path, timeout: int = 1800, **env: str) -> Run:
        proc = subprocess.run(
            self.netns.argv(argv),
            capture_output=True,
            text=True,
            env={**isolated_env(), **env},
            cwd=cwd,
            timeout=timeout,
        )
        return Run(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    folder = tmp_path_factory.mktemp("proxy-backends")
    root = write_index(wheelhouse_cp311(), folder / "index")
    project = write_tiny_extension(folder / "tinyext")
    with isolated_netns() as netns, serve_index(root) as index, tinyproxy(
        netns.host_addr, folder / "proxy", ()
    ) as proxy:
        # The topology the tests rely on: from inside, the proxy answers and the index does not.
        assert netns.can_connect(proxy.host, proxy.port), "the namespace cannot reach the proxy"
        assert not netns.can_connect("127.0.0.1", index.port), "the index is reachable directly"
        yield Lab(netns, proxy, index, project, folder)


def _leaks(r: Run, tmp: Path) -> list[str]:
    """Where the credentials appear: output, every file the build left in work/ (the cell log,
    staging) and dist/ (manifest, wheels and their members)."""
    places: dict[str, bytes] = {"builder stdout": r.out.encode(), "builder stderr": r.err.encode()}
    for top in (tmp / "work", tmp / "dist"):
        for path in sorted(top.rglob("*")):
            if path.is_file():
                places[str(path)] = path.read_bytes()
    for wheel in (tmp / "dist").glob("*.whl"):
        with zipfile.ZipFile(wheel) as zf:
            for member in zf.namelist():
                places[f"{wheel.name}:{member}"] = zf.read(member)
    return [where for where, data in places.items() if any(leak in data for leak in LEAKS)]


def _config(
    folder: Path,
    index: Index,
    *,
    arch: str = "X86",
    torch: str = "2.13.0",
    proxy: Proxy | None = None,
) -> Path:
    """A config naming *index* (no wheelhouse: pip must use the network), and *proxy* in its
    ``proxy:`` section when given."""
    text = (
        f'matrix:\n  arch: [{arch}]\n  python: ["3.11"]\n  torch: ["{torch}"]\n'
        f"pip:\n  index_url: {index.url}\n"
    )
    if proxy is not None:
        text += f"proxy:\n  http_proxy: {proxy.url}\n"
    path = folder / f"config-{arch}-{index.port}-{int(proxy is not None)}.yaml"
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- host backend


@pytest.mark.slow
def test_host_backend_installs_through_the_authenticating_proxy(lab: Lab, tmp_path: Path) -> None:
    config = _config(lab.folder, lab.index)
    args = (
        "--backend",
        "host",
        "--project",
        str(lab.project),
        "--config",
        str(config),
        "--jobs",
        "1",
    )
    # The torch environment is cached per index URL (this run's index port is new): a private
    # cache folder, removed with the test's, instead of one 700 MB venv per run in the user's.
    cache = str(tmp_path / "cache")
    # Control first (once torch is cached, a build needs no index): the same build without the
    # proxy cannot reach the index and fails at pip.
    control = tmp_path / "control"
    control.mkdir()
    # No retries: one try shows the index is out of reach; the backoff would only add time.
    c = lab.run_in_netns(
        build_argv(control, *args), control, AMPFORGE_CACHE=cache, BUILDER_PIP_RETRIES="0"
    )
    assert c.rc == 1, c.err[-3000:]
    assert f"error: {CELL}: step 'install torch==2.13.0' failed" in c.err, c.err[-3000:]
    assert "No matching distribution found for torch==2.13.0" in c.err, c.err[-3000:]
    assert not list((control / "dist").glob("*.whl"))

    ok = tmp_path / "proxied"
    ok.mkdir()
    r = lab.run_in_netns(
        build_argv(ok, *args, "--http-proxy", lab.proxy.url), ok, AMPFORGE_CACHE=cache
    )
    assert r.rc == 0, r.err[-5000:]
    (wheel,) = (ok / "dist").glob("tinyext-*.whl")
    assert wheel.name.startswith("tinyext-0.0.1+torch2.13-cp311-cp311-manylinux_2_"), wheel.name
    entry = next(w for w in manifest(ok / "dist")["wheels"] if w["cell"] == CELL)
    assert entry["file"] == wheel.name and entry["extra"]["backend"] == "host"
    assert entry["extra"]["modules"] == ["tinyext._C"]
    # The smoke test (a fresh venv, torch from the index, import) passed.
    assert "smoke: imported ['tinyext._C']" in (ok / "work" / "logs" / f"{CELL}.log").read_text()
    # The record the wheel was built from names the proxy, masked, with its layer, and the index.
    resolved = entry["extra"]["resolved"]
    assert resolved["proxy"] == {
        "HTTP_PROXY": {"value": lab.masked(), "source": "command line --http-proxy"}
    }
    assert resolved["index"]["index_url"] == lab.index.url
    assert resolved["backend"] == "host" and resolved["network"] == "this host's network"
    # torch came through the proxy: the index's page and the wheel (this run's index port is
    # new, so nothing was in pip's HTTP cache for that URL; the smoke venv's install may be).
    log = lab.proxy.log_text()
    base = f"GET http://127.0.0.1:{lab.index.port}/simple/"
    assert f"{base}torch/ HTTP/1.1" in log, log[-3000:]
    (torch_wheel,) = wheelhouse_cp311().glob("torch-*.whl")
    assert f"{base}torch/{urllib.parse.quote(torch_wheel.name)} HTTP/1.1" in log, log[-3000:]
    assert not _leaks(r, ok), f"the proxy password leaked into: {_leaks(r, ok)}"


# --------------------------------------------------------------------------- cross downloads

#: Run inside the namespace: the cross path's first download, as CrossBackend makes it (the
#: settings loaded as the CLI loads them, the environment from the same helper the backend uses).
DOWNLOAD = """\
import json, os, sys
from pathlib import Path
from builder.backends.pipenv import pip_env
from builder.config import CliOverrides, Settings, load_settings
from builder.cross.sysroot import TargetPython
from builder.cross.target_torch import require_cpu_torch
from builder.errors import StepFailed

config_file, cache, version = sys.argv[1:4]
config = load_settings(CliOverrides(config=config_file), os.environ).config
# Only the target's version and arch decide what is downloaded; no sysroot is needed for that.
target = TargetPython(version="3.11", arch="aarch64", sysroot=Path(cache), executable=Path(cache),
                      include_dir=Path(cache), sysconfig_dir=Path(cache), sysconfig_name="x",
                      ext_suffix=".cpython-311-aarch64-linux-gnu.so", lib_dirs=())
try:
    wheel = require_cpu_torch(version, target, cache=Path(cache),
                              env=pip_env(config, config.proxy.build_args(), Path(cache)))
except StepFailed as exc:
    print(config.proxy.redactor()(exc.message), file=sys.stderr)
    sys.exit(3)
print(json.dumps({"wheel": str(wheel), "proxy": config.proxy.describe()}))
"""


def _arm_torch_wheel(folder: Path) -> Path:
    """The aarch64 torch wheel the cross tests use, from the project's cache (filled by pip
    with this machine's own settings on first use, as test_cross.py does)."""
    scratch = folder / "no-sysroot"
    scratch.mkdir(exist_ok=True)
    target = TargetPython(
        version="3.11",
        arch="aarch64",
        sysroot=scratch,
        executable=scratch,
        include_dir=scratch,
        sysconfig_dir=scratch,
        sysconfig_name="x",
        ext_suffix=".cpython-311-aarch64-linux-gnu.so",
        lib_dirs=(),
    )
    return download_torch_wheel(ARM_TORCH, target)


@pytest.mark.slow
def test_cross_download_goes_through_the_proxy_to_the_configured_index(
    lab: Lab, tmp_path: Path
) -> None:
    source = _arm_torch_wheel(tmp_path)
    wheelhouse = tmp_path / "arm-wheelhouse"
    wheelhouse.mkdir()
    shutil.copyfile(source, wheelhouse / source.name)
    script = tmp_path / "download.py"
    script.write_text(DOWNLOAD)
    with serve_index(write_index(wheelhouse, tmp_path / "arm-index")) as index:
        assert not lab.netns.can_connect("127.0.0.1", index.port)
        cache = tmp_path / "fresh-cache"  # nothing can come from a cache
        config = _config(tmp_path, index, arch="ARM", torch=ARM_TORCH, proxy=lab.proxy)
        r = lab.run_in_netns(
            [sys.executable, str(script), str(config), str(cache), ARM_TORCH], tmp_path, timeout=900
        )
        assert r.rc == 0, r.err[-3000:]
        result = json.loads(r.out)
        assert result["proxy"] == [f"HTTP_PROXY={lab.masked()} (config file {config})"]
        wheel = Path(result["wheel"])
        assert wheel.is_relative_to(cache) and wheel.name == source.name
        assert sha256_file(wheel) == sha256_file(source)
        log = lab.proxy.log_text()
        base = f"GET http://127.0.0.1:{index.port}/simple/torch/"
        assert f"{base} HTTP/1.1" in log, log[-3000:]
        assert f"{base}{urllib.parse.quote(source.name)} HTTP/1.1" in log, log[-3000:]
        assert not any(leak in (r.out + r.err).encode() for leak in LEAKS)

        # Control: the same download without the proxy cannot reach the index.
        control_cache = tmp_path / "control-cache"
        c = lab.run_in_netns(
            [
                sys.executable,
                str(script),
                str(_config(tmp_path, index, arch="ARM", torch=ARM_TORCH)),
                str(control_cache),
                ARM_TORCH,
            ],
            tmp_path,
            timeout=900,
            # One retry: pip names the refused connection only when it retries.
            BUILDER_PIP_RETRIES="1",
        )
    assert c.rc == 3, c.err[-3000:]
    assert f"downloading torch=={ARM_TORCH} for cp311 manylinux_2_28_aarch64 failed" in c.err
    # pip tried the index itself, from a namespace where nothing listens on that port.
    assert (
        f"port={index.port}): Failed to establish a new connection: [Errno 111] "
        "Connection refused" in c.err
    ), c.err[-3000:]
    assert not list(control_cache.rglob("*.whl"))


# --------------------------------------------------------------------------- the seams

PROXY = f"http://{PROXY_USER}:{SENTINEL}@proxy.invalid:3128"
INDEX = "http://index.invalid/simple/"
EXTRA = "http://extra.invalid/simple/"


def _arm_settings(tmp_path: Path, backend: str) -> Settings:
    cfg = tmp_path / "arm.yaml"
    cfg.write_text(
        f'matrix:\n  arch: [ARM]\n  python: ["3.11"]\n  torch: ["{ARM_TORCH}"]\n'
        f"pip:\n  index_url: {INDEX}\n  extra_index_urls: [{EXTRA}]\n"
    )
    return load_settings(
        CliOverrides(
            config=str(cfg), arch="ARM", python="3.11", backend=backend, https_proxy=PROXY
        ),
        {},
    )


def test_cross_backend_downloads_get_the_pipelines_proxies_and_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pipeline's job for a cross cell carries the proxies of every layer, and CrossBackend
    gives them, with the configured index, to both target-torch downloads. Only the cross
    building blocks are fakes (a real run of them is the test above)."""
    import builder.backends.cross as cross  # noqa: PLC0415 - the module whose names are faked

    settings = _arm_settings(tmp_path, "cross")
    (resolved,) = resolve(settings, Host(Redactor()), registry(), out=tmp_path / "dist").cells
    assert resolved.identifier == ARM_CELL and resolved.backend == "cross"
    seen: dict[str, Any] = {}
    fake_wheel = tmp_path / f"torch-{ARM_TORCH}-cp311-cp311-manylinux_2_28_aarch64.whl"
    fake_wheel.write_bytes(b"not a wheel: the faked download's result")

    class Toolchain:
        cxx = Path("aarch64-linux-gnu-g++")
        lib_dirs: tuple[Path, ...] = ()

        def version(self) -> str:
            return "fake"

    def require_cpu_torch(version: str, python: TargetPython, **kw: Any) -> Path:
        seen["require_cpu_torch"] = (version, dict(kw["env"]))
        return fake_wheel

    def ensure_target_torch(version: str, python: TargetPython, **kw: Any) -> NoReturn:
        seen["ensure_target_torch"] = (version, dict(kw["env"]))
        raise StepFailed("fake: stopped after the downloads")

    sysroot = tmp_path / "sysroot" / "root"
    python = TargetPython(
        version="3.11",
        arch="aarch64",
        sysroot=sysroot,
        executable=sysroot,
        include_dir=sysroot,
        sysconfig_dir=sysroot,
        sysconfig_name="x",
        ext_suffix=".cpython-311-aarch64-linux-gnu.so",
        lib_dirs=(),
    )
    monkeypatch.setattr(cross, "find_toolchain", lambda machine: Toolchain())
    monkeypatch.setattr(cross, "ensure_target_python", lambda version, machine: python)
    monkeypatch.setattr(cross, "require_cpu_torch", require_cpu_torch)
    monkeypatch.setattr(cross, "ensure_target_torch", ensure_target_torch)
    opts = PipelineOptions(
        project=write_tiny_extension(tmp_path / "tinyext"),
        out=tmp_path / "dist",
        work=tmp_path / "work",
    )
    result = build_cell(
        resolved,
        None,
        settings.config,
        opts,
        registry(),
        None,
        Redactor(),
        lambda cell, step: None,
        "run-1",
    )
    assert result.error == "fake: stopped after the downloads", result.error
    assert [s.name for s in result.steps][-1] == "target torch"
    # The pipeline's network settings (pip.retries / pip.timeout) travel with the proxies.
    expected = {
        "HTTPS_PROXY": PROXY,
        "https_proxy": PROXY,
        "PIP_INDEX_URL": INDEX,
        "PIP_EXTRA_INDEX_URL": EXTRA,
        **settings.config.pip.network.env(),
    }
    assert seen == {
        "require_cpu_torch": (ARM_TORCH, expected),
        "ensure_target_torch": (ARM_TORCH, expected),
    }


def test_emulated_backend_builds_in_dockers_container_path_with_the_proxies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An emulated cell is built by docker's own ``build_in_container`` (which
    test_proxy_real.py runs for real: the recipe's build args go to ``docker build`` and into the
    container's environment), with a recipe whose build args are the proxies and whose
    Dockerfile does not name them."""
    import builder.backends.emulated as emulated  # noqa: PLC0415 - the module whose name is faked
    from builder.backends.base import CellJob, Steps  # noqa: PLC0415
    from builder.backends.docker import build_in_container  # noqa: PLC0415
    from builder.engines.base import OutputLog  # noqa: PLC0415
    from builder.pipeline_types import CellResult  # noqa: PLC0415

    assert emulated.build_in_container is build_in_container  # the docker path, not a copy
    settings = _arm_settings(tmp_path, "emulated")
    (resolved,) = resolve(settings, Host(Redactor()), registry(), out=tmp_path / "dist").cells
    assert resolved.backend == "emulated"
    recipe = render_recipe(resolved.cell, settings.config)
    assert recipe.build_args == {"HTTPS_PROXY": PROXY, "https_proxy": PROXY}
    assert SENTINEL not in recipe.dockerfile and "proxy.invalid" not in recipe.dockerfile
    assert INDEX in recipe.dockerfile and EXTRA in recipe.dockerfile  # PIP_*INDEX_URL
    seen: list[CellJob] = []
    monkeypatch.setattr(
        emulated, "build_in_container", lambda job, engine, base_id: seen.append(job)
    )
    job = CellJob(
        resolved=resolved,
        config=settings.config,
        opts=PipelineOptions(project=tmp_path, out=tmp_path / "dist", work=tmp_path / "work"),
        log=OutputLog(),
        log_path=tmp_path / "log",
        stage=tmp_path / "stage",
        steps=Steps(CellResult(cell=ARM_CELL), lambda cell, step: None),
        run_id="run-1",
        engine=_NoImages(),
        recipe=recipe,
    )  # type: ignore[arg-type]
    emulated.EmulatedBackend().build(job)
    assert seen == [job] and seen[0].recipe is recipe


class _NoImages:
    """The engine, as far as EmulatedBackend.build asks it (the base image's id)."""

    def image_id(self, ref: str) -> None:
        return None
