"""cibuildwheel's conventions, for users who bring its habits: selectors that combine as OR
with brace expansion, `--output-dir`, `--print-build-identifiers`, `--find-links` (old name
`--wheelhouse`), a proxy without a scheme, and `make matrix PARALLEL=`. Each case runs the
real command line in a subprocess (`python -m builder`, `make -n`) and checks its exit code
and what it prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from builder.config import REPO_ROOT, CliOverrides, load_settings
from builder.plan.cells import cell_id
from builder.plan.selectors import expand_braces

PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY")


def _env(**extra: str) -> dict[str, str]:
    """This environment minus the builder's and proxy variables (the host's own must not
    leak into what a case checks), plus *extra*."""
    drop = {*PROXY_VARS, *(v.lower() for v in PROXY_VARS)}
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUILDER_") and k not in drop}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env.update(extra)
    return env


def builder(*argv: str, cwd: Path = REPO_ROOT, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "builder", *argv],
        cwd=cwd,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def identifiers(*argv: str) -> list[str]:
    r = builder("plan", "--print-build-identifiers", *argv)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def plan_ids(*argv: str) -> list[str]:
    r = builder("plan", "--format", "json", *argv)
    assert r.returncode == 0, r.stderr
    return [c["id"] for c in json.loads(r.stdout)["cells"]]


# ------------------------------------------------------------------ selectors


def test_selectors_combine_as_or_like_cibuildwheels_build_option() -> None:
    # cibuildwheel's build = "cp39-* cp311-*": one string, space-separated, any of them.
    one_string = identifiers("cp39-* cp311-*", "--arch", "X86")
    assert one_string == [cell_id("X86", "3.9", "2.8.0")] + [
        cell_id("X86", "3.11", t) for t in ("2.8.0", "2.9.1", "2.13.0")
    ]
    # The same as separate arguments, and the same cells, in the same order, as `plan` lists.
    assert identifiers("cp39-*", "cp311-*", "--arch", "X86") == one_string
    assert plan_ids("cp39-* cp311-*", "--arch", "X86") == one_string


def test_braces_expand_inside_a_selector() -> None:
    assert expand_braces("cp3{11,12}-*") == ["cp311-*", "cp312-*"]
    assert expand_braces("cp3{1{1,2},9}-*") == ["cp311-*", "cp312-*", "cp39-*"]
    assert expand_braces("cp{}-{x}") == ["cp{}-{x}"]  # no comma: literal, as in bash
    braces = identifiers("cp3{11,12}-manylinux_x86_64-*")
    assert braces == identifiers("cp311-manylinux_x86_64-*", "cp312-manylinux_x86_64-*")
    assert {i.split("-")[0] for i in braces} == {"cp311", "cp312"} and len(braces) == 6


def test_a_selector_that_matches_nothing_is_a_usage_error_even_beside_a_good_one() -> None:
    r = builder("plan", "cp311-* cp27-*")
    assert r.returncode == 2
    assert "selector 'cp27-*' matches no cell; expected a pattern on identifiers like" in r.stderr
    assert r.stdout == ""


def test_arch_python_torch_still_narrow_the_selectors() -> None:
    ids = identifiers("cp39-* cp311-*", "--torch", "2.8.0", "--arch", "ARM")
    assert ids == [cell_id("ARM", "3.9", "2.8.0"), cell_id("ARM", "3.11", "2.8.0")]


# ------------------------------------------------------------------ print ids, output dir


def test_build_print_build_identifiers_prints_what_it_would_build_and_builds_nothing(
    tmp_path: Path,
) -> None:
    r = builder(
        "build",
        "--print-build-identifiers",
        "--all",
        "--arch",
        "X86",
        "cp3{11,13}-*",
        "--out",
        "dist",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    printed = r.stdout.splitlines()
    # Exactly the selected cells this host can build, as the resolved records say.
    doc = json.loads(builder("plan", "--format", "json", "--arch", "X86", "cp3{11,13}-*").stdout)
    assert printed == [c["id"] for c in doc["cells"] if c["buildable_here"]]
    assert printed and all(i.startswith(("cp311-", "cp313-")) for i in printed)
    assert not (tmp_path / "dist").exists() and not (tmp_path / "build").exists()
    # The default selection (`make wheel`): the one cell for this host.
    r = builder("build", "--print-build-identifiers", cwd=tmp_path)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 1, r.stderr


@pytest.mark.parametrize("command", ["build", "plan"])
def test_output_dir_is_out(tmp_path: Path, command: str) -> None:
    args = [command, "--arch", "X86", "--python", "3.11", "--torch", "2.13.0"]
    args += ["--dry-run"] if command == "build" else ["--format", "json"]
    records = {}
    for flag in ("--out", "--output-dir"):
        r = builder(*args, flag, str(tmp_path / "wheels"), cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        records[flag] = json.loads(r.stdout)["cells"][0]
    assert records["--output-dir"]["output"] == str(tmp_path / "wheels")
    assert records["--output-dir"] == records["--out"]


# ------------------------------------------------------------------ --find-links


def test_find_links_is_the_input_wheel_folder_and_wheelhouse_its_old_name(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    r = builder("build", "--backend", "host", "--find-links", str(missing), cwd=tmp_path)
    assert r.returncode == 2
    assert (
        f"command line --find-links: {missing} does not exist; expected an existing "
        "folder" in r.stderr
    )
    assert "note:" not in r.stderr
    old = builder("build", "--backend", "host", "--wheelhouse", str(missing), cwd=tmp_path)
    assert old.returncode == 2
    assert f"command line --find-links: {missing} does not exist" in old.stderr
    assert "note: --wheelhouse is now --find-links; the old name still works" in old.stderr
    assert not (tmp_path / "dist").exists()


# ------------------------------------------------------------------ proxy without a scheme


def test_a_proxy_without_a_scheme_is_taken_as_http_with_a_note(tmp_path: Path) -> None:
    r = builder(
        "plan",
        "--format",
        "json",
        "--arch",
        "X86",
        "--python",
        "3.11",
        "--torch",
        "2.13.0",
        HTTPS_PROXY="user:s3cretpw@proxy.corp:3128",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert (
        "note: HTTPS_PROXY (environment HTTPS_PROXY) has no scheme; taken as "
        "http://user:***@proxy.corp:3128, as pip and curl read it"
    ) in r.stderr
    record = json.loads(r.stdout)["cells"][0]
    assert "http://user:***@proxy.corp:3128" in json.dumps(record["proxy"])
    assert "s3cretpw" not in r.stdout + r.stderr
    # The command line, and a config file, the same way; a scheme given is left alone.
    r = builder(
        "plan",
        "--arch",
        "X86",
        "--python",
        "3.11",
        "--torch",
        "2.13.0",
        "--http-proxy",
        "proxy.corp:3128",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert (
        "note: HTTP_PROXY (command line --http-proxy) has no scheme; taken as "
        "http://proxy.corp:3128"
    ) in r.stderr
    r = builder(
        "plan",
        "--arch",
        "X86",
        "--python",
        "3.11",
        "--torch",
        "2.13.0",
        "--http-proxy",
        "http://proxy.corp:3128",
        cwd=tmp_path,
    )
    assert r.returncode == 0 and "note: HTTP" not in r.stderr, r.stderr
    # What reaches the build (Docker's build arguments, pip on the host) carries the scheme.
    settings = load_settings(CliOverrides(https_proxy="proxy.corp:3128"), env={})
    assert settings.config.proxy.build_args()["HTTPS_PROXY"] == "http://proxy.corp:3128"


def test_a_proxy_without_a_scheme_in_the_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "matrix.yaml"
    cfg.write_text(
        'matrix:\n  arch: [X86]\n  python: ["3.11"]\n  torch: ["2.13.0"]\n'
        "proxy:\n  https_proxy: proxy.corp:3128\n"
    )
    r = builder("plan", "--config", str(cfg), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (
        f"note: HTTPS_PROXY (config file {cfg}) has no scheme; taken as http://proxy.corp:3128"
    ) in r.stderr


def test_a_proxy_with_a_scheme_the_builder_cannot_use_is_still_exit_2(tmp_path: Path) -> None:
    r = builder("plan", "--https-proxy", "ftp://proxy.corp:21", cwd=tmp_path)
    assert r.returncode == 2
    assert (
        "--https-proxy: proxy URL has no supported scheme; expected http://, https://, "
        "socks5:// or socks5h://"
    ) in r.stderr


# ------------------------------------------------------------------ make matrix


def test_make_matrix_passes_parallel_jobs_and_find_links() -> None:
    """`make -n`: the command make would run, nothing built (-o builder-env: no set-up)."""
    env = {k: v for k, v in _env().items() if k not in ("MAKEFLAGS", "JOBS", "PARALLEL")}
    r = subprocess.run(
        [
            "make",
            "-n",
            "-o",
            "builder-env",
            "matrix",
            "PARALLEL=3",
            "JOBS=2",
            "WHEELHOUSE=/srv/wheels",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    text = r.stdout.replace("\\\n", " ")  # make -n shows the recipe's continuation lines
    line = next(ln for ln in text.splitlines() if "-m builder build" in ln)
    assert "--all --keep-going" in line and "--parallel 3" in line and "--jobs 2" in line
    assert "--find-links /srv/wheels" in line and "--wheelhouse" not in line
    r = subprocess.run(
        ["make", "-n", "-o", "builder-env", "matrix"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and "--parallel" not in r.stdout, r.stdout
