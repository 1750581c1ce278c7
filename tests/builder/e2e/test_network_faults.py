"""Networks that lie (issue 27, part 5): a proxy that resets connections, one that accepts and
never answers, an index that serves a wheel whose bytes do not match its hash -- real servers on
loopback (tests/builder/helpers/netfaultlib.py), real pip, driven through the builder's own runner
(builder/netpip.py) with its network settings loaded the way the command line loads them."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from helpers.builder_testlib import run_cli
from helpers.indexlib import clean_pip_env, make_wheel
from helpers.netfaultlib import faulty_proxy, lying_index
from helpers.proxylib import serve_index, write_index

from builder.backends.pipenv import pip_env
from builder.config import load_settings
from builder.errors import StepFailed
from builder.netpip import NetworkOptions, run_pip


def network(**env: str) -> NetworkOptions:
    return load_settings(env=env).config.pip.network


def download(
    index_url: str, dest: Path, net: NetworkOptions, log: Path, proxy: str | None = None
) -> str:
    env = clean_pip_env(PIP_NO_CACHE_DIR="1", PIP_INDEX_URL=index_url)
    if proxy:
        env.update(HTTP_PROXY=proxy, http_proxy=proxy)
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(dest), "tiny"]
    with log.open("w") as fh:
        return run_pip(argv, env, net, fh, lambda s: s, "pip download of tiny")


@pytest.fixture(scope="module")
def tiny_index(tmp_path_factory: pytest.TempPathFactory):
    folder = tmp_path_factory.mktemp("tiny-index")
    make_wheel(folder / "wheelhouse", "tiny", "1.0")
    with serve_index(write_index(folder / "wheelhouse", folder / "index")) as index:
        yield index


def test_defaults_suit_a_flaky_proxy() -> None:
    net = network()
    assert (net.retries, net.timeout) == (6, 30.0)  # builder/config/defaults.yaml
    assert net.env() == {"PIP_RETRIES": "6", "PIP_TIMEOUT": "30", "PIP_DEFAULT_TIMEOUT": "30"}


def test_the_settings_reach_every_pip_the_builds_run(tmp_path: Path) -> None:
    """The host, cross and smoke steps' pip environment (builder.backends.pipenv) carries
    them; the real pip honouring them is what the tests below show."""
    config = load_settings(env={"BUILDER_PIP_RETRIES": "3", "BUILDER_PIP_TIMEOUT": "2.5"}).config
    env = pip_env(config, {}, tmp_path / "ca")
    assert (env["PIP_RETRIES"], env["PIP_TIMEOUT"], env["PIP_DEFAULT_TIMEOUT"]) == (
        "3",
        "2.5",
        "2.5",
    )
    assert config.origins["pip_retries"] == "environment BUILDER_PIP_RETRIES"


@pytest.mark.parametrize(
    "var,value,fragment",
    [
        ("BUILDER_PIP_RETRIES", "many", "expected a whole number of retries from 0 to 100"),
        ("BUILDER_PIP_TIMEOUT", "-5", "expected a timeout in seconds above 0 and at most 3600"),
    ],
)
def test_bad_network_settings_exit_2(var: str, value: str, fragment: str) -> None:
    res = run_cli("plan", env={var: value})
    assert res.rc == 2, res.err
    assert f"environment {var}: {fragment}, got {value!r}" in res.err


@pytest.mark.promise(
    promise="a proxy that drops connections is retried with backoff, and the download arrives",
    fault="a loopback proxy that resets every second connection with a TCP RST",
    result="with the configured retries the wheel is downloaded whole; with none the step fails "
    "saying connections kept failing and which setting to raise",
)
def test_resets_are_retried(tiny_index, tmp_path: Path) -> None:
    with faulty_proxy(reset_every=2) as proxy:
        download(
            tiny_index.url,
            tmp_path / "ok",
            network(BUILDER_PIP_RETRIES="3", BUILDER_PIP_TIMEOUT="10"),
            tmp_path / "ok.log",
            proxy.url,
        )
        assert proxy.resets >= 1  # the fault happened, and was got through
    assert [p.name for p in (tmp_path / "ok").iterdir()] == ["tiny-1.0-py3-none-any.whl"]

    with faulty_proxy(reset_every=2) as proxy, pytest.raises(StepFailed) as failed:
        download(
            tiny_index.url,
            tmp_path / "no",
            network(BUILDER_PIP_RETRIES="0"),
            tmp_path / "no.log",
            proxy.url,
        )
    assert "connections kept failing after 0 retries" in failed.value.message
    assert "BUILDER_PIP_RETRIES" in failed.value.message
    assert not list((tmp_path / "no").glob("*.whl"))


@pytest.mark.promise(
    promise="a proxy that stops answering ends the step within the configured timeout, with a "
    "clear message, instead of hanging",
    fault="a loopback proxy that accepts every connection and never answers",
    result="pip gives up after pip.timeout per try; the step fails naming the stall, the "
    "timeout and the setting; nothing is downloaded",
)
def test_a_stall_ends_within_the_timeout(tiny_index, tmp_path: Path) -> None:
    net = network(BUILDER_PIP_RETRIES="1", BUILDER_PIP_TIMEOUT="1")
    start = time.monotonic()
    with faulty_proxy(stall=True) as proxy, pytest.raises(StepFailed) as failed:
        download(tiny_index.url, tmp_path / "d", net, tmp_path / "d.log", proxy.url)
    elapsed = time.monotonic() - start
    assert proxy.stalled >= 1
    assert "the network stalled: no answer within 1 s, 1 retries" in failed.value.message
    assert "BUILDER_PIP_TIMEOUT" in failed.value.message
    # Not a performance claim: the promise is that it ends. Two tries of 1 s each and pip's
    # start-up; a hang would run to pytest's own limit.
    assert elapsed < 60, elapsed
    assert not list((tmp_path / "d").glob("*.whl"))


@pytest.mark.promise(
    promise="a wheel whose bytes do not match the hash the index gives is refused, naming it",
    fault="an index whose page lists a wheel's sha256 while serving other bytes under its name",
    result="the download fails naming the file and both sha256s; the file is not kept",
)
def test_a_hash_mismatch_is_refused(tmp_path: Path) -> None:
    with lying_index(tmp_path / "liar", name="tiny") as liar, pytest.raises(StepFailed) as failed:
        download(liar.index.url, tmp_path / "d", network(), tmp_path / "d.log")
    message = failed.value.message
    assert f"hash mismatch: {liar.wheel_name} is not the file its sha256 names" in message
    assert liar.listed_sha256 in message
    assert not list((tmp_path / "d").glob("*.whl"))
