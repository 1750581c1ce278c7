"""The in-cell steps: run *inside* the build environment (container or host session).

Standard library only, Python >= 3.8 (the Ascend lines' cp38 cells): this file is copied into
the environment and run by the cell's own interpreter, so it cannot import the builder or
anything else from the host. The same
file runs in both backends, which is what makes the host and docker paths build the same wheel.

Usage (each step prints one final ``AMPFORGE_RESULT {json}`` line that the host side parses)::

    python steps.py venv DEST [--system-site-packages]
    DEST/bin/python steps.py install-torch --torch 2.13.0 [--wheelhouse DIR | --index-url URL]
    DEST/bin/python steps.py download-size --torch 2.13.0 --report FILE [--pip ZIP]
                                           [--index-url URL]
    DEST/bin/python steps.py install-toolkit --requirements FILE [--hashed]
                                             [--wheelhouse DIR | --index-url URL]
    DEST/bin/python steps.py site [--optional]
    DEST/bin/python steps.py build-wheel --project DIR --out DIR [--local-version torch2.13]
                                         [--shim auto|on|off] [--prefix-map OLD=NEW]
                                         [--no-libm-floor] [--cxx-floor] [--cxx11-abi 0|1]
                                         [--cflag FLAG ...]
                                         [--frontend pip|build|build[uv]|uv]
                                         [--frontend-arg ARG ...] [--uv-requirement LINE]
    python steps.py smoke --wheel W --torch 2.13.0 --venv DEST [--wheelhouse DIR] [--torch-site DIR]
                          [--module NAME ...] [--library PATH ...]
                          [--test-command CMD [--test-requires REQ ...] [--project DIR]
                           [--before-test CMD] [--test-extra EXTRA ...] [--test-source P ...]]
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.parse
import urllib.request
import venv
from pathlib import Path
from typing import NoReturn, Optional

RESULT_PREFIX = "AMPFORGE_RESULT "
#: sys.platlibdir (Python 3.9+); a 3.8 interpreter (the Ascend lines' cp38 cells) has lib/ only.
_PLATLIBDIR = getattr(sys, "platlibdir", "lib")

# GCC >= 11's libstdc++ reads glibc's __libc_single_threaded when <sys/single_threaded.h>
# exists; that one symbol (GLIBC_2.32) would cap the wheel's tag at the build host's glibc.
# Shadowing the header with a constant "not single threaded" keeps the always-atomic code
# path (correct, merely conservative) and drops the symbol reference.
_SHIM = """\
/* ampforge build shim: see builder/incell/steps.py. */
#ifndef _SYS_SINGLE_THREADED_H
#define _SYS_SINGLE_THREADED_H
static const char __libc_single_threaded = 0;
#endif
"""


# glibc 2.27 (float) and 2.29 (double) gave these libm functions new default symbol versions
# (same results, no SVID error wrapper). One ``pow`` call built against a newer glibc then
# needs GLIBC_2.29, i.e. manylinux_2_31 (there is no 2_29/2_30 policy): above the
# manylinux_2_28 of the torch wheels the result runs with. Every glibc still exports the old
# versions, so binding calls to the architecture's first symbol version keeps the wheel's floor
# where its other symbols put it; the .symver of a function a file never calls adds nothing.
# The cross path (builder/cross/build.py) uses the same header: this is its one definition.
#
# glibc 2.34 moved libdl into libc, where its functions got GLIBC_2.34 default versions; the old
# ones stay exported (from libc.so.6 since 2.34, from libdl.so.2 before, which torch's
# libtorch_cpu.so needs, so it is loaded wherever a torch extension is). torch 2.14's stable-ABI
# headers call dlsym (torch/csrc/stable/macros.h looks up shims newer than the extension's
# TORCH_TARGET_VERSION), so a stable build against them on a glibc >= 2.34 machine needed
# manylinux_2_34 for that one symbol. Only functions whose first version is the machine's base
# version belong here: a .symver naming a version the symbol never had fails the link.
LIBM_FLOOR_FUNCTIONS: tuple[str, ...] = (
    "exp",
    "exp2",
    "log",
    "log2",
    "pow",  # GLIBC_2.29
    "expf",
    "exp2f",
    "logf",
    "log2f",
    "powf",  # GLIBC_2.27
    "dlopen",
    "dlsym",
    "dlclose",
    "dlerror",
    "dladdr",
    "dlvsym",  # GLIBC_2.34
)
#: The first glibc symbol version of each machine: the versions the functions above had before.
GLIBC_BASE_VERSION: dict[str, str] = {"x86_64": "GLIBC_2.2.5", "aarch64": "GLIBC_2.17"}
LIBM_FLOOR_HEADER = "ampforge_libm_floor.h"


def libm_floor_shim(machine: str) -> str:
    """The forced-include header for *machine* (empty when its base version is unknown)."""
    base = GLIBC_BASE_VERSION.get(machine)
    if base is None:
        return ""
    directives = "\n".join(f'__asm__(".symver {f},{f}@{base}");' for f in LIBM_FLOOR_FUNCTIONS)
    return (
        f"/* ampforge build shim (builder/incell/steps.py): libm and libdl functions at their "
        f"{base} versions. */\n"
        "#if defined(__GNUC__) && !defined(__ASSEMBLER__) && !defined(AMPFORGE_LIBM_FLOOR)\n"
        f"#define AMPFORGE_LIBM_FLOOR\n{directives}\n#endif\n"
    )


# GCC >= 11's libstdc++ headers inline std::exception_ptr's copy and destructor as calls to
# _M_addref/_M_release (exported since CXXABI_1.3.13, GCC 11) and make allocators throw through
# __throw_bad_array_new_length (GLIBCXX_3.4.29). pybind11 copies an exception_ptr in every
# module's exception translation, so any torch extension built with GCC 12 needs the C++ runtime
# of glibc-2.34 systems: above manylinux2014 (glibc 2.17, GCC 4.8's libstdc++: GLIBCXX_3.4.19,
# CXXABI_1.3.7), the tag of the Ascend lines' torch wheels. This header gives the module its own
# inline definitions of those three: the two members call the library's out-of-line copy
# constructor and destructor (exported since CXXABI_1.3.3; looked up with dlvsym, bound to the
# base glibc version by the libm header, because a .symver reference to them would clash with
# their inline definitions in the same file), and the throw throws bad_alloc, the base class of
# bad_array_new_length. Only cells whose ceiling is below CXX_FLOOR_BELOW get it.
# The cross path (builder/cross/build.py) uses the same header: this is its one definition.
CXX_FLOOR_HEADER = "ampforge_cxx_floor.h"
#: A ceiling glibc below this one (manylinux_2_28) gets the C++ floor header.
CXX_FLOOR_BELOW = (2, 28)
CXX_FLOOR_SHIM = """\
/* ampforge build shim (builder/incell/steps.py): libstdc++ members newer than GCC 4.8's. */
#if defined(__cplusplus) && defined(__GNUC__) && !defined(AMPFORGE_CXX_FLOOR)
#define AMPFORGE_CXX_FLOOR
#include <dlfcn.h>
#include <exception>
#include <new>
#include <bits/functexcept.h>
namespace std {
[[noreturn]] inline void __throw_bad_array_new_length() { __throw_bad_alloc(); }
namespace __exception_ptr {
inline void* ampforge_cxxabi_133(const char* name) {
  return dlvsym(RTLD_DEFAULT, name, "CXXABI_1.3.3");
}
inline void exception_ptr::_M_addref() noexcept {
  static auto copy = reinterpret_cast<void (*)(void*, const void*)>(
      ampforge_cxxabi_133("_ZNSt15__exception_ptr13exception_ptrC1ERKS0_"));
  alignas(exception_ptr) unsigned char extra[sizeof(exception_ptr)];
  copy(extra, this);  /* the library's copy adds the reference; extra is never destroyed */
}
inline void exception_ptr::_M_release() noexcept {
  static auto destroy = reinterpret_cast<void (*)(void*)>(
      ampforge_cxxabi_133("_ZNSt15__exception_ptr13exception_ptrD1Ev"));
  destroy(this);  /* the library's destructor drops it (and frees it at zero) */
}
}  // namespace __exception_ptr
}  // namespace std
#endif
"""


def needs_cxx_floor(ceiling_glibc: str) -> bool:
    """Whether a cell whose wheel may need at most glibc *ceiling_glibc* ("2.17") gets the
    C++ floor header."""
    major, minor = (int(x) for x in ceiling_glibc.split(".")[:2])
    return (major, minor) < CXX_FLOOR_BELOW


def cxx11_abi_flag(abi: bool) -> str:
    """The define every extension built against a torch of that string ABI compiles with."""
    return f"-D_GLIBCXX_USE_CXX11_ABI={int(abi)}"


#: The variables naming the C and C++ compilers, and what a build uses when they are unset.
CCACHE_COMPILERS: tuple[tuple[str, str], ...] = (("CC", "gcc"), ("CXX", "g++"))


class CcacheSetupError(Exception):
    """The compiler the cache is to stand in front of cannot be found."""


def ccache_masquerade(
    env: dict[str, str],
    bin_dir: Path,
    *,
    ccache: str,
    basedir: str,
    statslog: str,
    cuda: bool = False,
) -> dict[str, str]:
    """The variables that compile every C/C++ file of a build through *ccache*, whatever drives
    the compiler: the one mechanism of every backend (the in-cell step and the cross build).

    ccache in *masquerade*: *bin_dir* gets links named like the compilers (``gcc``, ``g++``,
    ``aarch64-linux-gnu-g++``) pointing at ccache, which runs the real compiler of that name
    found further down ``PATH``. ``CC``/``CXX`` name the links, so they stay one word each:
    torch's ninja ``BuildExtension`` takes ``CXX`` as a single token (``CXX="ccache g++"``
    fails with ``Could not find compiler "-MMD"``), setuptools, ``use_ninja=False`` and CMake
    take ``CC``/``CXX`` as given, and whatever calls ``gcc`` from ``PATH`` finds the link first.
    torch's cpp_extension would put ccache in front once more (``_wrap_compiler``);
    ``TORCH_NO_COMPILER_WRAPPER`` leaves the wrapping to the links, so each compile is counted
    once. Paths under *basedir* hash relative to it (another build folder still hits); each
    compile's statistic goes to *statslog* (counted per cell by the host side). *env* is the
    build's environment (``CC``/``CXX``/``PATH`` as the build would see them); *cuda*: nvcc
    (the first on that ``PATH``, the cell's toolkit) gets a link too. Raises
    :class:`CcacheSetupError` when a compiler is not found.
    """
    search = env.get("PATH", os.defpath)
    bin_dir.mkdir(parents=True, exist_ok=True)
    out: dict[str, str] = {}
    real_dirs: list[str] = []
    for var, default in CCACHE_COMPILERS:
        words = shlex.split(env.get(var) or default)
        if words and Path(words[0]).name == "ccache":  # someone's CC="ccache gcc"
            words = words[1:]
        real = shutil.which(words[0], path=search) if words else None
        if real is None:
            raise CcacheSetupError(
                f"{var}={env.get(var) or default!r}: no such compiler on PATH ({search})"
            )
        link = bin_dir / Path(words[0]).name
        if not link.is_symlink():
            link.symlink_to(ccache)
        out[var] = shlex.join([str(link), *words[1:]])
        folder = str(Path(real).parent)
        if folder not in real_dirs:
            real_dirs.append(folder)
    # ccache looks the real compiler up by the link's name on PATH, skipping itself: the
    # compilers' own folders (an absolute CC's too) come right after the links.
    nvcc = shutil.which("nvcc", path=search) if cuda else None
    if cuda and nvcc is None:
        raise CcacheSetupError(f"a CUDA cell's build has no nvcc on PATH ({search})")
    if nvcc is not None:
        # nvcc too, for CUDA cells: a link named nvcc, and PYTORCH_NVCC naming it, the one
        # way into torch's ninja rule (it runs $CUDA_HOME/bin/nvcc otherwise, unwrapped under
        # TORCH_NO_COMPILER_WRAPPER). ccache (4.7) caches the `nvcc -MD -MF` compiles of
        # newer torches' rule (2.13's); the `--generate-dependencies-with-compile` of older
        # ones (2.6's) it cannot, and runs nvcc uncached. torch's setuptools path without
        # ninja calls CUDA_HOME's nvcc directly.
        link = bin_dir / "nvcc"
        if not link.is_symlink():
            link.symlink_to(ccache)
        out["PYTORCH_NVCC"] = str(link)
        folder = str(Path(nvcc).parent)
        if folder not in real_dirs:
            real_dirs.append(folder)
    out["PATH"] = os.pathsep.join([str(bin_dir), *real_dirs, search])
    out.update(
        TORCH_NO_COMPILER_WRAPPER="1",
        CCACHE_BASEDIR=basedir,
        CCACHE_NOHASHDIR="1",
        CCACHE_STATSLOG=statslog,
    )
    return out


def add_compile_flags(
    env: dict[str, str], flags: list[str], base: Optional[dict[str, str]] = None
) -> None:
    """Append *flags* to ``CFLAGS`` and ``CXXFLAGS`` in *env* (starting from *base*'s, this
    process's environment by default): setuptools, torch's BuildExtension (ninja or not) and
    CMake all add them to every compile."""
    if not flags:
        return
    start = os.environ if base is None else base
    for var in ("CFLAGS", "CXXFLAGS"):
        env[var] = " ".join([env.get(var, start.get(var, "")), *flags]).strip()


def evaluate_environment(assignments: list[tuple[str, str]], env: dict[str, str]) -> dict[str, str]:
    """cibuildwheel's ``environment``: each ``NAME=value`` (the value as written) evaluated in
    order by ``sh`` as an assignment -- ``$VAR``, ``${VAR}``, ``$(cmd)`` and quotes, no word
    splitting -- against *env* and the assignments before it. Returns the variables set. A
    failing evaluation names the variable, never its value (it may hold a passed secret)."""
    current = dict(env)
    out: dict[str, str] = {}
    for name, raw in assignments:
        proc = subprocess.run(
            ["sh", "-c", f'{name}={raw}\nprintf "%s" "${name}"'],
            env=current,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise ValueError(
                f"environment: {name}={raw} failed in the build environment "
                f"(exit {proc.returncode}): {proc.stderr.strip()[-300:]}"
            )
        current[name] = out[name] = proc.stdout
    return out


def frontend_argv(
    python: str,
    frontend: str,
    project: str,
    out: str,
    config_settings: list[tuple[str, str]],
    args: tuple[str, ...] = (),
    uv: str = "uv",
) -> list[str]:
    """The command that builds *project*'s wheel into *out* without build isolation: pip's
    ``pip wheel``, pypa/build's ``python -m build`` (``build`` and ``build[uv]``: uv installed
    the tools, the build itself is pypa/build's) or ``uv build`` (*uv*: its executable), with
    the PEP 517 config settings and cibuildwheel's ``; args:`` words (*args*) last.
    pip reads config settings only on the PEP 517 path (``--use-pep517``: a ``setup.py``-only
    project would otherwise run ``setup.py bdist_wheel`` and drop them, pip 23 silently)."""
    if frontend in ("build", "build[uv]"):  # pypa/build spells it in the singular
        return [
            python,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--skip-dependency-check",
            "--outdir",
            out,
            *[f"--config-setting={k}={v}" for k, v in config_settings],
            project,
            *args,
        ]
    if frontend == "uv":
        # --python: the build environment's interpreter runs the backend (uv finds no other);
        # --no-build-isolation: torch and the build requirements are the ones installed there.
        return [
            uv,
            "build",
            "--wheel",
            "--no-build-isolation",
            "--python",
            python,
            "--out-dir",
            out,
            *[f"--config-setting={k}={v}" for k, v in config_settings],
            project,
            *args,
        ]
    settings = [f"--config-settings={k}={v}" for k, v in config_settings]
    return [
        python,
        "-m",
        "pip",
        "wheel",
        "--no-build-isolation",
        "--no-deps",
        "--disable-pip-version-check",
        "--no-input",
        *(["--use-pep517"] if settings else []),
        *settings,
        "-w",
        out,
        # A bare name would be looked up on the index: always pass a path.
        project,
        *args,
    ]


#: pip's settings (its environment variables; ``pip config`` keys are the same names without
#: ``PIP_``, lower case, ``-`` for ``_``) and uv's variable for each: uv reads no pip.conf and
#: no PIP_* variable, so the step carries them over. uv reads HTTP(S)_PROXY, ALL_PROXY and
#: NO_PROXY itself, and SSL_CERT_FILE (a PEM bundle: the builder's merged CA bundle).
PIP_TO_UV: tuple[tuple[str, str], ...] = (
    ("PIP_INDEX_URL", "UV_DEFAULT_INDEX"),
    ("PIP_EXTRA_INDEX_URL", "UV_INDEX"),
    ("PIP_FIND_LINKS", "UV_FIND_LINKS"),
    ("PIP_NO_INDEX", "UV_NO_INDEX"),
    ("PIP_TRUSTED_HOST", "UV_INSECURE_HOST"),
    ("PIP_CERT", "SSL_CERT_FILE"),
    ("PIP_CLIENT_CERT", "SSL_CLIENT_CERT"),
    ("PIP_TIMEOUT", "UV_HTTP_TIMEOUT"),
    ("PIP_DEFAULT_TIMEOUT", "UV_HTTP_TIMEOUT"),
    ("PIP_RETRIES", "UV_HTTP_RETRIES"),
)
#: uv's separators differ from pip's for lists of URLs: pip takes spaces everywhere, uv's
#: UV_FIND_LINKS takes commas.
_UV_COMMA_LISTS = ("UV_FIND_LINKS",)


def pip_configuration(python: str) -> dict[str, str]:
    """pip's configuration files' settings as PIP_* names (``global.index-url`` ->
    ``PIP_INDEX_URL``; an ``install.`` key wins over a ``global.`` one, as for ``pip install``);
    {} when the environment has no pip."""
    try:
        proc = subprocess.run(
            [python, "-m", "pip", "config", "list"], capture_output=True, text=True
        )
    except OSError:
        return {}
    found: dict[str, tuple[int, str]] = {}
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        key, eq, raw = line.partition("=")
        section, dot, name = key.partition(".")
        if not eq or not dot or section not in ("global", "install"):
            continue  # ":env:." lines are PIP_* variables, read from the environment itself
        value = raw.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        rank = 1 if section == "install" else 0
        var = "PIP_" + name.upper().replace("-", "_")
        if var not in found or found[var][0] <= rank:
            found[var] = (rank, value)
    return {var: value for var, (_rank, value) in found.items()}


def uv_environment(
    env: dict[str, str], configured: dict[str, str], offline: bool = False
) -> tuple[dict[str, str], list[str]]:
    """uv's variables for pip's settings: *env*'s PIP_* variables (the builder's index, CA and
    network settings, and the caller's), else pip's configuration files' (*configured*). A UV_*
    variable already in *env* is kept. *offline* (a wheelhouse build): no index at all, and
    ``UV_OFFLINE``, as the builder's pip gets no index then. Returns the variables and, for
    the log, what came from where (names only: an index URL may carry a password)."""
    # UV_PYTHON_DOWNLOADS: the cell's interpreter or none, never one uv would download.
    out: dict[str, str] = {"UV_PYTHON_DOWNLOADS": "never"}
    said: list[str] = []
    if offline:
        out["UV_OFFLINE"] = "1"
        said.append("UV_OFFLINE (a wheelhouse build)")
    for pip_var, uv_var in PIP_TO_UV:
        if uv_var in env or uv_var in out:
            continue
        if offline and uv_var in ("UV_DEFAULT_INDEX", "UV_INDEX"):
            continue
        value, where = env.get(pip_var), pip_var
        if not value and pip_var in configured:
            value, where = configured[pip_var], "pip.conf " + pip_var[4:].lower().replace("_", "-")
        if not value:
            continue
        if uv_var in _UV_COMMA_LISTS:
            value = ",".join(value.split())
        if uv_var in ("UV_HTTP_TIMEOUT", "UV_HTTP_RETRIES"):  # uv takes whole numbers
            try:
                value = str(max(1 if uv_var == "UV_HTTP_TIMEOUT" else 0, round(float(value))))
            except ValueError:
                continue
        if uv_var == "UV_NO_INDEX" and value.lower() not in ("1", "true", "yes", "on"):
            continue
        out[uv_var] = value
        said.append(f"{uv_var} from {where}")
    return out, said


def uv_source_args(args: argparse.Namespace) -> list[str]:
    """``uv pip install``'s form of :func:`_pip_source_args`."""
    if args.wheelhouse:
        return ["--no-index", "--find-links", args.wheelhouse]
    return ["--default-index", args.index_url] if args.index_url else []


def layer_sites(python: str, sites: list[str]) -> None:
    """Put *sites* (another environment's site-packages) on *python*'s ``sys.path`` after its
    own, with a ``.pth`` file: pip and the build see what is installed there (torch) and
    install into this environment, never into the other."""
    purelib = subprocess.check_output(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
    )
    Path(purelib.strip(), "ampforge-torch.pth").write_text(
        "".join(folder + "\n" for folder in sites if folder)
    )


def _result(**fields: object) -> None:
    print(RESULT_PREFIX + json.dumps(fields, sort_keys=True), flush=True)


def _fail(message: str) -> NoReturn:
    print("error: " + message, file=sys.stderr, flush=True)
    raise SystemExit(1)


def _run(argv: list[str], env: Optional[dict[str, str]] = None, cwd: Optional[str] = None) -> None:
    print("+ " + " ".join(argv), flush=True)
    full = dict(os.environ)
    full.update(env or {})
    start = time.monotonic()
    code = subprocess.call(argv, env=full, cwd=cwd)
    print(f"+ exit {code} after {time.monotonic() - start:.1f}s", flush=True)
    if code != 0:
        _fail(f"command failed with exit code {code}: {' '.join(argv)}")


#: The lines of a build's output that are the compiler's (or linker's) own errors: a failing
#: build's traceback (torch's ninja path: ``RuntimeError: Error compiling objects``) pushes them
#: out of the output's tail, so they are repeated last. The cross build uses it too.
COMPILER_ERROR = re.compile(r": (?:fatal )?error:|undefined reference")


def _run_build(argv: list[str], env: dict[str, str]) -> None:
    """:func:`_run` for the build frontend: on failure, the compiler's error lines again."""
    print("+ " + " ".join(argv), flush=True)
    start = time.monotonic()
    errors: list[str] = []
    context = False  # gcc prints the offending source line right after its error line
    with subprocess.Popen(
        argv,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            if (context or COMPILER_ERROR.search(line)) and len(errors) < 8:
                errors.append(line.strip())
                context = not context
    sys.stdout.flush()
    print(f"+ exit {proc.returncode} after {time.monotonic() - start:.1f}s", flush=True)
    if proc.returncode != 0:
        if errors:
            print("compiler errors:\n" + "\n".join(errors), flush=True)
        _fail(f"command failed with exit code {proc.returncode}: {' '.join(argv)}")


def _shell(what: str, command: str, env: dict[str, str], cwd: str) -> None:
    """A before-all/before-build command through ``sh -c`` in the project's folder."""
    print(f"+ {what}: {command}", flush=True)
    full = {**os.environ, **env}
    start = time.monotonic()
    code = subprocess.call(["sh", "-c", command], env=full, cwd=cwd)
    print(f"+ {what} exit {code} after {time.monotonic() - start:.1f}s", flush=True)
    if code != 0:
        _fail(f"{what} failed with exit code {code}: {command}")


def _cibw_environment(assignments: list[str], env: dict[str, str]) -> dict[str, str]:
    """cibuildwheel's ``environment`` (``NAME=value`` words as written) evaluated over this
    process's environment and *env*. Names and values as written are logged, never the
    evaluated values (they may use a passed secret)."""
    pairs = [(a.split("=", 1)[0], a.split("=", 1)[1]) for a in assignments]
    for name, raw in pairs:
        print(f"+ environment: {name}={raw}", flush=True)
    try:
        return evaluate_environment(pairs, {**os.environ, **env})
    except ValueError as exc:
        _fail(str(exc))


def _pip_source_args(args: argparse.Namespace) -> list[str]:
    if args.wheelhouse:
        # Offline: only what the wheelhouse holds; pip names the missing requirement.
        return ["--no-index", "--find-links", args.wheelhouse]
    out: list[str] = []
    if args.index_url:
        out += ["--index-url", args.index_url]
    return out


def cmd_venv(args: argparse.Namespace) -> None:
    # Layered on another environment: its pip and setuptools serve, none of the venv's own
    # would shadow them.
    try:
        venv.create(
            args.dest,
            with_pip=not args.layer,
            clear=True,
            system_site_packages=args.system_site_packages,
        )
    except subprocess.CalledProcessError as exc:
        # venv runs ensurepip with its output captured: without it here, the log would show
        # only "returned non-zero exit status 1" (a full disk, for one, would go unsaid).
        sys.stderr.write(
            exc.output.decode(errors="replace")
            if isinstance(exc.output, bytes)
            else str(exc.output or "")
        )
        raise
    exe = Path(args.dest) / "bin" / "python"
    if args.layer:
        layer_sites(str(exe), args.layer.split(os.pathsep))
    _result(python=str(exe), version="{}.{}".format(*sys.version_info[:2]))


def cmd_install_torch(args: argparse.Namespace) -> None:
    reqs = ["torch==" + args.torch] + list(args.extra)
    # --no-compile: byte-compiling torch's thousands of modules costs more CPU than the
    # compile of a kernel file, for files that are compiled lazily on import anyway.
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
            "--no-compile",
            *_pip_source_args(args),
            *reqs,
        ]
    )
    # A bounded build requirement (the support table's setuptools<70 for torch 2.1) is brought
    # to the newest release inside its bound: "already satisfied" would keep the venv's own
    # (Python 3.8's ensurepip gives setuptools 56, which ignores pyproject.toml's [project]
    # table, so the wheel came out named UNKNOWN without the project's packages).
    bounded = [r for r in args.extra if re.search(r"[<>=!~]", r)]
    if bounded:
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                "--no-compile",
                "--upgrade",
                *_pip_source_args(args),
                *bounded,
            ]
        )
    _warm_bytecode()
    _result(torch=md.version("torch"))


#: What the builds and verifications run in a torch environment import from it: torch and its
#: extension builder (every build), and what the first optimizer a test makes imports lazily
#: (torch.optim's Optimizer.__init__ imports torch._dynamo on first use in torch 2.x: some 800
#: modules, 2 s of compiling on every verification without their bytecode).
WARM_IMPORTS = (
    "import torch, torch.utils.cpp_extension, torch.optim; "
    "torch.optim.SGD([torch.zeros(1, requires_grad=True)])"
)


def _warm_bytecode() -> None:
    """Byte-compile, once, the modules every later build in this environment imports.

    torch goes in with ``--no-compile`` (byte-compiling all of its modules costs more CPU than
    a kernel build), but the environment is cached and every build and verification after this
    one imports torch from it: without bytecode each of those imports compiles about a thousand
    modules again (torch 2.13: 4.2 CPU-s per ``import torch`` against 2.2 with bytecode), and
    where ``PYTHONDONTWRITEBYTECODE`` is set, as many CI images set it, they are never written
    and every import pays. One import here, with writing allowed, leaves the bytecode of just
    the modules imported. Only for a torch installed into this environment: a torch borrowed
    from the interpreter's own site-packages is not this builder's to write into. Best effort:
    a torch that does not import fails the build's own import, which says why."""
    try:
        site = str(md.distribution("torch").locate_file(""))
    except md.PackageNotFoundError:
        return
    prefix = os.path.realpath(sys.prefix)
    if os.path.commonpath([os.path.realpath(site), prefix]) != prefix:
        return
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    start = time.monotonic()
    code = subprocess.call(
        [sys.executable, "-c", WARM_IMPORTS],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    print(
        f"+ bytecode of `{WARM_IMPORTS}` written: exit {code} after "
        f"{time.monotonic() - start:.1f}s",
        flush=True,
    )


def cuda_home_in(sites: list[str]) -> str:
    """The CUDA toolkit the index's nvidia-cuda-nvcc wheel installed among *sites*: the
    ``nvidia/cu<major>`` folder holding ``bin/nvcc`` (its ``include``, ``lib`` and ``nvvm``
    beside it, from the other toolkit wheels); '' when none is there."""
    for site in sites:
        found = sorted(Path(site, "nvidia").glob("cu*/bin/nvcc"))
        if found:
            return str(found[-1].parent.parent)
    return ""


def cmd_install_toolkit(args: argparse.Namespace) -> None:
    """The CUDA toolkit's wheels (the resolved record's pins, one requirement a line in
    *--requirements*) into this environment, then what a wheel cannot hold: wheels carry no
    symbolic links, so the runtime wheel has ``libcudart.so.13`` but not the ``libcudart.so``
    that ``-lcudart`` (torch's CUDAExtension link line) looks for."""
    hashed = ["--require-hashes"] if args.hashed else []
    # --no-deps: the pins are the whole toolkit (nvcc's own requirements are among them), and
    # --require-hashes needs every installed file's digest named anyway.
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
            "--no-compile",
            "--no-deps",
            *hashed,
            *_pip_source_args(args),
            "-r",
            args.requirements,
        ]
    )
    sites = _torch_folders(md.distribution("torch")) if _has("torch") else []
    sites += [sysconfig.get_paths()["platlib"], sysconfig.get_paths()["purelib"]]
    home = cuda_home_in(sites)
    if not home:
        _fail(f"no nvidia/cu*/bin/nvcc in {sites} after installing the toolkit")
    lib = Path(home, "lib")
    for versioned in sorted(lib.glob("libcudart.so.*")):
        link = lib / "libcudart.so"
        if not link.exists():
            link.symlink_to(versioned.name)
        break
    version = (
        subprocess.run(
            [str(Path(home, "bin", "nvcc")), "--version"], capture_output=True, text=True
        )
        .stdout.strip()
        .splitlines()
    )
    _result(cuda_home=home, nvcc=version[-1] if version else "")


def _has(name: str) -> bool:
    try:
        md.distribution(name)
    except md.PackageNotFoundError:
        return False
    return True


def _remote_size(url: str) -> Optional[int]:
    """The size of the file at *url*: a ``file:`` URL's file, else the index's
    ``Content-Length`` for a HEAD request (proxies from the environment); None if unknown."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "file":
        try:
            return os.path.getsize(urllib.request.url2pathname(parts.path))
        except OSError:
            return None
    if parts.scheme not in ("http", "https"):
        return None
    try:
        request = urllib.request.Request(url.split("#")[0], method="HEAD")
        with urllib.request.urlopen(request, timeout=60) as response:
            length = response.headers.get("Content-Length")
    except (OSError, ValueError):
        return None
    return int(length) if length and length.isdigit() else None


def cmd_download_size(args: argparse.Namespace) -> None:
    """What ``install-torch`` would download, without downloading it: pip resolves with
    ``--dry-run --report`` (an index that serves PEP 658 metadata is never asked for the
    wheels themselves), then each file's size comes from the index (names and sizes only are
    printed: a URL may carry credentials)."""
    reqs = ["torch==" + args.torch] + list(args.extra)
    report = Path(args.report)
    pip = [f"{args.pip}/pip"] if args.pip else ["-m", "pip"]
    # An index without PEP 658 metadata: read each wheel's metadata with range requests rather
    # than downloading the wheel (the builder's own pip, --pip, knows the feature).
    lazy = ["--use-feature=fast-deps"] if args.pip else []
    argv = [
        sys.executable,
        *pip,
        "install",
        *lazy,
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--disable-pip-version-check",
        "--no-input",
        "--report",
        str(report),
        *_pip_source_args(args),
        *reqs,
    ]
    print("+ " + " ".join(argv), flush=True)
    code = subprocess.call(argv)
    if code != 0 or not report.is_file():
        _result(sized=False, reason=f"pip's dry run exited with code {code}")
        return
    items = []
    for entry in json.loads(report.read_text()).get("install", []):
        meta = entry.get("metadata", {})
        url = (entry.get("download_info") or {}).get("url", "")
        items.append(
            {
                "name": meta.get("name", "?"),
                "version": meta.get("version", "?"),
                "size": _remote_size(url),
            }
        )
    _result(sized=True, items=items)


def _folder_of(dist: md.Distribution) -> str:
    return str(Path(str(dist.locate_file(""))).resolve())


def _torch_folders(torch: md.Distribution) -> list[str]:
    """torch's folder, then those of everything it requires (transitively), each once: in a
    lib64 layout torch is in ``lib64/...`` and its pure-Python requirements in ``lib/...``."""
    folders: list[str] = []
    seen: set[str] = set()
    todo = [torch]
    while todo:
        dist = todo.pop(0)
        name = re.sub(r"[-_.]+", "-", str(dist.metadata["Name"] or "")).lower()
        if name in seen:
            continue
        seen.add(name)
        if _folder_of(dist) not in folders:
            folders.append(_folder_of(dist))
        for req in dist.requires or ():
            if "extra" in req.partition(";")[2]:
                continue  # an optional feature's requirement
            m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
            if m is None:
                continue
            try:
                todo.append(md.distribution(m.group(1)))
            except md.PackageNotFoundError:
                pass  # excluded by its marker on this interpreter
    return folders


def cmd_site(args: argparse.Namespace) -> None:
    """Which torch this interpreter has and the folders it and its requirements are installed
    in: a prepared (cached) torch environment is checked with this instead of installing again,
    and verification layers its venv on those folders.

    The folders are where the distributions' own metadata is, never a guessed ``purelib``: a
    binary wheel goes to *platlib*, which is ``lib64/...`` on RHEL-family interpreters
    (``sys.platlibdir``) while pure-Python requirements go to ``lib/...``, and a venv with
    system site packages has torch outside the venv."""
    try:
        dist = md.distribution("torch")
    except md.PackageNotFoundError:
        if args.optional:
            _result(torch="", site="", sites=[], platlibdir=_PLATLIBDIR)
            return
        _fail(f"{sys.executable} has no torch installed")
    folders = _torch_folders(dist)
    # A CUDA cell's environment has its toolkit too (install-toolkit): the build's CUDA_HOME.
    home = cuda_home_in([*folders, sysconfig.get_paths()["platlib"]])
    _result(
        torch=dist.version, site=folders[0], sites=folders, platlibdir=_PLATLIBDIR, cuda_home=home
    )


def _glibc_has_single_threaded() -> bool:
    inc = sysconfig.get_config_var("INCLUDEDIR") or "/usr/include"
    candidates = [Path("/usr/include/sys/single_threaded.h"), Path(inc) / "sys/single_threaded.h"]
    multiarch = sysconfig.get_config_var("MULTIARCH")
    if multiarch:
        candidates.append(Path("/usr/include") / multiarch / "sys/single_threaded.h")
    return any(p.exists() for p in candidates)


def cmd_build_wheel(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.glob("*.whl"))
    env = {"AMP_LOCAL_VERSION": args.local_version} if args.local_version else {}
    if args.cuda_home:
        # A CUDA cell: torch's cpp_extension takes the compiler from CUDA_HOME (the toolkit's
        # wheels in the cell's torch environment, never a system CUDA) and the targets from
        # TORCH_CUDA_ARCH_LIST; nvcc first on PATH for setup.py files that look for it there.
        env.update(
            CUDA_HOME=args.cuda_home,
            CUDA_PATH=args.cuda_home,
            TORCH_CUDA_ARCH_LIST=args.cuda_arch_list,
            PATH=str(Path(args.cuda_home, "bin")) + os.pathsep + os.environ.get("PATH", ""),
        )
    # cibuildwheel's environment first: the builder's flags and compiler cache then apply on
    # top of what it sets (CFLAGS="$CFLAGS -O3", CC=clang).
    env.update(_cibw_environment(args.environment, env))
    host_flags: list[str] = []  # the same flags for nvcc's host compiler (a CUDA cell)
    use_shim = args.shim == "on" or (args.shim == "auto" and _glibc_has_single_threaded())
    if use_shim:
        shim_dir = (Path(args.out).resolve().parent / "shim").resolve()
        (shim_dir / "sys").mkdir(parents=True, exist_ok=True)
        (shim_dir / "sys" / "single_threaded.h").write_text(_SHIM)
        # An absolute -I path: the compiler runs from temporary build directories.
        add_compile_flags(env, ["-I" + str(shim_dir)])
        host_flags.append("-I" + str(shim_dir))
    libm_shim = libm_floor_shim(platform.machine()) if args.libm_floor else ""
    if libm_shim:
        header = (Path(args.out).resolve().parent / "shim" / LIBM_FLOOR_HEADER).resolve()
        header.parent.mkdir(parents=True, exist_ok=True)
        header.write_text(libm_shim)
        add_compile_flags(env, ["-include", str(header)])
        host_flags.append("-include," + str(header))
    if args.cxx_floor:
        header = (Path(args.out).resolve().parent / "shim" / CXX_FLOOR_HEADER).resolve()
        header.parent.mkdir(parents=True, exist_ok=True)
        header.write_text(CXX_FLOOR_SHIM)
        add_compile_flags(env, ["-include", str(header)])
        host_flags.append("-include," + str(header))
    if args.cxx11_abi != "auto":
        # The cell's record says which string ABI its torch was built with (the support table's
        # torch_cxx11_abi): the torch installed here must agree, and the compile uses it even
        # where a project's own build passes no define.
        _check_cxx11_abi(args.cxx11_abi == "1")
        add_compile_flags(env, [cxx11_abi_flag(args.cxx11_abi == "1")])
        host_flags.append(cxx11_abi_flag(args.cxx11_abi == "1"))
    for mapping in args.prefix_map:
        # Reproducible builds: the session's directory differs per build (the host backend's
        # temporary folders), and torch's headers put __FILE__ into the binary (error messages).
        # Mapping it to one fixed name makes the compiled module independent of where it was built.
        add_compile_flags(env, ["-ffile-prefix-map=" + mapping])
        host_flags.append("-ffile-prefix-map=" + mapping)
    # The build config's extra_cflags (build.extra_cflags), after the builder's own flags.
    add_compile_flags(env, args.cflag)
    host_flags += [f for f in args.cflag if "," not in f]  # -Xcompiler splits on commas
    if args.cuda_home and host_flags:
        # nvcc compiles a .cu file's host code with g++ but reads neither CFLAGS nor CXXFLAGS:
        # without the shims its objects referenced __libc_single_threaded (GLIBC_2.32) and
        # the wheel failed its manylinux_2_28 ceiling. nvcc appends NVCC_APPEND_FLAGS to every
        # command line it runs (the host compiler's part through -Xcompiler).
        env["NVCC_APPEND_FLAGS"] = " ".join(
            [os.environ.get("NVCC_APPEND_FLAGS", ""), *(f"-Xcompiler={f}" for f in host_flags)]
        ).strip()
    use_ccache = args.ccache == "on" or (args.ccache == "auto" and shutil.which("ccache"))
    if args.ccache == "on" and not shutil.which("ccache"):
        _fail("--ccache on: ccache is not installed in this build environment")
    if args.ccache == "off":
        # Off means off: torch's cpp_extension puts ccache in front of the compiler by itself
        # whenever one is on PATH (TORCH_NO_COMPILER_WRAPPER turns that off; CCACHE_DISABLE
        # makes any ccache that still runs call the compiler directly).
        env.update(CCACHE_DISABLE="1", TORCH_NO_COMPILER_WRAPPER="1")
    if use_ccache:
        # The session's directory is the base (a build in another temporary folder, the host
        # backend's, still hits); this build's statistics go to a log the host side counts.
        work = Path(args.out).resolve().parent
        try:
            env.update(
                ccache_masquerade(
                    {**os.environ, **env},
                    work / "ccache-bin",
                    ccache=str(shutil.which("ccache")),
                    basedir=str(Path(args.project).resolve().parent),
                    statslog=str(work / "ccache-stats.log"),
                    cuda=bool(args.cuda_home),
                )
            )
        except CcacheSetupError as exc:
            _fail(f"ccache: {exc}")
    project = str(Path(args.project).resolve())
    if args.before_all:
        _shell("before-all", args.before_all, env, project)
    bindir = str(Path(sys.executable).parent)
    uv, uv_version = "", ""
    if args.frontend in ("build[uv]", "uv"):
        # Before before-build, as cibuildwheel's uv is there: `uv pip install` in it installs
        # into the build environment (UV_PYTHON), with pip's settings carried over.
        uv, uv_version = install_uv(args, env)
        mapped, said = uv_environment(
            {**os.environ, **env}, pip_configuration(sys.executable), offline=bool(args.wheelhouse)
        )
        env.update(mapped, UV_PYTHON=sys.executable)
        env["PATH"] = (
            str(Path(uv).parent) + os.pathsep + env.get("PATH", os.environ.get("PATH", ""))
        )
        print(
            f"+ uv: {uv_version} at {uv}; pip's settings for uv: {', '.join(said) or 'none set'}",
            flush=True,
        )
    if args.before_build:
        # The build environment's python and pip first on PATH, as cibuildwheel's.
        path = bindir + os.pathsep + env.get("PATH", os.environ.get("PATH", ""))
        _shell("before-build", args.before_build, {**env, "PATH": path}, project)
    if args.frontend == "build":
        try:
            subprocess.check_call([sys.executable, "-c", "import build"], stderr=subprocess.DEVNULL)
        except subprocess.CalledProcessError:
            _run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "--disable-pip-version-check",
                    "--no-input",
                    *_pip_source_args(args),
                    "build",
                ],
                env=env,
            )
    elif args.frontend == "build[uv]":
        try:
            subprocess.check_call([sys.executable, "-c", "import build"], stderr=subprocess.DEVNULL)
        except subprocess.CalledProcessError:
            _run(
                [uv, "pip", "install", "--python", sys.executable, *uv_source_args(args), "build"],
                env=env,
            )
    pip_version = subprocess.run(
        [sys.executable, "-m", "pip", "--version"], capture_output=True, text=True
    ).stdout.split(" from ")[0]
    tools = [pip_version or "no pip"] + ([uv_version] if uv else [])
    print(f"+ build frontend: {args.frontend} ({', '.join(tools)})", flush=True)
    if args.frontend_arg:
        print(f"+ build frontend args: {shlex.join(args.frontend_arg)}", flush=True)
    settings = [tuple(c.split("=", 1)) for c in args.config_setting]
    _run_build(
        frontend_argv(
            sys.executable,
            args.frontend,
            project,
            str(out),
            settings,
            tuple(args.frontend_arg),
            uv or "uv",
        ),
        env=env,
    )
    new = sorted(set(out.glob("*.whl")) - before)
    if len(new) != 1:
        _fail(f"expected exactly one new wheel in {out}, found {[p.name for p in new]}")
    wheel = new[0]
    version = wheel.name.split("-")[1]
    if args.local_version and not version.endswith("+" + args.local_version):
        _fail(
            f"the wheel's version {version!r} does not carry the local version "
            f"+{args.local_version}: the project's build must append $AMP_LOCAL_VERSION "
            "to its version"
        )
    _result(
        wheel=str(wheel),
        shim=use_shim,
        ccache=bool(use_ccache),
        libm_floor=bool(libm_shim),
        frontend=args.frontend,
        pip=pip_version,
        uv=uv_version,
    )


def install_uv(args: argparse.Namespace, env: dict[str, str]) -> tuple[str, str]:
    """The pinned uv (``--uv-requirement``: configs/uv.txt's line, with its hashes) into this
    environment by pip, ``--require-hashes``, from the wheelhouse offline; its executable and
    ``uv --version``."""
    if not args.uv_requirement:
        _fail(f"build frontend {args.frontend} needs --uv-requirement (the pinned uv)")
    req = Path(args.out).resolve().parent / "uv-requirements.txt"
    req.write_text(args.uv_requirement + "\n")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
            "--no-compile",
            "--no-deps",
            "--require-hashes",
            *_pip_source_args(args),
            "-r",
            str(req),
        ],
        env=env,
    )
    scripts = [sysconfig.get_path("scripts"), str(Path(sys.executable).parent)]
    uv = next((str(Path(d, "uv")) for d in scripts if Path(d, "uv").is_file()), "")
    if not uv:
        _fail(
            f"pip installed {args.uv_requirement.split()[0]} but no uv executable is in "
            f"{' or '.join(scripts)}"
        )
    version = subprocess.run([uv, "--version"], capture_output=True, text=True)
    if version.returncode != 0:
        _fail(f"{uv} --version failed (exit {version.returncode}): {version.stderr.strip()[-300:]}")
    return uv, version.stdout.strip()


def _check_cxx11_abi(expected: bool) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        _fail(f"cannot read torch's string ABI: {probe.stderr.strip()[-400:]}")
    found = probe.stdout.strip() == "1"
    if found != expected:
        _fail(
            f"the torch installed here was built with _GLIBCXX_USE_CXX11_ABI={int(found)}, "
            f"the cell's record says {int(expected)} (torch_cxx11_abi of the support table): "
            "correct the table"
        )


def _has_pip(sites: list[str]) -> bool:
    return any(Path(site, "pip", "__init__.py").is_file() for site in sites)


def cmd_smoke(args: argparse.Namespace) -> None:
    wheel = Path(args.wheel)
    # cibuildwheel's environment applies to the tests as to the build (its test venv starts
    # from the build's environment): evaluated here again, in the verification's environment,
    # for the install, the import check, test-requires and test-command.
    env = _cibw_environment(args.environment, {})
    sites = [s for s in (args.torch_site or "").split(os.pathsep) if s]
    # The prepared torch environment's pip serves the venv layered on it, as its torch does:
    # pip installs into the environment it runs in (sys.prefix: this venv), and a pip the
    # venv installs later (a before-test's `pip install -U pip`) comes first on its path.
    # ensurepip would cost more than the rest of the verification's Python work (5 CPU-s a
    # venv: it runs pip from a zip file, whose modules are compiled again on every import).
    layered_pip = _has_pip(sites)
    venv.create(args.venv, with_pip=not layered_pip, clear=True)
    if layered_pip:
        print("+ verification venv: pip from the torch environment it is layered on", flush=True)
    py = str(Path(args.venv) / "bin" / "python")
    if sites:
        # A fresh venv layered on the cell's prepared torch (a .pth line puts its site-packages
        # on sys.path, after the venv's own): pip sees torch==X installed and resolves the
        # wheel's requirements against it instead of downloading torch a second time.
        layer_sites(py, sites)
    testing = bool(args.test_command)
    if testing and args.before_test:
        # cibuildwheel's before-test: in the verification venv, before the wheel is installed
        # (it may install what the wheel's own install needs), from the project's copy.
        _shell(
            "before-test",
            args.before_test,
            _venv_env(args.venv, py, env),
            args.project or args.venv,
        )
    # cibuildwheel's test-extras: the wheel installed with those extras (only for a test).
    target = str(wheel) + (f"[{','.join(args.test_extra)}]" if testing and args.test_extra else "")
    _run(
        [
            py,
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-input",
            "--no-compile",
            *_pip_source_args(args),
            "torch==" + args.torch,
            target,
        ],
        env=env,
    )
    mods, libs = sorted(set(args.module)), sorted(set(args.library))
    # Importing from a neutral directory, so the installed wheel is used, never a source tree.
    # The other shared objects are loaded as their packages do (torch.ops.load_library), from
    # where the wheel installed them.
    code = "import torch\n" + "".join(f"import {m}\n" for m in mods)
    if libs:
        code += (
            "import os, sysconfig\n"
            f"for lib in {libs!r}:\n"
            "    found = [os.path.join(sysconfig.get_paths()[k], lib)\n"
            "             for k in ('platlib', 'purelib')]\n"
            "    found = [f for f in found if os.path.exists(f)]\n"
            "    assert found, 'not installed: ' + lib\n"
            "    torch.ops.load_library(found[0])\n"
        )
    code += f"print('smoke: imported', {mods!r}, 'loaded', {libs!r})\n"
    # The import check and the project's test run side by side: both only read the venv, and
    # each starts by importing torch (a second or more, on one core each). The check's output
    # is shown after the test's, and a failed import is what the step fails with, whatever
    # the test did: it is the cause to report.
    check = _Background([py, "-c", code], env=env, cwd=args.venv)
    tested = None
    try:
        if args.test_command:
            tested = _project_test(args, py, env)
    finally:
        check.finish()
    _result(modules=mods, libraries=libs, test_seconds=tested)


class _Background:
    """A command started now whose output is kept until :meth:`finish`, which prints it and
    fails the step (as :func:`_run` does) when the command failed."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: str) -> None:
        self.argv = argv
        self.output = tempfile.TemporaryFile(mode="w+")
        self.start = time.monotonic()
        self.proc = subprocess.Popen(
            argv,
            env={**os.environ, **env},
            cwd=cwd,
            stdout=self.output,
            stderr=subprocess.STDOUT,
        )

    def finish(self) -> None:
        code = self.proc.wait()
        took = time.monotonic() - self.start
        self.output.seek(0)
        print("+ " + " ".join(self.argv), flush=True)
        sys.stdout.write(self.output.read())
        self.output.close()
        print(f"+ exit {code} after {took:.1f}s", flush=True)
        if code != 0:
            _fail(f"command failed with exit code {code}: {' '.join(self.argv)}")


def _project_test(args: argparse.Namespace, py: str, environment: dict[str, str]) -> float:
    """cibuildwheel's test step: test-requires into the verification venv, then test-command
    through ``sh -c`` from an empty folder, with the cibuildwheel *environment* and the venv's
    bin first on PATH (the host side expanded the placeholders). Returns the command's
    seconds; a non-zero exit fails."""
    if args.test_requires:
        _run(
            [
                py,
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                "--no-compile",
                *_pip_source_args(args),
                *args.test_requires,
            ],
            env=environment,
        )
    cwd = Path(args.venv).resolve().parent / "test-cwd"
    shutil.rmtree(cwd, ignore_errors=True)
    cwd.mkdir(parents=True)
    copy_test_sources(args.project, args.test_source, cwd)
    env = _venv_env(args.venv, py, environment)
    print("+ test-command: " + args.test_command, flush=True)
    start = time.monotonic()
    code = subprocess.call(["sh", "-c", args.test_command], env=env, cwd=str(cwd))
    seconds = time.monotonic() - start
    print(f"+ test-command exit {code} after {seconds:.1f}s", flush=True)
    if code != 0:
        _fail(f"test-command failed with exit code {code}: {args.test_command}")
    return round(seconds, 1)


def _venv_env(venv_dir: str, py: str, environment: dict[str, str]) -> dict[str, str]:
    """This process's environment with cibuildwheel's *environment* and the verification venv
    active (its bin first on PATH), as the test's commands see it."""
    env = {**os.environ, **environment}
    env["PATH"] = str(Path(py).parent) + os.pathsep + env.get("PATH", "")
    env["VIRTUAL_ENV"] = str(Path(venv_dir).resolve())
    env.pop("PYTHONHOME", None)
    return env


def copy_test_sources(project: str, sources: list[str], cwd: Path) -> None:
    """cibuildwheel's test-sources: each project-relative path copied into the test's working
    folder, at the same relative place (the host side checked they are in the project)."""
    for rel in sources:
        src, dest = Path(project) / rel, cwd / rel
        if not src.exists():
            _fail(f"test-sources: {rel!r} is not in the project's copy {project}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(src, dest)
        print(f"+ test-sources: copied {rel}", flush=True)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="steps.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("venv", help="create a venv with pip for this interpreter")
    p.add_argument("dest")
    p.add_argument(
        "--system-site-packages",
        action="store_true",
        help="the venv sees this interpreter's own packages (its torch)",
    )
    p.add_argument(
        "--layer",
        default="",
        metavar="SITES",
        help="layer the venv (without a pip of its own) on these site-packages "
        "folders (os.pathsep-separated), after its own",
    )
    p.set_defaults(func=cmd_venv)

    def sources(q: argparse.ArgumentParser) -> None:
        q.add_argument("--wheelhouse", help="offline: install only from this directory")
        q.add_argument("--index-url", help="package index (default: pip's configuration)")

    p = sub.add_parser("install-torch", help="install torch==VERSION into this interpreter")
    p.add_argument("--torch", required=True)
    p.add_argument(
        "--extra",
        action="append",
        default=["setuptools", "wheel"],
        help="more build requirements (default: setuptools, wheel)",
    )
    sources(p)
    p.set_defaults(func=cmd_install_torch)

    p = sub.add_parser("install-toolkit", help="a CUDA cell's toolkit wheels (pinned)")
    p.add_argument("--requirements", required=True, help="a requirements file of the pins")
    p.add_argument("--hashed", action="store_true", help="the pins carry --hash: require them")
    sources(p)
    p.set_defaults(func=cmd_install_toolkit)

    p = sub.add_parser("download-size", help="what install-torch would download (no install)")
    p.add_argument("--torch", required=True)
    p.add_argument("--extra", action="append", default=["setuptools", "wheel"])
    p.add_argument("--report", required=True, help="where pip writes its JSON report")
    p.add_argument("--pip", help="a zip of pip to run instead of this environment's pip")
    sources(p)
    p.set_defaults(func=cmd_download_size)

    p = sub.add_parser("site", help="this interpreter's torch version and the folder it is in")
    p.add_argument(
        "--optional",
        action="store_true",
        help="no torch is not an error (torch is then reported as '')",
    )
    p.set_defaults(func=cmd_site)

    p = sub.add_parser("build-wheel", help="build the project's wheel, no build isolation")
    p.add_argument("--project", required=True)
    p.add_argument("--out", required=True, help="an empty directory for the wheel")
    p.add_argument("--local-version", default="", help="e.g. torch2.13 (-> +torch2.13)")
    p.add_argument("--shim", choices=("auto", "on", "off"), default="auto")
    p.add_argument("--cuda-home", default="", help="a CUDA cell: the toolkit's folder")
    p.add_argument("--cuda-arch-list", default="", help="a CUDA cell: TORCH_CUDA_ARCH_LIST")
    p.add_argument(
        "--ccache",
        choices=("auto", "on", "off"),
        default="off",
        help="compile through ccache (auto: when installed)",
    )
    p.add_argument(
        "--no-libm-floor",
        dest="libm_floor",
        action="store_false",
        help="do not bind exp/log/pow & co. to their oldest glibc symbol versions",
    )
    p.add_argument(
        "--cxx-floor",
        action="store_true",
        help="define libstdc++'s GCC 11+ members locally (manylinux2014 cells)",
    )
    p.add_argument(
        "--cxx11-abi",
        choices=("auto", "0", "1"),
        default="auto",
        help="the cell torch's string ABI: checked against torch, then defined",
    )
    p.add_argument(
        "--environment",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="cibuildwheel's environment: evaluated by sh in order (repeatable)",
    )
    p.add_argument("--before-all", default="", metavar="CMD")
    p.add_argument("--before-build", default="", metavar="CMD")
    p.add_argument(
        "--config-setting",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a PEP 517 config setting for the build backend (repeatable)",
    )
    p.add_argument("--frontend", choices=("pip", "build", "build[uv]", "uv"), default="pip")
    p.add_argument(
        "--frontend-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="cibuildwheel's '; args:': added to the frontend's command (repeatable)",
    )
    p.add_argument(
        "--uv-requirement",
        default="",
        metavar="LINE",
        help="the pinned uv for build[uv] and uv: 'uv==X --hash=sha256:...'",
    )
    sources(p)
    p.add_argument(
        "--cflag",
        action="append",
        default=[],
        metavar="FLAG",
        help="a compiler flag added to CFLAGS and CXXFLAGS (repeatable)",
    )
    p.add_argument(
        "--prefix-map",
        action="append",
        default=[],
        metavar="OLD=NEW",
        help="compile with -ffile-prefix-map=OLD=NEW (repeatable)",
    )
    p.set_defaults(func=cmd_build_wheel)

    p = sub.add_parser("smoke", help="install the wheel into a fresh venv and exercise it")
    p.add_argument("--wheel", required=True)
    p.add_argument("--torch", required=True)
    p.add_argument("--venv", required=True)
    p.add_argument(
        "--torch-site",
        help="the folders of a prepared torch install and its "
        "requirements (os.pathsep-separated) to layer the venv "
        "on (instead of installing torch again)",
    )
    p.add_argument(
        "--test-command",
        default="",
        help="the project's test command (placeholders already expanded), run by "
        "sh -c in an empty folder with the venv first on PATH",
    )
    p.add_argument(
        "--test-requires",
        action="append",
        default=[],
        help="a requirement installed before --test-command (repeatable)",
    )
    p.add_argument(
        "--project", default="", help="the project's copy (test-sources, before-test's folder)"
    )
    p.add_argument(
        "--before-test",
        default="",
        metavar="CMD",
        help="run in the venv before the wheel is installed (with --test-command)",
    )
    p.add_argument(
        "--test-extra",
        action="append",
        default=[],
        metavar="EXTRA",
        help="install the wheel with this extra (repeatable; with --test-command)",
    )
    p.add_argument(
        "--test-source",
        action="append",
        default=[],
        metavar="PATH",
        help="a project-relative path copied into the test's folder (repeatable)",
    )
    p.add_argument(
        "--environment",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="cibuildwheel's environment, as build-wheel's (repeatable)",
    )
    p.add_argument(
        "--module",
        action="append",
        default=[],
        help="an extension module the wheel ships, imported (repeatable)",
    )
    p.add_argument(
        "--library",
        action="append",
        default=[],
        help="another shared object the wheel installs (site-packages-relative "
        "path), loaded with torch.ops.load_library (repeatable)",
    )
    sources(p)
    p.set_defaults(func=cmd_smoke)

    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
