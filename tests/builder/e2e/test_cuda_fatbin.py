"""CUDA verification without a GPU (issue 34), on device code compiled by a real nvcc: the CUDA
13.0 toolkit the support table pins, installed from the package index (--require-hashes) into
one cache folder named after the pins' content and shared by every test and session.

* the fat binary reader (builder.wheel.fatbin) reports exactly the SASS and PTX nvcc was asked
  for, per object and for a shared object linked from two objects (two containers);
* a wheel's device code is checked against a cell's arch list (builder.wheel.cudacheck): a
  wrong list fails naming the file and the capabilities, a wheel without device code fails;
* auditwheel leaves libcudart external with a CUDA cell's excludes, and refuses to repair
  without them (builder.plan.cudacell.CUDA_EXCLUDES).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers.cudalib import index_nvcc, toolkit
from helpers.enginelib import missing

from builder.config.cuda import parse_arch_list
from builder.engines.host import HostEngine
from builder.errors import StepFailed
from builder.plan.cudacell import CUDA_EXCLUDES, CudaRecord
from builder.wheel.cudacheck import check_device_code
from builder.wheel.fatbin import FatbinError, device_code, parse_containers
from builder.wheel.repair import DEFAULT_EXCLUDES, host_auditwheel, repair_wheel

KERNEL = """\
__global__ void add_{n}(float* x, float a, int n) {{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += a;
}}
extern "C" void launch_{n}(float* x, float a, int n) {{
  add_{n}<<<(n + 255) / 256, 256>>>(x, a, n);
}}
"""


@pytest.fixture(scope="session")
def nvcc() -> Path:
    """The index's nvcc 13.0 (the support table's pins, by version and sha256), cached by the
    pins' content under the builder's cache root: downloaded once per machine."""
    return index_nvcc()


def _compile(nvcc: Path, out: Path, n: int, *gencode: str) -> Path:
    src = out.with_suffix(".cu")
    src.write_text(KERNEL.format(n=n))
    flags = [f"-gencode={g}" for g in gencode]
    subprocess.run(
        [str(nvcc), "-c", "-Xcompiler=-fPIC", *flags, str(src), "-o", str(out)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return out


def _shared(nvcc: Path, out: Path, objects: list[Path]) -> Path:
    """Linked by the host compiler, as torch's BuildExtension links a CUDA extension (``nvcc
    -shared`` would add a device-link stub for nvcc's default arch)."""
    lib = nvcc.parent.parent / "lib"
    subprocess.run(
        ["g++", "-shared", *map(str, objects), f"-L{lib}", "-lcudart", "-o", str(out)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return out


@pytest.fixture(scope="module")
def objects(nvcc: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("cuda-objects")
    a = _compile(nvcc, tmp / "a.o", 1, "arch=compute_75,code=sm_75")
    b = _compile(
        nvcc,
        tmp / "b.o",
        2,
        "arch=compute_80,code=sm_80",
        "arch=compute_90,code=[sm_90,compute_90]",
    )
    # the runtime wheel has libcudart.so.13 only (wheels hold no links); -lcudart needs the name
    link = nvcc.parent.parent / "lib" / "libcudart.so"
    if not link.exists():
        link.symlink_to("libcudart.so.13")
    return {
        "a": a,
        "b": b,
        "lib": _shared(nvcc, tmp / "libk.so", [a, b]),
        "one": _shared(nvcc, tmp / "libone.so", [b]),
    }


def test_the_reader_reports_what_nvcc_was_asked_for(objects: dict[str, Path]) -> None:
    a = device_code(objects["a"].read_bytes())
    b = device_code(objects["b"].read_bytes())
    assert a is not None and (a.sass, a.ptx) == ((75,), ())
    assert b is not None and (b.sass, b.ptx) == ((80, 90), (90,))
    linked = device_code(objects["lib"].read_bytes())  # two objects: two containers
    assert linked is not None and (linked.sass, linked.ptx) == ((75, 80, 90), (90,))
    assert linked.describe() == "sm_75, sm_80, sm_90, compute_90 (PTX)"


def test_a_host_only_file_has_no_device_code(tmp_path: Path) -> None:
    src = tmp_path / "h.c"
    src.write_text("int f(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", str(src), "-o", str(tmp_path / "h.so")], check=True)
    assert device_code((tmp_path / "h.so").read_bytes()) is None


def test_damaged_containers_are_refused() -> None:
    with pytest.raises(FatbinError, match="no fat binary magic"):
        parse_containers(b"\x01" * 32)
    header = (0xBA55ED50).to_bytes(4, "little") + b"\x01\x00\x10\x00" + (999).to_bytes(8, "little")
    with pytest.raises(FatbinError, match="claims 999 bytes"):
        parse_containers(header + b"\0" * 16)


def _wheel(tmp: Path, so: Path, name: str = "demo") -> Path:
    wheel = tmp / f"{name}-1.0+torch2.14.cu130-cp311-cp311-manylinux_2_28_x86_64.whl"
    info = f"{name}-1.0+torch2.14.cu130.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(so, f"{name}/{so.name}")
        zf.writestr(
            f"{info}/METADATA",
            f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0+torch2.14.cu130\n",
        )
        zf.writestr(
            f"{info}/WHEEL",
            "Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp311-cp311-manylinux_2_28_x86_64\n",
        )
        # auditwheel reads the files from RECORD
        zf.writestr(
            f"{info}/RECORD",
            f"{name}/{so.name},,\n{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n",
        )
    return wheel


def _record(text: str) -> CudaRecord:
    return CudaRecord(
        cuda="13.0",
        reason="test",
        arch_list=parse_arch_list(text, toolkit()),
        arch_list_source="the test's cuda.arch_list",
    )


def test_a_wheel_passes_with_its_arch_list_and_fails_by_name_with_another(
    objects: dict[str, Path], tmp_path: Path
) -> None:
    wheel = _wheel(tmp_path, objects["one"])
    report = check_device_code(wheel, _record("8.0;9.0+PTX"))
    assert report == {
        "version": "13.0",
        "arch_list": "8.0;9.0+PTX",
        "device_code": {"demo/libone.so": "sm_80, sm_90, compute_90 (PTX)"},
    }
    with pytest.raises(StepFailed) as err:
        check_device_code(wheel, _record("8.0;8.6"))
    assert (
        "demo/libone.so holds sm_80, sm_90, compute_90 (PTX); missing sm_86; not asked "
        "for sm_90, compute_90 (PTX)"
    ) in str(err.value)
    assert "TORCH_CUDA_ARCH_LIST=8.0;8.6 (the test's cuda.arch_list)" in str(err.value)
    with pytest.raises(StepFailed, match=r"; not asked for compute_90 \(PTX\)$"):
        check_device_code(wheel, _record("8.0;9.0"))


def test_a_wheel_without_device_code_fails(tmp_path: Path) -> None:
    src = tmp_path / "h.c"
    src.write_text("int f(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", str(src), "-o", str(tmp_path / "h.so")], check=True)
    with pytest.raises(StepFailed, match="no compiled file carries CUDA device code"):
        check_device_code(_wheel(tmp_path, tmp_path / "h.so"), _record("8.0"))


def test_repair_leaves_the_cuda_runtime_external_only_with_cuda_excludes(
    objects: dict[str, Path], nvcc: Path, tmp_path: Path
) -> None:
    needed = subprocess.run(
        ["readelf", "-d", str(objects["one"])], capture_output=True, text=True, check=True
    ).stdout
    assert "libcudart.so.13" in needed
    wheel = _wheel(tmp_path, objects["one"], "cudademo")
    aw, aw_env = host_auditwheel()
    # auditwheel finds the runtime where torch's environment would have it
    env = {**aw_env, "LD_LIBRARY_PATH": str(nvcc.parent.parent / "lib")}
    with HostEngine().session(parent=tmp_path) as session:
        inside = session.copy_in(wheel, session.workdir)
        with pytest.raises(StepFailed, match=r"would graft libcudart\.so\.13"):
            repair_wheel(
                session,
                inside,
                tmp_path / "plain",
                auditwheel=aw,
                env=env,
                excludes=DEFAULT_EXCLUDES,
                plat="manylinux_2_28_x86_64",
            )
        (tmp_path / "cuda").mkdir()
        repaired = repair_wheel(
            session,
            inside,
            tmp_path / "cuda",
            auditwheel=aw,
            env=env,
            excludes=(*DEFAULT_EXCLUDES, *CUDA_EXCLUDES),
            plat="manylinux_2_28_x86_64",
        )
    with zipfile.ZipFile(repaired.wheel) as zf:
        assert not [n for n in zf.namelist() if ".libs/" in n], zf.namelist()
    assert "libcudart.so.13" in json.dumps(repaired.audit.external_libs)
    assert os.path.basename(str(repaired.wheel)).startswith("cudademo-1.0+torch2.14.cu130-")


def test_the_aarch64_pins_are_the_indexs_files(tmp_path: Path) -> None:
    """The support table's aarch64 digests are those of the index's manylinux2014_aarch64
    wheels: pip downloads them for that platform with --require-hashes (~97 MB; an aarch64
    runner's host build installs exactly these)."""
    requirements = toolkit().requirements("aarch64")
    assert all("--hash=sha256:" in r for r in requirements), requirements
    (tmp_path / "requirements.txt").write_text("".join(r + "\n" for r in requirements))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--disable-pip-version-check",
            "--no-input",
            "--no-deps",
            "--require-hashes",
            "--only-binary=:all:",
            "--platform",
            "manylinux2014_aarch64",
            "--python-version",
            "3.11",
            "--implementation",
            "py",
            "-d",
            str(tmp_path / "wheels"),
            "-r",
            str(tmp_path / "requirements.txt"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode != 0 and "THESE PACKAGES DO NOT MATCH THE HASHES" not in proc.stderr:
        missing(
            f"the toolkit's aarch64 wheels could not be downloaded:\n{proc.stderr[-1500:]}",
            "CI needs the package index for the CUDA tests",
        )
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = sorted(p.name for p in (tmp_path / "wheels").glob("*.whl"))
    assert len(names) == len(requirements) and all("aarch64" in n for n in names), names
