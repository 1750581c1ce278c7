"""cibuildwheel's build options, with its names, meanings and precedence.

Layers, lowest to highest, each replacing the one below key by key: the project's
``pyproject.toml`` ``[tool.cibuildwheel]``; the build config file (top-level keys, the same
names); the environment (``BUILDER_ENVIRONMENT``, ``BUILDER_ENVIRONMENT_PASS``,
``BUILDER_BEFORE_ALL``, ``BUILDER_BEFORE_BUILD``, ``BUILDER_CONFIG_SETTINGS``,
``BUILDER_BUILD_FRONTEND``, ``BUILDER_REPAIR_WHEEL_COMMAND``); the command line
(``--environment`` ... ``--repair-wheel-command``).

* ``environment`` -- ``NAME=value`` assignments (a string, cibuildwheel's spelling, or a table),
  applied in order in the build environment before ``before-all``, ``before-build`` and the
  build; each value is evaluated there as a shell assignment would be (``$VAR``/``${VAR}``,
  ``$(cmd)``, quotes), so it may use the environment's own variables and earlier assignments.
* ``environment-pass`` -- names of this machine's variables whose values are passed into the
  build environment. Only the names are recorded: the values never reach a log, an image, a
  record or the manifest.
* ``before-all`` -- a shell command run once per cell's build environment, before anything is
  built (cibuildwheel: once per container; here every cell has its own).
* ``before-build`` -- a shell command run before the build, with the build environment's Python
  first on ``PATH`` (``pip install`` installs into it).
* ``config-settings`` -- PEP 517 config settings for the project's build backend (``KEY=VALUE``
  words, or a table whose values may be lists), e.g. ``--build-option=--cpp_ext``.
* ``build-frontend`` -- cibuildwheel's names: ``pip`` (``pip wheel --no-build-isolation``: the
  build environment's own pip, whose version the cell's log records), ``build`` (pypa/build,
  ``python -m build --wheel --no-isolation``: installed into the build environment first; it
  calls the backend itself, no pip involved in the build), ``build[uv]`` (pypa/build with uv as
  its installer: the pinned uv (configs/uv.txt) installed first, then pypa/build by ``uv pip
  install``) or ``uv`` (``uv build --wheel --no-build-isolation`` with the pinned uv). Each may
  carry extra arguments for the frontend's command, cibuildwheel's ``NAME; args: ARGS`` string
  (shell words) or its table ``{name = NAME, args = [...]}``, e.g. ``build; args:
  --skip-dependency-check``. The builder never isolates a build (torch must be in the build's
  environment), so ``build[uv]`` gets no ``--installer=uv``: uv installs the build's tools.
* ``repair-wheel-command`` -- replaces the builder's ``auditwheel repair`` (``{wheel}``: the
  wheel, ``{dest_dir}``: the folder the repaired wheel must be written to); verification
  checks its result as it checks the builder's own.

Commands take the placeholders ``{project}`` and ``{package}`` (the project's copy in the
build environment), as test-command does.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from builder.config.cibwtable import CibwTable, read_table
from builder.config.projecttest import PLACEHOLDERS, parse_command
from builder.config.uvpin import uv_pin
from builder.config.yamlfile import brief
from builder.errors import ConfigError

KEYS: tuple[str, ...] = (
    "environment",
    "environment-pass",
    "before-all",
    "before-build",
    "config-settings",
    "build-frontend",
    "repair-wheel-command",
)
FRONTENDS: tuple[str, ...] = ("pip", "build", "build[uv]", "uv")
#: The frontends that run the pinned uv (configs/uv.txt) in the build environment.
UV_FRONTENDS: tuple[str, ...] = ("build[uv]", "uv")
#: cibuildwheel's spellings of a frontend, for messages.
FRONTEND_FORMS = (
    "one of pip, build, build[uv], uv, optionally with arguments for the "
    "frontend: 'NAME; args: ARGS' (e.g. 'build; args: --skip-dependency-check') "
    "or a table {name = NAME, args = [ARG, ...]}"
)
#: The environment variable of each key (the builder's namespace, as its other settings).
ENV: dict[str, str] = {k: "BUILDER_" + k.upper().replace("-", "_") for k in KEYS}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: One shell word: quoted parts, escapes and plain characters up to unquoted whitespace.
_WORD = re.compile(r"""(?:'[^']*'|"(?:[^"\\]|\\.)*"|\\.|\$\([^)]*\)|[^\s'"\\])+""")
REPAIR_PLACEHOLDERS: tuple[str, ...] = ("wheel", "dest_dir")


@dataclass(frozen=True)
class CibwOptions:
    """The resolved options (defaults: none of them, the pip frontend)."""

    environment: tuple[tuple[str, str], ...] = ()  # (name, value as written), in order
    environment_pass: tuple[str, ...] = ()
    before_all: Optional[str] = None
    before_build: Optional[str] = None
    config_settings: tuple[tuple[str, str], ...] = ()
    build_frontend: str = "pip"
    #: The ``; args:`` words, added to the frontend's command after the builder's own.
    build_frontend_args: tuple[str, ...] = ()
    repair_wheel_command: Optional[str] = None
    #: Where each key's value came from, e.g. {"environment": "command line --environment"}.
    origins: Mapping[str, str] = field(default_factory=dict)

    def key(self) -> dict[str, Any]:
        """The part of a cell's input key: everything that shapes the wheel, the passed
        variables by name only."""
        return {
            "environment": [list(a) for a in self.environment],
            "environment_pass": list(self.environment_pass),
            "before_all": self.before_all,
            "before_build": self.before_build,
            "config_settings": [list(s) for s in self.config_settings],
            "build_frontend": self.build_frontend,
            "repair_wheel_command": self.repair_wheel_command,
            # Only when set: the keys of builds without them stay what they were.
            **(
                {"build_frontend_args": list(self.build_frontend_args)}
                if self.build_frontend_args
                else {}
            ),
            # The pin with its hashes: other bytes under the same version rebuild too.
            **({"uv": uv_pin().requirements_line()} if self.uses_uv else {}),
        }

    @property
    def uses_uv(self) -> bool:
        return self.build_frontend in UV_FRONTENDS

    def frontend_requirements(self) -> list[str]:
        """What the frontend installs into the build environment besides the cell's build
        requirements (the offline pre-flight checks a wheelhouse for them, ``fetch``
        downloads them): pypa/build, the pinned uv."""
        return ([uv_pin().requirement] if self.uses_uv else []) + (
            ["build"] if self.build_frontend in ("build", "build[uv]") else []
        )

    @property
    def frontend_spec(self) -> str:
        """The frontend as cibuildwheel spells it: ``build[uv]; args: --no-isolation``."""
        if not self.build_frontend_args:
            return self.build_frontend
        return f"{self.build_frontend}; args: {shlex.join(self.build_frontend_args)}"

    def record(self) -> dict[str, Any]:
        """What ``plan`` and the manifest show: the values and their sources."""
        return {**self.key(), "sources": dict(sorted(self.origins.items()))}

    def describe(self) -> list[str]:
        """One line per option set, with its source (passed variables by name)."""
        values = {**self.key(), "build_frontend": self.frontend_spec}
        return [
            f"{key}: {values[key.replace('-', '_')]!r} ({self.origins[key]})"
            for key in KEYS
            if key in self.origins
        ]

    def passed(self, env: Mapping[str, str]) -> dict[str, str]:
        """The ``environment-pass`` variables *env* has (a name it lacks is not passed)."""
        return {name: env[name] for name in self.environment_pass if name in env}


NO_OPTIONS = CibwOptions()


def parse_environment(value: Any) -> tuple[tuple[str, str], ...]:
    """``'A=1 B="$A x"'`` or ``{"A": "1"}`` -> ``(("A", "1"), ("B", '"$A x"'))``: the values
    as written, evaluated later in the build environment; raises ValueError."""
    if isinstance(value, Mapping):
        out = []
        for name, raw in value.items():
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise ValueError(f"{brief(name)} is not a variable name; expected e.g. CFLAGS")
            if not isinstance(raw, (str, int, float)) or isinstance(raw, bool):
                raise ValueError(f"{name}: {brief(raw)} is not a value; expected a string")
            out.append((name, shlex.quote(str(raw)) if isinstance(raw, (int, float)) else raw))
        return tuple(out)
    if not isinstance(value, str):
        raise ValueError(
            f"{brief(value)} is not an environment; expected 'NAME=value NAME2=value' "
            "or a table of NAME = value"
        )
    out = []
    rest = value.strip()
    while rest:
        found = re.match(r"([A-Za-z_][A-Za-z0-9_]*)=", rest)
        if found is None:
            raise ValueError(
                f"expected NAME=value at {brief(rest[:40])} in {brief(value)}; e.g. "
                "'PATH=\"$PATH:/opt/bin\" FORCE_CUDA=0'"
            )
        rest = rest[found.end() :]
        word = _WORD.match(rest)
        raw = word.group(0) if word else ""
        out.append((found.group(1), raw))
        rest = rest[len(raw) :]
        if rest and not rest[0].isspace():
            raise ValueError(
                f"unbalanced quote or stray character after {found.group(1)}= "
                f"in {brief(value)}; expected NAME=value words, quotes closed"
            )
        rest = rest.lstrip()
    return tuple(out)


def parse_names(value: Any) -> tuple[str, ...]:
    items = value.split() if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise ValueError(
            f"{brief(value)} is not a list of variable names; expected e.g. "
            "'HF_TOKEN PIP_INDEX_URL' or a list"
        )
    for name in items:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ValueError(f"{brief(name)} is not a variable name; expected e.g. HF_TOKEN")
    return tuple(items)


def parse_config_settings(value: Any) -> tuple[tuple[str, str], ...]:
    """``'KEY=VALUE KEY2=VALUE'`` or a table (list values repeat the key); raises ValueError."""
    pairs: list[tuple[str, str]] = []
    if isinstance(value, Mapping):
        for key, raw in value.items():
            for one in raw if isinstance(raw, (list, tuple)) else [raw]:
                if not isinstance(one, (str, int, float)) or isinstance(one, bool):
                    raise ValueError(f"{key}: {brief(one)} is not a value; expected a string")
                pairs.append((str(key), str(one)))
    elif isinstance(value, str):
        try:
            words = shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"{brief(value)}: {exc}") from None
        for word in words:
            key, eq, one = word.partition("=")
            if not eq or not key:
                raise ValueError(
                    f"{brief(word)} is not KEY=VALUE; expected e.g. '--build-option=--cpp_ext'"
                )
            pairs.append((key, one))
    else:
        raise ValueError(
            f"{brief(value)} is not config settings; expected 'KEY=VALUE ...' or a table"
        )
    if not pairs:
        raise ValueError("no settings; expected 'KEY=VALUE ...' (leave the key out for none)")
    return tuple(pairs)


def _split_semicolons(text: str) -> list[str]:
    """*text* split at the ``;`` outside quotes (cibuildwheel's option separator)."""
    parts, current, quote = [], "", ""
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == ";":
            parts.append(current)
            current = ""
            continue
        current += char
    return [*parts, current]


def parse_frontend(value: Any) -> tuple[str, tuple[str, ...]]:
    """cibuildwheel's ``build-frontend``: ``NAME``, ``NAME; args: ARGS`` or a table
    ``{name = NAME, args = [...]}`` -> (name, args); raises ValueError naming the forms."""
    if isinstance(value, Mapping):
        unknown = sorted(str(k) for k in value if k not in ("name", "args"))
        if unknown or "name" not in value:
            what = f"unknown key {', '.join(unknown)}" if unknown else "no name"
            raise ValueError(f"{brief(dict(value))}: {what}; expected {FRONTEND_FORMS}")
        name, raw = value["name"], value.get("args", [])
        if isinstance(raw, str):
            raw = _shell_words(raw, value)
        if not isinstance(raw, (list, tuple)) or not all(isinstance(a, str) for a in raw):
            raise ValueError(
                f"args {brief(raw)} is not a list of strings; expected {FRONTEND_FORMS}"
            )
        args = tuple(raw)
    elif isinstance(value, str):
        first, *rest = _split_semicolons(value)
        name, words = first.strip(), []
        for part in rest:
            key, colon, text = part.partition(":")
            if not colon or key.strip() != "args":
                raise ValueError(
                    f"{brief(part.strip())} in {brief(value)} is not "
                    f"'args: ARGS'; expected {FRONTEND_FORMS}"
                )
            words += _shell_words(text, value)
        args = tuple(words)
    else:
        raise ValueError(f"{brief(value)} is not a build frontend; expected {FRONTEND_FORMS}")
    if name not in FRONTENDS:
        raise ValueError(f"{brief(name)} is not a build frontend; expected {FRONTEND_FORMS}")
    return str(name), args


def _shell_words(text: str, whole: Any) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"args in {brief(whole)}: {exc}; expected {FRONTEND_FORMS}") from None


def parse_repair(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        value = " && ".join(parse_repair(v) for v in value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(
            f"{brief(value)} is not a command; expected e.g. 'auditwheel repair "
            "--exclude libtorch.so -w {dest_dir} {wheel}'"
        )
    unknown = sorted(
        {m.group(1) for m in re.finditer(r"\{([A-Za-z_]\w*)\}", value)}
        - set(REPAIR_PLACEHOLDERS)
        - set(PLACEHOLDERS)
    )
    if unknown:
        raise ValueError(
            f"unknown placeholder {', '.join('{' + n + '}' for n in unknown)} in "
            f"{brief(value)}; expected {{wheel}} and {{dest_dir}}"
        )
    if "{wheel}" not in value or "{dest_dir}" not in value:
        raise ValueError(
            f"{brief(value)} does not name both placeholders; expected {{wheel}} (the "
            "wheel to repair) and {dest_dir} (where the repaired wheel goes)"
        )
    return value.strip()


_PARSERS = {
    "environment": parse_environment,
    "environment-pass": parse_names,
    "before-all": parse_command,
    "before-build": parse_command,
    "config-settings": parse_config_settings,
    "build-frontend": parse_frontend,
    "repair-wheel-command": parse_repair,
}


def layer(
    data: Mapping[str, Any],
    *,
    origin: str,
    file: Optional[str] = None,
    key_prefix: str = "",
    lines: Optional[Mapping[str, Optional[int]]] = None,
    base: CibwOptions = NO_OPTIONS,
    name: Optional[str] = None,
    inherit: Optional[Mapping[str, str]] = None,
) -> CibwOptions:
    """*base* with the keys *data* sets (absent or null: not set here) replaced; ConfigError
    (exit 2) naming the file, line and key of a bad value (*name*: the key's name in
    messages, when it is a variable or a flag). *inherit*: key -> ``append``/``prepend``
    (an override's ``inherit``): the value is added to *base*'s instead of replacing it."""
    out = base
    for key in KEYS:
        if data.get(key) is None:
            continue
        where = name or key_prefix + key
        try:
            parsed = _PARSERS[key](data[key])
        except ValueError as exc:
            raise ConfigError(str(exc), file=file, line=(lines or {}).get(key), key=where) from None
        attr, source = key.replace("-", "_"), origin
        rule = (inherit or {}).get(key)
        if rule is not None and key in out.origins:
            if key == "build-frontend":  # one value: merge says why it cannot be combined
                merge(out.frontend_spec, data[key], rule, file=file, key=where)
            parsed = merge(getattr(out, attr), parsed, rule, file=file, key=where)
            source = f"{out.origins[key]} {rule}ed by {origin}"
        # (Any: each key's parser returns its own field's type)
        values: dict[str, Any] = (
            {"build_frontend": parsed[0], "build_frontend_args": parsed[1]}
            if key == "build-frontend"
            else {attr: parsed}
        )
        out = replace(out, **values, origins={**out.origins, key: source})
    return out


def merge(before: Any, after: Any, rule: str, *, file: Optional[str], key: str) -> Any:
    """cibuildwheel's ``inherit``: *after* appended to (or prepended before) *before*:
    commands joined with ``&&``, lists and assignments concatenated (a later assignment
    wins when the shell evaluates them); ConfigError for a key with one value (a frontend)."""
    first, second = (before, after) if rule == "append" else (after, before)
    frontend = key.rsplit(".", 1)[-1] in ("build-frontend",)
    if isinstance(first, tuple) and not frontend:
        return first + second
    if isinstance(first, str) and not frontend:
        return f"{first} && {second}"
    raise ConfigError(
        f"inherit = {rule!r}: {brief(before)} and {brief(after)} cannot be "
        "combined; expected inherit only on commands, lists and tables",
        file=file,
        key=key,
    )


def from_pyproject(
    project: Path, identifiers: Optional[Sequence[str]] = None, table: Optional[CibwTable] = None
) -> CibwOptions:
    """The project's ``[tool.cibuildwheel]`` build options, ``[tool.cibuildwheel.linux]``'s
    replacing them key by key as in cibuildwheel, then the overrides that select the cell
    named *identifiers* (none: the global value; none without a pyproject.toml)."""
    table = table if table is not None else read_table(project)
    out = NO_OPTIONS
    for lay in table.layers(identifiers):
        out = layer(
            lay.data,
            origin=lay.origin,
            file=table.file,
            key_prefix=lay.key_prefix,
            base=out,
            inherit=lay.inherit,
        )
    return out


def upper_layers(
    config_layer: CibwOptions, env: Mapping[str, str], cli: Mapping[str, Optional[str]]
) -> CibwOptions:
    """The layers above the project's: config file < ``BUILDER_*`` < command line (*cli*:
    key -> value or None)."""
    out = config_layer
    for key, var in ENV.items():
        if env.get(var):
            out = layer({key: env[var]}, origin=f"environment {var}", name=var, base=out)
    for key in KEYS:
        if cli.get(key) is not None:
            out = layer({key: cli[key]}, origin=f"command line --{key}", name=f"--{key}", base=out)
    return out


def over(base: CibwOptions, upper: CibwOptions) -> CibwOptions:
    """*base* with every key *upper* sets replaced by *upper*'s."""
    out = base
    for key in KEYS:
        if key in upper.origins:
            attrs = [key.replace("-", "_")]
            if key == "build-frontend":
                attrs.append("build_frontend_args")
            out = replace(
                out,
                **{a: getattr(upper, a) for a in attrs},
                origins={**out.origins, key: upper.origins[key]},
            )
    return out


def resolve_build_options(
    project: Path,
    config_layer: CibwOptions,
    env: Mapping[str, str],
    cli: Mapping[str, Optional[str]],
    identifiers: Optional[Sequence[str]] = None,
) -> CibwOptions:
    """pyproject < config file < ``BUILDER_*`` < command line (*cli*: key -> value or None);
    *identifiers*: the cell whose overrides apply (none: the global options)."""
    return over(from_pyproject(project, identifiers), upper_layers(config_layer, env, cli))
