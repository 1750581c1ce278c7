"""SIGTERM and SIGHUP end a build as Ctrl-C does, and a SIGKILLed builder's container does not
outlive the next build (or ``python -m builder clean``).

Each signal is sent for real to a builder subprocess whose signal dispositions are reset to a
terminal's defaults (a test runner started in the background passes SIGINT ignored; nohup passes
SIGHUP ignored), mid-build: while pip installs torch or builds the wheel inside the cell's
container, or inside the host session. The Ctrl-C (SIGINT) case is in
tests/builder/e2e/test_pipeline_failures.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.enginelib import docker_engine, wheelhouse_cp311
from helpers.pipelinelib import (
    CELL,
    blocking_project,
    build_argv,
    builder_env,
    dist_state,
    run_build,
    run_subprocess,
    seed_dist,
    start_blocked_docker_build,
    wait_until_building,
)

from builder.engines.docker import CONTAINER_LABEL
from builder.engines.owner import (
    BOOT_LABEL,
    HOST_LABEL,
    PID_LABEL,
    PID_START_LABEL,
    boot_id,
    machine_id,
    owner_labels,
    process_start,
)
from builder.images.base_image import build_base_image
from builder.signals import Terminated, exit_code

# -- the handlers, in a child process (no build) ----------------------------------------------

_CHILD = textwrap.dedent("""\
    import os, signal, sys, time
    from builder.signals import Terminated, terminate_as_interrupt
    sig = getattr(signal, sys.argv[1])
    try:
        with terminate_as_interrupt():
            os.kill(os.getpid(), sig)
            time.sleep(5)
        print("no exception")
    except Terminated as exc:
        print("terminated", exc.name, exc.exit_code, isinstance(exc, KeyboardInterrupt))
    print("after", signal.getsignal(sig) == signal.SIG_DFL)
    """)


def _child(sig: str, ignored: bool = False) -> subprocess.CompletedProcess:
    def dispositions() -> None:
        signal.signal(getattr(signal, sig), signal.SIG_IGN if ignored else signal.SIG_DFL)

    return subprocess.run(
        [sys.executable, "-c", _CHILD, sig],
        capture_output=True,
        text=True,
        env=builder_env(),
        preexec_fn=dispositions,
        timeout=60,
    )


@pytest.mark.parametrize(("sig", "code"), [("SIGTERM", 143), ("SIGHUP", 129)])
def test_term_and_hup_raise_a_keyboard_interrupt_with_128_plus_the_signal(
    sig: str, code: int
) -> None:
    r = _child(sig)
    assert r.stdout.splitlines() == [f"terminated {sig} {code} True", "after True"], r.stderr
    assert exit_code(Terminated(getattr(signal, sig))) == code
    assert exit_code(KeyboardInterrupt()) == 130


def test_a_signal_the_parent_ignored_stays_ignored() -> None:
    """nohup's ignored SIGHUP is a decision of the user's: the build goes on."""
    r = _child("SIGHUP", ignored=True)
    assert r.stdout.splitlines() == ["no exception", "after False"], r.stderr


# -- real builds ------------------------------------------------------------------------------


def _no_leftovers(tmp_path: Path, before: dict[str, bytes]) -> None:
    assert dist_state(tmp_path / "dist") == before
    assert not list((tmp_path / "work" / "stage").glob("*")), "staging folder left behind"


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_signal_mid_build_removes_the_container_and_leaves_dist_intact(
    tmp_path: Path, sig: signal.Signals
) -> None:
    engine = docker_engine()
    base = build_base_image(engine)
    before = seed_dist(tmp_path / "dist")
    name = f"{sig.name.lower()}-tinyext"
    proc, seen = start_blocked_docker_build(engine, tmp_path, name, base.tag)
    try:
        # At once: pip is at work in the container now (a condition, not a delay).
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, err
    assert f"terminated by {sig.name}" in err and "Traceback" not in err, err
    left = {c["Id"] for c in engine.api.containers(all=True)}
    assert not (seen & left), "the build's container was left behind"
    _no_leftovers(tmp_path, before)


def _processes_under(folder: Path) -> list[str]:
    """Command lines of processes that run in or name *folder* (the host session's tree)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if str(folder) in cmd or cwd.startswith(str(folder)):
            found.append(f"{entry.name}: {cmd[:200]}")
    return found


@pytest.mark.slow
def test_sigterm_mid_host_build_ends_the_host_session(tmp_path: Path) -> None:
    """The host backend's pip (its own process group) is killed with the builder; its session
    folder is removed."""
    before = seed_dist(tmp_path / "dist")
    project = blocking_project(tmp_path / "term-host-tinyext")
    argv = build_argv(
        tmp_path,
        "--backend",
        "host",
        "--project",
        str(project),
        "--wheelhouse",
        str(wheelhouse_cp311()),
    )
    proc = run_subprocess(argv, tmp_path)
    stage = tmp_path / "work" / "stage"
    try:
        wait_until_building(
            proc, tmp_path / "work" / "logs" / f"{CELL}.log", lambda: bool(_processes_under(stage))
        )
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert "terminated by SIGTERM" in err and "Traceback" not in err, err
    assert not _processes_under(tmp_path / "work"), "the host session's processes survived"
    _no_leftovers(tmp_path, before)


@pytest.mark.docker
@pytest.mark.slow
def test_a_killed_builders_container_is_removed_by_clean_and_by_the_next_build(
    tmp_path: Path,
) -> None:
    """SIGKILL leaves the container (nothing can run); ``clean --dry-run`` names it, the next
    ``build`` removes it at start. Containers of a live builder (this test process), of another
    machine, or without owner labels are never touched."""
    engine = docker_engine()
    base = build_base_image(engine)
    proc, seen = start_blocked_docker_build(engine, tmp_path, "kill-tinyext", base.tag)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    (killed,) = seen
    others: dict[str, str] = {}
    try:
        assert engine.api.inspect_container(killed)["State"]["Running"], (
            "SIGKILL cannot clean up: the container must still be there for this test to mean "
            "anything"
        )
        labels = engine.api.inspect_container(killed)["Config"]["Labels"]
        assert labels[PID_LABEL] == str(proc.pid) and labels[HOST_LABEL] == machine_id()
        assert labels[BOOT_LABEL] == boot_id() and labels[PID_START_LABEL]
        # Containers that must stay: a live owner (this process), another machine's, an older
        # builder's without owner labels.
        alive = {CONTAINER_LABEL: "1", **owner_labels()}
        assert alive[PID_START_LABEL] == process_start(os.getpid())
        foreign = {**alive, PID_LABEL: str(proc.pid), HOST_LABEL: "another-machine"}
        for kind, lab in (
            ("alive", alive),
            ("foreign", foreign),
            ("unlabelled", {CONTAINER_LABEL: "1"}),
        ):
            made = engine.api.create_container(
                base.tag,
                command=["sleep", "infinity"],
                labels={**lab, f"{CONTAINER_LABEL}.test": kind},
            )
            others[kind] = str(made["Id"])

        dry = subprocess.run(
            [sys.executable, "-m", "builder", "clean", "--dry-run"],
            capture_output=True,
            text=True,
            env=builder_env(),
            timeout=120,
        )
        assert dry.returncode == 0, dry.stderr
        assert f"would remove {killed[:12]} " in dry.stdout, dry.stdout
        assert f"builder pid {proc.pid} is gone" in dry.stdout
        for kind, cid in others.items():
            assert f"would remove {cid[:12]}" not in dry.stdout, kind
            assert f"kept {cid[:12]}" in dry.stdout, (kind, dry.stdout)
        assert engine.api.inspect_container(killed)["State"]["Running"]  # dry run: untouched

        # The next build removes it before anything else (here it then fails on a base image
        # that does not exist: exit 1, after the cleanup).
        (tmp_path / "next").mkdir()
        r = run_build(
            tmp_path / "next",
            "--backend",
            "docker",
            "--base-image",
            "ampforge-test/no-such-image:1",
            "--project",
            str(tmp_path / "kill-tinyext"),
        )
        assert r.rc == 1, r.err
        assert (
            f"removed container {killed[:12]} (cell {CELL}) left behind: builder pid "
            f"{proc.pid} is gone"
        ) in r.err, r.err
        ids = {c["Id"] for c in engine.api.containers(all=True)}
        assert killed not in ids
        assert set(others.values()) <= ids, "a container that was not stale was removed"
    finally:
        for cid in [killed, *others.values()]:
            try:
                engine.api.remove_container(cid, force=True, v=True)
            except Exception:  # noqa: BLE001 - already removed (the point of the test)
                pass
