"""cibuildwheel's ``build-frontend`` values (issue 35): ``pip``, ``build``, ``build[uv]``, ``uv``
and the ``; args:`` / ``{name, args}`` forms -- parsed as cibuildwheel documents them, refused
with exit 2 naming the key, the value and the accepted forms; uv pinned once (configs/uv.txt),
pip's settings carried over to uv's variables; and real host builds of a tiny extension with
``build[uv]`` and ``uv`` (uv from the wheelhouse, offline) whose logs show uv at work, the
``; args:`` words on the frontend's command, and the wheel verified.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest
from helpers.enginelib import CACHE, filled_once, wheelhouse_cp311, write_tiny_extension
from helpers.indexlib import make_wheel
from helpers.pipelinelib import CELL, builder_env, manifest, one_cell_config, run_build

from builder.config.buildoptions import FRONTENDS, CibwOptions, parse_frontend
from builder.config.uvpin import parse_pin, pin_file, uv_pin
from builder.errors import ConfigError
from builder.incell import steps
from builder.incell.steps import frontend_argv, pip_configuration, uv_environment
from builder.offline.preflight import Target, cell_requirements, index_wheelhouse, resolve

FORMS = "one of pip, build, build[uv], uv"


@pytest.mark.parametrize(
    ("value", "name", "args"),
    [
        ("pip", "pip", ()),
        ("build", "build", ()),
        ("build[uv]", "build[uv]", ()),
        ("uv", "uv", ()),
        ("pip; args: --no-build-isolation", "pip", ("--no-build-isolation",)),
        ("build; args: --no-isolation", "build", ("--no-isolation",)),
        ("build[uv];args:-n -x", "build[uv]", ("-n", "-x")),
        ("uv; args: '-C a=b c' -v", "uv", ("-C a=b c", "-v")),
        ("uv; args: -v; args: --quiet", "uv", ("-v", "--quiet")),  # repeated: concatenated
        ("build; args: 'x;y'", "build", ("x;y",)),  # a quoted ; is part of a word
        ({"name": "pip", "args": ["--no-build-isolation"]}, "pip", ("--no-build-isolation",)),
        ({"name": "build[uv]", "args": "--no-isolation -x"}, "build[uv]", ("--no-isolation", "-x")),
        ({"name": "uv"}, "uv", ()),
    ],
)
def test_each_documented_form_parses(value: object, name: str, args: tuple[str, ...]) -> None:
    assert parse_frontend(value) == (name, args)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("poetry", "'poetry' is not a build frontend"),
        ("uv[build]", "'uv[build]' is not a build frontend"),
        ("Build", "'Build' is not a build frontend"),  # cibuildwheel's names are lower case
        ("", "'' is not a build frontend"),
        ("; args: -n", "'' is not a build frontend"),
        ("build; argz: -n", "'argz: -n'"),
        ("build; -n", "'-n'"),
        ("build; args: 'unclosed", "No closing quotation"),
        (3, "3 is not a build frontend"),
        ({"args": ["-n"]}, "no name"),
        ({"name": "pip", "arg": ["-n"]}, "unknown key arg"),
        ({"name": "pip", "args": [1]}, "is not a list of strings"),
        ({"name": "flit"}, "'flit' is not a build frontend"),
    ],
)
def test_bad_forms_name_the_accepted_ones(value: object, why: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_frontend(value)
    assert why in str(info.value) and FORMS in str(info.value), str(info.value)
    assert "'NAME; args: ARGS'" in str(info.value) and "{name = NAME" in str(info.value)


def _project(root: Path, cibuildwheel: str = "") -> Path:
    write_tiny_extension(root)
    if cibuildwheel:
        with open(root / "pyproject.toml", "a") as fh:
            fh.write("\n[tool.cibuildwheel]\n" + textwrap.dedent(cibuildwheel))
    return root


def _plan(tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "builder", "plan", *args],
        capture_output=True,
        text=True,
        env=builder_env(**env),
        cwd=tmp,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("where", "raw", "named", "shown"),
    [
        ("cli", "uv; argz: -v", "--build-frontend", "'argz: -v'"),
        ("env", "build[pip]", "BUILDER_BUILD_FRONTEND", "'build[pip]'"),
        ("config", "'pip; args: \"x'", "build-frontend", "'pip; args: \"x'"),
        ("config", "{name: pip, argv: [-v]}", "build-frontend", "{'name': 'pip', 'argv': ['-v']}"),
        ("pyproject", '{ name = "uv", args = [1] }', "tool.cibuildwheel.build-frontend", "[1]"),
        ("pyproject", '"hatch"', "tool.cibuildwheel.build-frontend", "'hatch'"),
    ],
)
def test_an_unsupported_value_exits_2_naming_key_value_and_forms(
    tmp_path: Path, where: str, raw: str, named: str, shown: str
) -> None:
    project = _project(tmp_path / "p", f"build-frontend = {raw}\n" if where == "pyproject" else "")
    config = one_cell_config(tmp_path, f"build-frontend: {raw}\n" if where == "config" else "")
    args = ["--project", str(project), "--config", str(config)]
    args += [f"--build-frontend={raw}"] if where == "cli" else []
    r = _plan(tmp_path, *args, **({"BUILDER_BUILD_FRONTEND": raw} if where == "env" else {}))
    assert r.returncode == 2, r.stdout + r.stderr
    assert named in r.stderr and FORMS in r.stderr, r.stderr
    assert shown in r.stderr, r.stderr  # the value, as given
    if where in ("config", "pyproject"):
        assert str(config if where == "config" else project / "pyproject.toml") in r.stderr


def test_plan_shows_the_frontend_its_args_and_the_uv_pin(tmp_path: Path) -> None:
    project = _project(tmp_path / "p", 'build-frontend = "build[uv]; args: --no-isolation"\n')
    config = one_cell_config(tmp_path)
    r = _plan(tmp_path, "--project", str(project), "--config", str(config), "--format", "json")
    assert r.returncode == 0, r.stderr
    (cell,) = json.loads(r.stdout)["cells"]
    opts = cell["build_options"]
    assert opts["build_frontend"] == "build[uv]"
    assert opts["build_frontend_args"] == ["--no-isolation"]
    assert opts["uv"] == uv_pin().requirements_line()  # a new pin: a new input key
    assert opts["uv"].startswith(f"uv=={uv_pin().version} --hash=sha256:")
    assert opts["sources"]["build-frontend"] == "pyproject.toml [tool.cibuildwheel]"
    # The command line's table form wins over pyproject's, as every layer does.
    r = _plan(
        tmp_path,
        "--project",
        str(project),
        "--config",
        str(config),
        "--build-frontend",
        "pip; args: --no-build-isolation",
    )
    assert r.returncode == 0, r.stderr
    assert (
        "option:  build-frontend: 'pip; args: --no-build-isolation' (command line --build-frontend)"
    ) in r.stdout, r.stdout


def test_keys_without_args_or_uv_stay_as_they_were() -> None:
    """Builds made before this change keep their input keys (no rebuild of every cell)."""
    for frontend in ("pip", "build"):
        key = CibwOptions(build_frontend=frontend).key()
        assert set(key) == {
            "environment",
            "environment_pass",
            "before_all",
            "before_build",
            "config_settings",
            "build_frontend",
            "repair_wheel_command",
        }
    assert set(FRONTENDS) == {"pip", "build", "build[uv]", "uv"}


def test_the_pin_is_one_line_with_a_hash_per_machine(tmp_path: Path) -> None:
    pin = uv_pin()
    assert pin_file().name == "uv.txt" and pin.version.startswith("0.13.")
    assert len(pin.hashes) == 2 and all(len(h) == len("sha256:") + 64 for h in pin.hashes)
    assert pin.requirements_line().startswith(f"uv=={pin.version} --hash=sha256:")
    for bad in (
        "",
        "uv>=0.13 --hash=sha256:" + "0" * 64,
        "uv==0.13.9",
        "uv==0.13.9 --hash=md5:abc",
        "uv==1\nbuild==1",
    ):
        with pytest.raises(ConfigError, match="expected"):
            parse_pin(bad, str(tmp_path / "uv.txt"))


def test_frontend_commands_take_the_args_last() -> None:
    settings = [("--build-option", "--x")]
    pip = frontend_argv("py", "pip", "/p", "/o", settings, ("--no-build-isolation",))
    assert (
        pip[-2:] == ["/p", "--no-build-isolation"] and "--config-settings=--build-option=--x" in pip
    )
    for name in ("build", "build[uv]"):
        cmd = frontend_argv("py", name, "/p", "/o", settings, ("-n",))
        assert cmd[:6] == [
            "py",
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--skip-dependency-check",
        ] and cmd[-2:] == ["/p", "-n"]
        assert "--installer=uv" not in cmd  # never isolated: uv installs the tools instead
    uv = frontend_argv("py", "uv", "/p", "/o", settings, ("-v",), uv="/bin/uv")
    assert uv == [
        "/bin/uv",
        "build",
        "--wheel",
        "--no-build-isolation",
        "--python",
        "py",
        "--out-dir",
        "/o",
        "--config-setting=--build-option=--x",
        "/p",
        "-v",
    ]


def test_pip_settings_map_to_uv_variables() -> None:
    env = {
        "PIP_INDEX_URL": "https://u:pw@idx.example/simple",
        "PIP_EXTRA_INDEX_URL": "https://a.example/simple https://b.example/simple",
        "PIP_FIND_LINKS": "/w1 /w2",
        "PIP_CERT": "/ca.pem",
        "PIP_TIMEOUT": "2.5",
        "PIP_DEFAULT_TIMEOUT": "99",
        "PIP_RETRIES": "7",
        "PIP_TRUSTED_HOST": "h1 h2",
        "UV_HTTP_RETRIES": "1",
    }  # set by the caller: kept
    got, said = uv_environment(env, {"PIP_INDEX_URL": "https://conf.example/simple"})
    assert got == {
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_DEFAULT_INDEX": "https://u:pw@idx.example/simple",
        "UV_INDEX": "https://a.example/simple https://b.example/simple",
        "UV_FIND_LINKS": "/w1,/w2",
        "UV_INSECURE_HOST": "h1 h2",
        "SSL_CERT_FILE": "/ca.pem",
        "UV_HTTP_TIMEOUT": "2",
    }
    assert "UV_DEFAULT_INDEX from PIP_INDEX_URL" in said and "pw" not in " ".join(said)
    # pip's configuration files when the environment sets nothing; SSL_CERT_FILE kept.
    got, said = uv_environment(
        {"SSL_CERT_FILE": "/mine.pem"},
        {"PIP_EXTRA_INDEX_URL": "file:///x/simple", "PIP_CERT": "/c"},
    )
    assert got == {"UV_PYTHON_DOWNLOADS": "never", "UV_INDEX": "file:///x/simple"}
    assert said == ["UV_INDEX from pip.conf extra-index-url"]
    # A wheelhouse build: no index, uv offline (as the builder's pip gets no index then).
    got, _ = uv_environment(env, {}, offline=True)
    assert "UV_DEFAULT_INDEX" not in got and "UV_INDEX" not in got and got["UV_OFFLINE"] == "1"


def test_pip_configuration_files_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "pip.conf"
    conf.write_text(
        "[global]\nindex-url = https://g.example/simple\ntimeout = 5\n"
        "[install]\nindex-url = https://i.example/simple\n"
    )
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    got = pip_configuration(sys.executable)
    assert got["PIP_INDEX_URL"] == "https://i.example/simple"  # install. wins, as for install
    assert got["PIP_TIMEOUT"] == "5"
    assert pip_configuration(str(tmp_path / "no-python")) == {}


def _with_uv_frontends(dest: Path) -> None:
    """The cp311 wheelhouse plus pypa/build and its requirements and the pinned uv (pip checks
    the pin's hashes as it downloads)."""
    dest.mkdir(parents=True, exist_ok=True)
    for wheel in wheelhouse_cp311().glob("*.whl"):
        shutil.copy2(wheel, dest / wheel.name)
    pip = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--only-binary=:all:",
        "--dest",
        str(dest),
    ]
    subprocess.run([*pip, "build", "pyproject_hooks"], check=True, timeout=600)
    subprocess.run(
        [*pip, "--no-deps", "--require-hashes", "-r", str(pin_file())], check=True, timeout=600
    )


def _house() -> Path:
    return filled_once(
        CACHE / f"wheelhouse-cp311-uv-frontends-{uv_pin().version}", _with_uv_frontends
    )


def test_the_pinned_uv_installs_and_reads_the_mapped_index(tmp_path: Path) -> None:
    """The step's own install (pip, --require-hashes, offline from a wheelhouse), then
    ``uv pip install`` with only PIP_INDEX_URL set: uv finds a package that exists only on that
    index, so the mapping is what it used."""
    import argparse  # noqa: PLC0415

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = str(env_dir / "bin" / "python")
    house = _house()
    args = argparse.Namespace(
        uv_requirement=uv_pin().requirements_line(),
        out=str(tmp_path / "o"),
        wheelhouse=str(house),
        index_url=None,
        frontend="uv",
    )
    (tmp_path / "o").mkdir()
    # steps.py as the cell runs it: by its own interpreter, standard library only.
    step = subprocess.run(
        [
            py,
            "-c",
            "import argparse, importlib.util, sys; "
            "spec = importlib.util.spec_from_file_location('steps', sys.argv[1]); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            "print(m.install_uv(argparse.Namespace(**eval(sys.argv[2])), {}))",
            str(Path(steps.__file__)),
            repr(vars(args)),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert step.returncode == 0, step.stdout + step.stderr
    assert "--require-hashes" in step.stdout and f"uv {uv_pin().version}" in step.stdout
    index = tmp_path / "simple" / "ampforge-uvprobe"
    make_wheel(index, "ampforge-uvprobe", "4711")
    (index / "index.html").write_text(
        "".join(f'<a href="{w.name}">{w.name}</a>\n' for w in index.glob("*.whl"))
    )
    mapped, said = uv_environment({"PIP_INDEX_URL": (tmp_path / "simple").as_uri()}, {})
    assert said == ["UV_DEFAULT_INDEX from PIP_INDEX_URL"]
    uv = str(env_dir / "bin" / "uv")
    clean = {k: v for k, v in builder_env().items() if not k.startswith(("UV_", "PIP_"))}
    got = subprocess.run(
        [uv, "pip", "install", "--python", py, "ampforge-uvprobe"],
        capture_output=True,
        text=True,
        env={**clean, **mapped},
        timeout=300,
    )
    assert got.returncode == 0, got.stderr
    assert "+ ampforge-uvprobe==4711" in got.stderr, got.stderr


def test_the_offline_preflight_and_fetch_list_uv_for_its_frontends(tmp_path: Path) -> None:
    """What the frontend installs is part of the cell's requirements: a wheelhouse without the
    pinned uv is named before anything is built; the test wheelhouse has it."""
    uv = CibwOptions(build_frontend="uv").frontend_requirements()
    assert uv == [f"uv=={uv_pin().version}"]
    assert CibwOptions(build_frontend="build[uv]").frontend_requirements() == [*uv, "build"]
    assert CibwOptions().frontend_requirements() == []
    target = Target("3.11", "x86_64", "manylinux_2_28_x86_64", CELL)
    reqs = cell_requirements("2.13.0", frontend=[*uv, "build"])
    assert resolve(index_wheelhouse(_house()), target, reqs).ok
    missing = resolve(index_wheelhouse(wheelhouse_cp311()), target, reqs).missing
    assert {m.requirement for m in missing} == {*uv, "build"}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("frontend", "built_by"),
    [
        ('"build[uv]; args: --skip-dependency-check"', " -m build --wheel --no-isolation"),
        ('{ name = "uv", args = ["--verbose"] }', "/uv build --wheel --no-build-isolation"),
    ],
)
def test_a_host_build_with_a_uv_frontend(tmp_path: Path, frontend: str, built_by: str) -> None:
    """A tiny extension built by the host backend from a wheelhouse (offline) with the frontend
    its pyproject.toml names: the log shows the pinned uv installed with its hashes, found by
    before-build, uv's part (installing pypa/build, or building), the ``; args:`` words on the
    frontend's command, and the wheel repaired and import-checked."""
    house = _house()
    # before-build finds the pinned uv first on PATH, aimed at the build's interpreter.
    project = _project(
        tmp_path / "proj",
        f"build-frontend = {frontend}\n"
        """before-build = 'test "$UV_PYTHON" = "$(command -v python)" && """
        """uv --version | sed "s/^/before-build sees /"'\n""",
    )
    r = run_build(
        tmp_path,
        "--backend",
        "host",
        "--project",
        str(project),
        "--config",
        str(one_cell_config(tmp_path)),
        "--wheelhouse",
        str(house),
    )
    assert r.rc == 0, r.err[-4000:]
    log = (tmp_path / "work" / "logs" / f"{CELL}.log").read_text()
    version = uv_pin().version
    install = [x for x in log.splitlines() if "--require-hashes" in x]
    assert install and "-m pip install" in install[0] and "--no-index" in install[0], log[:3000]
    assert f"Successfully installed uv-{version}" in log
    assert f"+ uv: uv {version}" in log and "UV_OFFLINE (a wheelhouse build)" in log
    assert f"before-build sees uv {version}" in log, log[:4000]
    (command,) = [x for x in log.splitlines() if built_by in x and x.startswith("+ ")]
    name = "build[uv]" if "build[uv]" in frontend else "uv"
    assert f"+ build frontend: {name} (" in log and f"uv {version}" in log
    if name == "build[uv]":
        assert "/uv pip install --python " in log and "+ build==" in log  # uv installed build
        assert command.endswith("/project --skip-dependency-check"), command
        assert "+ build frontend args: --skip-dependency-check" in log
    else:
        assert command.endswith("/project --verbose"), command
        assert f"DEBUG uv {version}" in log  # --verbose reached uv itself
        assert "+ build frontend args: --verbose" in log
    assert "Fixed-up wheel written to" in log and "smoke: imported ['tinyext._C']" in log
    (entry,) = [e for e in manifest(tmp_path / "dist")["wheels"] if e["cell"] == CELL]
    recorded = entry["extra"]["resolved"]["build_options"]
    assert recorded["build_frontend"] == name
    assert recorded["uv"] == uv_pin().requirements_line()
