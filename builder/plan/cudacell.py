"""A cell's CUDA decisions, made once: which CUDA and why, where its torch comes from, which
toolkit packages (pinned) are installed beside it, the TORCH_CUDA_ARCH_LIST and where it came
from, and the libraries auditwheel must leave external. ``plan`` prints the record, the build
executes it, verification checks the wheel against it, the manifest stores it.

The arch list's layers, lowest first: the support table's default for the CUDA version, the
config's ``cuda.arch_list."<cuda>"``, the cell's ``matrix.include`` entry (``cuda_arch_list``),
and ``TORCH_CUDA_ARCH_LIST`` in cibuildwheel's ``environment`` (any layer: the project's
pyproject.toml, the config, the command line). The last is the build's own setting, so the record
takes it as written; a value that needs the shell to evaluate it cannot be checked before the
build and is refused (exit 2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Optional

from builder.config import BuildConfig, Selection
from builder.config.cuda import CPU, ArchList, cuda_tag, parse_arch_list
from builder.errors import ConfigError
from builder.redact import redact_url_credentials

#: What auditwheel must leave external in a CUDA wheel, as torch's own CUDA wheels do: the
#: driver (libcuda, from the machine), the CUDA runtime and libraries (from torch's nvidia-*
#: requirements), torch's CUDA libraries. Grafting them would ship a second CUDA next to torch's.
CUDA_EXCLUDES: tuple[str, ...] = (
    "libcuda.so*",
    "libcudart.so*",
    "libtorch_cuda*.so",
    "libc10_cuda.so",
    "libcublas*.so*",
    "libcufft*.so*",
    "libcurand.so*",
    "libcusparse*.so*",
    "libcusolver*.so*",
    "libcudnn*.so*",
    "libnccl.so*",
    "libnvrtc*.so*",
    "libnvJitLink.so*",
    "libnvToolsExt.so*",
    "libnvtx*.so*",
    "libcupti.so*",
    "libcufile*.so*",
    "libnvshmem*.so*",
    "libcusparseLt.so*",
)
ARCH_VARIABLE = "TORCH_CUDA_ARCH_LIST"


@dataclass(frozen=True)
class CudaRecord:
    cuda: str  # "cpu" | "13.0"
    reason: str
    torch_index_url: Optional[str] = None  # None: the cell's usual sources
    torch_source: str = ""
    toolkit: tuple[str, ...] = ()  # pip requirement lines, "--hash" included when pinned
    toolkit_hashed: bool = False
    arch_list: Optional[ArchList] = None
    arch_list_source: str = ""
    excludes: tuple[str, ...] = field(default=())

    @property
    def enabled(self) -> bool:
        return self.cuda != CPU

    @property
    def tag(self) -> str:
        return cuda_tag(self.cuda)

    def to_dict(self) -> dict[str, Any]:
        if not self.enabled:
            return {"version": CPU, "reason": self.reason}
        assert self.arch_list is not None
        return {
            "version": self.cuda,
            "tag": self.tag,
            "reason": self.reason,
            "torch_index_url": (
                redact_url_credentials(self.torch_index_url) if self.torch_index_url else None
            ),
            "torch_source": self.torch_source,
            "toolkit": list(self.toolkit),
            "toolkit_hashed": self.toolkit_hashed,
            "arch_list": self.arch_list.text,
            "sass": list(self.arch_list.sass),
            "ptx": list(self.arch_list.ptx),
            "arch_list_source": self.arch_list_source,
            "auditwheel_exclude_added": list(self.excludes),
        }


def resolve_cuda(cell: Any, config: BuildConfig, selection: Selection) -> CudaRecord:
    """The record of *cell* (a :class:`builder.plan.cells.Cell` that expand() kept, so its CUDA
    build is reachable)."""
    if selection.cuda is not None:
        reason = f"named ({selection.origins.get('cuda')})"
    elif config.matrix.cudas == (CPU,):
        reason = "cpu: the matrix names no CUDA (no CUDA compile; the default)"
    else:
        reason = f"the matrix's cuda axis ({config.source_name})"
    if cell.cuda == CPU:
        return CudaRecord(cuda=CPU, reason=reason)
    table = config.support.cuda
    toolkit = table.toolkit(cell.cuda)
    source, why_not = table.torch_source(
        cell.torch, cell.machine, cell.cuda, config.cuda.index_urls, config.cuda.origin
    )
    assert toolkit is not None and source is not None, why_not  # expand() dropped such cells
    text, where = (
        toolkit.default_arch_list,
        (f"the support table's default for CUDA {cell.cuda} ({table.file})"),
    )
    if cell.cuda in config.cuda.arch_list:
        text = config.cuda.arch_list[cell.cuda]
        where = f'cuda.arch_list."{cell.cuda}" ({config.cuda.origin})'
    for rule in config.matrix.include:
        if rule.cuda_arch_list and rule.matches(cell.arch, cell.python, cell.torch, cell.cuda):
            text, where = rule.cuda_arch_list, f"{rule.key}.cuda_arch_list ({rule.file})"
    for name, raw in config.build_options.environment:
        if name == ARCH_VARIABLE:
            value = raw.strip().strip("'\"")
            env_origin = config.build_options.origins.get("environment", "environment")
            if re.search(r"[$`\\]", value):
                raise ConfigError(
                    f"{ARCH_VARIABLE}={raw} needs the shell to evaluate it; "
                    'expected a literal list (e.g. "8.0;9.0+PTX"): the '
                    "verification checks the wheel against it",
                    key=f"environment ({env_origin})",
                )
            text, where = value, f"environment {ARCH_VARIABLE} ({env_origin})"
    try:
        arch_list = parse_arch_list(text, toolkit)
    except ValueError as exc:
        raise ConfigError(f"{ARCH_VARIABLE} {text!r}: {exc}", key=where) from None
    hashed = toolkit.hashed(cell.machine)
    return CudaRecord(
        cuda=cell.cuda,
        reason=reason,
        torch_index_url=source.index_url,
        torch_source=source.reason,
        toolkit=tuple(toolkit.requirements(cell.machine)),
        toolkit_hashed=hashed,
        arch_list=arch_list,
        arch_list_source=where,
        excludes=CUDA_EXCLUDES,
    )
