"""amp._ext: the compiled module is used when it matches the imported torch; otherwise one
clear warning and the fallback (apex's 'No module named amp_C' / undefined-symbol failure)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from amp import _ext


@pytest.fixture
def fresh_ext():
    _ext.reset()
    yield _ext
    _ext.reset()


def _fake_module(tmp_path, monkeypatch, name: str, body: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_built_extension_matches_this_torch(fresh_ext):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mod = fresh_ext.load()
    assert mod is not None, "amp._C is not built (make setup)"
    assert mod.__torch_version__ == torch.__version__
    assert mod.isa() in ("avx512", "avx2", "generic")


def test_version_mismatch_warns_once_and_falls_back(fresh_ext, tmp_path, monkeypatch):
    name = _fake_module(
        tmp_path, monkeypatch, "fake_amp_c_old", "__torch_version__ = '1.13.1+cu117'\n"
    )
    with pytest.warns(
        _ext.AmpExtensionWarning,
        match=r"built against torch 1\.13\.1\+cu117, but torch .* is imported",
    ):
        assert fresh_ext.load(name) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # cached: no second warning
        assert fresh_ext.load(name) is None


def test_import_error_warns_and_falls_back(fresh_ext, tmp_path, monkeypatch):
    name = _fake_module(
        tmp_path,
        monkeypatch,
        "fake_amp_c_broken",
        """
        raise ImportError("undefined symbol: _ZN3c1017RegisterOperatorsD1Ev")
    """,
    )
    with pytest.warns(_ext.AmpExtensionWarning, match="undefined symbol"):
        assert fresh_ext.load(name) is None


def test_missing_module_warns(fresh_ext):
    with pytest.warns(_ext.AmpExtensionWarning, match="No module named"):
        assert fresh_ext.load("amp._C_does_not_exist") is None


def test_disable_env_forces_fallback_silently(fresh_ext, monkeypatch):
    monkeypatch.setenv("AMP_DISABLE_EXTENSION", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fresh_ext.load() is None


def test_fallback_optimizer_runs_with_one_warning_in_a_fresh_process(tmp_path):
    # A whole user session where amp._C is unusable: one warning, correct training.
    script = tmp_path / "run.py"
    script.write_text(
        textwrap.dedent("""
        import sys, types, warnings
        fake = types.ModuleType("amp._C"); fake.__torch_version__ = "0.0.0"
        sys.modules["amp._C"] = fake
        import torch
        from amp.optimizers import FusedAdam
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as seen:
            p = torch.nn.Parameter(torch.ones(5))
            opt = FusedAdam([p], lr=0.1)
            for _ in range(3):
                p.grad = torch.ones(5)
                opt.step()
        msgs = [str(w.message) for w in seen if "compiled kernels unavailable" in str(w.message)]
        assert len(msgs) == 1, msgs
        assert "built against torch 0.0.0" in msgs[0]
        assert bool((p < 1).all())
        print("ok")
    """)
    )
    env = dict(os.environ)
    env.pop("AMP_DISABLE_EXTENSION", None)
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_kernels_run_in_parallel_and_follow_set_num_threads():
    # CppExtension does not add -fopenmp; without it at::parallel_for is silently serial.
    mod = _ext.load()
    assert mod is not None
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert mod._parallel_threads_seen() == 2
        torch.set_num_threads(1)
        assert mod._parallel_threads_seen() == 1
    finally:
        torch.set_num_threads(before)


def _sysfs_last_level_cache() -> int:
    """cpu0's highest-level data or unified cache as sysfs gives it (what lscpu prints); 0
    without sysfs."""
    best_level, best = 0, 0
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if kind == "Instruction" or level < best_level or not size:
            continue
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1], 1)
        best_level, best = level, int(size.rstrip("KMG")) * unit
    return best


def test_the_kernels_size_their_stores_by_the_cache_sysfs_names():
    """The half copy is streamed past the last-level cache; its size comes from sysfs, which
    glibc's sysconf contradicted on a VM (320 MiB for the 32 MiB lscpu showed)."""
    mod = _ext.load()
    assert mod is not None
    expected = _sysfs_last_level_cache()
    if expected == 0:
        pytest.skip("no cache sizes in sysfs here: the kernels fall back to sysconf")
    assert mod._cache_bytes() == expected
