"""Builds behind a real authenticating proxy, and CA injection, end to end (issue 6).

The build container sits on a Docker ``--internal`` network: no route out, only the proxy
(tinyproxy from Debian, basic auth whose password is a sentinel string) on the network's
gateway. The package index (the cp311 wheelhouse as PEP 503 pages) listens on the host's
127.0.0.1, which a container cannot reach itself: every package the build installs has to
come through the proxy. Then the same with an HTTPS index whose certificate a throwaway CA
signed: the build succeeds with ``--ca-bundle`` and fails clearly without it.

Cost: two real builds of the tiny extension (``--jobs 1``; torch moves through the proxy
twice each, ~200 MB a time) and two quick failures; one module-wide proxy, network and index.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.enginelib import docker_engine, wheelhouse_cp311, write_tiny_extension
from helpers.pipelinelib import CELL, Run, builder_env, manifest, run_build
from helpers.proxylib import (
    PROXY_USER,
    SENTINEL,
    Index,
    InternalNetwork,
    Proxy,
    ThrowawayCA,
    internal_network,
    make_ca,
    serve_index,
    tinyproxy,
    write_index,
)

from builder.config.proxy import PROXY_KEYS
from builder.engines.docker import DockerEngine
from builder.images.base_image import build_base_image

pytestmark = [pytest.mark.slow, pytest.mark.docker]

#: The sentinel as it could leak: the password itself, and the Proxy-Authorization token.
LEAKS = (SENTINEL.encode(), base64.b64encode(f"{PROXY_USER}:{SENTINEL}".encode()))


@dataclass
class Setup:
    engine: DockerEngine
    base: str  # the local base image's tag
    network: InternalNetwork
    proxy: Proxy
    http: Index
    https: Index
    ca: ThrowawayCA
    project: Path
    folder: Path

    def config(self, index: Index, *, proxy_in_config: bool = False) -> Path:
        """A config file naming *index* (no --wheelhouse: pip must use the network)."""
        text = (
            'matrix:\n  arch: [X86]\n  python: ["3.11"]\n  torch: ["2.13.0"]\n'
            f"pip:\n  index_url: {index.url}\n"
        )
        if proxy_in_config:
            text += f"proxy:\n  http_proxy: {self.proxy.url}\n  https_proxy: {self.proxy.url}\n"
        path = self.folder / f"config-{index.port}-{int(proxy_in_config)}.yaml"
        path.write_text(text)
        return path

    def build(
        self, tmp: Path, config: Path, *extra: str, proxy_env: bool = True, **more_env: str
    ) -> Run:
        env = {"HTTP_PROXY": self.proxy.url, "HTTPS_PROXY": self.proxy.url} if proxy_env else {}
        env.update(more_env)
        return run_build(
            tmp,
            "--backend",
            "docker",
            "--base-image",
            self.base,
            "--network",
            self.network.name,
            "--project",
            str(self.project),
            "--config",
            str(config),
            "--jobs",
            "1",
            *extra,
            **env,
        )


#: The builder must see only the proxies a test gives it (and no CA or network from the host).
CLEARED = [n for k in PROXY_KEYS for n in (k, k.upper())] + ["BUILDER_CA_BUNDLE", "BUILDER_NETWORK"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    engine = docker_engine()
    base = build_base_image(engine).tag
    folder = tmp_path_factory.mktemp("proxy")
    root = write_index(wheelhouse_cp311(), folder / "index")
    ca = make_ca(folder / "ca")
    project = write_tiny_extension(folder / "tinyext")
    before = {
        i["Id"]
        for name in ("ampforge/cell", "ampforge/torch")
        for i in engine.api.images(name=name)
    }
    with pytest.MonkeyPatch.context() as mp, internal_network(engine) as net, serve_index(
        root
    ) as http_index, serve_index(root, (ca.server_cert, ca.server_key)) as https_index, tinyproxy(
        net.gateway, folder / "proxy", (https_index.port,)
    ) as proxy:
        for name in CLEARED:
            mp.delenv(name, raising=False)
        yield Setup(engine, base, net, proxy, http_index, https_index, ca, project, folder)
        _remove_own_images(engine, before, (http_index.url, https_index.url))


def _remove_own_images(engine: DockerEngine, before: set[str], urls: tuple[str, ...]) -> None:
    """The cell images and torch layers these tests made (their environment names one of this
    run's index URLs); the shared images of other tests are left alone."""
    for image in [
        *engine.api.images(name="ampforge/torch"),
        *engine.api.images(name="ampforge/cell"),
    ]:  # torch layers first: children
        if image["Id"] in before:
            continue
        env = engine.api.inspect_image(image["Id"])["Config"].get("Env") or []
        if any(url in e for e in env for url in urls):
            engine.remove_image(image["Id"])


def assert_no_sentinel(s: Setup, r: Run, tmp: Path, image: str | None) -> None:
    """The credentials appear nowhere the build left a trace."""
    places: dict[str, bytes] = {"builder stdout": r.out.encode(), "builder stderr": r.err.encode()}
    for path in sorted((tmp / "work").rglob("*")):  # cell logs (and anything staged)
        if path.is_file():
            places[f"work file {path}"] = path.read_bytes()
    dist = tmp / "dist"
    if (dist / "manifest.json").exists():
        places["dist/manifest.json"] = (dist / "manifest.json").read_bytes()
    for wheel in dist.glob("*.whl"):
        places[f"wheel {wheel.name}"] = wheel.read_bytes()
        with zipfile.ZipFile(wheel) as zf:
            for member in zf.namelist():
                places[f"wheel member {member}"] = zf.read(member)
    if image is not None:
        history = s.engine.api.history(image)  # what `docker history --no-trunc` prints
        places["docker history"] = json.dumps(history).encode()
        places["docker inspect (image config)"] = json.dumps(
            s.engine.api.inspect_image(image)
        ).encode()
    assert (tmp / "work" / "logs" / f"{CELL}.log").is_file()
    leaked = [where for where, data in places.items() if any(leak in data for leak in LEAKS)]
    assert not leaked, f"the proxy password leaked into: {leaked}"


def _built_wheel(tmp: Path, r: Run) -> tuple[Path, dict]:
    assert r.rc == 0, r.err[-5000:]
    (wheel,) = (tmp / "dist").glob("tinyext-*.whl")
    assert wheel.name.startswith("tinyext-0.0.1+torch2.13-cp311-cp311-manylinux_2_"), wheel.name
    entry = next(w for w in manifest(tmp / "dist")["wheels"] if w["cell"] == CELL)
    assert entry["file"] == wheel.name and entry["extra"]["modules"] == ["tinyext._C"]
    # The smoke test (install into a fresh venv with torch from the index, import) passed.
    log = (tmp / "work" / "logs" / f"{CELL}.log").read_text()
    assert "smoke: imported ['tinyext._C']" in log
    return wheel, entry


def test_build_succeeds_only_through_the_authenticating_proxy(setup: Setup, tmp_path: Path) -> None:
    config = setup.config(setup.http)
    # What a user checks first: the proxy as the builder sees it, password masked.
    plan = subprocess.run(
        [sys.executable, "-m", "builder", "plan", "--config", str(config)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env=builder_env(HTTPS_PROXY=setup.proxy.url),
    )
    assert plan.returncode == 0, plan.stderr
    masked = f"HTTPS_PROXY=http://{PROXY_USER}:***@{setup.proxy.host}:{setup.proxy.port}"
    assert f"{masked} (environment HTTPS_PROXY)" in plan.stdout + plan.stderr
    assert SENTINEL not in plan.stdout + plan.stderr

    # Control first (once the torch layer exists, a build needs no index): the same build
    # without the proxy cannot reach the index and fails at pip.
    control = tmp_path / "control"
    control.mkdir()
    # No retries: the control proves the index is out of reach, which one try shows; pip's
    # backoff over the default retries would only add time.
    c = setup.build(control, config, proxy_env=False, BUILDER_PIP_RETRIES="0")
    assert c.rc == 1, c.err[-3000:]
    assert f"error: {CELL}: step 'install torch==2.13.0' failed" in c.err, c.err[-3000:]
    assert "No matching distribution found for torch==2.13.0" in c.err, c.err[-3000:]
    assert "TLS verification failed" not in c.err  # the hint is for certificate errors only
    assert not list((control / "dist").glob("*.whl"))

    r = setup.build(tmp_path, config)
    _, entry = _built_wheel(tmp_path, r)
    # The proxy saw the index requests (pip asks for the torch page through it).
    log = setup.proxy.log_text()
    assert f"GET http://127.0.0.1:{setup.http.port}/simple/torch/" in log, log[-3000:]
    assert f"GET http://127.0.0.1:{setup.http.port}/simple/torch/torch-2.13.0" in log
    assert_no_sentinel(setup, r, tmp_path, entry["extra"]["image"])
    # torch was installed through the proxy into a committed layer: not a trace of it there.
    assert_no_sentinel(setup, r, tmp_path, entry["extra"]["torch_image"])


def test_https_index_through_the_proxy_needs_the_injected_ca(setup: Setup, tmp_path: Path) -> None:
    # Proxies from the config file this time (the other test uses the environment).
    config = setup.config(setup.https, proxy_in_config=True)
    without = tmp_path / "without-ca"
    without.mkdir()
    r = setup.build(without, config, proxy_env=False, BUILDER_PIP_RETRIES="0")  # one try shows it
    assert r.rc == 1, r.err[-3000:]
    assert f"error: {CELL}: step 'install torch==2.13.0' failed" in r.err, r.err[-3000:]
    assert "hint: TLS verification failed inside the build" in r.err, r.err[-3000:]
    assert "--ca-bundle PEM, or BUILDER_CA_BUNDLE=PEM" in r.err
    assert_no_sentinel(setup, r, without, None)
    # pip reached the server through the proxy (CONNECT) and refused its certificate.
    assert f"CONNECT 127.0.0.1:{setup.https.port} " in setup.proxy.log_text()

    ok = tmp_path / "with-ca"
    ok.mkdir()
    r = setup.build(ok, config, "--ca-bundle", str(setup.ca.ca_pem), proxy_env=False)
    _, entry = _built_wheel(ok, r)
    image = entry["extra"]["image"]
    # The CA is in the image's trust store and bundle (it is public; the proxy is not).
    env = setup.engine.api.inspect_image(image)["Config"]["Env"]
    assert "PIP_CERT=/usr/local/share/ampforge/ca-bundle.pem" in env
    assert_no_sentinel(setup, r, ok, image)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ("--backend", "docker", "--network", "ampforge-no-such-network"),
            "has no network 'ampforge-no-such-network'; expected one from `docker network ls`",
        ),
        (
            ("--backend", "host", "--network", "ampforge-no-such-network"),
            "--network ampforge-no-such-network is for the docker backend; this build uses host",
        ),
    ],
)
def test_network_option_errors_name_the_problem(
    tmp_path: Path, args: tuple[str, ...], expected: str
) -> None:
    """Usage errors (exit 2) before anything is built."""
    if "docker" in args:
        docker_engine()  # the check asks the engine
    project = write_tiny_extension(tmp_path / "tinyext")
    r = run_build(tmp_path, *args, "--project", str(project))
    assert r.rc == 2, r.err[-2000:]
    assert expected in r.err, r.err[-2000:]
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").iterdir())
