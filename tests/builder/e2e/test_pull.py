"""Base-image pulls (``--pull missing|always|never``) against a real registry on loopback.

The registry is Debian's ``docker-registry`` started by the test on a free port
(:mod:`registrylib`); the image pushed to it is the locally built base image (the one every
docker test uses, built once and reused by content). The daemon pulls from ``127.0.0.1:<port>``
over plain HTTP (its default insecure registries include 127.0.0.0/8).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.builder_testlib import BASE_CONFIG, run_cli, write_config
from helpers.enginelib import docker_engine
from helpers.proxylib import free_port
from helpers.registrylib import Registry, local_registry, push

from builder.backends import registry as backend_registry
from builder.backends.base import Host
from builder.backends.docker import pull_base_images
from builder.config import CliOverrides, load_settings
from builder.config.proxy import ProxySettings
from builder.engines.daemon_proxy import DROP_IN
from builder.engines.docker import DockerEngine
from builder.engines.pull import PullProgress, failure_kind, needs_pull
from builder.errors import ConfigError
from builder.images.base_image import build_base_image
from builder.plan.resolve import resolve
from builder.redact import Redactor

SECRET = "pull-S3cret-77"

# -- the policy, through every layer --------------------------------------------------------


def _settings(cfg: Path, env: dict[str, str] | None = None, **cli):
    return load_settings(CliOverrides(config=str(cfg), **cli), env or {})


def test_pull_policy_every_layer(tmp_path: Path) -> None:
    bare = write_config(tmp_path, BASE_CONFIG, "bare.yaml")
    s = _settings(bare)
    assert (s.config.pull, s.config.origins["pull"]) == ("missing", "built-in default")
    cfg = write_config(tmp_path, BASE_CONFIG + "build:\n  pull: never\n")
    s = _settings(cfg)
    assert (s.config.pull, s.config.origins["pull"]) == ("never", f"config file {cfg}")
    s = _settings(cfg, {"BUILDER_PULL": "always"})
    assert (s.config.pull, s.config.origins["pull"]) == ("always", "environment BUILDER_PULL")
    s = _settings(cfg, {"BUILDER_PULL": "always"}, pull="missing")
    assert (s.config.pull, s.config.origins["pull"]) == ("missing", "command line --pull")
    # every cell's base image carries the policy the backends decide by
    assert {i.pull for i in s.config.images.values()} == {"missing"}


def test_offline_means_never_and_always_contradicts_it(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, BASE_CONFIG + "build:\n  pull: always\n")
    s = _settings(cfg, offline=True)
    assert s.config.pull == "never" and "--offline" in s.config.origins["pull"]
    assert {i.pull for i in s.config.images.values()} == {"never"}
    with pytest.raises(ConfigError, match="contradict") as err:
        _settings(cfg, {"BUILDER_PULL": "always"}, offline=True)
    assert err.value.return_code == 2


def test_bad_pull_values_exit_2_naming_the_key(tmp_path: Path) -> None:
    bare = write_config(tmp_path, BASE_CONFIG, "bare.yaml")
    r = run_cli("plan", "--config", str(bare), env={"BUILDER_PULL": "sometimes"})
    assert r.rc == 2
    assert "environment BUILDER_PULL" in r.err and "missing, always, never" in r.err
    r = run_cli("plan", "--config", str(bare), "--pull", "sometimes")
    assert r.rc == 2 and "invalid choice: 'sometimes'" in r.err
    cfg = write_config(tmp_path, BASE_CONFIG + "build:\n  pull: true\n")
    r = run_cli("plan", "--config", str(cfg))
    assert r.rc == 2 and "build.pull" in r.err


def test_needs_pull() -> None:
    assert needs_pull("missing", present=False) and not needs_pull("missing", present=True)
    assert needs_pull("always", present=True) and needs_pull("always", present=False)
    assert not needs_pull("never", present=False)


@pytest.mark.parametrize(
    "message, kind",
    [
        (
            'Get "http://127.0.0.1:1/v2/": dial tcp 127.0.0.1:1: connect: connection refused',
            "network",
        ),
        (
            "Get https://quay.io/v2/: net/http: request canceled while waiting for connection "
            "(Client.Timeout exceeded while awaiting headers)",
            "network",
        ),
        (
            "Get https://quay.io/v2/: proxyconnect tcp: dial tcp 10.0.0.1:3128: i/o timeout",
            "network",
        ),
        (
            "manifest for 127.0.0.1:5000/ampforge/base:nope not found: manifest unknown: "
            "manifest unknown",
            "not found",
        ),
        (
            "pull access denied for nosuch, repository does not exist or may require "
            "'docker login'",
            "not found",
        ),
        ("invalid reference format", "other"),
    ],
)
def test_failure_kind(message: str, kind: str) -> None:
    assert failure_kind(message) == kind


def test_progress_is_a_few_lines_per_layer() -> None:
    p = PullProgress("reg/x:1")
    events = [
        {"status": "Pulling from x", "id": "1"},
        {"status": "Pulling fs layer", "id": "aaa"},
        {"status": "Already exists", "id": "bbb"},
        *(
            {"status": "Downloading", "id": "aaa", "progressDetail": {"current": c, "total": 100}}
            for c in range(1, 101)
        ),
        {"status": "Download complete", "id": "aaa"},
        {"status": "Extracting", "id": "aaa", "progressDetail": {"current": 5}},
        {"status": "Pull complete", "id": "aaa"},
        {"status": "Status: Downloaded newer image for reg/x:1"},
    ]
    lines = [line for e in events if (line := p.line(e)) is not None]
    downloads = [line for line in lines if "downloading" in line]
    assert len(downloads) == 4  # each quarter once, not a line per chunk
    assert downloads[-1].endswith("downloading 0.0 MB of 0.0 MB")
    assert "pull reg/x:1: layer bbb: already exists" in lines
    assert lines[-1] == "pull reg/x:1: Status: Downloaded newer image for reg/x:1"
    assert p.summary().startswith("pull reg/x:1: done (2 layers, 1 fetched, 1 already here")


# -- the real registry ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def pushed(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[DockerEngine, Registry, str, str]]:
    """(engine, registry, the pushed ref, the base image id): the local base image pushed to a
    registry of our own, under a tag the engine does not have."""
    engine = docker_engine()
    base = build_base_image(engine)
    with local_registry(tmp_path_factory.mktemp("registry")) as reg:
        ref = reg.ref("ampforge/base:pulltest")
        push(engine, base.tag, ref)
        yield engine, reg, ref, base.image_id
        engine.remove_image(ref)


def _cli_build(tmp_path: Path, ref: str, env: dict[str, str], *extra: str):
    """``build`` of this host's default cell in base image *ref*: the pull comes first, so a
    pull that fails stops it before anything is built."""
    return run_cli(
        "build",
        "--backend",
        "docker",
        "--base-image",
        ref,
        "--out",
        str(tmp_path / "dist"),
        "--work-dir",
        str(tmp_path / "work"),
        *extra,
        env=env,
    )


@pytest.mark.docker
def test_pull_that_works_and_the_records_after_it(pushed, tmp_path: Path) -> None:
    engine, reg, ref, base_id = pushed
    engine.remove_image(ref)
    assert engine.image_id(ref) is None
    settings = load_settings(
        CliOverrides(base_image=ref, backend="docker", arch="X86", python="3.11", torch="2.13.0"),
        {},
    )
    before = resolve(settings, Host(Redactor()), backend_registry(), out=tmp_path)
    [cell] = before.here
    assert "pulled first: --pull missing" in cell.backend_reason
    assert cell.image.image_id is None
    said: list[str] = []
    pulled = pull_base_images(before.here, engine, ProxySettings(), said.append)
    assert pulled == [ref]
    # The very image that was pushed (the ids are the config digest), with progress said.
    assert engine.image_id(ref) == base_id
    assert said[0] == f"base image: pulling {ref} (--pull missing)"
    assert said[-1].startswith(f"pull {ref}: done (")
    assert "/v2/ampforge/base/manifests/pulltest" in reg.log_text()  # it came from there
    # Resolved again, the record names the pulled image, Debian inside (its labels).
    after = resolve(settings, Host(Redactor()), backend_registry(), out=tmp_path)
    [cell] = after.here
    assert cell.image.image_id == base_id and cell.cell.image.family == "debian"
    # --pull missing with the image present: nothing more is pulled.
    assert pull_base_images(after.here, engine, ProxySettings(), said.append) == []


@pytest.mark.docker
def test_a_missing_tag_is_said_as_such(pushed, tmp_path: Path) -> None:
    _, reg, _, _ = pushed
    ref = reg.ref("ampforge/base:no-such-tag")
    r = _cli_build(tmp_path, ref, {"HTTPS_PROXY": f"http://u:{SECRET}@127.0.0.1:9"})
    assert r.rc == 1, r.err
    assert f"could not pull base image {ref}" in r.err
    assert "manifest unknown" in r.err and "no such image or tag" in r.err
    assert DROP_IN not in r.err  # not a proxy problem: no proxy advice
    assert not (tmp_path / "dist").exists() or not any((tmp_path / "dist").iterdir())


def _daemon_proxies(engine: DockerEngine) -> dict[str, str]:
    info = engine.info()
    found = {
        "HTTP_PROXY": info.get("HttpProxy"),
        "HTTPS_PROXY": info.get("HttpsProxy"),
        "NO_PROXY": info.get("NoProxy"),
    }
    return {k: v for k, v in found.items() if v}


@pytest.mark.docker
def test_unreachable_registry_gives_the_daemon_proxy_fix(tmp_path: Path) -> None:
    engine = docker_engine()
    ours = f"http://builder:{SECRET}@127.0.0.1:{free_port('127.0.0.1')}"
    assert _daemon_proxies(engine).get("HTTPS_PROXY") != ours
    ref = f"127.0.0.1:{free_port('127.0.0.1')}/ampforge/base:pulltest"  # nothing listens
    r = _cli_build(tmp_path, ref, {"HTTPS_PROXY": ours})
    assert r.rc == 1, r.err
    assert f"could not pull base image {ref}" in r.err and "connection refused" in r.err
    assert "does not see this shell's proxy" in r.err
    # The exact fix, password masked: the drop-in, its line, the two systemctl commands.
    assert DROP_IN in r.err and "[Service]" in r.err
    masked = ours.replace(SECRET, "***")
    assert f'Environment="HTTPS_PROXY={masked}"' in r.err
    assert "daemon-reload && sudo systemctl restart docker" in r.err
    assert SECRET not in r.out + r.err


@pytest.mark.docker
def test_unreachable_registry_with_agreeing_proxies_blames_no_proxy(tmp_path: Path) -> None:
    engine = docker_engine()
    ref = f"127.0.0.1:{free_port('127.0.0.1')}/ampforge/base:pulltest"
    r = _cli_build(tmp_path, ref, _daemon_proxies(engine))  # the engine's own proxies
    assert r.rc == 1, r.err
    assert "agrees with yours" in r.err and "not the cause" in r.err
    assert DROP_IN not in r.err


@pytest.mark.docker
def test_never_pulls_nothing_and_says_how(pushed, tmp_path: Path) -> None:
    engine, _, ref, _ = pushed
    engine.remove_image(ref)
    cfg = write_config(tmp_path, BASE_CONFIG + f"images:\n  X86:\n    base: {ref}\n")
    r = run_cli(
        "plan",
        "--config",
        str(cfg),
        "--arch",
        "X86",
        "--python",
        "3.11",
        "--torch",
        "2.13.0",
        "--backend",
        "docker",
        "--pull",
        "never",
    )
    assert r.rc == 0, r.err
    assert "not buildable on this host" in r.out and "--pull never" in r.out
    assert engine.image_id(ref) is None
    # auto with the image missing prefers a backend that needs no pull (this host's Python).
    r = run_cli(
        "plan",
        "--config",
        str(cfg),
        "--arch",
        "X86",
        "--python",
        "3.11",
        "--torch",
        "2.13.0",
        "--format",
        "json",
    )
    assert r.rc == 0, r.err
    assert '"backend": "host"' in r.out and "a docker build pulls it first" in r.out


@pytest.mark.docker
def test_doctor_says_the_build_pulls_a_missing_base_image(tmp_path: Path) -> None:
    docker_engine()
    ref = f"127.0.0.1:{free_port('127.0.0.1')}/ampforge/base:absent"
    cfg = write_config(tmp_path, BASE_CONFIG + f"images:\n  X86:\n    base: {ref}\n")
    sel = (
        "--config",
        str(cfg),
        "--arch",
        "X86",
        "--python",
        "3.11",
        "--torch",
        "2.13.0",
        "--backend",
        "docker",
        "--format",
        "json",
    )
    checks = {c["name"]: c for c in json.loads(run_cli("doctor", *sel).out)["checks"]}
    line = checks["base image X86"]
    assert line["status"] == "WARN" and "the build pulls it first: --pull missing" in line["detail"]
    checks = {
        c["name"]: c for c in json.loads(run_cli("doctor", *sel, "--pull", "never").out)["checks"]
    }
    # never: no docker cell can be built here (see plan), and nothing is said to be pulled
    assert "pulls it" not in checks["base image X86"]["detail"]
    cell = checks["cell cp311-manylinux_x86_64-torch2.13.0"]
    assert cell["status"] == "FAIL" and "--pull never" in cell["detail"]
