"""`python -m builder doctor` against this machine: its real engine, a real container for the
TLS probe, a real missing socket for the FAIL case. Each run is a subprocess, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.enginelib import docker_engine

from builder.config import REPO_ROOT
from builder.config.proxy import ProxySettings
from builder.engines.daemon_proxy import DROP_IN, ROOTLESS_DROP_IN, compare, daemon_proxy, fix_text
from builder.images.base_image import build_base_image

HOST_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
NAMES = {
    "engine",
    "engine proxy",
    "CA trust in a container",
    "base image X86",
    "debootstrap",
    "disk space",
    "caches",
    "auditwheel + patchelf",
    "cells",
}


def doctor(*argv: str, **env: str) -> tuple[int, dict, str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("BUILDER_")
        and k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
    }
    base["PYTHONPATH"] = str(REPO_ROOT)
    r = subprocess.run(
        [sys.executable, "-m", "builder", "doctor", "--format", "json", *argv],
        cwd=REPO_ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads(r.stdout)
    return r.returncode, doc, r.stderr


def by_name(doc: dict) -> dict[str, dict]:
    return {c["name"]: c for c in doc["checks"]}


def test_report_structure_and_the_engine_here() -> None:
    docker_engine()  # CI starts dockerd: there the engine must answer
    rc, doc, _ = doctor()
    assert set(doc) == {"ok", "exit_code", "checks"}
    assert doc["exit_code"] == rc and doc["ok"] == (rc == 0)
    for c in doc["checks"]:
        assert set(c) == {"name", "status", "detail", "fix"}
        assert c["status"] in ("OK", "WARN", "FAIL") and c["detail"]
        if c["status"] != "OK":
            assert c["fix"] or "see engine" in c["detail"] or "could not check" in c["detail"]
    assert rc == (1 if any(c["status"] == "FAIL" for c in doc["checks"]) else 0)
    checks = by_name(doc)
    assert NAMES <= set(checks), set(checks)
    assert checks["engine"]["status"] == "OK"
    assert checks["engine"]["detail"].startswith(("docker ", "podman ")), checks["engine"]
    assert "auditwheel " in checks["auditwheel + patchelf"]["detail"]
    assert checks["cells"]["status"] == "OK" and "buildable here" in checks["cells"]["detail"]


def test_an_engine_that_does_not_answer_is_a_fail_with_the_fix(tmp_path: Path) -> None:
    missing = f"unix://{tmp_path}/no-docker.sock"
    rc, doc, _ = doctor(DOCKER_HOST=missing)
    engine = by_name(doc)["engine"]
    assert rc == 1 and doc["ok"] is False
    assert engine["status"] == "FAIL"
    assert engine["detail"].startswith(f"no container engine answers at {missing}")
    assert "dockerd" in engine["fix"] and "--backend host" in engine["fix"]
    # The table says the same, with the fix under the line.
    r = subprocess.run(
        [sys.executable, "-m", "builder", "doctor"],
        cwd=REPO_ROOT,
        env={**os.environ, "DOCKER_HOST": missing, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("FAIL  engine "))
    assert lines[i + 1].strip().startswith("fix: ")
    assert lines[-1].endswith("FAIL: fix the FAIL lines before building")
    # Building without containers does not need one: the same finding is a WARN.
    _, doc, _ = doctor("--backend", "host", DOCKER_HOST=missing)
    assert by_name(doc)["engine"]["status"] == "WARN"
    assert "not needed: --backend host" in by_name(doc)["engine"]["detail"]


def test_ca_trust_probe_from_a_container() -> None:
    """The probe runs in the local base image (built here, or reused by content), with the
    host's CA bundle: it must verify. Without a bundle the image's own store decides; when it
    does not trust the index's certificate (an intercepting proxy) the line is a FAIL for a
    docker build, with the fix."""
    if not HOST_BUNDLE.is_file():
        pytest.skip(f"no {HOST_BUNDLE} on this host to give the probe")
    build_base_image(docker_engine())
    args = ("--base-image", "local", "--probe-timeout", "15")
    rc, doc, _ = doctor(*args, "--ca-bundle", str(HOST_BUNDLE))
    ca = by_name(doc)["CA trust in a container"]
    assert ca["status"] == "OK", ca
    assert ca["detail"].startswith("TLS verified: https://")
    assert f"CA bundle {HOST_BUNDLE}" in ca["detail"]
    rc, doc, _ = doctor(*args)
    ca = by_name(doc)["CA trust in a container"]
    assert "the image trust store only" in ca["detail"]
    if ca["status"] != "OK":
        assert ca["status"] == "FAIL" and rc == 1, ca
        assert "CERTIFICATE_VERIFY_FAILED" in ca["detail"]
        assert "--ca-bundle PEM" in ca["fix"] and "BUILDER_CA_BUNDLE" in ca["fix"]


def test_engine_proxy_against_a_shell_proxy_says_how_to_give_it_to_the_daemon() -> None:
    engine = docker_engine()
    if engine.api.info().get("HttpsProxy"):
        pytest.skip("this engine has its own HTTPS proxy; the case needs one without")
    _, doc, err = doctor(
        "--backend", "host", HTTPS_PROXY="http://builder:s3cretpw@proxy.corp.example:3128"
    )
    line = by_name(doc)["engine proxy"]
    assert line["status"] == "WARN"
    assert (
        "HTTPS_PROXY: yours http://builder:***@proxy.corp.example:3128, the engine's none"
        in line["detail"]
    )
    assert DROP_IN in line["fix"] or "containers.conf" in line["fix"]
    assert (
        'Environment="HTTPS_PROXY=http://builder:***@proxy.corp.example:3128"' in line["fix"]
        or engine.is_podman
    )
    assert "s3cretpw" not in json.dumps(doc) + err


def test_fix_text_per_engine_kind() -> None:
    user = ProxySettings(
        values={"https_proxy": "http://u:pw1234@p.example:3128", "no_proxy": "localhost"},
        origins={},
    )
    docker = daemon_proxy({"HttpsProxy": "", "SecurityOptions": ["name=seccomp"]})
    same, described = compare(docker, user)
    assert not same and "yours http://u:***@p.example:3128, the engine's none" in described
    text = fix_text(user, docker)
    assert (
        DROP_IN in text and "sudo systemctl daemon-reload && sudo systemctl restart docker" in text
    )
    assert 'Environment="NO_PROXY=localhost"' in text and "pw1234" not in text
    rootless = daemon_proxy({"SecurityOptions": ["name=seccomp", "name=rootless"]})
    text = fix_text(user, rootless)
    assert ROOTLESS_DROP_IN in text and "systemctl --user restart docker" in text
    podman = daemon_proxy({}, podman=True)
    assert 'env = ["HTTPS_PROXY=http://u:***@p.example:3128", "NO_PROXY=localhost"]' in fix_text(
        user, podman
    )
    # Docker shows a daemon's password masked: the same proxy still compares equal.
    masked = daemon_proxy({"HttpsProxy": "http://u:xxxxx@p.example:3128"})
    assert compare(
        masked, ProxySettings(values={"https_proxy": "http://u:pw1234@p.example:3128"}, origins={})
    )[0]
