"""The torch <-> CPython wheel availability table (``configs/support.yaml``).

A cell (arch, python, torch) can only be built when torch publishes a wheel for that
Python on that machine: the build installs it. The table is data, not code, so a new
torch release is one YAML entry. The same file pairs each torch with its torch-npu release
(``torch_npu``): the release a wheel's ``npu`` extra pins (:meth:`SupportTable.npu_pin`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from builder.config import values
from builder.config.cuda import CudaTable, load_cuda
from builder.config.yamlfile import YamlDocument, brief, format_path, load_yaml
from builder.errors import ConfigError

MACHINES = ("x86_64", "aarch64")


#: The manylinux glibc of torch's own wheels when the table names none for a release.
DEFAULT_TORCH_GLIBC = "2.28"
#: The cross backend's host torch when the table names none (configs/support.yaml explains).
DEFAULT_CROSS_HOST_TORCH = "2.13.0"
#: The C++ string ABI of torch's wheels when the table names none: the C++11 ABI
#: (``_GLIBCXX_USE_CXX11_ABI=1``), which every release of the 'torch' table from 2.7.1 on uses.
DEFAULT_CXX11_ABI = True


@dataclass(frozen=True)
class LineFact:
    """One per-torch fact of the support table for a cell, with where it was read from."""

    value: object
    reason: str


@dataclass(frozen=True)
class NpuRelease:
    """The torch-npu release paired with one torch, and the Pythons it has wheels for."""

    release: str  # "2.8.0.post5"
    wheels: Mapping[str, tuple[str, ...]]  # machine -> Python versions


@dataclass(frozen=True)
class NpuPin:
    """What a cell's ``npu`` extra pins: *release* (None: no extra) and why."""

    release: Optional[str]
    reason: str


@dataclass(frozen=True)
class SupportTable:
    """``wheels[torch][machine]`` is the tuple of Python versions with a torch wheel;
    ``cuda_builds[machine]`` the releases whose wheel on the default index is a CUDA build
    there; ``torch_glibc[torch]`` the glibc of torch's own manylinux tag (the ceiling for ours)."""

    file: str
    wheels: Mapping[str, Mapping[str, tuple[str, ...]]]
    cuda_builds: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    torch_glibc: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: torch -> its torch-npu release (None: none requires that torch); None: no such table.
    torch_npu: Optional[Mapping[str, Optional[NpuRelease]]] = None
    #: Why an older Python ("3.8") or torch line ("2.1": every 2.1.x) is not supported: end of
    #: life, a missing API, a failed measurement. The bounds themselves are the project's.
    unsupported: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: The torch a cross build's *host* interpreter imports to run the project's build
    #: (torch.utils.cpp_extension's logic; the headers and libraries are the target's).
    cross_host_torch: str = DEFAULT_CROSS_HOST_TORCH
    #: The ``cuda`` section: toolkits and each torch's CUDA builds (builder.config.cuda).
    cuda: CudaTable = field(default_factory=CudaTable)
    #: torch (or "default") -> machine (or "*": both) -> whether its wheel was built with the
    #: C++11 string ABI (``_GLIBCXX_USE_CXX11_ABI=1``); an extension must be compiled alike.
    cxx11_abi: Mapping[str, Mapping[str, bool]] = field(default_factory=dict)
    #: torch -> the setuptools specifier its torch.utils.cpp_extension works with ("<70").
    setuptools: Mapping[str, str] = field(default_factory=dict)

    def _per_machine(
        self, table: Mapping[str, Mapping[str, object]], torch: str, machine: str
    ) -> tuple[object, str]:
        """The value for (*torch*, *machine*) and the table key it came from."""
        for key in (torch, "default"):
            entry = table.get(key)
            if entry is None:
                continue
            for m in (machine, "*"):
                if m in entry:
                    return entry[m], key if m == "*" else f"{key}.{m}"
        return None, ""

    def glibc(self, torch: str, machine: str) -> LineFact:
        """The glibc torch's own wheel for *machine* needs (the ceiling for ours)."""
        value, key = self._per_machine(self.torch_glibc, torch, machine)
        if value is None:
            return LineFact(
                DEFAULT_TORCH_GLIBC,
                f"the builder's default {DEFAULT_TORCH_GLIBC} "
                f"(no torch_glibc entry in {self.file})",
            )
        return LineFact(value, f"torch_glibc.{key} in {self.file}")

    def abi(self, torch: str, machine: str) -> LineFact:
        """Whether torch's *machine* wheel uses the C++11 string ABI, and where that is said:
        the ``-D_GLIBCXX_USE_CXX11_ABI`` every extension built against it must be compiled
        with (a mismatch links, then fails to import with undefined std::string symbols)."""
        value, key = self._per_machine(self.cxx11_abi, torch, machine)
        if value is None:
            return LineFact(
                DEFAULT_CXX11_ABI,
                f"the builder's default, the C++11 ABI (no torch_cxx11_abi entry in {self.file})",
            )
        return LineFact(value, f"torch_cxx11_abi.{key} in {self.file}")

    def setuptools_requirement(self, torch: str) -> LineFact:
        """The setuptools requirement of a build against *torch* (``setuptools<70`` for torch
        2.1, whose cpp_extension imports ``pkg_resources.packaging``), and where it is said."""
        spec = self.setuptools.get(torch)
        if spec is None:
            return LineFact(
                "setuptools",
                f"no bound: torch {torch}'s cpp_extension needs none "
                f"(no torch_setuptools entry in {self.file})",
            )
        return LineFact(f"setuptools{spec}", f"torch_setuptools.{torch} in {self.file}")

    def why_unsupported(self, axis: str, value: str) -> Optional[str]:
        """The recorded reason for Python *value* ("3.8") or torch *value* ("2.1.0"), if any."""
        table = self.unsupported.get(axis, {})
        if axis == "torch":
            value = ".".join(value.split(".")[:2])
        return table.get(value)

    def oldest(self, allowed: Callable[[str, str], bool]) -> Optional[tuple[str, str, str]]:
        """``(python, torch, machine)``: the oldest torch of the table with a wheel for a Python
        that *allowed(python, torch)* accepts, with its oldest such Python (x86_64 first)."""
        for torch in sorted(self.wheels, key=values.torch_key):
            for machine in MACHINES:
                for python in sorted(self.pythons(torch, machine), key=values.python_key):
                    if allowed(python, torch):
                        return python, torch, machine
        return None

    def npu_pin(self, torch: str, python: str, machine: str) -> NpuPin:
        """The torch-npu release a wheel built for (torch, python, machine) pins in its ``npu``
        extra: the table's release for that torch when it publishes a wheel for that Python on
        that machine (``pip install pkg[npu]`` must be installable), else none, with why."""
        if self.torch_npu is None:
            return NpuPin(None, f"{self.file} has no torch_npu table")
        entry = self.torch_npu.get(torch)
        if entry is None:
            return NpuPin(None, f"no torch-npu release requires torch {torch} (per {self.file})")
        cp = values.cp_tag(python)
        if python not in entry.wheels.get(machine, ()):
            return NpuPin(
                None,
                f"torch-npu {entry.release} (for torch {torch}) publishes no {cp} "
                f"wheel for {machine} (per {self.file})",
            )
        return NpuPin(
            entry.release,
            f"the newest final torch-npu release for torch {torch}, "
            f"with a {cp} wheel for {machine} (per {self.file})",
        )

    def build_requirements(self, torch: str) -> tuple[str, ...]:
        """What a build against *torch* installs beside it: setuptools (with the bound of
        torch_setuptools where that torch's cpp_extension needs one) and wheel."""
        return (str(self.setuptools_requirement(torch).value), "wheel")

    def is_cuda_build(self, torch: str, machine: str) -> bool:
        return torch in self.cuda_builds.get(machine, ())

    def torch_plat(self, torch: str, machine: str) -> str:
        """The platform tag of torch's own wheel, e.g. ``manylinux_2_28_x86_64``."""
        glibc = str(self.glibc(torch, machine).value)
        return f"manylinux_{glibc.replace('.', '_')}_{machine}"

    def knows(self, torch: str) -> bool:
        return torch in self.wheels

    def pythons(self, torch: str, machine: str) -> tuple[str, ...]:
        return self.wheels.get(torch, {}).get(machine, ())

    def supports(self, torch: str, python: str, machine: str) -> bool:
        return python in self.pythons(torch, machine)

    def why_not(self, torch: str, python: str, machine: str) -> str:
        """The reason a combination is unsupported, for 'dropped' lines and errors."""
        have = self.pythons(torch, machine)
        if not have:
            return f"torch {torch} publishes no wheels for {machine} (per {self.file})"
        ordered = sorted(have, key=values.python_key)
        span = f"{values.cp_tag(ordered[0])}-{values.cp_tag(ordered[-1])}"
        return (
            f"torch {torch} publishes no {values.cp_tag(python)} wheel for {machine} "
            f"(it has {span}; per {self.file})"
        )


def _fail(doc_file: str, line: int | None, path: tuple, message: str) -> ConfigError:
    return ConfigError(message, file=doc_file, line=line, key=format_path(path))


def load_support(path: Path, display: str | None = None) -> SupportTable:
    """Load and validate a support table; errors name file, line and key."""
    doc = load_yaml(path, display)
    data = doc.data
    if not isinstance(data, dict) or "torch" not in data or not set(data) <= _TOP_KEYS:
        optional = ", ".join(f"'{k}'" for k in sorted(_TOP_KEYS - {"torch"}))
        raise _fail(
            doc.file,
            doc.line(()),
            (),
            f"expected a mapping with the key 'torch' (and optionally {optional})",
        )
    table = data["torch"]
    if not isinstance(table, dict) or not table:
        raise _fail(
            doc.file,
            doc.line(("torch",)),
            ("torch",),
            "expected a non-empty mapping of torch version -> {machine: [python, ...]}",
        )
    wheels: dict[str, dict[str, tuple[str, ...]]] = {}
    for torch, per_arch in table.items():
        p = ("torch", str(torch))
        if not isinstance(torch, str):
            raise _fail(
                doc.file,
                doc.line(p),
                p,
                f"expected the torch version as a quoted string, got {brief(torch)}",
            )
        try:
            values.torch_version(torch)
        except ValueError as exc:
            raise _fail(doc.file, doc.line(p), p, str(exc)) from None
        if not isinstance(per_arch, dict) or not per_arch:
            raise _fail(
                doc.file, doc.line(p), p, f"expected a mapping with keys from {', '.join(MACHINES)}"
            )
        wheels[torch] = {}
        for machine, pythons in per_arch.items():
            mp = p + (str(machine),)
            if machine not in MACHINES:
                raise _fail(
                    doc.file,
                    doc.line(mp),
                    mp,
                    f"unknown machine {brief(machine)}; expected one of {', '.join(MACHINES)}",
                )
            wheels[torch][machine] = _pythons(doc, mp, pythons)
    return SupportTable(
        file=doc.file,
        wheels=wheels,
        cuda_builds=_cuda_builds(doc, wheels),
        torch_glibc=_torch_glibc(doc, wheels),
        torch_npu=_torch_npu(doc, wheels),
        unsupported=_unsupported(doc),
        cross_host_torch=_cross_host_torch(doc, wheels),
        cuda=load_cuda(doc, wheels),
        cxx11_abi=_cxx11_abi(doc, wheels),
        setuptools=_torch_setuptools(doc, wheels),
    )


_TOP_KEYS = {
    "torch",
    "cuda_builds",
    "torch_glibc",
    "torch_npu",
    "unsupported",
    "cross_host_torch",
    "cuda",
    "torch_cxx11_abi",
    "torch_setuptools",
}


def _per_machine_table(
    doc: YamlDocument,
    name: str,
    wheels: Mapping[str, object],
    check: Callable[[object], bool],
    expected: str,
) -> dict[str, dict[str, object]]:
    """A mapping of torch release (or "default") -> value, or -> {machine: value}: one value
    for both machines ("*" inside), or one per machine where torch's two wheels differ."""
    raw = doc.data.get(name) or {}
    p: tuple = (name,)
    if not isinstance(raw, dict):
        raise _fail(
            doc.file,
            doc.line(p),
            p,
            f'expected a mapping of torch (or "default") -> {expected}, or -> '
            f"{{machine: {expected}}}",
        )
    out: dict[str, dict[str, object]] = {}
    for key, entry in raw.items():
        kp = p + (str(key),)
        if not isinstance(key, str) or (key != "default" and key not in wheels):
            raise _fail(
                doc.file,
                doc.line(kp),
                kp,
                f"torch {brief(key)} is not in this table's 'torch' mapping; expected "
                f'"default" or one of {", ".join(wheels)}',
            )
        per = entry if isinstance(entry, dict) else {"*": entry}
        if not per:
            raise _fail(
                doc.file,
                doc.line(kp),
                kp,
                f"expected {expected} or a mapping of machine -> {expected}",
            )
        for machine, value in per.items():
            mp = kp if machine == "*" else kp + (str(machine),)
            if machine != "*" and machine not in MACHINES:
                raise _fail(
                    doc.file,
                    doc.line(mp),
                    mp,
                    f"unknown machine {brief(machine)}; expected one of {', '.join(MACHINES)}",
                )
            if not check(value):
                raise _fail(doc.file, doc.line(mp), mp, f"expected {expected}, got {brief(value)}")
        out[key] = dict(per)
    return out


def _cxx11_abi(doc: YamlDocument, wheels: Mapping[str, object]) -> dict[str, dict[str, bool]]:
    table = _per_machine_table(
        doc,
        "torch_cxx11_abi",
        wheels,
        lambda v: isinstance(v, bool),
        "true (the C++11 string ABI) or false (the pre-C++11 one)",
    )
    return {k: {m: bool(v) for m, v in per.items()} for k, per in table.items()}


def _torch_setuptools(doc: YamlDocument, wheels: Mapping[str, object]) -> dict[str, str]:
    raw = doc.data.get("torch_setuptools") or {}
    p: tuple = ("torch_setuptools",)
    if not isinstance(raw, dict):
        raise _fail(
            doc.file,
            doc.line(p),
            p,
            'expected a mapping of torch -> a quoted setuptools specifier like "<70"',
        )
    out: dict[str, str] = {}
    for torch, spec in raw.items():
        tp = p + (str(torch),)
        if not isinstance(torch, str) or torch not in wheels:
            raise _fail(
                doc.file,
                doc.line(tp),
                tp,
                f"torch {brief(torch)} is not in this table's 'torch' mapping; "
                f"expected one of {', '.join(wheels)}",
            )
        try:
            ok = isinstance(spec, str) and bool(spec.strip()) and bool(SpecifierSet(spec))
        except InvalidSpecifier:
            ok = False
        if not ok:
            raise _fail(
                doc.file,
                doc.line(tp),
                tp,
                f'expected a quoted setuptools version specifier like "<70", got {brief(spec)}',
            )
        out[torch] = str(spec).strip()
    return out


def _cross_host_torch(doc: YamlDocument, wheels: Mapping[str, Mapping[str, object]]) -> str:
    p: tuple = ("cross_host_torch",)
    if "cross_host_torch" not in doc.data:
        return DEFAULT_CROSS_HOST_TORCH
    raw = doc.data["cross_host_torch"]
    if not isinstance(raw, str) or raw not in wheels or "x86_64" not in wheels[raw]:
        raise _fail(
            doc.file,
            doc.line(p),
            p,
            "expected a quoted torch release of this table's 'torch' mapping with "
            f"x86_64 wheels (the cross builds' host torch), got {brief(raw)}",
        )
    return raw


def _unsupported(doc: YamlDocument) -> dict[str, dict[str, str]]:
    raw = doc.data.get("unsupported") or {}
    p: tuple = ("unsupported",)
    if not isinstance(raw, dict) or not set(raw) <= {"python", "torch"}:
        raise _fail(doc.file, doc.line(p), p, "expected a mapping with 'python' and/or 'torch'")
    out: dict[str, dict[str, str]] = {}
    for axis, table in raw.items():
        ap = p + (axis,)
        if not isinstance(table, dict):
            raise _fail(doc.file, doc.line(ap), ap, "expected a mapping of version -> reason")
        for version, reason in table.items():
            vp = ap + (str(version),)
            shape = re.fullmatch(r"[0-9]+\.[0-9]+", version) if isinstance(version, str) else None
            if shape is None or not isinstance(reason, str) or not reason.strip():
                raise _fail(
                    doc.file,
                    doc.line(vp),
                    vp,
                    f'expected a quoted major.minor like "3.8" or "2.1" and a reason, '
                    f"got {brief(version)}: {brief(reason)}",
                )
        out[axis] = {str(k): str(v).strip() for k, v in table.items()}
    return out


def _pythons(doc: YamlDocument, mp: tuple, pythons: object) -> tuple[str, ...]:
    """A validated list of quoted Python versions at path *mp*."""
    if not isinstance(pythons, list):
        raise _fail(doc.file, doc.line(mp), mp, "expected a list of Python versions")
    for i, py in enumerate(pythons):
        ip = mp + (i,)
        if not isinstance(py, str):
            raise _fail(
                doc.file,
                doc.line(ip),
                ip,
                f'expected a quoted Python version like "3.10", got {brief(py)}',
            )
        try:
            values.python_version(py)
        except ValueError as exc:
            raise _fail(doc.file, doc.line(ip), ip, str(exc)) from None
    return tuple(pythons)


def _cuda_builds(doc: YamlDocument, wheels: Mapping[str, object]) -> dict[str, tuple[str, ...]]:
    raw = doc.data.get("cuda_builds") or {}
    p: tuple = ("cuda_builds",)
    if not isinstance(raw, dict):
        raise _fail(doc.file, doc.line(p), p, "expected a mapping of machine -> [torch, ...]")
    out: dict[str, tuple[str, ...]] = {}
    for machine, torches in raw.items():
        mp = p + (str(machine),)
        if machine not in MACHINES:
            raise _fail(
                doc.file,
                doc.line(mp),
                mp,
                f"unknown machine {brief(machine)}; expected one of {', '.join(MACHINES)}",
            )
        if not isinstance(torches, list) or not all(isinstance(t, str) for t in torches):
            raise _fail(doc.file, doc.line(mp), mp, "expected a list of quoted torch versions")
        for i, torch in enumerate(torches):
            if torch not in wheels:
                ip = mp + (i,)
                raise _fail(
                    doc.file,
                    doc.line(ip),
                    ip,
                    f"torch {brief(torch)} is not in this table's 'torch' mapping; "
                    f"expected one of {', '.join(wheels)}",
                )
        out[machine] = tuple(torches)
    return out


def _torch_glibc(doc: YamlDocument, wheels: Mapping[str, object]) -> dict[str, dict[str, str]]:
    table = _per_machine_table(
        doc,
        "torch_glibc",
        wheels,
        lambda v: isinstance(v, str) and re.fullmatch(r"2\.\d{1,3}", v) is not None,
        'a quoted glibc version like "2.28"',
    )
    return {k: {m: str(v) for m, v in per.items()} for k, per in table.items()}


def _npu_release(doc: YamlDocument, path: tuple, torch: str, raw: object) -> str:
    """A torch-npu release for *torch*: its version is torch's plus an optional .postN (the
    scheme torch-npu publishes under); pre-releases and other torches are refused."""
    expected = f"a quoted torch-npu release for torch {torch} ({torch} or {torch}.postN)"
    if not isinstance(raw, str):
        raise _fail(doc.file, doc.line(path), path, f"expected {expected}, got {brief(raw)}")
    try:
        version = Version(raw)
    except InvalidVersion:
        raise _fail(
            doc.file,
            doc.line(path),
            path,
            f"{brief(raw)} is not a PEP 440 version; expected {expected}",
        ) from None
    if version.is_prerelease or version.local is not None or version.epoch:
        raise _fail(
            doc.file,
            doc.line(path),
            path,
            f"{brief(raw)} is a pre-release or carries an epoch/local label; expected "
            f"{expected}: the pin is the newest final release",
        )
    if version.base_version != torch:
        raise _fail(
            doc.file,
            doc.line(path),
            path,
            f"torch-npu {raw} is for torch {version.base_version}, not {torch}; "
            f"expected {expected}",
        )
    return raw


def _torch_npu(
    doc: YamlDocument, wheels: Mapping[str, object]
) -> Optional[dict[str, Optional[NpuRelease]]]:
    if "torch_npu" not in doc.data:
        return None
    raw = doc.data["torch_npu"]
    p: tuple = ("torch_npu",)
    if not isinstance(raw, dict):
        raise _fail(
            doc.file,
            doc.line(p),
            p,
            "expected a mapping of torch -> {release: ..., <machine>: [python, ...]} or null",
        )
    out: dict[str, Optional[NpuRelease]] = {}
    for torch, entry in raw.items():
        tp = p + (str(torch),)
        if not isinstance(torch, str) or torch not in wheels:
            raise _fail(
                doc.file,
                doc.line(tp),
                tp,
                f"torch {brief(torch)} is not in this table's 'torch' mapping; "
                f"expected one of {', '.join(wheels)}",
            )
        if entry is None:
            out[torch] = None  # checked: no torch-npu release requires this torch
            continue
        keys = ("release", *MACHINES)
        if not isinstance(entry, dict) or "release" not in entry or not set(entry) <= set(keys):
            raise _fail(
                doc.file,
                doc.line(tp),
                tp,
                f"expected null or a mapping with 'release' and machines from "
                f"{', '.join(MACHINES)}, got {brief(entry)}",
            )
        release = _npu_release(doc, tp + ("release",), torch, entry["release"])
        out[torch] = NpuRelease(
            release=release,
            wheels={m: _pythons(doc, tp + (m,), pys) for m, pys in entry.items() if m != "release"},
        )
    missing = [t for t in wheels if t not in out]
    if missing:
        raise _fail(
            doc.file,
            doc.line(p),
            p,
            f"no entry for torch {', '.join(missing)}; expected each torch of the "
            "'torch' mapping with its torch-npu release, or null when none requires it",
        )
    return out
