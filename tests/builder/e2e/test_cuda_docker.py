"""The CUDA toolkit in the docker backend (issue 34 part 2): a CUDA cell's torch layer gets the
CUDA torch and the toolkit's wheels pinned in the support table (the resolved record's lines,
``--require-hashes``), through the cell's own pip configuration: the rendered recipe's indexes,
the proxies in the install's exec environment only (never in the Dockerfile or the committed
layer), a bundle's wheelhouse offline. The build's CUDA_HOME, TORCH_CUDA_ARCH_LIST, PATH and
nvcc's ccache link come from the in-cell build step, shared with the host backend
(test_cuda_ccache.py runs it), and the wheel's device code is read back by the fatbin check.

The fast tests fake the engine (no container, no download) and run in CI; the end-to-end cell
(marker ``cuda_build``: a 3 GB CUDA torch layer and nvcc's compiles) builds a one-``.cu``
CUDAExtension in a real container.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

import pytest
from helpers.builder_testlib import SUPPORT
from helpers.enginelib import docker_engine

from builder.backends import registry
from builder.backends.base import CellJob, Host, PipelineOptions, Steps
from builder.backends.torchenv import docker_torch_image
from builder.config import CliOverrides, Settings, load_settings
from builder.engines.base import OutputLog, RunResult
from builder.images.base_image import build_base_image
from builder.images.render import render_recipe
from builder.pipeline_types import CellResult
from builder.plan.resolve import resolve
from builder.redact import Redactor

SENTINEL = "Cud4ProxySentinel-9183"
PROXY = f"http://carol:{SENTINEL}@proxy.invalid:3128"
INDEX = "https://mirror.invalid/simple"
CELL = "cp311-manylinux_x86_64-torch2.14.1-cu130"
BASE_ID = "sha256:" + "b" * 64
RESULT = "AMPFORGE_RESULT "
CUDA_HOME = "/opt/ampforge/venv/lib/python3.11/site-packages/nvidia/cu13"


class _Session:
    """A container as docker_torch_image uses it: each exec recorded, each step's result
    line as the real steps.py prints it."""

    def __init__(
        self, runs: list[tuple[list[str], dict[str, str]]], copied: dict[str, str]
    ) -> None:
        self.workdir = "/ampforge-torch"
        self.log = OutputLog()
        self.runs, self.copied = runs, copied

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
        check: bool = True,
        step: str = "",
        tail_lines: int = 0,
    ) -> RunResult:
        argv = list(argv)
        self.runs.append((argv, dict(env or {})))
        verb = argv[2] if len(argv) > 2 else ""
        out = {
            "install-toolkit": {"cuda_home": CUDA_HOME, "nvcc": "Build cuda_13.0"},
            "install-torch": {"torch": "2.14.1"},
            "download-size": {"sized": True, "items": []},
        }.get(verb)
        tail = (RESULT + json.dumps(out),) if out is not None else ()
        return RunResult(argv=tuple(argv), exit_code=0, tail=tail)

    def copy_in(self, src: Path, dest_dir: str) -> str:
        inside = f"{dest_dir}/{src.name}"
        self.copied[inside] = src.read_text() if src.suffix == ".txt" else ""
        return inside


class _Api:
    def images(self, filters: Any = None) -> list[dict[str, Any]]:
        return []

    def tag(self, *args: Any) -> None:
        return None

    def inspect_image(self, ref: str) -> dict[str, Any]:
        return {"Config": {"Labels": {}}}


class _Engine:
    """The engine as far as resolving and the torch layer ask it."""

    base_url = "unix:///fake.sock"
    server_version = "fake"
    is_podman = False

    def __init__(self) -> None:
        self.api = _Api()
        self.runs: list[tuple[list[str], dict[str, str]]] = []
        self.copied: dict[str, str] = {}
        self.containers: list[dict[str, Any]] = []
        self.commits: list[tuple[str, dict[str, str]]] = []

    def image_id(self, ref: str) -> Optional[str]:
        return None if ref.startswith("ampforge/torch:") else BASE_ID

    @contextlib.contextmanager
    def container(self, image: str, **kwargs: Any) -> Iterator[_Session]:
        self.containers.append({"image": image, **kwargs})
        yield _Session(self.runs, self.copied)

    def commit(self, session: _Session, tag: str, labels: Mapping[str, str]) -> str:
        self.commits.append((tag, dict(labels)))
        return "sha256:" + "c" * 64


def _settings(tmp_path: Path, offline: bool = False) -> Settings:
    cfg = tmp_path / "cuda.yaml"
    cfg.write_text(
        f"support: {SUPPORT}\n"
        'matrix: {arch: [X86], python: ["3.11"], torch: ["2.14.1"], '
        'cuda: ["13.0"]}\n'
        f"pip:\n  index_url: {INDEX}\n"
    )
    return load_settings(
        CliOverrides(
            config=str(cfg),
            arch="X86",
            python="3.11",
            torch="2.14.1",
            cuda="13.0",
            backend="docker",
            https_proxy=PROXY,
            offline=offline or None,
        ),
        {},
    )


def _job(
    tmp_path: Path, engine: _Engine, settings: Settings, wheelhouse: Optional[Path] = None
) -> CellJob:
    host = Host(Redactor(), engine_factory=lambda: engine)  # type: ignore[arg-type,return-value]
    (resolved,) = resolve(settings, host, registry(), out=tmp_path / "dist").cells
    assert resolved.identifier == CELL and resolved.backend == "docker", resolved.backend_reason
    opts = PipelineOptions(
        project=tmp_path,
        out=tmp_path / "dist",
        work=tmp_path / "work",
        wheelhouse=wheelhouse,
        offline=settings.config.offline.enabled,
    )
    return CellJob(
        resolved=resolved,
        config=settings.config,
        opts=opts,
        log=OutputLog(sink=_fresh_lines().append),
        log_path=tmp_path / "log",
        stage=tmp_path / "stage",
        steps=Steps(CellResult(cell=CELL), lambda cell, step: None),
        run_id="run-1",
        engine=engine,  # type: ignore[arg-type]
        proxy_env=settings.config.proxy.build_args(),
        recipe=render_recipe(resolved.cell, settings.config),
    )


#: What the last job's log said (OutputLog's sink), emptied for each job so a test reads only
#: its own cell's lines.
_LINES: list[str] = []


def _fresh_lines() -> list[str]:
    _LINES.clear()
    return _LINES


def _verb(engine: _Engine, verb: str) -> tuple[list[str], dict[str, str]]:
    (found,) = [(argv, env) for argv, env in engine.runs if argv[2:3] == [verb]]
    return found


def test_a_cuda_cells_torch_layer_installs_the_pinned_toolkit_through_its_pip_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMPFORGE_CACHE", str(tmp_path / "cache"))
    engine = _Engine()
    settings = _settings(tmp_path)
    job = _job(tmp_path, engine, settings)
    record = job.resolved.cuda
    # The pins are the support table's, read once into the resolved record (not written here).
    table = settings.config.support.cuda.toolkit("13.0")
    assert table is not None and record.toolkit == tuple(table.requirements("x86_64"))
    assert record.toolkit_hashed
    assert record.toolkit[0].startswith("nvidia-cuda-nvcc==13.0.88 --hash=sha256:")
    tag = docker_torch_image(job, engine, "ampforge/cell:x", BASE_ID, None, None)
    assert tag.startswith(f"ampforge/torch:{CELL}-")
    torch_argv, torch_env = _verb(engine, "install-torch")
    assert torch_argv[torch_argv.index("--torch") + 1] == "2.14.1"
    assert torch_argv[torch_argv.index("--index-url") + 1] == INDEX
    argv, env = _verb(engine, "install-toolkit")
    assert argv[0] == "/opt/ampforge/venv/bin/python" and "--hashed" in argv
    assert argv[argv.index("--index-url") + 1] == INDEX
    requirements = engine.copied[argv[argv.index("--requirements") + 1]]
    assert requirements.splitlines() == list(record.toolkit)
    # The proxies reach pip through the exec only, with the builder's network settings.
    for seen in (env, torch_env):
        assert seen["HTTPS_PROXY"] == PROXY and seen["PIP_NO_CACHE_DIR"] == "1"
    ((committed, labels),) = engine.commits
    assert committed == tag
    parts = json.loads(labels["org.ampforge.torch.parts"])
    assert parts["cuda"] == {
        "version": "13.0",
        "torch_index_url": record.torch_index_url,
        "toolkit": list(record.toolkit),
    }
    # Nothing with the proxy's password is in the layer's config, the container's own
    # environment or the Dockerfile; the index is the recipe's (PIP_INDEX_URL).
    assert SENTINEL not in json.dumps(labels)
    assert SENTINEL not in json.dumps(engine.containers, default=str)
    assert job.recipe is not None and SENTINEL not in job.recipe.dockerfile
    assert f'PIP_INDEX_URL="{INDEX}"' in job.recipe.dockerfile
    assert f"ampforge: CUDA 13.0 toolkit in {CUDA_HOME} (Build cuda_13.0)" in _LINES


def test_offline_the_toolkit_comes_from_the_bundles_wheelhouse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMPFORGE_CACHE", str(tmp_path / "cache"))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    engine = _Engine()
    job = _job(tmp_path, engine, _settings(tmp_path, offline=True), wheelhouse=wheels)
    docker_torch_image(
        job, engine, "ampforge/cell:x", BASE_ID, {str(wheels): "/wheelhouse"}, "/wheelhouse"
    )
    argv, env = _verb(engine, "install-toolkit")
    assert argv[argv.index("--wheelhouse") + 1] == "/wheelhouse" and "--index-url" not in argv
    assert "HTTPS_PROXY" not in env  # no network offline: no proxies either
    assert engine.containers[0]["network"] is False


def test_plan_builds_a_docker_cuda_cell_and_names_the_backends_that_cannot(tmp_path: Path) -> None:
    engine = _Engine()
    job = _job(tmp_path, engine, _settings(tmp_path))
    assert "does not install a CUDA toolkit" not in job.resolved.backend_reason
    from builder.plan.choose import CUDA_BACKENDS  # noqa: PLC0415

    assert CUDA_BACKENDS == ("docker", "host")


# -- end to end: a real container ---------------------------------------------------------

SETUP = """\
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CUDAExtension

setup(name="twice", version="0.1", packages=["twice"],
      ext_modules=[CUDAExtension("twice._C", ["twice/twice.cpp", "twice/twice_kernel.cu"])],
      cmdclass={"build_ext": BuildExtension})
"""
CPP = """\
#include <torch/extension.h>
torch::Tensor twice_cuda(torch::Tensor x);
torch::Tensor twice(torch::Tensor x) { return twice_cuda(x); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("twice", &twice, "x * 2 on the GPU"); }
"""
KERNEL = """\
#include <torch/extension.h>
__global__ void twice_kernel(const float* x, float* y, int64_t n) {
  int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.f * x[i];
}
torch::Tensor twice_cuda(torch::Tensor x) {
  auto y = torch::empty_like(x);
  int64_t n = x.numel();
  twice_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
  return y;
}
"""


def _cuda_project(root: Path) -> Path:
    (root / "twice").mkdir(parents=True)
    (root / "twice" / "__init__.py").write_text("")
    (root / "twice" / "twice.cpp").write_text(CPP)
    (root / "twice" / "twice_kernel.cu").write_text(KERNEL)
    (root / "setup.py").write_text(SETUP)
    (root / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools", "wheel", "torch"]\n'
        'build-backend = "setuptools.build_meta"\n\n[tool.ampforge]\n'
        'test-command = "python -c \\"import torch, twice._C; '
        "assert torch.version.cuda == '13.0'; print('twice cuda import ok')\\\"\"\n"
    )
    return root


@pytest.mark.cuda_build
@pytest.mark.docker
@pytest.mark.slow
def test_docker_cuda_cell_builds_a_verified_cuda_extension(tmp_path: Path) -> None:
    """fetch --no-images the cell's wheels (CUDA torch, its nvidia-* packages, the toolkit),
    then build the cell with the docker backend from that wheelhouse: the wheel's name tells
    its CUDA, its module holds exactly the asked SASS/PTX, and it imports beside the CUDA
    torch in a fresh venv (no GPU)."""
    base = build_base_image(docker_engine())  # the local base image (no registry reachable)
    project = _cuda_project(tmp_path / "twice")
    cfg = tmp_path / "cuda.yaml"
    cfg.write_text(
        f"support: {SUPPORT}\n"
        'matrix: {arch: [X86], python: ["3.11"], torch: ["2.14.1"], cuda: ["13.0"]}\n'
        'cuda:\n  arch_list: {"13.0": "8.0;9.0+PTX"}\n'
    )
    bundle = tmp_path / "bundle"
    start = time.monotonic()
    fetched = subprocess.run(
        [
            sys.executable,
            "-m",
            "builder",
            "fetch",
            "--config",
            str(cfg),
            "--cuda",
            "13.0",
            "--python",
            "3.11",
            "--arch",
            "X86",
            "--no-images",
            "--backend",
            "docker",
            "--project",
            str(project),
            "--bundle",
            str(bundle),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert fetched.returncode == 0, fetched.stderr[-4000:]
    wheels = sorted(p.name for p in (bundle / "wheels").iterdir())
    assert any(n.startswith("nvidia_cuda_nvcc-13.0.88") for n in wheels), wheels
    fetch_s = time.monotonic() - start
    start = time.monotonic()
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "builder",
            "build",
            "--config",
            str(cfg),
            "--cuda",
            "13.0",
            "--python",
            "3.11",
            "--arch",
            "X86",
            "--torch",
            "2.14.1",
            "--backend",
            "docker",
            "--base-image",
            base.tag,
            "--project",
            str(project),
            "--wheelhouse",
            str(bundle / "wheels"),
            "--out",
            str(tmp_path / "dist"),
        ],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    build_s = time.monotonic() - start
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-5000:]
    (wheel,) = (tmp_path / "dist").glob("twice-0.1+torch2.14.cu130-*.whl")
    manifest = json.loads((tmp_path / "dist" / "manifest.json").read_text())
    (entry,) = [e for e in manifest["wheels"] if e["file"] == wheel.name]
    assert entry["extra"]["cuda"]["device_code"] == {
        "twice/_C.cpython-311-x86_64-linux-gnu.so": "sm_80, sm_90, compute_90 (PTX)"
    }, entry
    assert entry["extra"]["torch_image"].startswith(f"ampforge/torch:{CELL}-")
    with zipfile.ZipFile(wheel) as zf:
        assert not [n for n in zf.namelist() if "libcudart" in n or "libcuda." in n]
    print(
        f"fetch {fetch_s:.0f} s ({len(wheels)} wheels); docker build {build_s:.0f} s; "
        f"wheel {wheel.stat().st_size} bytes"
    )
