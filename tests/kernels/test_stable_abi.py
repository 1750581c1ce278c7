"""amp._C on torch's stable ABI (kernels/bindings_stable.cpp) or through pybind11
(kernels/bindings.cpp): setup.py picks by the torch it builds against, amp._ext accepts a stable
module for every torch from its minimum on, and the stable module is what it claims to be.

The kernel tests of this folder run on whichever binding `make setup` built (the stable one for
torch >= 2.10); the pybind11 binding is compiled and self-tested by the builder's torch 2.9.1
cross build (tests/builder/e2e/test_pipeline_arm.py). Both are bit-equal to each other over the same
kernel core (docs/stable-wheels.md).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import amp._C
import pytest
import torch

from amp import _ext

# The checkout (not builder.config's): this folder runs without the builder too (make test-torch).
REPO_ROOT = Path(__file__).resolve().parents[2]

# setup.py at the repository root, as a module (its setup() call runs only as __main__).
_spec = importlib.util.spec_from_file_location("amp_setup", REPO_ROOT / "setup.py")
assert _spec is not None and _spec.loader is not None
amp_setup = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(amp_setup)

#: The pybind11 module's functions: the stable module must have exactly these, by name.
FUNCTIONS = {
    "isa",
    "set_isa",
    "supported_isas",
    "_parallel_threads_seen",
    "_cache_bytes",
    "scale",
    "axpby",
    "l2norm",
    "adam",
    "sgd",
    "lamb",
    "scale_l2norm",
    "adagrad",
    "novograd",
    "_limit_probe",
    "multi_tensor_scale",
    "multi_tensor_axpby",
    "multi_tensor_l2norm",
    "multi_tensor_unscale_l2norm",
    "multi_tensor_adam",
    "multi_tensor_sgd",
    "multi_tensor_lamb",
    "multi_tensor_adagrad",
    "multi_tensor_novograd",
}


@pytest.mark.parametrize(
    "torch_version, python, expected",
    [
        ("2.8.0", (3, 9), "pybind11"),
        ("2.9.1+cpu", (3, 13), "pybind11"),  # no stable lists / parallel_for before 2.10
        ("2.10.0", (3, 9), "pybind11"),  # below the abi3 floor
        ("2.10.0+cpu", (3, 10), "stable"),
        ("2.13.0", (3, 14), "stable"),
    ],
)
def test_setup_picks_the_binding_by_torch_and_python(torch_version, python, expected) -> None:
    assert amp_setup.binding_for(torch_version, python) == expected


def test_setup_reads_the_floor_from_pyproject_and_refuses_an_impossible_request() -> None:
    assert (amp_setup.STABLE_MIN_TORCH, amp_setup.ABI3_FLOOR) == ((2, 10), (3, 10))
    assert amp_setup.binding_for("2.13.0", (3, 11), "pybind11") == "pybind11"
    with pytest.raises(SystemExit, match=r"AMP_BINDING=stable needs torch >= 2\.10"):
        amp_setup.binding_for("2.9.1", (3, 11), "stable")
    with pytest.raises(SystemExit, match="expected auto, stable or pybind11"):
        amp_setup.binding_for("2.13.0", (3, 11), "cffi")


def test_every_kernel_header_is_a_dependency_of_the_extension() -> None:
    """An edit to a header alone (cpu_ops_impl.h, driver.h, ...) rebuilds amp._C: setuptools
    skips an extension none of whose sources or depends is newer than the built module."""
    (ext,) = amp_setup._extension_kwargs()["ext_modules"]
    headers = {f"kernels/{p.name}" for p in (REPO_ROOT / "kernels").glob("*.h")}
    assert headers and set(ext.depends) == headers


def test_the_built_module_is_the_binding_setup_chose() -> None:
    chosen = amp_setup.binding_for(torch.__version__, sys.version_info[:2])
    path = Path(amp._C.__file__)
    if chosen == "stable":
        assert amp._C.__torch_abi__ == "stable" and amp._C.__torch_min__ == "2.10"
        assert path.name == "_C.abi3.so"
        # The same functions as the pybind11 module, as plain Python callables over torch.ops.
        names = {n for n in dir(amp._C) if callable(getattr(amp._C, n)) and not n.startswith("__")}
        assert names == FUNCTIONS
        assert amp._C.l2norm([torch.ones(4)])[1] is None  # defaults as pybind11's
        assert len(amp._C.l2norm([torch.ones(4)], per_tensor=True)[1]) == 1
    else:
        assert amp._C.__torch_abi__ == "unstable" and ".abi3." not in path.name
    assert {n for n in FUNCTIONS if not hasattr(amp._C, n)} == set()


def _tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_the_stable_module_passes_torch_abi_audit_and_abi3audit() -> None:
    if getattr(amp._C, "__torch_abi__", "") != "stable":
        pytest.skip(
            f"this build of amp._C is the pybind11 one (torch {torch.__version__}): "
            "nothing stable to audit"
        )
    so = amp._C.__file__
    doc = json.loads(_tool("torch_abi_audit.cli", "--json", so).stdout)
    (ext,) = doc["extensions"]
    assert ext["torch"]["stable"] is True and ext["torch"]["unstable_symbols"] == []
    # The minimum torch the symbols need is the TORCH_TARGET_VERSION it was built for.
    assert ext["torch"]["min_torch_version"] == "2.10.0"
    assert "torch_parallel_for" in ext["torch"]["version_defining_symbols"]
    assert ext["cpython"]["compliant"] is True and ext["cpython"]["violations"] == []
    r = _tool("abi3audit", "--strict", "--verbose", so)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 ABI violations" in " ".join((r.stdout + r.stderr).split())


def _module(**attrs: str) -> types.ModuleType:
    mod = types.ModuleType("fake_amp_c")
    mod.__dict__.update(attrs)
    return mod


def test_a_stable_module_serves_every_torch_from_its_minimum_on() -> None:
    stable = _module(__torch_abi__="stable", __torch_min__="2.10", __torch_version__="2.13.0")
    for version in ("2.10.0", "2.10.0+cpu", "2.11.0", "2.13.0+cu130", "3.0.0"):
        assert _ext.torch_mismatch(stable, version) == "", version
    assert _ext.torch_mismatch(stable, "2.9.1") == (
        "is built on torch's stable ABI for torch >= 2.10, but torch 2.9.1 is imported"
    )
    # A pybind11 build (no __torch_abi__ in older builds either) needs its very torch.
    pinned = _module(__torch_version__="2.13.0+cpu")
    assert _ext.torch_mismatch(pinned, "2.13.0+cpu") == ""
    assert "was built against torch 2.13.0+cpu, but torch 2.10.0" in _ext.torch_mismatch(
        pinned, "2.10.0"
    )


def test_errors_keep_their_python_type_through_the_dispatcher() -> None:
    with pytest.raises(ValueError, match=r"^amp._C: inputs is an empty list$"):
        amp._C.scale([], [], 1.0)
    with pytest.raises(TypeError, match=r"^amp._C: tensors\[0\] has dtype Double; expected"):
        amp._C.l2norm([torch.ones(2, dtype=torch.float64)])
    with pytest.raises(ValueError, match="unknown ISA 'sse9'"):
        amp._C.set_isa("sse9")
