"""The support table's ``cuda`` section: CUDA toolkits from the package index, and which CUDA build
of each torch release is reachable where (``configs/support.yaml`` explains the facts).

A cell's ``cuda`` axis value is ``cpu`` (no CUDA compile: today's cells) or a CUDA version such as
``13.0``. For a CUDA cell the resolver (builder.plan.resolve) asks :meth:`CudaTable.torch_source`
where its torch comes from and :meth:`CudaTable.toolkit` what to install beside it; the arch list
is parsed and checked here (:func:`parse_arch_list`), once, for every layer that may name one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

from builder.config.yamlfile import YamlDocument, brief, format_path
from builder.errors import ConfigError

CPU = "cpu"
MACHINES = ("x86_64", "aarch64")
# fullmatch, as every value check: "$" would take "13.0\n"
_CUDA = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}")
_CAP = re.compile(r"([0-9]{1,3})\.([0-9])(\+PTX)?")


def cuda_tag(cuda: str) -> str:
    """``13.0`` -> ``cu130`` (the spelling of identifiers and local versions); ``cpu`` -> ''."""
    return "" if cuda == CPU else "cu" + cuda.replace(".", "")


def is_cuda_version(value: str) -> bool:
    return bool(_CUDA.fullmatch(value))


@dataclass(frozen=True)
class ToolkitPackage:
    name: str  # nvidia-cuda-nvcc
    version: str  # 13.0.88
    sha256: Mapping[str, str] = field(default_factory=dict)  # machine -> digest

    def requirement(self, machine: str) -> str:
        digest = self.sha256.get(machine)
        pin = f"{self.name}=={self.version}"
        return f"{pin} --hash=sha256:{digest}" if digest else pin


@dataclass(frozen=True)
class Toolkit:
    cuda: str
    capabilities: tuple[str, ...]  # "7.5", "9.0", ...
    default_arch_list: str  # "7.5;8.0;9.0+PTX"
    packages: tuple[ToolkitPackage, ...]

    def hashed(self, machine: str) -> bool:
        """Every package has a digest for *machine*: pip installs them with --require-hashes."""
        return all(machine in p.sha256 for p in self.packages)

    def requirements(self, machine: str) -> list[str]:
        """The pip requirement lines (with ``--hash`` options when :meth:`hashed`)."""
        hashed = self.hashed(machine)
        return [
            p.requirement(machine) if hashed else f"{p.name}=={p.version}" for p in self.packages
        ]


@dataclass(frozen=True)
class ArchList:
    """A TORCH_CUDA_ARCH_LIST, parsed: SASS for each capability, PTX for those marked +PTX."""

    text: str  # as TORCH_CUDA_ARCH_LIST takes it: "8.0;9.0+PTX"
    sass: tuple[str, ...]  # ("80", "90")
    ptx: tuple[str, ...]  # ("90",)


def parse_arch_list(text: str, toolkit: Toolkit) -> ArchList:
    """*text* (``;``- or space-separated ``X.Y`` with optional ``+PTX``) checked against what
    *toolkit*'s nvcc can target; ValueError saying what is wrong (callers add file and key)."""
    words = [w for w in re.split(r"[;\s]+", text.strip()) if w]
    if not words:
        raise ValueError('an empty arch list; expected e.g. "8.0;9.0+PTX"')
    sass: list[str] = []
    ptx: list[str] = []
    for word in words:
        m = _CAP.fullmatch(word)
        if m is None:
            raise ValueError(
                f"{brief(word)} is not a compute capability; expected X.Y or X.Y+PTX "
                "(e.g. 8.6, 9.0+PTX)"
            )
        cap = f"{m.group(1)}.{m.group(2)}"
        if cap not in toolkit.capabilities:
            raise ValueError(
                f"compute capability {cap} is not a target of CUDA {toolkit.cuda} "
                f"(its nvcc targets {', '.join(toolkit.capabilities)})"
            )
        code = cap.replace(".", "")
        if code not in sass:
            sass.append(code)
        if m.group(3) and code not in ptx:
            ptx.append(code)
    return ArchList(text=";".join(words), sass=tuple(sass), ptx=tuple(ptx))


@dataclass(frozen=True)
class TorchSource:
    """Where a CUDA cell's torch comes from: the default index, or the CUDA version's own
    (``index_url``, from the config); None from :meth:`CudaTable.torch_source` when neither."""

    index_url: Optional[str]  # None: the default index (pip.index_url or pip's configuration)
    reason: str


@dataclass(frozen=True)
class CudaTable:
    file: str = ""
    toolkits: Mapping[str, Toolkit] = field(default_factory=dict)
    #: torch -> machine -> the CUDA version of the default index's build there
    default_index: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: torch -> the CUDA versions whose own index serves a build of it
    per_cuda_indexes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def toolkit(self, cuda: str) -> Optional[Toolkit]:
        return self.toolkits.get(cuda)

    def torch_source(
        self, torch: str, machine: str, cuda: str, index_urls: Mapping[str, str], index_origin: str
    ) -> tuple[Optional[TorchSource], str]:
        """(source, '') when torch *torch*'s CUDA *cuda* build for *machine* is reachable, else
        (None, why not). A configured per-CUDA index (*index_urls*, a mirror the user keeps)
        wins for the CUDA versions the table says it serves; the default index serves its own
        build's CUDA version."""
        tag = cuda_tag(cuda)
        if cuda not in self.toolkits:
            return None, (
                f"no CUDA {cuda} toolkit in {self.file} (cuda.toolkits); known: "
                f"{', '.join(self.toolkits) or 'none'}"
            )
        url = index_urls.get(cuda)
        if url is not None and cuda in self.per_cuda_indexes.get(torch, ()):
            return TorchSource(
                url,
                f"torch {torch}'s {tag} build from the CUDA {cuda} index "
                f'({index_origin}: cuda.index_urls."{cuda}"; per '
                f"{self.file})",
            ), ""
        default = self.default_index.get(torch, {}).get(machine)
        if default == cuda:
            return TorchSource(
                None,
                f"the default index's torch {torch} for {machine} is the "
                f"CUDA {cuda} build (per {self.file})",
            ), ""
        have = (
            f"the default index's torch {torch} for {machine} is the CUDA {default} build"
            if default
            else f"{self.file} records no CUDA build of the default index's "
            f"torch {torch} for {machine}"
        )
        if url is not None:
            why = (
                f'; cuda.index_urls."{cuda}" is configured, but {self.file} records no '
                f'{tag} build of torch {torch} on a per-CUDA index (cuda.torch."{torch}"'
                ".per_cuda_indexes)"
            )
        else:
            why = f'; no per-CUDA index for {cuda} is configured (config cuda.index_urls."{cuda}")'
        return None, f"torch {torch} has no reachable {tag} build: {have}{why}"


def _fail(doc: YamlDocument, path: tuple, message: str) -> ConfigError:
    return ConfigError(message, file=doc.file, line=doc.line(path), key=format_path(path))


def load_cuda(doc: YamlDocument, torches: Mapping[str, object]) -> CudaTable:
    """The ``cuda`` section of the support table *doc* (empty when absent); errors name file,
    line and key. *torches*: the table's ``torch`` mapping (every release named must be in it)."""
    raw = doc.data.get("cuda")
    p: tuple = ("cuda",)
    if raw is None:
        return CudaTable(file=doc.file)
    if not isinstance(raw, dict) or not set(raw) <= {"toolkits", "torch"}:
        raise _fail(doc, p, "expected a mapping with 'toolkits' and 'torch'")
    toolkits = {
        cuda: _toolkit(doc, p + ("toolkits", cuda), cuda, spec)
        for cuda, spec in _mapping(doc, p + ("toolkits",), raw.get("toolkits")).items()
    }
    default_index: dict[str, dict[str, str]] = {}
    per_cuda: dict[str, tuple[str, ...]] = {}
    for torch, spec in _mapping(doc, p + ("torch",), raw.get("torch")).items():
        tp = p + ("torch", torch)
        if torch not in torches:
            raise _fail(
                doc,
                tp,
                f"torch {brief(torch)} is not in this table's 'torch' mapping; "
                f"expected one of {', '.join(torches)}",
            )
        if not isinstance(spec, dict) or not set(spec) <= {"default_index", "per_cuda_indexes"}:
            raise _fail(
                doc, tp, "expected a mapping with 'default_index' and/or 'per_cuda_indexes'"
            )
        default_index[torch] = {}
        for machine, cuda in _mapping(
            doc, tp + ("default_index",), spec.get("default_index") or {}
        ).items():
            mp = tp + ("default_index", machine)
            if machine not in MACHINES:
                raise _fail(
                    doc,
                    mp,
                    f"unknown machine {brief(machine)}; expected one of {', '.join(MACHINES)}",
                )
            default_index[torch][machine] = _cuda_known(doc, mp, cuda, toolkits)
        listed = spec.get("per_cuda_indexes") or []
        if not isinstance(listed, list):
            raise _fail(doc, tp + ("per_cuda_indexes",), "expected a list of CUDA versions")
        per_cuda[torch] = tuple(
            _cuda_known(doc, tp + ("per_cuda_indexes", i), c, toolkits)
            for i, c in enumerate(listed)
        )
    return CudaTable(
        file=doc.file, toolkits=toolkits, default_index=default_index, per_cuda_indexes=per_cuda
    )


def _mapping(doc: YamlDocument, path: tuple, raw: object) -> dict[str, object]:
    if not isinstance(raw, dict) or not all(isinstance(k, str) for k in raw):
        raise _fail(doc, path, "expected a mapping with quoted keys")
    return raw


def _cuda_known(
    doc: YamlDocument, path: tuple, cuda: object, toolkits: Mapping[str, Toolkit]
) -> str:
    if not isinstance(cuda, str) or cuda not in toolkits:
        raise _fail(
            doc,
            path,
            f"expected a quoted CUDA version of cuda.toolkits "
            f"({', '.join(toolkits) or 'none'}), got {brief(cuda)}",
        )
    return cuda


def _toolkit(doc: YamlDocument, path: tuple, cuda: str, spec: object) -> Toolkit:
    if not is_cuda_version(cuda):
        raise _fail(doc, path, f'expected a quoted CUDA version like "13.0", got {brief(cuda)}')
    keys = {"capabilities", "default_arch_list", "packages"}
    if not isinstance(spec, dict) or set(spec) != keys:
        raise _fail(doc, path, f"expected a mapping with {', '.join(sorted(keys))}")
    caps = spec["capabilities"]
    if (
        not isinstance(caps, list)
        or not caps
        or not all(isinstance(c, str) and _CAP.fullmatch(c) and "+" not in c for c in caps)
    ):
        raise _fail(
            doc,
            path + ("capabilities",),
            f'expected a list of quoted compute capabilities like "8.0", got {brief(caps)}',
        )
    packages = []
    for name, pkg in _mapping(doc, path + ("packages",), spec["packages"]).items():
        pp = path + ("packages", name)
        if (
            not isinstance(pkg, dict)
            or not isinstance(pkg.get("version"), str)
            or not (set(pkg) <= {"version", "sha256"})
        ):
            raise _fail(doc, pp, 'expected {version: "X.Y.Z", sha256: {machine: digest}}')
        digests = pkg.get("sha256") or {}
        for machine, digest in digests.items() if isinstance(digests, dict) else [(None, 0)]:
            if machine not in MACHINES or not (
                isinstance(digest, str) and re.fullmatch(r"[0-9a-f]{64}", digest)
            ):
                raise _fail(
                    doc,
                    pp + ("sha256",),
                    f"expected a mapping of machine "
                    f"({', '.join(MACHINES)}) -> sha256 hex "
                    f"digest, got {brief(machine)}: {brief(digest)}",
                )
        packages.append(ToolkitPackage(name, pkg["version"], dict(digests)))
    if not packages:
        raise _fail(doc, path + ("packages",), "expected at least one package (nvidia-cuda-nvcc)")
    toolkit = Toolkit(
        cuda=cuda, capabilities=tuple(caps), default_arch_list="", packages=tuple(packages)
    )
    default = spec["default_arch_list"]
    try:
        parsed = parse_arch_list(default if isinstance(default, str) else "", toolkit)
    except ValueError as exc:
        raise _fail(doc, path + ("default_arch_list",), str(exc)) from None
    return Toolkit(
        cuda=cuda,
        capabilities=toolkit.capabilities,
        default_arch_list=parsed.text,
        packages=toolkit.packages,
    )
