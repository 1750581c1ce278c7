"""``python -m builder``: the command-line front end.

Each subcommand is its own module under ``builder.commands`` exposing ``NAME``, ``HELP``,
``DESCRIPTION``, ``add_arguments(parser)`` and ``run(args, ctx) -> int``; adding a command
(build, fetch, index, base-image, publish, clean) means adding a module name to ``COMMANDS``.

Everything printed goes through one Redactor seeded, before anything is parsed, with the
proxy URLs in the environment and on the command line, so a password never reaches the
terminal or a log -- not even in an argparse usage error. ``BuilderError`` becomes its
message and its exit code (2 for configuration, 1 for failed steps); argparse usage
errors exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TextIO

from builder import __version__, signals
from builder.config import CliOverrides, Settings, load_settings
from builder.config.load import BACKENDS, PULL_POLICIES
from builder.config.proxy import proxies_from_env
from builder.errors import BuilderError, ConfigError
from builder.pathargs import check_path_arguments, shown
from builder.redact import Redactor
from builder.signals import terminate_as_interrupt

if TYPE_CHECKING:  # resolve_from_args imports these when it runs (see there)
    from builder.backends.base import Host
    from builder.plan.resolve import Resolution

COMMANDS: tuple[str, ...] = (
    "builder.commands.plan",
    "builder.commands.render",
    "builder.commands.build",
    "builder.commands.base_image",
    "builder.commands.fetch",
    "builder.commands.index",
    "builder.commands.publish",
    "builder.commands.merge",
    "builder.commands.doctor",
    "builder.commands.clean",
    "builder.commands.cache",
    "builder.commands.update_images",
)


class Output:
    """Redacted stdout/stderr writer shared by all commands."""

    def __init__(
        self, redactor: Redactor, stdout: TextIO | None = None, stderr: TextIO | None = None
    ):
        self.redact = redactor
        self._stdout = stdout
        self._stderr = stderr

    def out(self, text: str = "") -> None:
        print(self.redact(text), file=self._stdout or sys.stdout)

    def err(self, text: str) -> None:
        print(self.redact(text), file=self._stderr or sys.stderr)


@dataclass
class Context:
    output: Output
    env: Mapping[str, str]


class _Parser(argparse.ArgumentParser):
    """ArgumentParser whose usage errors are redacted too."""

    redactor: Redactor = Redactor()

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, self.redactor(f"{self.prog}: error: {message}\n"))


# ------------------------------------------------------------------ shared options


def add_config_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "configuration (command line > environment > config file > built-in defaults)"
    )
    g.add_argument(
        "--config", metavar="FILE", help="build configuration YAML (default: configs/matrix.yaml)"
    )
    g.add_argument(
        "--jobs",
        type=int,
        metavar="N",
        help="parallel compile jobs inside a cell (env BUILDER_JOBS; config build.jobs)",
    )
    g.add_argument(
        "--offline",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="build without network: pip uses only the wheelhouse "
        "(env BUILDER_OFFLINE=1; config offline.enabled)",
    )
    g.add_argument(
        "--backend",
        choices=BACKENDS,
        default=None,
        help="where cells are built: auto (default) picks per cell and says why "
        "(env BUILDER_BACKEND; config build.backend)",
    )
    g.add_argument(
        "--base-image",
        metavar="REF",
        default=None,
        help="base image for this host's arch instead of the config's; 'local' builds or "
        "reuses the one from `python -m builder base-image` (env BUILDER_BASE_IMAGE)",
    )
    g.add_argument(
        "--network",
        metavar="NAME",
        default=None,
        help="Docker network the cell's image build and container join, e.g. an --internal "
        "network whose only way out is the proxy (docker backend; env BUILDER_NETWORK; "
        "config build.network; default: the engine's bridge)",
    )
    g.add_argument(
        "--pull",
        choices=PULL_POLICIES,
        default=None,
        help="base images: missing (default) pulls those the engine lacks, always pulls each "
        "build, never pulls; --offline means never (env BUILDER_PULL; config build.pull)",
    )
    g.add_argument(
        "--ca-bundle",
        metavar="PEM",
        help="extra CA certificates for the image trust store "
        "(env BUILDER_CA_BUNDLE; config ca_bundle)",
    )
    for key, what in (("http", "HTTP"), ("https", "HTTPS"), ("all", "any protocol")):
        g.add_argument(
            f"--{key}-proxy",
            metavar="URL",
            help=f"proxy for {what} inside the build, passed as a build argument only "
            f"(env {key.upper()}_PROXY / {key}_proxy; config proxy.{key}_proxy)",
        )
    g.add_argument(
        "--no-proxy",
        metavar="HOSTS",
        help="comma-separated hosts that bypass the proxy "
        "(env NO_PROXY / no_proxy; config proxy.no_proxy)",
    )


#: cibuildwheel's build options as flags (builder.config.buildoptions.KEYS): (metavar, help).
BUILD_OPTION_FLAGS: dict[str, tuple[str, str]] = {
    "environment": (
        "ASSIGNMENTS",
        "cibuildwheel's environment: 'NAME=value ...' set in the build "
        "environment and the verification's (test-command, repair-wheel-command), "
        "each value evaluated there by sh ($VAR, $(cmd)) (config environment; "
        "pyproject [tool.cibuildwheel] environment)",
    ),
    "environment-pass": (
        "NAMES",
        "this machine's variables passed into the build and "
        "verification environments (values never logged or recorded)",
    ),
    "before-all": ("CMD", "run once per cell's build environment before anything is built"),
    "before-build": ("CMD", "run before the build, the build environment's python first on PATH"),
    "config-settings": (
        "SETTINGS",
        "PEP 517 config settings, 'KEY=VALUE ...' (e.g. "
        "--config-settings=--build-option=--cpp_ext)",
    ),
    "build-frontend": (
        "FRONTEND",
        "pip (default: pip wheel, the build environment's pip), "
        "build (pypa/build, installed into the build environment), build[uv] "
        "(pypa/build installed by the pinned uv) or uv (uv build); "
        "'NAME; args: ARGS' adds arguments to the frontend's command",
    ),
    "repair-wheel-command": (
        "CMD",
        "replaces auditwheel repair: {wheel} and {dest_dir} placeholders",
    ),
}


def add_build_option_flags(g: argparse._ArgumentGroup) -> None:
    """cibuildwheel's build options as flags: one definition for ``build`` and ``plan``
    (each above BUILDER_*, the config file and pyproject's [tool.cibuildwheel])."""
    for key, (metavar, text) in BUILD_OPTION_FLAGS.items():
        g.add_argument(f"--{key}", metavar=metavar, default=None, help=text)


#: What each command selects when no arch, Python, torch or selector is named.
EVERY_CELL = "default: every cell of the matrix"
HOST_CELL = (
    "default: this host's one cell -- its arch and the builder's Python, with the "
    "newest torch it can build; --all for every cell"
)


def add_selection_options(
    p: argparse.ArgumentParser, selectors: bool = True, *, default: str
) -> None:
    g = p.add_argument_group(f"selection ({default})")
    g.add_argument(
        "--arch",
        metavar="A",
        help="X86 or ARM (also x86_64/aarch64); comma-separated for several (env BUILDER_ARCH)",
    )
    g.add_argument(
        "--python",
        metavar="P",
        help="Python version(s) such as 3.11 or 3.9,3.10 (env BUILDER_PYTHON); with no "
        "--torch, each resolves to the newest torch of the matrix that this host can build "
        "(else the newest), and says so",
    )
    g.add_argument(
        "--torch", metavar="T", help="torch release(s) such as 2.13.0 (env BUILDER_TORCH)"
    )
    g.add_argument(
        "--cuda",
        metavar="C",
        help="the cuda axis: cpu or CUDA version(s) such as 13.0 (env BUILDER_CUDA; "
        "docs/cuda-wheels.md)",
    )
    if selectors:
        g.add_argument(
            "selectors",
            nargs="*",
            metavar="SELECTOR",
            help="shell-style patterns on cell identifiers, e.g. 'cp311-*' or "
            "'*-manylinux_aarch64-*'; several (as arguments or space-separated in one, "
            'as cibuildwheel\'s build="cp39-* cp311-*") select the cells matching any of '
            "them; braces expand: 'cp3{11,12}-*'",
        )


def add_print_identifiers_option(g: argparse._ActionsContainer, what: str) -> None:
    """cibuildwheel's ``--print-build-identifiers``: one cell identifier a line, then exit."""
    g.add_argument(
        "--print-build-identifiers",
        action="store_true",
        help=f"print the identifier of each cell {what}, one a line, and stop",
    )


class RenamedOption(argparse.Action):
    """An option that also answers to an old name; using the old name leaves a note
    (printed by :func:`main`) naming the new one."""

    def __init__(
        self, option_strings: Sequence[str], dest: str, old: Sequence[str] = (), **kwargs: object
    ) -> None:
        self.old = tuple(old)
        super().__init__(option_strings, dest, **kwargs)  # type: ignore[arg-type]

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        if option_string in self.old:
            notes = [
                *getattr(namespace, "usage_notes", ()),
                f"{option_string} is now {self.option_strings[0]}; the old name "
                "still works for this release",
            ]
            namespace.usage_notes = notes


def overrides_from_args(args: argparse.Namespace) -> CliOverrides:
    return CliOverrides(
        config=args.config,
        arch=args.arch,
        python=args.python,
        torch=args.torch,
        cuda=getattr(args, "cuda", None),
        patterns=tuple(getattr(args, "selectors", None) or ()),
        jobs=args.jobs,
        offline=args.offline,
        bundle=getattr(args, "bundle", None),
        ca_bundle=args.ca_bundle,
        http_proxy=args.http_proxy,
        https_proxy=args.https_proxy,
        no_proxy=args.no_proxy,
        all_proxy=args.all_proxy,
        backend=args.backend,
        base_image=args.base_image,
        network=args.network,
        pull=args.pull,
    )


def load_from_args(args: argparse.Namespace, ctx: Context) -> Settings:
    """Resolve all layers; also teaches the output redactor the config file's proxies."""
    settings = load_settings(overrides_from_args(args), ctx.env)
    settings.config.proxy.redactor(ctx.output.redact)
    for note in settings.config.proxy.notes:
        ctx.output.err(f"note: {note}")
    return settings


# ------------------------------------------------------------------ entry point


def _prog_name() -> str:
    """``ampforge-build`` when run as the installed console script, else ``python -m builder``."""
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return script if script.startswith("ampforge-build") else "python -m builder"


def option_names(parser: argparse.ArgumentParser, command: str) -> dict[str, str]:
    """argparse dest -> how *command*'s option is spelled in messages (its first long option,
    or a positional argument's metavar)."""
    names: dict[str, str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            for a in action.choices[command]._actions:
                longs = [o for o in a.option_strings if o.startswith("--")]
                names[a.dest] = longs[0] if longs else str(a.metavar or a.dest)
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=_prog_name(),
        description="Build manylinux wheels of ampforge for every cell (arch x Python x torch) "
        "of a YAML matrix. Exit codes: 0 success, 1 a step failed, 2 bad configuration or usage.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module_name in COMMANDS:
        module = importlib.import_module(module_name)
        p = sub.add_parser(
            module.NAME,
            help=module.HELP,
            description=module.DESCRIPTION,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(p)
        p.set_defaults(handler=module.run)
    return parser


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    env = os.environ if env is None else env
    redactor = Redactor()
    for arg in argv:
        redactor.add_url(arg)
    for value, _name in proxies_from_env(env).values():
        redactor.add_url(value)
    _Parser.redactor = redactor
    output = Output(redactor)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors (exit 2)
        return int(exc.code or 0)
    if not getattr(args, "handler", None):
        parser.print_help(sys.stderr)
        return 2
    for note in getattr(args, "usage_notes", ()):
        output.err(f"note: {note}")
    try:
        check_path_arguments(args.command, args, option_names(parser, args.command))
    except ConfigError as exc:
        output.err(f"error: {exc.message}")
        return exc.return_code
    try:
        # SIGTERM/SIGHUP (kill, timeout, a CI cancel) clean up as Ctrl-C does (builder.signals).
        with terminate_as_interrupt():
            return int(args.handler(args, Context(output=output, env=env)))
    except BuilderError as exc:
        output.err(f"error: {exc.message}")
        return exc.return_code
    except KeyboardInterrupt as exc:
        output.err(signals.describe(exc))
        return signals.exit_code(exc)
    except BrokenPipeError:
        # `plan | head`: the reader left; not an error of ours. Silence the final flush.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except OSError as exc:
        # A file-system error no step turned into a message of its own (a path that changed
        # under the build, a permission denied deep in a step): one line naming the file, not
        # a traceback.
        where = f" ({shown(exc.filename)})" if isinstance(exc.filename, str) else ""
        output.err(f"error: {exc.strerror or exc}{where}")
        return 1


def with_build_options(settings: Settings, args: argparse.Namespace, ctx: Context) -> Settings:
    """*settings* with cibuildwheel's build options resolved over all their layers (the
    project's pyproject.toml, the config file, ``BUILDER_*``, the command line): what ``plan``
    shows and every cell is built with; and the project's whole ``[tool.cibuildwheel]``
    (build, skip, test-skip, archs, overrides, images: builder.config.cibwproject), which the
    resolver applies per cell."""
    from builder.arch import ARCHES  # noqa: PLC0415
    from builder.config.buildoptions import KEYS, over, upper_layers  # noqa: PLC0415
    from builder.config.buildoptions import from_pyproject as options_from  # noqa: PLC0415
    from builder.config.cibwproject import read_project  # noqa: PLC0415
    from builder.config.model import default_project  # noqa: PLC0415
    from builder.config.projecttest import upper_test  # noqa: PLC0415

    project = getattr(args, "project", None)
    root = Path(project).resolve() if project else default_project()
    cli = {key: getattr(args, key.replace("-", "_"), None) for key in KEYS}
    upper = upper_layers(settings.config.build_options, ctx.env, cli)
    host_arch = next((a for a, spec in ARCHES.items() if spec.machine == platform.machine()), None)
    cibw = read_project(
        root,
        host_arch=host_arch,
        upper_options=upper,
        upper_test=upper_test(
            settings.config.test,
            getattr(args, "test_requires", None),
            getattr(args, "test_command", None),
        ),
    )
    options = over(options_from(root, table=cibw.table), upper)
    from builder.config.cibwkeys import project_warnings  # noqa: PLC0415

    for line in project_warnings(root):  # a cibuildwheel key not read is named, never dropped
        ctx.output.err(f"warning: {line}")
    for line in cibw.warnings:
        ctx.output.err(f"warning: {line}")
    if cibw.engine == "podman":
        from builder.engines.podman import podman_url  # noqa: PLC0415

        file, key = cibw.engine_where
        url, how = podman_url(file=file, key=key)
        # Every DockerEngine of this process (the backends, doctor, the image steps) connects
        # where DOCKER_HOST says, as the docker CLI would.
        os.environ["DOCKER_HOST"] = url
        ctx.output.err(f"note: engine podman ({key} in {file}): {url}, from {how}")
    # The environment-pass values reach the build's processes, whose output (a before-build
    # that echoes, a test that prints its environment) goes to the cell's log and into error
    # lines: the redactor masks them there as it masks proxy passwords. The backends read
    # this process's environment, in-process callers may give another.
    names = {n for cell_options in (options, upper) for n in cell_options.environment_pass}
    names |= {n for o in cibw.table.overrides for n in _pass_names(o.layer.data)}
    for env in (ctx.env, os.environ):
        for name in sorted(names):
            if env.get(name):
                ctx.output.redact.add_secret(env[name])
    return replace(settings, config=replace(settings.config, build_options=options, cibw=cibw))


def _pass_names(data: Mapping[str, object]) -> list[str]:
    """The names an override's ``environment-pass`` passes (their values are masked too)."""
    value = data.get("environment-pass")
    words = value.split() if isinstance(value, str) else value
    return [w for w in words if isinstance(w, str)] if isinstance(words, list) else []


def resolve_from_args(
    args: argparse.Namespace,
    ctx: Context,
    *,
    everything: bool,
    settings: Settings | None = None,
    host: Host | None = None,
) -> tuple[Settings, Resolution]:
    """Settings -> the resolved records (:mod:`builder.plan.resolve`); notes and warnings go
    to stderr. *everything*: no selection means the whole matrix (else this host's cell).
    *host*: this machine's facts, when the caller probes them too (``doctor``)."""
    # Deferred: only the commands that resolve cells need the backends and the modules of the
    # tools behind them (index, publish and every --help must not depend on those).
    from builder.backends import registry  # noqa: PLC0415
    from builder.backends.base import Host  # noqa: PLC0415
    from builder.plan.resolve import resolve  # noqa: PLC0415

    settings = settings or load_from_args(args, ctx)
    host = host or Host(ctx.output.redact)
    project = getattr(args, "project", None)
    settings = with_build_options(settings, args, ctx)
    resolution = resolve(
        settings,
        host,
        registry(),
        out=Path(getattr(args, "out", "dist")),
        everything=everything,
        project=Path(project) if project else None,
    )
    for w in resolution.warnings:
        ctx.output.err(f"warning: {w}")
    for n in resolution.notes:
        ctx.output.err(f"note: {n}")
    return settings, resolution
