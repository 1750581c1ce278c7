"""Shared fixtures. `backend`: run a kernel/optimizer test on every backend (the compiled
kernels per ISA, and the pure-torch fallback)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Optional

import pytest
import torch
import torch.distributed as dist
from amp_state import reset_amp  # tests/amp_state.py
from hypothesis import settings

from amp import _ext
from amp import _torch_compat as compat

# Under CI the property tests draw the same examples every run (derandomize): a CI run must
# not pass or fail by chance. Locally they explore new examples each run, and a failure
# prints the @reproduce_failure blob that replays it.
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)


def _select(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = request.param
    if name == "fallback":
        monkeypatch.setenv("AMP_DISABLE_EXTENSION", "1")
        _ext.reset()
        yield name
        monkeypatch.delenv("AMP_DISABLE_EXTENSION")
        _ext.reset()
        return
    mod = _ext.load()
    assert mod is not None, "amp._C must be built for the test suite (make setup)"
    try:
        mod.set_isa(name)
    except ValueError:
        pytest.skip(f"this CPU cannot run the {name} kernels")
    yield name
    mod.set_isa("auto")


# Every compiled build: one the CPU cannot run (AVX-512 on most machines) is skipped, and
# the skip says so; the dispatch itself is tested in tests/kernels/test_ext_loading.py.
@pytest.fixture(params=["avx512", "avx2", "generic", "fallback"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    yield from _select(request, monkeypatch)


@pytest.fixture(params=["avx512", "avx2", "generic"])
def compiled_backend(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """The compiled kernels only, per ISA (for what exists only in amp._C)."""
    yield from _select(request, monkeypatch)


# ------------------------------------------------------------------ amp's process-wide state
#
# amp keeps process-wide state, as apex does (the opt properties, loss scalers, O1's handle).
# Every test starts and ends with it reset: a suite that initializes amp without cleaning up
# (tests/optimizers' O1 runs) must not decide how a later module's tests start.
@pytest.fixture(autouse=True)
def _fresh_amp_state() -> Iterator[None]:
    reset_amp()
    yield
    reset_amp()


# ------------------------------------------------------------------ one-rank gloo group
#
# A single-process gloo group (an in-memory store) for tests of amp's collectives. Torch before
# 2.8 destroys a gloo group while holding the GIL, and the destructor joins the group's worker
# threads. A worker that has just run the last all-reduce may still be dropping that work's
# tensors, and the flag tensor amp reduced is by then only alive on the C++ side: freeing it needs
# the GIL, so the join never returns (torch 2.6.0: a loop of init, all_reduce, destroy hung within
# 300 rounds, every time; with a barrier before destroy, 3,000 rounds passed). The barrier's wait
# releases the GIL, so the worker finishes with the earlier work before the group goes.
@pytest.fixture
def one_rank_gloo() -> Iterator[None]:
    assert dist.is_available()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
        dist.barrier()
        time.sleep(0.05)  # the GIL released a moment more: see tests/amp/_gloo_group.py
    finally:
        dist.destroy_process_group()


# ------------------------------------------------------------------ parallel runs (xdist)
#
# `make test` runs two pytest-xdist workers with `--dist loadgroup`. Most of the suite's wall
# time is builds, and much of a build waits (pip unpacking torch, the engine committing a
# layer, QEMU, a proxy): a second stream fills those waits. Two rules keep the streams apart:
#
# * every test that drives the container engine runs in one stream ("docker"), in order: they
#   assert on the engine's state (no container left behind, images they made) and would see
#   each other's containers if run side by side;
# * every other test stays with its module, so module-scoped fixtures (a built raw wheel, a
#   proxy lab, the NPU test device) are made once, not once per worker.
#
# The docker stream is the longest single unit, so it is collected first (the worker that takes
# it starts with it), then the light modules, then the other builder modules, which the workers
# then take one at a time as they free up. A test's group is exported as AMPFORGE_TEST_GROUP so
# that tests/builder/helpers/enginelib.docker_engine() can refuse to hand the engine to a test
# outside the docker stream (a new module that uses the engine must be listed here, or carry the
# `docker` marker).

DOCKER_MODULES = frozenset(
    {
        "test_base_image.py",
        "test_doctor.py",
        "test_emulation.py",
        "test_engines.py",
        "test_pipeline_front.py",
        "test_proxy_real.py",
        "test_render_docker.py",
    }
)  # modules whose engine tests all carry the marker need not be listed (their other tests
#     then run in either stream): test_repair.py, test_signals.py, test_pull.py, ...
DOCKER_GROUP = "docker"
# Session fixtures (tests/builder/conftest.py) whose users must share a worker, or the build
# behind the fixture would run once per worker.
FIXTURE_GROUPS = {"docker_amp_build": DOCKER_GROUP, "host_amp_build": "host-amp-build"}
TESTS_ROOT = Path(__file__).resolve().parent


def stream_of(item: pytest.Item) -> str:
    """The xdist group of *item*: "docker", its shared fixture's, or its module's path."""
    path = item.path
    if item.get_closest_marker("docker") or path.name in DOCKER_MODULES:
        return DOCKER_GROUP  # first: the engine rule is about correctness, the rest about time
    for fixture in getattr(item, "fixturenames", ()):
        if fixture in FIXTURE_GROUPS:
            return FIXTURE_GROUPS[fixture]
    return f"module:{path.relative_to(TESTS_ROOT)}"


def pytest_itemcollected(item: pytest.Item) -> None:
    # As each item is collected: xdist reads the marks in its pytest_collection_modifyitems,
    # which (registered by the worker) runs before any conftest's version of that hook.
    if item.get_closest_marker("xdist_group") is None:
        item.add_marker(pytest.mark.xdist_group(stream_of(item)))


def _order(item: pytest.Item) -> int:
    mark = item.get_closest_marker("xdist_group")
    if mark and mark.args[0] == DOCKER_GROUP:
        return 0
    return 2 if (TESTS_ROOT / "builder") in item.path.parents else 1


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_order)  # stable: each module keeps its own order
    if any(_on_npu(item) for item in items):
        _npu_device().install_at_collection()


@pytest.hookimpl(tryfirst=True)  # before any fixture of the test, module-scoped ones too
def pytest_runtest_setup(item: pytest.Item) -> None:
    mark = item.get_closest_marker("xdist_group")
    os.environ["AMPFORGE_TEST_GROUP"] = str(mark.args[0]) if mark else ""


# ------------------------------------------------------------------ CPU per test (opt-in)
#
# AMPFORGE_CPU_PROFILE=DIR: each test's CPU-seconds to DIR (tests/cpu_profile.py; summed by
# benchmarks/ci_cpu.py). CI is CPU-bound on two cores, so this, not wall time, says which tests
# cost its minutes.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Optional[pytest.Item]) -> object:
    out_dir = os.environ.get("AMPFORGE_CPU_PROFILE")
    if not out_dir:
        return (yield)
    from cpu_profile import measured  # noqa: PLC0415 (only when profiling is asked for)

    mark = item.get_closest_marker("xdist_group")
    group = str(mark.args[0]) if mark else ""
    with measured(out_dir, item.nodeid, group, engine_stream=group == DOCKER_GROUP):
        return (yield)


# ------------------------------------------------------------------ what an older torch lacks
#
# amp runs on torch 2.1 and later (amp/_torch_compat.py), and `make test-torch` runs amp's suites
# on the older lines. Two things those torches lack are not amp's to provide, and the tests that
# need them are skipped there, each with its reason: float16 arithmetic on the CPU (torch 2.1:
# no float16 matmul or convolution, and autocast takes bfloat16 only; amp.initialize says so
# itself, HalfUnsupportedError), and torch.amp.GradScaler (torch >= 2.3), the reference amp's loss
# scaling is compared with. Only those errors, and only where the probe confirms the lack:
# anything else a test raises is its failure. The tests that compute in float16 wherever torch's
# default device is run on the npu test device there instead (half_device, below): what is
# skipped for float16 is what needs the CPU itself in float16 (tests/npu's comparisons of the
# device with the CPU), or a worker process that cannot take the device (its own reason).
_HALF_ON_CPU = ("not implemented for 'Half'", "AutocastCPU only support Bfloat16")
_NPU_FIXTURES = ("npu", "npu_backend", "torch_npu", "saturating_npu")


def _lacking(exc: BaseException, item: pytest.Item) -> Optional[str]:
    version = torch.__version__
    if isinstance(exc, compat.HalfUnsupportedError) or (
        isinstance(exc, (RuntimeError, NotImplementedError))
        and any(s in str(exc) for s in _HALF_ON_CPU)
    ):
        if not (
            compat.half_matmul_supported("cpu") and compat.autocast_supports("cpu", torch.float16)
        ):
            first = str(exc).splitlines()[0][:160]
            if any(f in getattr(item, "fixturenames", ()) for f in _NPU_FIXTURES):
                return (
                    f"torch {version}'s CPU has no float16 matmul/autocast, and this test "
                    f"compares the npu device with the CPU in float16: {first}"
                )
            return f"torch {version}'s CPU has no float16 matmul/autocast: {first}"
    if (
        isinstance(exc, AttributeError)
        and "GradScaler" in str(exc)
        and compat.grad_scaler_class() is None
    ):
        return f"torch {version} has no torch.amp.GradScaler (torch >= 2.3), this test's reference"
    return None


# ------------------------------------------------------------------ float16 on the npu test device
#
# Tests marked `half_device` compute in float16 on torch's default device (models and data made
# without a device argument). Where torch's CPU has float16 kernels they run on the CPU, as
# every other test does. Where it has none (torch 2.1), they run on the npu test device
# (tests/npu/device) instead of being skipped: it computes float16 as an NPU does (float32
# arithmetic, float16 results) where the CPU has no kernel. The device is installed when
# collection ends (before any backward pass, as tests/npu/conftest.py does) and is torch's
# default device during the test's call (`with torch.device("npu")`: factory functions without
# a device argument make npu tensors). There a float16 error is the test's failure, never a
# skip; and a marked test that ran no op on the device fails (its marker would be wrong).


def _cpu_has_float16() -> bool:
    return compat.half_matmul_supported("cpu") and compat.autocast_supports("cpu", torch.float16)


def _on_npu(item: pytest.Item) -> bool:
    """AMPFORGE_HALF_DEVICE=npu sends them there on any torch (to compare the two lines)."""
    if item.get_closest_marker("half_device") is None:
        return False
    return os.environ.get("AMPFORGE_HALF_DEVICE") == "npu" or not _cpu_has_float16()


def _npu_device() -> ModuleType:
    """tests/npu/npu_device.py, the module tests/npu/conftest.py installs the device with."""
    folder = str(TESTS_ROOT / "npu")
    if folder not in sys.path:
        sys.path.append(folder)
    import npu_device  # noqa: PLC0415 (found only once its folder is on sys.path)

    return npu_device


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    if _on_npu(item):
        installed = _npu_device().session_device()
        before = installed.ops.fallback_calls()
        with torch.device("npu"):
            result = yield
        # half_device(in_worker=True): the float16 work runs in worker processes the test starts
        # on its default device (it checks where they ran itself).
        in_worker = item.get_closest_marker("half_device").kwargs.get("in_worker", False)
        if not in_worker and installed.ops.fallback_calls() == before:
            raise AssertionError(
                "marked half_device, but ran no op on the npu device it was given as torch's "
                "default device: it computes nothing in float16 there"
            )
        return result
    try:
        return (yield)
    except Exception as exc:
        reason = _lacking(exc, item)
        if reason is None:
            raise
        pytest.skip(reason)
