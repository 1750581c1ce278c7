"""Real clients (issue 28): torch C++ extensions as their authors publish them on the package
index, built through ``--project`` as a release engineer would, with ccache installed.

Nothing of theirs is in this repository: the test downloads each sdist at run time (``pip
download`` from the default index, once per session) and builds it unchanged. The two are the
smallest real torch extensions found whose sdists build against a CPU torch
(docs/third-party-projects.md lists the candidates and their build times):

* torchsort 0.1.10 -- one C++ file (``torchsort.isotonic_cpu``), torch's default ninja
  ``BuildExtension``; its setup.py builds a CUDA extension whenever an ``nvcc`` is on PATH, so
  on a machine with a CUDA toolkit it needs cibuildwheel's ``environment`` to hide it;
* quad-iou 0.2.0 -- two C++ files, a *top-level* extension module (``quad_iou_cpu``) next to
  its package, OpenMP in compile and link.

One build per backend: torchsort on the host and cross (aarch64) backends, quad-iou on the
docker backend. Each wheel is installed into a fresh venv (under QEMU for aarch64) with the
cell's torch, and its test-command round-trips the project's ops.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from helpers.airgaplib import airgapped_env, require_unshare
from helpers.enginelib import docker_engine, missing, wheelhouse_cp311
from helpers.netnslib import isolated_netns
from helpers.pipelinelib import CELL, build_argv, builder_env, manifest, run_build
from helpers.proxylib import serve_index, tinyproxy, write_index

from builder.config import REPO_ROOT
from builder.images.base_image import build_base_image

#: (requirement, the sdist's folder) of each client.
TORCHSORT = ("torchsort==0.1.10", "torchsort-0.1.10")
QUAD_IOU = ("quad-iou==0.2.0", "quad_iou-0.2.0")

#: cibuildwheel's environment that hides every ``nvcc`` from the build: each PATH folder
#: holding one is dropped (evaluated by sh in the build environment, wherever it runs).
HIDE_NVCC = (
    "PATH=\"$(echo $PATH | tr : '\\n' | while read -r d; do test -x $d/nvcc "
    '|| echo $d; done | paste -sd: -)"'
)

#: Round trips of each project's ops in the verification venv. torchsort: soft ranks and
#: sorts of distinct values at a small regularization are the hard ones, and the sort is
#: differentiable; quad-iou: a unit square against itself and against its half-shifted copy.
TORCHSORT_TEST = (
    'python -c "import shutil, torch, torchsort; '
    "x = torch.tensor([[8., 0., 5., 3., 2., 1., 6., 7., 9., 4.]], requires_grad=True); "
    "r = torchsort.soft_rank(x, regularization_strength=1e-3); "
    "assert torch.equal(r.detach().round(), (x.detach().argsort().argsort() + 1).float()), r; "
    "s = torchsort.soft_sort(x, regularization_strength=1e-3); "
    "assert torch.allclose(s.detach(), x.detach().sort().values, atol=1e-3), s; "
    "s.sum().backward(); assert x.grad is not None and x.grad.shape == x.shape; "
    "assert shutil.which('nvcc') is None, 'environment: nvcc still on PATH'; "
    "print('torchsort round trip ok')\""
)
QUAD_IOU_TEST = (
    'python -c "import torch, quad_iou; '
    "a = torch.tensor([[[0., 0.], [1., 0.], [1., 1.], [0., 1.]]]); "
    "r = quad_iou.calculate_iou(a, torch.cat([a, a + torch.tensor([0.5, 0.])])); "
    "assert torch.allclose(r.flatten(), torch.tensor([1., 1. / 3.]), atol=1e-4), r; "
    "assert torch.get_num_threads() == 1, 'environment: OMP_NUM_THREADS'; "
    "print('quad-iou round trip ok')\""
)


def _without_nvcc(path: str) -> str:
    """PATH minus the folders that hold an ``nvcc`` (what HIDE_NVCC does in the build)."""
    return ":".join(d for d in path.split(":") if d and not (Path(d) / "nvcc").exists())


@pytest.fixture(scope="session")
def sdists(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both clients' sdists from the default index, once per session. pip prepares each
    sdist's metadata by running its setup.py: with this venv's torch (no build isolation,
    which would download another torch) and no nvcc on PATH (torchsort's would ask for CUDA).
    """
    if shutil.which("ccache") is None:
        missing("ccache is not installed", ".ci/run installs the ccache package")
    dest = tmp_path_factory.mktemp("client-sdists")
    env = {**os.environ, "PATH": _without_nvcc(os.environ["PATH"])}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "--dest",
            str(dest),
            TORCHSORT[0],
            QUAD_IOU[0],
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if proc.returncode != 0:
        missing(
            f"the package index is not reachable: pip download {TORCHSORT[0]} "
            f"{QUAD_IOU[0]} failed:\n{proc.stderr[-1500:]}",
            "CI needs the package index for the real-client tests",
        )
    return dest


def _unpack(sdists: Path, client: tuple[str, str], dest: Path) -> Path:
    (archive,) = sdists.glob(client[1] + ".tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    return dest / client[1]


def _entry(dist: Path, cell: str) -> dict:
    (entry,) = [e for e in manifest(dist)["wheels"] if e["cell"] == cell]
    return entry


def _compiled_through_ccache(entry: dict) -> None:
    stats = entry["extra"]["ccache"]
    assert stats["hits"] + stats["misses"] >= 1, stats


@pytest.mark.slow
def test_torchsort_on_the_host_backend(sdists: Path, tmp_path: Path) -> None:
    project = _unpack(sdists, TORCHSORT, tmp_path / "src")
    r = run_build(
        tmp_path,
        "--backend",
        "host",
        "--project",
        str(project),
        "--find-links",
        str(wheelhouse_cp311()),
        "--environment",
        HIDE_NVCC,
        "--test-command",
        TORCHSORT_TEST,
    )
    assert r.rc == 0, r.err[-4000:]
    entry = _entry(tmp_path / "dist", CELL)
    assert entry["file"].startswith("torchsort-0.1.10+torch2.13-cp311-cp311-manylinux_"), entry
    assert entry["extra"]["modules"] == ["torchsort.isotonic_cpu"]
    _compiled_through_ccache(entry)
    log = (tmp_path / "work" / "logs" / f"{CELL}.log").read_text()
    assert "torchsort round trip ok" in log and "+ environment: PATH=" in log


@pytest.mark.slow
@pytest.mark.docker
def test_quad_iou_on_the_docker_backend(sdists: Path, tmp_path: Path) -> None:
    project = _unpack(sdists, QUAD_IOU, tmp_path / "src")
    base = build_base_image(docker_engine())
    r = run_build(
        tmp_path,
        "--backend",
        "docker",
        "--base-image",
        base.tag,
        "--arch",
        "X86",
        "--python",
        "3.11",
        "--find-links",
        str(wheelhouse_cp311()),
        "--project",
        str(project),
        "--environment",
        "OMP_NUM_THREADS=1",
        "--test-command",
        QUAD_IOU_TEST,
    )
    assert r.rc == 0, r.err[-4000:]
    entry = _entry(tmp_path / "dist", CELL)
    assert entry["file"].startswith("quad_iou-0.2.0+torch2.13-cp311-cp311-manylinux_"), entry
    assert entry["extra"]["modules"] == ["quad_iou_cpu"]  # top level: imported, listed
    _compiled_through_ccache(entry)
    log = (tmp_path / "work" / "logs" / f"{CELL}.log").read_text()
    assert "quad-iou round trip ok" in log


@pytest.mark.slow
def test_torchsort_cross_built_for_arm(sdists: Path, tmp_path: Path) -> None:
    cell = "cp311-manylinux_aarch64-torch2.9.1"
    project = _unpack(sdists, TORCHSORT, tmp_path / "src")
    r = run_build(
        tmp_path,
        "--backend",
        "cross",
        "--arch",
        "ARM",
        "--python",
        "3.11",
        "--torch",
        "2.9.1",
        "--project",
        str(project),
        "--environment",
        HIDE_NVCC,
        "--test-command",
        TORCHSORT_TEST,
    )
    assert r.rc == 0, r.err[-4000:]
    entry = _entry(tmp_path / "dist", cell)
    assert entry["file"].startswith("torchsort-0.1.10+torch2.9-cp311-cp311-manylinux_"), entry
    assert entry["file"].endswith("_aarch64.whl"), entry
    assert entry["extra"]["modules"] == ["torchsort.isotonic_cpu"]
    _compiled_through_ccache(entry)
    report = entry["extra"]["verification"]
    assert report["torch"] == "2.9.1+cpu" and report["test"]["exit"] == 0, report
    assert report["test"]["tail"][-1] == "torchsort round trip ok", report


#: torchsort's CUDA extension for CUDA 13.0 and two compute capabilities (SASS for both, PTX for
#: the newer): the support table's toolkit from the package index in the cell's torch
#: environment, no system CUDA (every folder with an nvcc is off PATH, as in `sdists`).
CUDA_CELL = "cp311-manylinux_x86_64-torch2.14.1-cu130"
CUDA_CONFIG = f"""\
support: {Path(__file__).resolve().parents[3] / "configs" / "support.yaml"}
matrix:
  arch: [X86]
  python: ["3.11"]
  torch: ["2.14.1"]
  cuda: ["13.0"]
cuda:
  arch_list: {{"13.0": "8.0;9.0+PTX"}}
"""
TORCHSORT_CUDA_TEST = (
    'python -c "import torch, torchsort, torchsort.isotonic_cuda; '
    "assert torch.version.cuda == '13.0', torch.version.cuda; "
    "x = torch.tensor([[3., 1., 2.]]); "
    "assert torch.equal(torchsort.soft_rank(x, regularization_strength=1e-3).round(), "
    "torch.tensor([[3., 1., 2.]])); print('torchsort cuda import ok')\""
)


@pytest.mark.slow
@pytest.mark.cuda_build
@pytest.mark.timeout(3600)
def test_torchsort_cuda_extension_for_cuda_13_0(sdists: Path, tmp_path: Path) -> None:
    """Measured on this project's 2-CPU machine: the CUDA torch environment (torch 2.14.1 and
    its nvidia-* packages, 3.0 GB, from a local mirror) 42 s, the toolkit 4 s, the compile of
    isotonic_cuda.cu for two capabilities several minutes: a slow test, which CI runs in a
    background lane of its own beside the main suite (.ci/run's CUDA lane)."""
    project = _unpack(sdists, TORCHSORT, tmp_path / "src")
    config = tmp_path / "cuda.yaml"
    config.write_text(CUDA_CONFIG)
    r = run_build(
        tmp_path,
        "--config",
        str(config),
        "--backend",
        "host",
        "--cuda",
        "13.0",
        "--project",
        str(project),
        "--test-command",
        TORCHSORT_CUDA_TEST,
        timeout=3600,
        PATH=_without_nvcc(os.environ["PATH"]),
    )
    assert r.rc == 0, r.err[-4000:]
    entry = _entry(tmp_path / "dist", CUDA_CELL)
    assert entry["file"].startswith("torchsort-0.1.10+torch2.14.cu130-cp311-cp311-manylinux_"), (
        entry
    )
    assert entry["extra"]["modules"] == ["torchsort.isotonic_cpu", "torchsort.isotonic_cuda"]
    cuda = entry["extra"]["cuda"]
    assert cuda["arch_list"] == "8.0;9.0+PTX" and cuda["device_code"] == {
        "torchsort/isotonic_cuda.cpython-311-x86_64-linux-gnu.so": "sm_80, sm_90, compute_90 (PTX)"
    }, cuda
    assert entry["extra"]["resolved"]["cuda"]["version"] == "13.0"
    # Both compiles (isotonic_cpu.cpp by g++, isotonic_cuda.cu by nvcc) went through ccache:
    # torch's ninja rule ran nvcc through the link PYTORCH_NVCC names.
    stats = entry["extra"]["ccache"]
    assert stats["hits"] + stats["misses"] == 2, stats
    log = (tmp_path / "work" / "logs" / f"{CUDA_CELL}.log").read_text()
    assert "torchsort cuda import ok" in log
    # No nvcc on the build's PATH but the toolkit's (CUDA_HOME's, from the index's wheels): the
    # device code above is that nvcc's.
    assert shutil.which("nvcc", path=_without_nvcc(os.environ["PATH"])) is None
    assert "nvidia-cuda-nvcc==13.0.88" in entry["extra"]["resolved"]["cuda"]["toolkit"][0]


def _fetch_cuda_bundle(project: Path, config: Path, bundle: Path, path: str) -> str:
    """``fetch --no-images`` of the CUDA cell on this connected machine: the CUDA torch, its
    nvidia-* packages, the toolkit's pins and the project's build requirements. Its output."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "builder",
            "fetch",
            "--config",
            str(config),
            "--cuda",
            "13.0",
            "--python",
            "3.11",
            "--arch",
            "X86",
            "--project",
            str(project),
            "--bundle",
            str(bundle),
            "--no-images",
        ],
        capture_output=True,
        text=True,
        env=builder_env(PATH=path),
        cwd=bundle.parent,
        timeout=3600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.cuda_build
@pytest.mark.timeout(5400)
def test_torchsort_cuda_through_a_proxy_then_air_gapped_from_the_bundle(
    sdists: Path, tmp_path: Path
) -> None:
    """The CUDA cell as a release engineer behind a proxy, then on an air-gapped machine, runs
    it. A bundle is fetched on this connected machine; then

    1. *through a proxy*: the builder runs in a network namespace whose one link leads to an
       authenticating tinyproxy, and the only index (the bundle's wheels as PEP 503 pages, on
       this machine's loopback) is reachable through it alone: the CUDA torch, its nvidia-*
       packages and the toolkit's hashed pins all come through the proxy;
    2. *air-gapped*: a namespace with loopback only, ``--bundle``, a fresh cache (the toolkit
       and torch come from the bundle): the same wheel name and device code. Its compiles miss
       even with the first build's compiler cache: the torch headers' folder (inside each
       cache's torch environment) is part of every compile's command line.

    Three CUDA torches' worth of moving (~3 GB each: fetch, proxy, bundle) and one compile of
    isotonic_cuda.cu: the slowest test there is, outside CI's lane."""
    unshare = require_unshare()
    project = _unpack(sdists, TORCHSORT, tmp_path / "src")
    path = _without_nvcc(os.environ["PATH"])
    config = tmp_path / "cuda.yaml"
    config.write_text(CUDA_CONFIG)
    bundle = tmp_path / "bundle"
    fetched = _fetch_cuda_bundle(project, config, bundle, path)
    wheels = sorted(p.name for p in (bundle / "wheels").glob("*.whl"))
    assert any(n.startswith("torch-2.14.1") for n in wheels), wheels
    assert any(n.startswith("nvidia_cuda_nvcc-13.0") for n in wheels), wheels
    print(fetched[-2000:])  # what it downloaded, and how much (the closing note reads it)

    args = (
        "--backend",
        "host",
        "--cuda",
        "13.0",
        "--python",
        "3.11",
        "--arch",
        "X86",
        "--project",
        str(project),
        "--test-command",
        TORCHSORT_CUDA_TEST,
    )
    env = {"PYTHONPATH": str(REPO_ROOT), "PATH": path}
    proxied, offline = tmp_path / "proxied", tmp_path / "offline"
    proxied.mkdir()
    offline.mkdir()
    cache_a, cache_b = tmp_path / "cache-a", tmp_path / "cache-b"

    # 1. Through the proxy, from an index nothing else reaches.
    root = write_index(bundle / "wheels", tmp_path / "index")
    with isolated_netns() as netns, serve_index(root) as index, tinyproxy(
        netns.host_addr, tmp_path / "proxy", ()
    ) as proxy:
        assert netns.can_connect(proxy.host, proxy.port)
        assert not netns.can_connect("127.0.0.1", index.port), "the index is reachable directly"
        via = tmp_path / "via-proxy.yaml"
        via.write_text(CUDA_CONFIG + f"pip:\n  index_url: {index.url}\n")
        proc = subprocess.run(
            netns.argv(build_argv(proxied, "--config", str(via), *args, "--http-proxy", proxy.url)),
            capture_output=True,
            text=True,
            cwd=proxied,
            timeout=3600,
            env=airgapped_env(AMPFORGE_CACHE=str(cache_a), **env),
        )
        assert proc.returncode == 0, proc.stderr[-5000:]
        log = proxy.log_text()
    base = f"GET http://127.0.0.1:{index.port}/simple/"
    for page in ("torch", "nvidia-cuda-nvcc"):
        assert f"{base}{page}/ HTTP/1.1" in log, (page, log[-3000:])
    first = _entry(proxied / "dist", CUDA_CELL)
    assert first["extra"]["ccache"]["misses"] == 2, first["extra"]["ccache"]
    assert first["extra"]["resolved"]["index"]["index_url"] == index.url

    # 2. Air-gapped, from the bundle. The index's pages hard-linked the bundle's wheels, which
    # the bundle check refuses (a file with two names may change under another): the index
    # goes first, as it would not be carried.
    shutil.rmtree(root)
    proc = subprocess.run(
        [
            unshare,
            "--net",
            "--",
            *build_argv(offline, "--config", str(config), *args, "--bundle", str(bundle)),
        ],
        capture_output=True,
        text=True,
        cwd=offline,
        timeout=3600,
        env=airgapped_env(AMPFORGE_CACHE=str(cache_b), **env),
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    second = _entry(offline / "dist", CUDA_CELL)
    stats = second["extra"]["ccache"]
    assert stats["hits"] + stats["misses"] == 2, stats  # nvcc's compile went through it too
    assert second["extra"]["cuda"]["device_code"] == first["extra"]["cuda"]["device_code"]
    assert second["file"] == first["file"] and second["file"].startswith(
        "torchsort-0.1.10+torch2.14.cu130-cp311-cp311-manylinux_"
    )
    out = (offline / "work" / "logs" / f"{CUDA_CELL}.log").read_text()
    assert "torchsort cuda import ok" in out
