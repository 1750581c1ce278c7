"""Docker engine through the docker SDK: ping, images, and containers that are always removed.

One class owns a container's whole life (create -> run -> copy in/out -> remove), in the spirit of
cibuildwheel's ``oci_container.py``; engine differences are handled here and nowhere else.

Podman
------
Podman speaks the Docker API through its socket, so this module works against it with the
differences below; a project's ``container-engine = "podman"`` finds or starts that socket
(:mod:`builder.engines.podman`), or by hand::

    podman system service --time=0 unix:///run/podman/podman.sock &
    export DOCKER_HOST=unix:///run/podman/podman.sock

Quirks seen with Debian's podman 4.3 on Debian 12 hosts (tests/builder/e2e/test_podman.py builds a
cell through it):

* ``crun`` fails on this kernel's cgroup layout: configure ``runtime = "runc"`` under
  ``[engine]`` in ``/etc/containers/containers.conf``; the API cannot choose the OCI runtime.
* Containers only start with explicit ``nofile``/``nproc`` ulimits of 1024: when the engine
  reports itself as Podman, :meth:`DockerEngine.container` sets them (``_PODMAN_ULIMITS``).
* A container's start, and an exec's, sometimes fail under load with HTTP 500 "write child:
  broken pipe": :meth:`DockerEngine.container` removes the container and starts a new one, and
  :meth:`DockerSession.run` starts a new exec (both ``_PODMAN_START_ATTEMPTS`` times in all, with
  pauses growing from 0.5 s to 8 s between them).
* The compat ``import`` drops its ``tag`` parameter and reads ``LABEL a=1 b=2`` as one label:
  :meth:`DockerEngine.import_rootfs` passes ``repo:tag`` and one ``LABEL`` per pair.
* Images it builds or imports are named ``docker.io/<name>`` (loaded ones ``localhost/<name>``);
  the short names this module uses still find them.
* Its image store is its own: :meth:`DockerEngine.copy_image_from` copies a base image dockerd
  made (``docker save | podman load``) instead of debootstrapping it again.

Base images are pulled only as the build's pull policy says (``--pull``, decided in
:mod:`builder.engines.pull`); air-gapped hosts build theirs locally
(:mod:`builder.images.base_image`) or load them from a tarball.
"""

from __future__ import annotations

import contextlib
import io
import os
import posixpath
import re
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Optional

from builder.engines.base import TAIL_LINES, OutputLog, RunResult, check_result, iter_lines
from builder.engines.owner import CONTAINER_LABEL, owner_labels
from builder.errors import EngineUnavailable, StepFailed
from builder.redact import Redactor


class PullError(StepFailed):
    """The engine could not pull an image; the message is the engine's (redacted)."""


_START_HINT = (
    "Start an engine and try again:\n"
    "  - Docker: `.ci/dockerd-up` (or `dockerd &`, or `systemctl start docker`);\n"
    '  - Podman: container-engine = "podman" in the project\'s [tool.cibuildwheel], or\n'
    "    `podman system service --time=0 unix:///run/podman/podman.sock &` then\n"
    "    `export DOCKER_HOST=unix:///run/podman/podman.sock`;\n"
    "  - or build without containers: --backend host (make wheel BACKEND=host)."
)

# The pauses before each new try of a start that failed with podman's broken-pipe race (so
# 6 tries in all, 15.5 s of pauses at most): the race comes with load, which takes seconds to
# pass. (Every try failing is a service whose working folder is gone: podman.py starts it in /.)
_PODMAN_RETRY_PAUSES = (0.5, 1.0, 2.0, 4.0, 8.0)
_PODMAN_START_ATTEMPTS = len(_PODMAN_RETRY_PAUSES) + 1

_PODMAN_ULIMITS = [
    {"Name": "nofile", "Soft": 1024, "Hard": 1024},
    {"Name": "nproc", "Soft": 1024, "Hard": 1024},
]


def _docker_module() -> Any:
    try:
        import docker  # noqa: PLC0415  (optional dependency of the builder extra)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise EngineUnavailable(
            "the Python package 'docker' is not installed: pip install 'ampforge[builder]'"
        ) from exc
    return docker


class DockerEngine:
    """A connection to a Docker-API engine (dockerd or a Podman socket).

    ``base_url`` defaults to ``DOCKER_HOST`` (then the default socket), like the docker CLI.
    Construction pings the engine and raises :class:`EngineUnavailable` when nothing answers.
    """

    name = "docker"

    def __init__(
        self,
        base_url: str | None = None,
        *,
        redactor: Redactor | None = None,
        timeout: int = 600,
    ) -> None:
        docker = _docker_module()
        self.redactor = redactor or Redactor()
        self.base_url = base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        try:
            if base_url is None:
                # from_env also honours DOCKER_TLS_VERIFY / DOCKER_CERT_PATH.
                self.api = docker.from_env(timeout=timeout).api
            else:
                self.api = docker.APIClient(base_url=base_url, version="auto", timeout=timeout)
            self.api.ping()
            version = self.api.version()
        except Exception as exc:  # DockerException, requests' ConnectionError, socket errors
            raise EngineUnavailable(
                f"no container engine answers at {self.base_url}: {self.redactor(str(exc))}\n"
                + _START_HINT
            ) from exc
        components = " ".join(c.get("Name", "") for c in version.get("Components", []))
        self.is_podman = "podman" in components.lower()
        self.server_version = str(version.get("Version", "?"))

    # -- images ---------------------------------------------------------------------------
    def image_id(self, ref: str) -> str | None:
        """The image id of *ref* (tag or id), or None when the engine does not have it."""
        docker = _docker_module()
        try:
            return str(self.api.inspect_image(ref)["Id"])
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.NotFound:
            return None

    def repo_digests(self, ref: str) -> list[str]:
        """The ``name@sha256:...`` references the engine has for *ref*: set by a pull or a
        push (what a registry serves), empty for an image built here or ``docker load``-ed."""
        return [str(d) for d in self.api.inspect_image(ref).get("RepoDigests") or []]

    def registry_digest(self, ref: str) -> str:
        """The digest the registry serves for *ref* now, asked through the daemon (``GET
        /distribution``: the manifest only, nothing pulled). :class:`PullError` as a pull."""
        docker = _docker_module()
        try:
            return str(self.api.inspect_distribution(ref)["Descriptor"]["digest"])
        except docker.errors.APIError as exc:
            raise PullError(self.redactor(str(exc.explanation or exc))) from exc

    def pull(self, ref: str) -> Iterator[dict[str, Any]]:
        """``docker pull ref``: the engine's progress events as they come (dicts with
        ``status``, ``id``, ``progressDetail``). A failure raises :class:`PullError` with the
        engine's own message, whether the request is refused at once (unreachable registry,
        unknown tag) or the stream reports it midway."""
        docker = _docker_module()
        try:
            # use_config_proxy does not apply: the daemon pulls with its own environment.
            for event in self.api.pull(ref, stream=True, decode=True):
                if "error" in event:
                    detail = event.get("errorDetail") or {}
                    raise PullError(self.redactor(str(detail.get("message") or event["error"])))
                yield event
        except docker.errors.APIError as exc:
            raise PullError(self.redactor(str(exc.explanation or exc))) from exc

    def info(self) -> dict[str, Any]:
        """The engine's ``/info`` (``docker info``): proxies, rootless, storage ..."""
        return dict(self.api.info())

    def has_network(self, name: str) -> bool:
        """Whether the engine has a network called *name* (``docker network ls``)."""
        return any(n.get("Name") == name for n in self.api.networks(names=[name]))

    def import_rootfs(
        self, tarball: Path, repository: str, tag: str, changes: Sequence[str] = ()
    ) -> str:
        """``docker import`` a root filesystem tarball; return the new image id."""
        if self.is_podman:
            # Podman 4.3's compat import drops the ``tag`` query parameter (the image came out
            # as <repository>:latest) and reads ``LABEL a=1 b=2`` as one label ``a`` whose
            # value is "1 b=2": the tag goes into the repository, one LABEL per pair.
            self.api.import_image(
                src=str(tarball),
                repository=f"{repository}:{tag}",
                changes=_one_label_each(changes) or None,
            )
        else:
            self.api.import_image(
                src=str(tarball), repository=repository, tag=tag, changes=list(changes) or None
            )
        image = self.image_id(f"{repository}:{tag}")
        if image is None:
            raise StepFailed(f"docker import of {tarball} did not produce {repository}:{tag}")
        return image

    def copy_image_from(self, other: DockerEngine, ref: str) -> str:
        """*ref* from engine *other* into this one (``docker save | podman load``, through a
        temporary file); returns its id here. How a podman engine gets the base image a
        docker engine already made from the same content key, instead of debootstrapping
        again (podman tags it ``localhost/<ref>``; a short name still finds it)."""
        with tempfile.TemporaryFile() as buf:
            for chunk in other.api.get_image(ref):
                buf.write(chunk)
            buf.seek(0)
            for _event in self.api.load_image(buf):
                pass
        found = self.image_id(ref)
        if found is None:
            raise StepFailed(
                f"loading {ref} from {other.base_url} into {self.base_url} did not produce it"
            )
        return found

    def build_image(
        self,
        dockerfile: str,
        tag: str,
        *,
        context: Path | None = None,
        build_args: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        log: OutputLog | None = None,
        nocache: bool = False,
        network: str | None = None,
    ) -> str:
        """Build *dockerfile* (text) with *context* (a directory, may be None); return the id.

        Proxies belong in *build_args* (``HTTP_PROXY`` ...): Docker treats those names as
        predefined build args and keeps them out of the image's history and environment,
        whereas ``ENV`` would bake them into a layer. Every log line is redacted.
        *network* names the Docker network the ``RUN`` steps join (default: the engine's).
        """
        log = log or OutputLog(redactor=self.redactor)
        docker = _docker_module()
        with tempfile.TemporaryFile() as ctx:
            _write_context(ctx, dockerfile, context)
            ctx.seek(0)
            tail: list[str] = []
            image_id: Optional[str] = None
            log.open()
            try:
                stream = self.api.build(
                    fileobj=ctx,
                    custom_context=True,
                    dockerfile=_DOCKERFILE_NAME,
                    tag=tag,
                    rm=True,
                    forcerm=True,
                    nocache=nocache,
                    buildargs=dict(build_args or {}),
                    labels=dict(labels or {}) or None,
                    decode=True,
                    # The SDK would otherwise copy proxies from ~/.docker/config.json into
                    # build args on its own; we pass exactly what the caller gave us.
                    use_config_proxy=False,
                    network_mode=network,
                )
                for chunk in stream:
                    if "stream" in chunk:
                        # The classic builder colours a step's stderr; logs want plain text.
                        text = _ANSI.sub("", str(chunk["stream"]))
                        for line in text.splitlines():
                            tail.append(log.write_line(line))
                            del tail[:-25]
                    if "aux" in chunk and isinstance(chunk["aux"], dict):
                        image_id = chunk["aux"].get("ID", image_id)
                    if "error" in chunk:
                        detail = log.write_line(str(chunk["error"]))
                        shown = "\n".join("    " + t for t in tail[-15:])
                        where = f"\n  full log: {log.log_file}" if log.log_file else ""
                        raise StepFailed(
                            f"image build for {tag} failed: {detail}\n  last lines:\n{shown}{where}"
                        )
            except docker.errors.APIError as exc:
                raise StepFailed(
                    f"image build for {tag} failed: {self.redactor(str(exc))}"
                ) from exc
            finally:
                log.close()
        found = self.image_id(tag)
        if found is None:
            raise StepFailed(f"image build for {tag} finished without producing the image")
        return image_id or found

    def remove_image(self, ref: str) -> None:
        docker = _docker_module()
        with contextlib.suppress(docker.errors.NotFound):
            self.api.remove_image(ref, force=True)

    # -- containers -----------------------------------------------------------------------
    def leftover_containers(self) -> list[str]:
        """Ids of containers made by this module that still exist (should be none)."""
        found = self.api.containers(all=True, filters={"label": CONTAINER_LABEL})
        return [str(c["Id"]) for c in found]

    @contextlib.contextmanager
    def container(
        self,
        image: str,
        *,
        env: Mapping[str, str] | None = None,
        binds: Mapping[str, str] | None = None,
        volumes: Mapping[str, str] | None = None,
        network: bool = True,
        network_name: str | None = None,
        labels: Mapping[str, str] | None = None,
        workdir: str = "/ampforge",
        log: OutputLog | None = None,
    ) -> Iterator[DockerSession]:
        """A running container for the duration of the ``with`` block; removed afterwards.

        *binds* maps host paths to read-only paths inside (e.g. a wheelhouse); remote engines
        cannot see host paths, use :meth:`DockerSession.copy_in` there. *volumes* maps named
        volumes (created on first use, kept afterwards) to read-write paths inside: the compiler
        cache (``ccache``, ``CCACHE_DIR=/ccache`` in the base image). ``network=False``
        starts the container with no network at all (offline builds); *network_name* attaches
        it to that Docker network instead of the default bridge (e.g. an ``--internal``
        network whose only way out is a proxy).
        The container is removed on every exit path: success, exception, KeyboardInterrupt.
        """
        # The owner (pid, machine, boot): a killed builder's container is found and removed
        # by the next one (builder.engines.owner).
        all_labels = {
            CONTAINER_LABEL: "1",
            f"{CONTAINER_LABEL}.session": uuid.uuid4().hex,
            **owner_labels(),
        }
        all_labels.update(labels or {})
        mounts = {h: {"bind": c, "mode": "ro"} for h, c in (binds or {}).items()}
        mounts.update({v: {"bind": c, "mode": "rw"} for v, c in (volumes or {}).items()})
        host_config = self.api.create_host_config(
            binds=mounts or None,
            network_mode=(network_name or None) if network else "none",
            ulimits=_PODMAN_ULIMITS if self.is_podman else None,
        )
        out = log or OutputLog(redactor=self.redactor)

        def create() -> str:
            created = self.api.create_container(
                image,
                # Keep the container alive; each step runs as its own exec.
                command=["sleep", "infinity"],
                environment=dict(env or {}),
                working_dir="/",
                labels=all_labels,
                host_config=host_config,
                network_disabled=not network,
                use_config_proxy=False,
            )
            return str(created["Id"])

        cid = self._create_and_start(create, out)
        try:
            session = DockerSession(self, cid, workdir, out)
            session.run(["mkdir", "-p", workdir], cwd="/", step="prepare workdir")
            yield session
        finally:
            self._remove(cid)

    def _create_and_start(self, create: Callable[[], str], log: OutputLog) -> str:
        """A started container made by *create*; its id. A container that does not start is
        removed (on every exit path, Ctrl-C included). Podman 4.3 sometimes fails a start
        under load with HTTP 500 "write child: broken pipe" (its runtime's pipe to the
        container's first process closed early); the container is then dead but a new one
        starts, so on podman that error is retried with a fresh container, up to
        ``_PODMAN_START_ATTEMPTS`` times, each retry logged. dockerd's errors, and podman's
        others, are raised at once."""
        docker = _docker_module()
        for attempt in range(1, _PODMAN_START_ATTEMPTS + 1):
            cid = create()
            try:
                self.api.start(cid)
                return cid
            except docker.errors.APIError as exc:
                self._remove(cid)
                if (
                    not (self.is_podman and _is_start_race(exc))
                    or attempt == _PODMAN_START_ATTEMPTS
                ):
                    raise
                log.note(
                    f"podman: the container did not start ({_first_line(exc)}); "
                    f"podman's start race, starting a new one "
                    f"({attempt}/{_PODMAN_START_ATTEMPTS - 1})"
                )
                time.sleep(_PODMAN_RETRY_PAUSES[attempt - 1])
            except BaseException:
                self._remove(cid)
                raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    def commit(
        self, session: DockerSession, tag: str, labels: Mapping[str, str] | None = None
    ) -> str:
        """The container's filesystem as image *tag* (on the container's image config, plus
        *labels*); returns its id. Whatever the container was started with (its command, its
        environment) is not carried over: only the image's own config is."""
        image = self.api.inspect_container(session.id)["Image"]
        config = dict(self.api.inspect_image(image).get("Config") or {})
        conf = {
            "Env": list(config.get("Env") or []),
            "Cmd": config.get("Cmd"),
            "Entrypoint": config.get("Entrypoint"),
            "WorkingDir": config.get("WorkingDir"),
            "Labels": {**(config.get("Labels") or {}), **(labels or {})},
        }
        repo, _, name = tag.rpartition(":")
        made = self.api.commit(session.id, repository=repo, tag=name, conf=conf)
        return str(made["Id"])

    def _remove(self, cid: str) -> None:
        docker = _docker_module()
        # A second Ctrl-C while we clean up must not leave the container behind: retry once
        # and re-raise the interrupt afterwards.
        interrupted: Optional[BaseException] = None
        for _ in range(2):
            try:
                self.api.remove_container(cid, force=True, v=True)
                break
            except docker.errors.NotFound:
                break
            except KeyboardInterrupt as exc:
                interrupted = exc
        if interrupted is not None:
            raise interrupted


def _is_start_race(exc: Exception) -> bool:
    """Podman's failed start under load: a server error whose text is the runtime's broken
    pipe (seen: '500 Server Error ... write child: broken pipe')."""
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return status == 500 and "broken pipe" in str(exc).lower()


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _one_label_each(changes: Sequence[str]) -> list[str]:
    """``LABEL a=1 b=2`` -> ``LABEL a=1``, ``LABEL b=2`` (values without spaces, as ours are);
    other instructions as they are."""
    out: list[str] = []
    for change in changes:
        word, _, rest = change.partition(" ")
        if word.upper() == "LABEL":
            out += [f"LABEL {pair}" for pair in rest.split()]
        else:
            out.append(change)
    return out


_DOCKERFILE_NAME = "Dockerfile.ampforge"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _write_context(fileobj: Any, dockerfile: str, context: Path | None) -> None:
    """Tar the build context (sorted, for stable layer caching) plus the Dockerfile text."""
    with tarfile.open(fileobj=fileobj, mode="w") as tar:
        if context is not None:
            if not context.is_dir():
                raise StepFailed(f"build context {context} is not a directory")
            for path in sorted(context.rglob("*")):
                tar.add(path, arcname=path.relative_to(context).as_posix(), recursive=False)
        data = dockerfile.encode("utf-8")
        info = tarfile.TarInfo(_DOCKERFILE_NAME)
        info.size = len(data)
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(data))


class DockerSession:
    """A running container: run commands, copy files in and out. Made by ``container()``."""

    def __init__(self, engine: DockerEngine, cid: str, workdir: str, log: OutputLog) -> None:
        self.engine = engine
        self.id = cid
        self.workdir = workdir
        self.log = log

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        check: bool = True,
        step: str = "",
        tail_lines: int = TAIL_LINES,
    ) -> RunResult:
        api = self.engine.api
        exec_id, stream = self._start_exec(argv, env, cwd or self.workdir)
        self.log.open()
        try:
            tail = self.log.capture(iter_lines(stream), tail_lines)
        finally:
            self.log.close()
        code = api.exec_inspect(exec_id).get("ExitCode")
        result = RunResult(
            argv=tuple(argv),
            exit_code=-1 if code is None else int(code),
            tail=tail,
            log_path=self.log.log_file,
        )
        if check:
            check_result(result, step, f"container {self.id[:12]}", self.log.redactor)
        return result

    def _start_exec(
        self, argv: Sequence[str], env: Mapping[str, str] | None, cwd: str
    ) -> tuple[str, Iterator[bytes]]:
        """An exec of *argv* started; its id and its output stream. Podman 4.3 fails an exec's
        start under load as it fails a container's (HTTP 500 "write child: broken pipe": conmon
        gone before it was told to run the command, so the command never ran). On podman that
        error is retried with a new exec, up to ``_PODMAN_START_ATTEMPTS`` times, each retry
        noted in the log; docker-py raises it before any output, so none is lost. dockerd's
        errors, and podman's others, are raised at once."""
        docker = _docker_module()
        api = self.engine.api
        for attempt in range(1, _PODMAN_START_ATTEMPTS + 1):
            exec_id = api.exec_create(self.id, list(argv), environment=dict(env or {}), workdir=cwd)
            try:
                return str(exec_id["Id"]), api.exec_start(exec_id["Id"], stream=True)
            except docker.errors.APIError as exc:
                if (
                    not (self.engine.is_podman and _is_start_race(exc))
                    or attempt == _PODMAN_START_ATTEMPTS
                ):
                    raise
                self.log.note(
                    f"podman: the command {argv[0]} did not start ({_first_line(exc)}); "
                    f"podman's start race, starting it again "
                    f"({attempt}/{_PODMAN_START_ATTEMPTS - 1})"
                )
                time.sleep(_PODMAN_RETRY_PAUSES[attempt - 1])
        raise AssertionError("unreachable: the last attempt returns or raises")

    def copy_in(self, src: Path, dest_dir: str) -> str:
        if not src.exists():
            raise StepFailed(f"cannot copy {src} into the container: it does not exist")
        self.run(["mkdir", "-p", dest_dir], step="copy in")
        with tempfile.TemporaryFile() as buf:
            with tarfile.open(fileobj=buf, mode="w") as tar:
                tar.add(src, arcname=src.name)
            buf.seek(0)
            if not self.engine.api.put_archive(self.id, dest_dir, buf):
                raise StepFailed(f"copying {src} into the container at {dest_dir} failed")
        return posixpath.join(dest_dir, src.name)

    def copy_out(self, src: str, dest_dir: Path) -> Path:
        docker = _docker_module()
        dest_dir.mkdir(parents=True, exist_ok=True)
        try:
            stream, _stat = self.engine.api.get_archive(self.id, src)
        except docker.errors.NotFound as exc:
            raise StepFailed(f"{src} does not exist in the container") from exc
        with tempfile.TemporaryFile() as buf:
            for chunk in stream:
                buf.write(chunk)
            buf.seek(0)
            with tarfile.open(fileobj=buf, mode="r") as tar:
                # 'data' refuses absolute paths, links out of dest_dir and device files.
                tar.extractall(dest_dir, filter="data")
        return dest_dir / posixpath.basename(src.rstrip("/"))
