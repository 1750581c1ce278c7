"""The test device's build cache (npu_device.build_and_load): keyed, atomic, safe when two
sessions race, never required. The compiler is replaced by a stub that writes a file, so
these tests check the cache logic itself; the real build is the session fixture's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import npu_device
import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


class FakeBuild:
    """Stands in for the compiler and for torch.ops.load_library."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.compiled: list[Path] = []
        self.loaded: list[Path] = []
        self.before_finish: list[Path] = []  # a final folder "another session" fills first
        monkeypatch.setattr(npu_device, "_compile_and_load", self.compile)
        monkeypatch.setattr(torch.ops, "load_library", lambda p: self.loaded.append(Path(p)))

    def compile(self, into: Path) -> None:
        self.compiled.append(into)
        (into / f"{npu_device.LIB_NAME}.so").write_text(f"built in {into.name}")
        for final in self.before_finish:
            final.mkdir()
            (final / f"{npu_device.LIB_NAME}.so").write_text("the other session's build")


def test_cold_build_lands_atomically_under_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeBuild(monkeypatch)
    lib, built, _ = npu_device.build_and_load(tmp_path)
    key = npu_device.cache_key()
    assert built
    assert lib == tmp_path / key / f"{npu_device.LIB_NAME}.so"
    assert len(fake.compiled) == 1 and fake.compiled[0].parent == tmp_path
    # The temporary build folder was renamed into place: nothing else is left.
    assert [p.name for p in tmp_path.iterdir()] == [key]
    assert fake.loaded == []  # torch's JIT loader already loaded the fresh build


def test_warm_start_loads_without_compiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeBuild(monkeypatch)
    npu_device.build_and_load(tmp_path)
    lib, built, seconds = npu_device.build_and_load(tmp_path)
    assert not built and seconds == 0.0
    assert len(fake.compiled) == 1
    assert fake.loaded == [lib]


def test_losing_a_race_keeps_the_winners_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeBuild(monkeypatch)
    final = tmp_path / npu_device.cache_key()
    fake.before_finish.append(final)
    lib, built, _ = npu_device.build_and_load(tmp_path)
    assert built
    assert lib == final / f"{npu_device.LIB_NAME}.so"
    assert lib.read_text() == "the other session's build"
    assert [p.name for p in tmp_path.iterdir()] == [final.name]


def test_failed_build_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(into: Path) -> None:
        (into / "half.o").write_text("")
        raise RuntimeError("compiler failed")

    monkeypatch.setattr(npu_device, "_compile_and_load", broken)
    with pytest.raises(RuntimeError, match="compiler failed"):
        npu_device.build_and_load(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_unwritable_cache_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeBuild(monkeypatch)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    fallback = tmp_path / "session"
    lib, built, _ = npu_device.build_and_load(blocker / "cache", fallback)
    assert built and lib.parent.parent == fallback
    assert len(fake.compiled) == 1


def test_cache_key_follows_sources_flags_and_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = npu_device.cache_key()
    assert key == npu_device.cache_key()
    src = tmp_path / "npu_device.cpp"
    src.write_bytes(npu_device.SOURCES[0].read_bytes() + b"\n// changed\n")
    with monkeypatch.context() as m:
        m.setattr(npu_device, "SOURCES", (src,))
        assert npu_device.cache_key() != key
    with monkeypatch.context() as m:
        m.setattr(npu_device, "CFLAGS", ("-O2",))
        assert npu_device.cache_key() != key
    with monkeypatch.context() as m:
        m.setattr(torch, "__version__", "0.0.0")
        assert npu_device.cache_key() != key
    assert npu_device.cache_key() == key


def test_default_cache_is_outside_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AMPFORGE_NPU_DEVICE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/var/cache-test")
    assert npu_device.default_cache_root() == Path("/var/cache-test/ampforge/npu-device")
    monkeypatch.delenv("XDG_CACHE_HOME")
    root = npu_device.default_cache_root()
    assert root == Path.home() / ".cache" / "ampforge" / "npu-device"
    assert REPO not in root.parents
    monkeypatch.setenv("AMPFORGE_NPU_DEVICE_CACHE", "/elsewhere")
    assert npu_device.default_cache_root() == Path("/elsewhere")


def test_session_device_library_is_the_cached_one(npu_backend: npu_device.Installed) -> None:
    assert npu_backend.path.name == f"{npu_device.LIB_NAME}.so"
    assert npu_backend.path.parent.name == npu_device.cache_key()
    assert npu_backend.path.is_file()


def test_install_after_first_backward_is_explained(npu_backend: npu_device.Installed) -> None:
    # Why conftest installs at collection time: autograd fixes its device threads at the
    # process's first backward pass. A fresh process shows the message a late install gets.
    code = (
        "import torch\n"
        "x = torch.ones(1, requires_grad=True)\n"
        "(x * 2).sum().backward()\n"
        "import npu_device\n"
        "npu_device.install()\n"
    )
    env = {**os.environ, "AMPFORGE_NPU_DEVICE_CACHE": str(npu_backend.path.parent.parent)}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(npu_device.__file__).parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    assert "installed after this process's first backward pass" in proc.stderr
