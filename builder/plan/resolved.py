"""The resolved cell: one record per cell with every decision and its reason
(:class:`ResolvedCell`, made by :func:`builder.plan.resolve.resolve`), and where its backend
builds it (:class:`ImageChoice`). Both the plan that makes these records and the backends that
execute them import this module; it imports neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from builder.config.buildoptions import CibwOptions
from builder.config.pins import parse_ref
from builder.config.projecttest import ProjectTest
from builder.plan.cells import Cell
from builder.plan.cudacell import CudaRecord

#: What ``base_image`` is when the backend builds without an image (host, cross).
THIS_HOST = "this host"


@dataclass(frozen=True)
class BuildHost:
    """The interpreter and torch on *this* host that run a project's build for a cell of another
    machine (the cross backend): a cached torch environment, never the builder's own."""

    python: str  # X.Y of the host interpreter
    torch: str  # the torch release installed beside it
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"python": self.python, "torch": self.torch, "reason": self.reason}

    def key(self) -> tuple[str, str]:
        """What decides the environment: (python, torch)."""
        return self.python, self.torch


@dataclass(frozen=True)
class ImageChoice:
    """Where a cell is built: an image ref (docker, emulated) or a description (host, cross)."""

    ref: str
    image_id: Optional[str] = None
    family: Optional[str] = None  # manylinux | debian, for the rendered recipe
    plat: Optional[str] = None  # the image's own glibc tag
    build_host: Optional[BuildHost] = None  # cross: what runs the project's build here


@dataclass(frozen=True)
class ResolvedCell:
    cell: Cell  # with the base image actually used
    torch_reason: str
    backend: str
    backend_reason: str
    buildable: bool  # on this host
    runner: str  # THIS_HOST, or the CI runner label of a native machine
    runner_reason: str
    image: ImageChoice
    plat: str  # the platform tag the wheel must meet (never above torch's own)
    plat_reason: str
    network: str
    torch_npu: Optional[str]  # the release the wheel's `npu` extra pins; None: no extra
    torch_npu_reason: str
    settings: Mapping[str, Any] = field(default_factory=dict)  # proxy/CA/index, masked
    output: str = ""
    host_machine: str = ""
    # Which build serves the cell (builder.plan.builds): "stable" (one abi3 wheel on torch's
    # stable ABI per arch, built by `built_by`, verified here) or "per-torch" (its own).
    wheel: str = "per-torch"
    build_group: str = ""
    built_by: str = ""
    build_reason: str = ""
    torch_requirement: str = ""  # the stable wheel's, e.g. torch>=2.10 ("": pinned per torch)
    #: The CUDA decisions (builder.plan.cudacell): cpu, or the CUDA, its torch's index, the
    #: toolkit pins, the arch list and the libraries auditwheel leaves external.
    cuda: CudaRecord = CudaRecord(cuda="cpu", reason="cpu")
    #: The libraries auditwheel must leave external (build.auditwheel_exclude + CUDA's)
    auditwheel_exclude: tuple[str, ...] = ()
    # The cell torch's line facts (configs/support.yaml), applied by every backend's build:
    # its C++ string ABI (the -D_GLIBCXX_USE_CXX11_ABI the compile uses), the setuptools its
    # cpp_extension accepts, and whether the C++ floor header is compiled in (a ceiling below
    # manylinux_2_28: builder.incell.steps.CXX_FLOOR_SHIM).
    cxx11_abi: bool = True
    cxx11_abi_reason: str = ""
    setuptools: str = "setuptools"
    setuptools_reason: str = ""
    cxx_floor: bool = False
    #: The cell's own cibuildwheel options and test (a project's overrides that select it
    #: applied; builder.config.cibwproject); None: the config's, for every cell alike.
    build_options: Optional[CibwOptions] = None
    test: Optional[ProjectTest] = None
    #: Where the base image's reference comes from (the config, the project's
    #: manylinux-<arch>-image, --base-image).
    image_source: str = ""

    @property
    def stable(self) -> bool:
        return self.wheel == "stable"

    @property
    def local_version(self) -> Optional[str]:
        """The wheel's local version label (``torch2.13``); None for a stable wheel, which
        serves many torches and so names none (and may go to PyPI)."""
        return None if self.stable else self.cell.torch_local

    @property
    def identifier(self) -> str:
        return self.cell.identifier

    def to_dict(self) -> dict[str, Any]:
        c = self.cell
        return {
            "id": c.identifier,
            "arch": c.arch,
            "machine": c.machine,
            "python": c.python,
            "cp": c.cp,
            "torch": c.torch,
            "torch_reason": self.torch_reason,
            "cuda": self.cuda.to_dict(),
            "auditwheel_exclude": list(self.auditwheel_exclude),
            "local_version": self.local_version,
            "wheel": self.wheel,
            "build_group": self.build_group or c.identifier,
            "built_by": self.built_by or c.identifier,
            "build_reason": self.build_reason,
            "torch_requirement": self.torch_requirement or None,
            "torch_npu": self.torch_npu,
            "torch_npu_reason": self.torch_npu_reason,
            "backend": self.backend,
            "backend_reason": self.backend_reason,
            "buildable_here": self.buildable,
            "runner": self.runner,
            "runner_reason": self.runner_reason,
            "base_image": self.image.ref,
            "base_image_id": self.image.image_id,
            "base_image_source": self.image_source or None,
            # the digest the ref pins (a new one is a new recipe, so a new cell key); None:
            # unpinned, or no image (host, cross)
            "base_image_digest": parse_ref(self.image.ref).digest,
            "family": c.image.family,
            "python_path": c.python_path,
            # cross cells: the host interpreter + torch that run the project's build
            "build_host": (
                self.image.build_host.to_dict() if self.image.build_host is not None else None
            ),
            "plat": self.plat,
            "plat_reason": self.plat_reason,
            "glibc": glibc_of(self.plat),
            "cxx11_abi": self.cxx11_abi,
            "cxx11_abi_reason": self.cxx11_abi_reason,
            "setuptools": self.setuptools,
            "setuptools_reason": self.setuptools_reason,
            "cxx_floor": self.cxx_floor,
            "docker_platform": c.docker_platform,
            "network": self.network,
            **self.settings,
            "output": self.output,
            # the project's test as this cell runs it (test-skip, overrides applied)
            "test": self.test.record() if self.test is not None else None,
        }


def glibc_of(plat: str) -> str:
    """``manylinux_2_17_aarch64`` -> ``2.17``."""
    parts = plat.split("_")
    return f"{parts[1]}.{parts[2]}" if len(parts) > 3 and parts[0] == "manylinux" else ""
