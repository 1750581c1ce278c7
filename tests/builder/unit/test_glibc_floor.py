"""Platform tags no higher than the paired torch's: the data and rules behind it (no build).

The builds themselves are checked where they happen: a real tiny extension's symbol versions and
repair in test_repair.py, the whole cell (exit 1 naming the symbols) in
test_pipeline_failures.py, the cross cell on bullseye in test_cross_pythons.py.
"""

from __future__ import annotations

import ctypes
import json
import re
import shutil
import subprocess
from pathlib import Path

import auditwheel.policy
import pytest

from builder.config import REPO_ROOT
from builder.config.support import load_support
from builder.errors import StepFailed
from builder.incell.steps import GLIBC_BASE_VERSION, LIBM_FLOOR_FUNCTIONS, libm_floor_shim
from builder.wheel.repair import oldest_tag
from builder.wheel.wheelcheck import (
    CXX_LIMITS,
    VersionNeed,
    _elf_needs,
    glibc_floor,
    lowest_glibc,
    need_summary,
    needs_glibc,
    pushers,
    tag_glibc,
)


def _numeric(v: str) -> tuple[int, ...] | None:
    return tuple(int(x) for x in v.split(".")) if re.fullmatch(r"\d+(\.\d+)*", v) else None


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_the_cxx_runtime_table_agrees_with_the_manylinux_policies(machine: str) -> None:
    """Our own table (the check is independent of auditwheel) against the policy data
    auditwheel ships: each row's newest GLIBCXX_/CXXABI_ versions are the policy's."""
    policy_file = Path(auditwheel.policy.__file__).with_name("manylinux-policy.json")
    policies = {
        p["name"]: p["symbol_versions"].get(machine, {})
        for p in json.loads(policy_file.read_text())
    }
    for glibc, glibcxx, cxxabi in CXX_LIMITS:
        versions = policies[f"manylinux_{glibc[0]}_{glibc[1]}"]
        if not versions:  # manylinux1 and manylinux2010 exist for x86 machines only
            assert glibc < lowest_glibc(machine) and machine == "aarch64", (glibc, machine)
            continue
        newest = {
            family: max(v for v in map(_numeric, versions[family]) if v is not None)
            for family in ("GLIBCXX", "CXXABI")
        }
        assert (newest["GLIBCXX"], newest["CXXABI"]) == (glibcxx, cxxabi), glibc


def _need(family: str, version: str, *symbols: str) -> VersionNeed:
    return VersionNeed(
        member="pkg/_C.so",
        library="lib.so",
        family=family,
        version=tuple(int(x) for x in version.split(".")),
        symbols=symbols,
    )


def test_the_floor_is_the_oldest_tag_every_need_allows() -> None:
    # What the kernels need with the libm floor: memcpy@2.14 and the C++11 string ABI.
    needs = [
        _need("GLIBC", "2.14", "memcpy"),
        _need("GLIBCXX", "3.4.21", "_ZNSt13runtime"),
        _need("CXXABI", "1.3.9", "_ZdlPvm"),
    ]
    assert glibc_floor(needs) == (2, 24)
    assert glibc_floor(needs[:1]) == (2, 17)  # never below manylinux2014
    assert glibc_floor(needs[:1], "x86_64") == (2, 14)  # no manylinux2014 floor on x86_64:
    assert glibc_floor([], "x86_64") == (2, 5)  # its policies start at manylinux1
    assert glibc_floor([], "aarch64") == (2, 17)
    assert pushers([_need("GLIBCXX", "3.4.9", "x")], (2, 5))  # newer than manylinux1's GCC 4.1
    assert needs_glibc(_need("GLIBC", "2.29", "pow")) == (2, 29)
    assert needs_glibc(_need("GLIBCXX", "3.4.29", "x")) == (2, 34)
    assert needs_glibc(_need("GLIBCXX", "3.4.99", "x")) == (99, 99)  # no tag allows it
    assert need_summary(needs) == {"CXXABI": "1.3.9", "GLIBC": "2.14", "GLIBCXX": "3.4.21"}
    # Against torch's manylinux_2_28: only the 2.29 pow and the GCC 11 string member push.
    over = pushers(
        [*needs, _need("GLIBC", "2.29", "pow"), _need("GLIBCXX", "3.4.29", "str")], (2, 28)
    )
    assert [n.name for n in over] == ["GLIBCXX_3.4.29", "GLIBC_2.29"]
    assert over[1].describe() == "pkg/_C.so: pow@GLIBC_2.29 (lib.so)"


def test_tags_parse_and_the_oldest_is_the_achieved_one() -> None:
    assert tag_glibc("manylinux_2_28_x86_64") == ((2, 28), "x86_64")
    assert tag_glibc("manylinux2014_aarch64") == ((2, 17), "aarch64")
    with pytest.raises(StepFailed, match="linux_x86_64 is not manylinux"):
        tag_glibc("linux_x86_64")
    assert oldest_tag(["manylinux_2_24_x86_64", "manylinux_2_28_x86_64"]) == (
        "manylinux_2_24_x86_64"
    )
    assert (
        oldest_tag(["manylinux_2_28_x86_64", "manylinux2014_x86_64", "manylinux_2_17_x86_64"])
        == "manylinux2014_x86_64"
    )


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_libm_floor_binds_every_newly_versioned_function_to_the_base_version(machine: str) -> None:
    shim = libm_floor_shim(machine)
    base = GLIBC_BASE_VERSION[machine]
    assert set(LIBM_FLOOR_FUNCTIONS) == {
        "exp",
        "exp2",
        "log",
        "log2",
        "pow",
        "expf",
        "exp2f",
        "logf",
        "log2f",
        "powf",
        "dlopen",
        "dlsym",
        "dlclose",
        "dlerror",
        "dladdr",
        "dlvsym",
    }
    for name in LIBM_FLOOR_FUNCTIONS:
        assert f'__asm__(".symver {name},{name}@{base}");' in shim
    assert "!defined(__ASSEMBLER__)" in shim  # harmless in a .S file's preprocessing
    assert libm_floor_shim("riscv64") == ""  # unknown base version: no shim, honest tag


def test_every_torch_of_the_support_table_has_a_ceiling_at_or_above_manylinux2014() -> None:
    support = load_support(REPO_ROOT / "configs" / "support.yaml")
    for torch in support.wheels:
        for machine in support.wheels[torch]:
            glibc, tag_machine = tag_glibc(support.torch_plat(torch, machine))
            assert tag_machine == machine and glibc >= (2, 17)


# What torch 2.14's stable-ABI headers do (torch/csrc/stable/macros.h): look a shim up at run
# time. Built on a glibc >= 2.34 machine, dlsym's default version is GLIBC_2.34.
_DLSYM_CPP = """\
#include <dlfcn.h>
#include <cmath>
extern "C" void* lookup(const char* name) { return dlsym(RTLD_DEFAULT, name); }
extern "C" double power(double a, double b) { return std::pow(a, b); }
"""


@pytest.mark.parametrize(
    "compiler, machine", [("g++", "x86_64"), ("aarch64-linux-gnu-g++", "aarch64")]
)
def test_a_compiled_dlsym_call_binds_to_the_base_version_and_still_resolves(
    tmp_path: Path, compiler: str, machine: str
) -> None:
    """The real compiler and this machine's glibc (2.36: dlsym@@GLIBC_2.34, pow@@GLIBC_2.29),
    with and without the floor header: with it, the module needs nothing above the machine's
    base version from dlsym/pow, and (natively) still finds a symbol through dlsym."""
    if shutil.which(compiler) is None:
        pytest.fail(f"{compiler} is not installed (.ci/run installs the cross toolchain)")
    src = tmp_path / "lookup.cpp"
    src.write_text(_DLSYM_CPP)
    (tmp_path / "floor.h").write_text(libm_floor_shim(machine))
    built = {}
    for name, extra in (("plain", []), ("floored", ["-include", str(tmp_path / "floor.h")])):
        out = tmp_path / f"{name}.so"
        subprocess.run(
            [compiler, "-shared", "-fPIC", "-O2", *extra, str(src), "-o", str(out)], check=True
        )
        built[name] = {
            sym: n.name for n in _elf_needs(out.name, out.read_bytes()) for sym in n.symbols
        }
    assert built["plain"]["dlsym"] == "GLIBC_2.34", built  # the fault, as torch 2.14 meets it
    base = GLIBC_BASE_VERSION[machine]
    assert built["floored"]["dlsym"] == built["floored"]["pow"] == base, built
    if machine == "x86_64":
        lib = ctypes.CDLL(str(tmp_path / "floored.so"))
        lib.lookup.restype = ctypes.c_void_p
        assert lib.lookup(b"malloc"), "dlsym bound to its old version found nothing"
        assert lib.lookup(b"ampforge_no_such_symbol") is None
