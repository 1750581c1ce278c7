"""The config file's ``cuda`` section: per CUDA version, the index that serves torch's build for it
(``cuda.index_urls``: one URL per CUDA version, typically a mirror of the vendor's per-CUDA index)
and the TORCH_CUDA_ARCH_LIST replacing the support table's default (``cuda.arch_list``).

Checked here once, against the support table's toolkits: an arch list naming a capability the
CUDA version's nvcc cannot target is a configuration error (exit 2) naming file, key and value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from builder.config import values
from builder.config.cuda import CudaTable, parse_arch_list
from builder.config.yamlfile import YamlDocument, brief, format_path
from builder.errors import ConfigError


@dataclass(frozen=True)
class CudaOptions:
    index_urls: Mapping[str, str] = field(default_factory=dict)  # "13.0" -> URL
    arch_list: Mapping[str, str] = field(default_factory=dict)  # "13.0" -> "8.0;9.0+PTX"
    origin: str = "built-in default"


NO_CUDA_OPTIONS = CudaOptions()


def layer(
    merged: Mapping[str, Any], doc: YamlDocument, table: CudaTable, origin: str
) -> CudaOptions:
    """The ``cuda`` section of the merged config (*doc*: the file, for lines)."""
    raw = merged.get("cuda") or {}
    out: dict[str, dict[str, str]] = {"index_urls": {}, "arch_list": {}}
    for key in out:
        for cuda, value in (raw.get(key) or {}).items():
            path = ("cuda", key, cuda)

            def fail(message: str, path: tuple = path) -> ConfigError:
                return ConfigError(
                    message, file=doc.file, line=doc.line(path), key=format_path(path)
                )

            toolkit = table.toolkit(cuda)
            if toolkit is None:
                raise fail(
                    f"CUDA {brief(cuda)} has no toolkit in {table.file} (cuda.toolkits); "
                    f"expected one of {', '.join(table.toolkits) or 'none'}"
                )
            try:
                out[key][cuda] = (
                    values.index_url(value)
                    if key == "index_urls"
                    else parse_arch_list(value, toolkit).text
                )
            except ValueError as exc:
                raise fail(f"{brief(value)}: {exc}") from None
    return CudaOptions(
        index_urls=out["index_urls"],
        arch_list=out["arch_list"],
        origin=origin if raw else "built-in default",
    )
