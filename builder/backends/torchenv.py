"""torch installed once per cell and reused, keyed by content.

Installing ``torch==X`` dominated a rebuild: once in the build venv and again in the
verification venv, every build (tens of seconds from a wheelhouse, minutes from an index that
serves the CUDA build). Here it happens once per *torch key* -- what decides the installed
files:

* where it is installed: the cell image's id (docker: recipe, base image, interpreter) or the
  interpreter's path and version (host);
* ``torch==X`` and the build requirements next to it;
* the source: the wheelhouse's content (every file's sha256), or the index URLs when online;
* the builder's install step itself (``steps.py``'s digest).

When the host backend's interpreter already has the cell's torch installed (a system Python of
openEuler or RHEL with torch and torch-npu, a developer's pyenv), the venv is made with that
interpreter's site packages visible and pip finds torch there instead of installing it again;
that torch's version and folder are part of the key. Its folder is what torch's own metadata
says -- ``lib64/python3.X/site-packages`` on RHEL-family interpreters -- never a guessed
``lib/``, and it is what verification layers its venv on.

The docker backend keeps the result as an image layer (``ampforge/torch:<cell>-<key>``, the cell
image plus the install, committed); the host backend as a venv under the cache root. The build
runs in that environment, and verification makes a fresh venv *layered on it* (``--torch-site``):
pip finds ``torch==X`` installed and installs only the wheel. A changed input makes a new entry,
and the log names the inputs that changed since the last entry for the same cell.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from builder.atomicfile import atomic_write
from builder.backends.base import CellJob
from builder.backends.downloadsize import announce_large_download
from builder.cache import (
    TREE_MANIFEST,
    cache_root,
    content_key,
    discard_entry,
    ensure_entry,
    file_digest,
    folder_digest,
    hold_entry,
    tree_problems,
    write_tree_manifest,
)
from builder.engines.base import Session
from builder.engines.docker import CONTAINER_LABEL, DockerEngine
from builder.engines.host import HostEngine
from builder.incell import STEPS_SCRIPT, install_toolkit, install_torch, parse_result

#: The build requirements installed beside torch (the in-cell ``install-torch`` default) for a
#: torch the support table bounds no setuptools for; :meth:`SupportTable.build_requirements` is
#: what a cell's environment gets (``setuptools<70`` for torch 2.1).
BUILD_REQUIREMENTS = ("setuptools", "wheel")
#: Label holding the key's parts (JSON) on torch layers, to say what changed on a rebuild.
PARTS_LABEL = "org.ampforge.torch.parts"
CELL_LABEL = "org.ampforge.torch.cell"
#: The repository of the torch layers (``ampforge/torch:<cell>-<key>``).
TORCH_REPOSITORY = "ampforge/torch"
#: The cache folder of the torch layers' locks (:func:`layer_lock`).
LAYER_LOCKS = "torch-layers"
#: The cell image's venv (``docker/partials/python.j2``: ``AMPFORGE_VENV``).
IMAGE_VENV_PYTHON = "/opt/ampforge/venv/bin/python"


def install_cell_torch(
    job: CellJob,
    session: Session,
    python: str,
    steps: str,
    *,
    wheelhouse: Optional[str],
    requirements: Sequence[str],
    env: Optional[dict[str, str]] = None,
    torch: Optional[str] = None,
) -> None:
    """torch and *requirements* into *python*'s environment in *session* and, for a CUDA cell,
    its toolkit beside them: what every backend's torch environment holds (the host's cached
    venv, the docker torch layer). *torch*: another release than the cell's (the cross
    backend's host torch), installed without CUDA."""
    cuda = job.resolved.cuda if torch is None else None
    install_torch(
        session,
        python,
        steps,
        torch=torch or job.cell.torch,
        wheelhouse=wheelhouse,
        index_url=(
            cuda.torch_index_url if cuda and cuda.torch_index_url else job.config.pip.index_url
        ),
        env=env,
        extra_requirements=requirements,
    )
    if cuda is not None and cuda.enabled:
        # The toolkit from the package index (the cell's usual sources: its proxies and
        # indexes, a bundle's wheelhouse offline), pinned by the resolved record: no system
        # CUDA. The build's CUDA_HOME, TORCH_CUDA_ARCH_LIST, PATH and nvcc's ccache link come
        # from the in-cell build step, which finds this toolkit in the environment.
        got = install_toolkit(
            session,
            python,
            steps,
            requirements=cuda.toolkit,
            hashed=cuda.toolkit_hashed,
            wheelhouse=wheelhouse,
            index_url=job.config.pip.index_url,
            env=env,
        )
        job.log.note(f"ampforge: CUDA {cuda.cuda} toolkit in {got['cuda_home']} ({got['nvcc']})")


def torch_key_parts(
    job: CellJob, where: Mapping[str, Any], torch: Optional[str] = None
) -> dict[str, Any]:
    """The inputs of the cell's torch environment (see the module docstring); *torch*: another
    release than the cell's (the cross backend's host torch)."""
    opts, config = job.opts, job.config
    if opts.wheelhouse is not None and opts.wheelhouse.is_dir():
        source: dict[str, Any] = {"wheelhouse": folder_digest(opts.wheelhouse)}
    else:
        source = {
            "index_url": config.pip.index_url,
            "extra_index_urls": list(config.pip.extra_index_urls),
        }
    version = torch or job.cell.torch
    parts = {
        **where,
        "torch": version,
        "requirements": list(config.support.build_requirements(version)),
        "source": source,
        "offline": opts.offline,
        "steps": file_digest(STEPS_SCRIPT),
    }
    cuda = job.resolved.cuda
    if cuda.enabled and torch is None:
        # A CUDA cell's environment holds its CUDA torch build and its toolkit: both decide the
        # files (a cpu cell's key has no such part, so its cached environments stay valid).
        parts["cuda"] = {
            "version": cuda.cuda,
            "torch_index_url": cuda.torch_index_url,
            "toolkit": list(cuda.toolkit),
        }
    return parts


#: The key's inputs besides where torch is installed (torch_key_parts' own fields).
KEY_INPUTS = frozenset({"torch", "requirements", "source", "offline", "steps"})
#: Where: the host's interpreter (its own torch, when borrowed), the docker cell image.
HOST_WHERE = frozenset({"python", "python_version"})
HOST_OPTIONAL = frozenset({"interpreter_torch", "cuda"})
DOCKER_WHERE = frozenset({"cell_image"})
DOCKER_OPTIONAL = frozenset({"cuda"})


def superseded(
    parts: Mapping[str, Any],
    name_key: str,
    where: frozenset[str],
    optional: frozenset[str] = frozenset(),
) -> str:
    """Why a torch entry made from *parts* (its recorded key inputs) and named *name_key* can
    never be hit by this builder -- '' when it still can. Its name must be the key of its
    inputs, its inputs the ones this builder's key has, its install step this builder's."""
    want = where | KEY_INPUTS
    have = set(parts)
    if not parts:
        return "no record of its key's inputs (made by an earlier builder)"
    if not want <= have <= want | optional:
        return (
            "made with another key scheme (inputs "
            f"{', '.join(sorted(have ^ (want | (have & optional))))} differ)"
        )
    if content_key([json.dumps(dict(parts), sort_keys=True)]) != name_key:
        return "its name is not the key of its recorded inputs (another key scheme)"
    steps = file_digest(STEPS_SCRIPT)
    if parts["steps"] != steps:
        return (
            f"made by another install step (steps.py {str(parts['steps'])[:12]}, this "
            f"builder's {steps[:12]})"
        )
    requirements = list(parts["requirements"])
    if requirements[1:] != list(BUILD_REQUIREMENTS[1:]) or not str(requirements[0]).startswith(
        BUILD_REQUIREMENTS[0]
    ):
        return (
            f"made with other build requirements ({parts['requirements']}, this builder's "
            f"{list(BUILD_REQUIREMENTS)}, setuptools bounded per torch)"
        )
    return ""


def host_env_superseded(entry: Path) -> str:
    """:func:`superseded` for a host torch environment folder (its key.json), plus the reasons
    only a host has: no record of its files (remade on use), its interpreter gone."""
    if not (entry / TREE_MANIFEST).is_file():
        return "no record of its files (made by an earlier builder: a build makes it again)"
    parts = _read_json(entry / "key.json")
    why = superseded(parts, entry.name.rsplit("-", 1)[-1], HOST_WHERE, HOST_OPTIONAL)
    if not why and not os.path.exists(str(parts["python"])):
        why = f"its interpreter {parts['python']} is gone"
    return why


def layer_lock(name: str) -> Path:
    """Where a build on this machine holds the torch layer ``ampforge/torch:<name>`` while it
    uses it (between finding the layer and its last container; :func:`builder.cache.hold_entry`
    on this path): a layer has no folder here, only its lock."""
    return cache_root() / LAYER_LOCKS / name


def changed_parts(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


# -- host: a cached venv ----------------------------------------------------------------------


def host_torch_env(
    job: CellJob, python: str, env: Mapping[str, str], torch: Optional[str] = None
) -> str:
    """A torch venv for *python* on this host -- the cell's torch, or *torch* (the cross
    backend's host torch, whose X.Y need not be the cell's) -- made on first use under the cache
    root (``$AMPFORGE_CACHE``, default ``~/.cache/ampforge``) and reused while its key holds;
    returns its interpreter."""
    version = torch or job.cell.torch
    python_version = _version_of(python)
    where: dict[str, Any] = {"python": os.path.realpath(python), "python_version": python_version}
    own = _own_torch(job, python, env, version)
    if own is not None:
        # The interpreter has the cell's torch already (an openEuler/RHEL system Python with
        # torch and torch-npu installed, or a developer's pyenv): the venv borrows it instead
        # of installing another copy, and pip finds it where it is -- lib64/... on
        # RHEL-family layouts -- through the interpreter's own site-packages.
        where["interpreter_torch"] = own
    parts = torch_key_parts(job, where, version)
    requirements = tuple(parts["requirements"])
    key = content_key([json.dumps(parts, sort_keys=True)])
    root = cache_root() / "torch-envs"
    xy = ".".join(python_version.split()[0].split(".")[:2])
    # A CUDA cell's environment is another one than the cpu cell's of the same torch.
    tag = f"-cu{job.cell.cuda.replace('.', '')}" if "cuda" in parts else ""
    final = root / f"py{xy}-torch{version}{tag}-{key}"
    last = root / f"py{xy}-torch{version}{tag}.json"
    venv_python = final / "venv" / "bin" / "python"
    # In use from here to the build's end: `cache prune` leaves it alone meanwhile.
    hold_entry(final)
    if final.is_dir() and not (final / TREE_MANIFEST).is_file():
        # Made by a builder that kept no record of its files: nothing to check it against.
        job.log.note(
            f"ampforge: the torch {version} environment {final} has no record of "
            "its files (made by an earlier builder): making it again"
        )
        discard_entry(final)
    if final.is_dir():
        damage = tree_problems(final / "venv", final / TREE_MANIFEST)
        if damage:
            # A cache that lies (a file deleted or truncated by hand, a disk error, a tool
            # that wrote into the venv): never build against it; make it again.
            job.warn(
                f"the cached torch {version} environment {final} is damaged "
                f"({'; '.join(damage)}): removing it and making it again"
            )
            discard_entry(final)
        else:
            job.log.note(
                f"ampforge: torch {version} environment {final} is cached "
                f"(key {key}; its files match their record)"
            )
    if not final.is_dir():
        previous = _read_json(last)
        changed = changed_parts(previous, parts) if previous else []
        why = (
            f"changed: {', '.join(changed)}"
            if changed
            else "same inputs as the last one"
            if previous
            else "first build of this cell here"
        )
        job.log.note(f"ampforge: making the torch {version} environment {final} ({why})")

        def fill(tmp: Path) -> None:
            # A venv keeps working when renamed as long as it is run as ``venv/bin/python``
            # (its prefix comes from pyvenv.cfg next to it); scripts' shebangs are never used.
            with HostEngine().session(env=env, log=job.log, parent=job.stage) as session:
                steps = session.copy_in(STEPS_SCRIPT, session.workdir)
                borrow = ["--system-site-packages"] if own is not None else []
                made = parse_result(
                    session.run(
                        [python, steps, "venv", str(tmp / "venv"), *borrow],
                        step="create torch venv",
                    )
                )
                if own is None:  # a borrowed torch downloads nothing
                    announce_large_download(
                        job,
                        session,
                        str(made["python"]),
                        steps,
                        requirements=requirements,
                        torch=version,
                        machine=platform.machine(),
                        room=str(tmp),
                    )
                wheelhouse = str(job.opts.wheelhouse.resolve()) if job.opts.wheelhouse else None
                install_cell_torch(
                    job,
                    session,
                    str(made["python"]),
                    steps,
                    wheelhouse=wheelhouse,
                    requirements=requirements,
                    torch=torch,
                )
            (tmp / "key.json").write_text(json.dumps(parts, sort_keys=True, indent=1) + "\n")
            # What the environment holds, so that the next build can tell it was not changed.
            write_tree_manifest(tmp / "venv", tmp / TREE_MANIFEST)

        ensure_entry(final, fill)
        _write_json(last, parts)
    return str(venv_python)


def _own_torch(
    job: CellJob, python: str, env: Mapping[str, str], torch: str
) -> Optional[dict[str, str]]:
    """The torch installed in *python* itself when it is the cell's (``2.13.0`` or a local
    build of it such as ``2.13.0+cpu``): its version and folder, as torch's metadata says;
    else None."""
    with HostEngine().session(env=env, log=job.log, parent=job.stage) as session:
        steps = session.copy_in(STEPS_SCRIPT, session.workdir)
        found = parse_result(
            session.run([python, steps, "site", "--optional"], step="interpreter's torch")
        )
    version = str(found.get("torch", ""))
    if version.split("+")[0] != torch:
        return None
    job.log.note(
        f"ampforge: {python} has torch {version} in {found['site']} "
        f"(platlibdir {found['platlibdir']}): the torch environment uses it"
    )
    return {"version": version, "site": str(found["site"])}


def _version_of(python: str) -> str:
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return sys.version
    return subprocess.run(
        [python, "-c", "import sys; print(sys.version)"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return _loads(path.read_text())
    except OSError:
        return {}


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    atomic_write(path, (json.dumps(data, sort_keys=True, indent=1) + "\n").encode())


# -- docker: an image layer -------------------------------------------------------------------


def docker_torch_image(
    job: CellJob,
    engine: DockerEngine,
    cell_image: str,
    cell_image_id: str,
    wheelhouse_bind: Optional[Mapping[str, str]],
    wheelhouse: Optional[str],
) -> str:
    """The tag of the cell image plus torch (committed once per key and reused)."""
    cell, opts = job.cell, job.opts
    parts = torch_key_parts(job, {"cell_image": cell_image_id})
    key = content_key([json.dumps(parts, sort_keys=True)])
    repo, name = TORCH_REPOSITORY, f"{cell.identifier}-{key}"
    tag = f"{repo}:{name}"
    # The build's container and, minutes later, the verification's are made from this layer:
    # held from here to the build's end, so that `cache prune` leaves it alone meanwhile.
    hold_entry(layer_lock(name))
    if engine.image_id(tag) is not None:
        job.log.note(f"ampforge: torch layer {tag} is up to date (key {key})")
        # A label cannot change once committed; tagging the image again sets the engine's own
        # record of its last use (LastTagTime), which `cache list` and `cache prune` read.
        engine.api.tag(tag, repo, name)
        return tag
    earlier = [
        img for img in engine.api.images(filters={"label": f"{CELL_LABEL}={cell.identifier}"})
    ]
    previous = {}
    if earlier:
        newest = max(earlier, key=lambda img: int(img.get("Created", 0)))
        previous = _loads((newest.get("Labels") or {}).get(PARTS_LABEL, ""))
    why = (
        f"changed: {', '.join(changed_parts(previous, parts))}"
        if previous
        else "first build of this cell on this engine"
    )
    job.log.note(f"ampforge: installing torch {cell.torch} into a new layer {tag} ({why})")
    # The proxies reach pip through the exec's environment only: a container's own environment
    # would be committed into the layer's config (and with it any proxy password).
    pip_env = {} if opts.offline else dict(job.proxy_env)
    pip_env["PIP_NO_CACHE_DIR"] = "1"  # the download cache would bloat the layer
    pip_env.update(job.config.pip.network.env())
    with engine.container(
        cell_image,
        binds=wheelhouse_bind,
        network=not opts.offline,
        network_name=opts.network,
        labels={f"{CONTAINER_LABEL}.run": job.run_id, f"{CONTAINER_LABEL}.cell": cell.identifier},
        log=job.log,
        workdir="/ampforge-torch",
    ) as session:
        steps = session.copy_in(STEPS_SCRIPT, session.workdir)
        requirements = tuple(parts["requirements"])
        # The layer is written to the engine's storage: the container's root shows its room.
        announce_large_download(
            job, session, IMAGE_VENV_PYTHON, steps, requirements=requirements, env=pip_env, room="/"
        )
        install_cell_torch(
            job,
            session,
            IMAGE_VENV_PYTHON,
            steps,
            wheelhouse=wheelhouse,
            requirements=requirements,
            env=pip_env,
        )
        session.run(["rm", "-rf", session.workdir], cwd="/", step="clean torch layer")
        engine.commit(
            session,
            tag,
            labels={CELL_LABEL: cell.identifier, PARTS_LABEL: json.dumps(parts, sort_keys=True)},
        )
    return tag


def _loads(text: str) -> dict[str, Any]:
    try:
        return dict(json.loads(text))
    except ValueError:
        return {}
