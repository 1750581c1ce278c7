"""The locally built, manylinux-shaped base image (no registry is reachable)."""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path

import pytest
from helpers.enginelib import docker_engine

from builder.errors import ConfigError, StepFailed
from builder.images.base_image import BaseImageSpec, build_base_image, host_debian_mirror

# -- the Debian mirror comes from the host's APT sources --------------------------------------


def _apt(tmp_path: Path, files: dict[str, str]) -> Path:
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    for name, text in files.items():
        (apt / name).write_text(text)
    return apt


def test_mirror_from_deb822_sources_skips_security_and_disabled(tmp_path: Path) -> None:
    apt = _apt(
        tmp_path,
        {
            "sources.list.d/debian.sources": (
                "Types: deb\nURIs: http://mirror.example.test/debian-security\n"
                "Suites: bookworm-security\nComponents: main\n\n"
                "Types: deb\n# a comment\nURIs: http://mirror.example.test/debian\n"
                "Suites: bookworm bookworm-updates\nComponents: main contrib\n"
            ),
            "sources.list.d/other.sources.disabled": (
                "Types: deb\nURIs: http://wrong.example.test/\nSuites: bookworm\nComponents: main\n"
            ),
        },
    )
    assert host_debian_mirror("bookworm", apt) == "http://mirror.example.test/debian"
    # Another suite of the same archive: the plain Debian source is still the answer.
    assert host_debian_mirror("bullseye", apt) == "http://mirror.example.test/debian"


def test_mirror_from_one_line_list_with_options(tmp_path: Path) -> None:
    apt = _apt(
        tmp_path,
        {
            "sources.list": (
                "# deb http://commented.example.test/debian bookworm main\n"
                "deb [arch=amd64 signed-by=/k.gpg] http://one.example.test/debian bullseye main\n"
                "deb http://two.example.test/debian bookworm main\n"
            )
        },
    )
    assert host_debian_mirror("bookworm", apt) == "http://two.example.test/debian"
    assert host_debian_mirror("bullseye", apt) == "http://one.example.test/debian"


def test_no_mirror_is_a_config_error_naming_the_option(tmp_path: Path) -> None:
    apt = _apt(tmp_path, {"sources.list": "deb https://example.test/apt nodistro main\n"})
    with pytest.raises(ConfigError, match="--mirror URL") as err:
        host_debian_mirror("bookworm", apt)
    assert err.value.return_code == 2


# -- the content key ---------------------------------------------------------------------------


def test_key_changes_with_content_not_order() -> None:
    a = BaseImageSpec(packages=("python3", "g++"), auditwheel_version="6.8.2")
    b = BaseImageSpec(packages=("g++", "python3"), auditwheel_version="6.8.2")
    c = BaseImageSpec(packages=("g++", "python3", "make"), auditwheel_version="6.8.2")
    d = BaseImageSpec(suite="bullseye", packages=("g++", "python3"), auditwheel_version="6.8.2")
    assert a.key() == b.key()
    assert len({a.key(), c.key(), d.key()}) == 3
    assert a.tag.startswith("ampforge/base:bookworm-amd64-")


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"suite": "Bookworm; rm -rf /"}, "suite"),
        ({"arch": "sparc"}, "arch"),
        ({"packages": ("python3", "g++ make")}, "packages"),
    ],
)
def test_bad_spec_is_rejected(kwargs: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        BaseImageSpec(**kwargs)  # type: ignore[arg-type]


# -- the real thing -----------------------------------------------------------------------------


@pytest.mark.docker
@pytest.mark.slow
def test_base_image_is_manylinux_shaped_and_cached(tmp_path: Path) -> None:
    engine = docker_engine()
    first = build_base_image(engine, work_root=tmp_path)
    assert first.python_tag == "cp311"
    assert first.auditwheel_plat.startswith("manylinux_2_") and first.auditwheel_plat.endswith(
        "_x86_64"
    )
    probe = (
        "import json,os,subprocess,sys;"
        "print(json.dumps({'plat': os.environ['AUDITWHEEL_PLAT'], 'py': sys.version_info[:2],"
        "'aw': subprocess.run(['auditwheel','--version'],capture_output=True,text=True).stdout,"
        "'pe': subprocess.run(['patchelf','--version'],capture_output=True,text=True).stdout}))"
    )
    with engine.container(first.tag) as session:
        res = session.run(["/opt/python/cp311-cp311/bin/python", "-c", probe])
        gxx = session.run(["g++", "--version"])
    info = json.loads(res.tail[-1])
    assert info["plat"] == first.auditwheel_plat
    assert info["py"] == [3, 11]
    assert f"auditwheel {version('auditwheel')}" in info["aw"]
    major, minor = (int(x) for x in info["pe"].split()[1].split(".")[:2])
    assert (major, minor) >= (0, 17)
    assert gxx.ok
    # Nothing of the temporary root filesystem is left behind.
    assert list(tmp_path.iterdir()) == []

    seen: list[str] = []
    second = build_base_image(engine, work_root=tmp_path, progress=seen.append)
    assert second.reused and second.image_id == first.image_id
    assert seen == []  # no debootstrap, no import, no build


@pytest.mark.docker
def test_failed_debootstrap_leaves_nothing_behind(tmp_path: Path) -> None:
    engine = docker_engine()
    spec = BaseImageSpec(packages=("python3", "ampforge-no-such-package"))
    with pytest.raises(StepFailed, match="debootstrap"):
        # Port 9 (discard) refuses at once: the failure is immediate and local.
        build_base_image(engine, spec, mirror="http://127.0.0.1:9/debian", work_root=tmp_path)
    assert list(tmp_path.iterdir()) == []
    assert engine.image_id(spec.tag) is None
    mounts = Path("/proc/mounts").read_text()
    assert str(tmp_path) not in mounts
