"""Compile one kernel file three ways: x86 native, aarch64 cross, aarch64 emulated (QEMU).

Same source, same flags (setup.py's release flags); only the compiler and the torch/Python
headers differ:

  native    g++ (x86_64)            host torch + host Python headers
  cross     aarch64-linux-gnu-g++   aarch64 torch 2.9.1 + Debian arm64 Python headers
  emulated  Debian arm64 g++-12 run under qemu-aarch64 (what an arm64 container on this host
            does), same headers as cross

The emulated compiler is unpacked from Debian arm64 .debs into the cache on first use.

    python benchmarks/build_arm.py [--source kernels/ops_generic.cpp] [--rounds 1] [--no-emulated]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from builder.cross import ensure_target_python, ensure_target_torch, find_qemu, find_toolchain  # noqa: E402
from builder.cross.sysroot import ensure_debian_root  # noqa: E402

FLAGS = ["-O3", "-g0", "-fopenmp", "-fno-math-errno", "-ffp-contract=off", "-std=c++20", "-fPIC",
         "-DTORCH_EXTENSION_NAME=_C", "-DTORCH_API_INCLUDE_EXTENSION_H", "-DNDEBUG"]

# `apt-cache depends --recurse g++-12:arm64`, minus what a compile never touches.
COMPILER_PACKAGES = [
    "g++-12", "gcc-12", "cpp-12", "gcc-12-base", "libgcc-12-dev", "libstdc++-12-dev",
    "binutils", "binutils-aarch64-linux-gnu", "binutils-common", "libbinutils", "libctf0",
    "libctf-nobfd0",
    "libgprofng0", "libjansson4", "libc6", "libc6-dev", "linux-libc-dev", "libcrypt-dev",
    "libcrypt1", "libgcc-s1", "libgmp10", "libisl23", "libmpc3", "libmpfr6", "libzstd1",
    "zlib1g", "libstdc++6", "libgomp1", "libatomic1", "libasan8", "libhwasan0", "liblsan0",
    "libtsan2", "libubsan1", "libitm1", "libcc1-0",
]


def timed(cmd: list[str], env: dict[str, str] | None = None) -> float:
    start = time.monotonic()
    run = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if run.returncode != 0:
        raise SystemExit(f"compile failed: {' '.join(cmd[:3])} ...\n{run.stderr[-2000:]}")
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="kernels/ops_generic.cpp")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--no-emulated", action="store_true")
    args = parser.parse_args()
    source = (REPO / args.source).resolve()
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"

    import sysconfig

    import torch.utils.cpp_extension as cpp

    toolchain = find_toolchain()
    target_python = ensure_target_python(py)
    target_torch = ensure_target_torch("2.9.1", target_python)
    kernels = ["-I", str(source.parent)]
    host_inc = [f"-I{p}" for p in cpp.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    target_inc = [f"-I{p}" for p in target_torch.include_dirs] + [f"-I{target_python.include_dir}"]

    out = Path(tempfile.mkdtemp(prefix="ampforge-bench-"))
    cases: dict[str, tuple[list[str], dict[str, str] | None]] = {
        "native x86_64 (g++)": (["g++", *FLAGS, *kernels, *host_inc], None),
        "cross aarch64 (aarch64-linux-gnu-g++)": ([str(toolchain.cxx), *FLAGS, *kernels,
                                                   *target_inc], None),
    }
    if not args.no_emulated:
        root = ensure_debian_root([p + ":arm64" for p in COMPILER_PACKAGES], "gcc12-aarch64")
        qemu = find_qemu()
        # g++ execs cc1plus and `as` (binutils:arm64 provides /usr/bin/as; without it the
        # lookup falls through -L to the host's x86 `as`). QEMU_LD_PREFIX lets the
        # binfmt-launched children find the arm64 loader and libraries too (provision.sh
        # registers qemu-aarch64 with binfmt).
        env = {**os.environ, "QEMU_LD_PREFIX": str(root),
               "PATH": f"{root}/usr/bin:{os.environ['PATH']}"}
        cases["emulated aarch64 (g++-12 under qemu)"] = (
            [str(qemu), "-L", str(root), str(root / "usr/bin/aarch64-linux-gnu-g++-12"),
             *FLAGS, *kernels, *target_inc], env)

    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):  # interleave rounds: this machine's speed drifts
        for name, (cmd, env) in cases.items():
            times[name].append(timed([*cmd, "-c", str(source), "-o", str(out / "x.o")], env))
    shutil.rmtree(out)

    native = statistics.median(times["native x86_64 (g++)"])
    print(f"compile of {args.source} (median of {args.rounds}), {os.cpu_count()} cores")
    print(f"{'case':42} {'seconds':>8} {'vs native':>10}")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:42} {med:8.1f} {med / native:9.2f}x")
    if "emulated aarch64 (g++-12 under qemu)" in times:
        emu = statistics.median(times["emulated aarch64 (g++-12 under qemu)"])
        cross = statistics.median(times["cross aarch64 (aarch64-linux-gnu-g++)"])
        print(f"cross is {emu / cross:.1f}x faster than emulated")


if __name__ == "__main__":
    main()
