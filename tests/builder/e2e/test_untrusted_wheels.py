"""Wheels from elsewhere into ``merge``, ``index`` and ``publish`` (and a wheelhouse): whatever a
broken or malicious one holds, it is refused before anything is written, naming the file and the
entry. Each hostile wheel is a real zip made from a good one with one thing changed; the good
one passes, so each refusal is about that one thing."""

from __future__ import annotations

import base64
import hashlib
import json
import stat
import zipfile
from pathlib import Path

import pytest
from helpers.indexlib import make_wheel

from builder.cli import main
from builder.wheel.integrity import wheel_problem
from builder.wheel.untrusted import release_problems


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _members(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def _write(
    path: Path, members: list[tuple[zipfile.ZipInfo | str, bytes]], record: bool = True
) -> Path:
    """A wheel of *members*, with a true RECORD (unless *record* is False: as given)."""
    info_dir = next(
        str(n if isinstance(n, str) else n.filename).split("/")[0]
        for n, _ in members
        if str(n if isinstance(n, str) else n.filename).endswith("/METADATA")
    )
    rows = [
        m
        for m in members
        if str(m[0] if isinstance(m[0], str) else m[0].filename) != f"{info_dir}/RECORD"
    ]
    if record:
        lines = [
            f"{n if isinstance(n, str) else n.filename},{_digest(d)},{len(d)}" for n, d in rows
        ]
        rows.append(
            (f"{info_dir}/RECORD", ("\n".join(lines) + f"\n{info_dir}/RECORD,,\n").encode())
        )
    else:
        rows = members
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in rows:
            zf.writestr(name, data)
    return path


def _good(tmp: Path) -> tuple[Path, list[tuple[zipfile.ZipInfo | str, bytes]]]:
    wheel = make_wheel(tmp / "src", "fleetpkg", "1.0")
    members = [(n, d) for n, d in _members(wheel).items()]
    return wheel, members


def _hostile(tmp: Path, case: str) -> Path:
    wheel, members = _good(tmp)
    out = tmp / "in"
    out.mkdir(exist_ok=True)
    target = out / wheel.name
    if case == "dotdot":
        return _write(target, [*members, ("fleetpkg/../../evil.py", b"print('out')\n")])
    if case == "absolute":
        return _write(target, [*members, ("/etc/evil.conf", b"x\n")])
    if case == "symlink":
        link = zipfile.ZipInfo("fleetpkg/passwd")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        return _write(target, [*members, (link, b"/etc/passwd")])
    if case == "duplicate":
        first = next(n for n, _ in members if str(n).endswith("__init__.py"))
        with pytest.warns(UserWarning, match="Duplicate name"):
            return _write(target, [*members, (first, b"VERSION = 'other'\n")])
    if case == "record-lies":
        path = _write(target, members)
        data = _members(path)
        init = next(n for n in data if n.endswith("__init__.py"))
        data[init] = b"import os; os.system('true')\n"  # RECORD keeps the old hash
        return _write(target, list(data.items()), record=False)
    if case == "unlisted":
        path = _write(target, members)
        return _write(
            target, [*_members(path).items(), ("fleetpkg/extra.py", b"x = 1\n")], record=False
        )
    if case == "metadata-name":
        swapped = [
            (
                n,
                d.replace(b"Name: fleetpkg", b"Name: otherpkg")
                if str(n).endswith("/METADATA")
                else d,
            )
            for n, d in members
        ]
        return _write(target, swapped)
    if case == "bad-name":
        return _write(out / "fleetpkg.whl", members)
    if case == "bomb":
        return _write(target, [*members, ("fleetpkg/zeros.bin", bytes(100 << 20))])
    raise AssertionError(case)


EXPECTED = {
    "dotdot": "entry 'fleetpkg/../../evil.py': a '..' segment",
    "absolute": "entry '/etc/evil.conf': an absolute path",
    "symlink": "entry 'fleetpkg/passwd': a symbolic link",
    "duplicate": "fleetpkg/__init__.py': listed twice",
    "record-lies": "fleetpkg/__init__.py': fleetpkg-1.0.dist-info/RECORD records sha256=",
    "unlisted": "entry 'fleetpkg/extra.py' is not in fleetpkg-1.0.dist-info/RECORD",
    "metadata-name": "METADATA says 'otherpkg' '1.0', its file name fleetpkg 1.0",
    "bad-name": "its file name does not parse as a wheel's",
    "bomb": "entry 'fleetpkg/zeros.bin': unpacks to 104857600 bytes from",
}


def test_the_good_wheel_passes(tmp_path: Path) -> None:
    wheel, members = _good(tmp_path)
    assert release_problems(wheel) == []
    assert release_problems(_write(tmp_path / wheel.name, members)) == []


@pytest.mark.promise(
    promise="a wheel from elsewhere is refused by merge, index and publish before anything is "
    "written, naming the file and the entry",
    fault="a wheel with a '..' or absolute entry, a symlink, a name listed twice, a RECORD that "
    "lies or misses an entry, METADATA for another project, a name that does not parse, a "
    "member that unpacks to 100 MB from a few hundred bytes",
    result="exit 1 with the wheel and the entry named; the output folder is not made",
)
@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_a_hostile_wheel_is_refused_by_index_and_merge(tmp_path: Path, capsys, case: str) -> None:
    wheel = _hostile(tmp_path, case)
    assert any(EXPECTED[case] in p for p in release_problems(wheel)), release_problems(wheel)
    out = tmp_path / "index-out"
    assert main(["index", str(wheel.parent), "--out", str(out)], env={}) == 1
    err = capsys.readouterr().err
    assert f"{wheel.name}: " in err and EXPECTED[case] in err, err
    assert not out.exists()
    (wheel.parent / "manifest.json").write_text(json.dumps({"wheels": []}))
    release = tmp_path / "release"
    assert main(["merge", str(wheel.parent), "--out", str(release)], env={}) == 1
    err = capsys.readouterr().err
    assert EXPECTED[case] in err and not release.exists(), err


@pytest.mark.parametrize("case", ["dotdot", "absolute", "symlink", "bomb"])
def test_a_wheelhouse_wheel_with_unsafe_members_is_damaged(tmp_path: Path, case: str) -> None:
    """The cheap check every wheel taken in gets (wheelhouses, bundles, torch's own)."""
    problem = wheel_problem(_hostile(tmp_path, case))
    assert problem is not None and EXPECTED[case] in problem, problem


# -- a cell's own output, before repair ---------------------------------------------------------

HOSTILE_BACKEND = '''\
"""An in-tree PEP 517 backend whose wheel holds what the case names."""
import os, zipfile

CASE = {case!r}
NAME = "hostile-1.0-py3-none-any.whl"


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    info = "hostile-1.0.dist-info"
    with zipfile.ZipFile(os.path.join(wheel_directory, NAME), "w") as zf:
        zf.writestr("hostile/__init__.py", "")
        if CASE == "dotdot":
            zf.writestr("hostile/../../escaped.py", "print('out')\\n")
        zf.writestr(info + "/METADATA", "Metadata-Version: 2.1\\nName: hostile\\nVersion: 1.0\\n")
        zf.writestr(info + "/WHEEL", "Wheel-Version: 1.0\\nGenerator: hostile\\n"
                    "Root-Is-Purelib: true\\nTag: py3-none-any\\n")
        # "record-lies": RECORD names a digest no member has (and lists no other member).
        zf.writestr(info + "/RECORD", "hostile/__init__.py,sha256=AAAA,0\\n" + info
                    + "/RECORD,,\\n")
    return NAME
'''


@pytest.mark.slow
@pytest.mark.promise(
    promise="a wheel the project's own build makes is checked before the builder rewrites, "
    "repairs or verifies it: a hostile one fails the cell naming the entry, and "
    "nothing is written outside the build's folders",
    fault="a project whose PEP 517 backend writes a wheel with a '../../' entry, or with a "
    "RECORD that lies",
    result="build exits 1 naming the wheel and the entry; dist/ keeps only what it had; no "
    "escaped file anywhere",
)
@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("dotdot", "entry 'hostile/../../escaped.py': a '..' segment"),
        ("record-lies", "hostile/__init__.py': hostile-1.0.dist-info/RECORD records sha256="),
    ],
)
def test_a_hostile_wheel_from_the_projects_own_build_fails_the_cell(
    tmp_path: Path, case: str, expected: str
) -> None:
    from helpers.enginelib import wheelhouse_cp311  # noqa: PLC0415 - the slow tests' helpers
    from helpers.pipelinelib import dist_state, run_build, seed_dist  # noqa: PLC0415

    project = tmp_path / "proj"
    project.mkdir()
    (project / "hostile_backend.py").write_text(HOSTILE_BACKEND.format(case=case))
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "hostile_backend"\nbackend-path = ["."]\n'
    )
    before = seed_dist(tmp_path / "dist")
    r = run_build(
        tmp_path,
        "--backend",
        "host",
        "--project",
        str(project),
        "--wheelhouse",
        str(wheelhouse_cp311()),
    )
    assert r.rc == 1, r.err[-3000:]
    assert (
        "the project's build made hostile-1.0-py3-none-any.whl, which is not a wheel this "
        "builder repairs or releases"
    ) in r.err, r.err[-3000:]
    assert expected in r.err, r.err[-3000:]
    assert "Traceback" not in r.err
    assert dist_state(tmp_path / "dist") == before
    assert not list(tmp_path.parent.rglob("escaped.py"))
