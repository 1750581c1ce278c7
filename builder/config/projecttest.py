"""A project's own tests as verification: cibuildwheel's ``test-requires`` and ``test-command``.

Three layers, lowest to highest, each replacing the one before it key by key:

1. the project's ``pyproject.toml``, ``[tool.cibuildwheel]`` (where a project that already uses
   cibuildwheel keeps them; this repository's ``amp`` declares its smoke test there);
2. the build config file, top-level keys ``test-requires`` and ``test-command``;
3. the command line, ``--test-requires`` and ``--test-command``.

Meaning as in cibuildwheel: ``test-requires`` are installed into the verification environment
next to the wheel and the cell's torch; ``test-command`` then runs there through ``sh -c``, from
an empty temporary folder (so the installed wheel is imported, never the source tree), with that
environment's ``python`` first on ``PATH``. A non-zero exit fails the cell. Placeholders:
``{project}`` is the project's root and ``{package}`` the package that was built, both as the
verification environment sees them; the builder copies one folder (``--project``), so both name
its copy there. A list of commands (TOML or YAML) runs as one, joined with `` && ``.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from packaging.requirements import InvalidRequirement, Requirement

from builder.config import pyproject as pp
from builder.config.cibwtable import read_table
from builder.config.yamlfile import brief, clip
from builder.errors import ConfigError

PLACEHOLDERS: tuple[str, ...] = ("project", "package")
#: ``{name}`` is a placeholder; other braces (``{}``, ``{a,b}``, ``${VAR}``'s ``{VAR}`` is one,
#: so write ``$VAR``) are left to the shell.
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: The config file's and pyproject's key names (cibuildwheel's spelling).
REQUIRES_KEY = "test-requires"
COMMAND_KEY = "test-command"
_EXAMPLE = "e.g. 'python -m pytest {project}/tests'"


#: cibuildwheel's other test keys (read from the project's pyproject.toml only).
BEFORE_KEY = "before-test"
EXTRAS_KEY = "test-extras"
SOURCES_KEY = "test-sources"
GROUPS_KEY = "test-groups"


@dataclass(frozen=True)
class ProjectTest:
    """What verification runs beyond importing the wheel's modules (nothing by default)."""

    requires: tuple[str, ...] = ()
    command: Optional[str] = None
    #: Where each value came from (for messages), e.g. "command line --test-command".
    requires_origin: str = ""
    command_origin: str = ""
    #: before-test: run in the verification venv before the wheel is installed.
    before: Optional[str] = None
    #: test-extras: the wheel is installed as ``wheel[extra,...]``.
    extras: tuple[str, ...] = ()
    #: test-sources: project-relative paths copied into the test's working folder.
    sources: tuple[str, ...] = ()
    #: test-groups, and the requirements they stand for (resolved here, from the project's
    #: [dependency-groups]: builder.config.depgroups).
    groups: tuple[str, ...] = ()
    group_requires: tuple[str, ...] = ()
    #: The origin of before-test, test-extras, test-sources, test-groups (key -> origin).
    origins: Mapping[str, str] = field(default_factory=dict)
    #: Why this cell's test is not run (test-skip), "" when it is.
    skipped: str = ""

    @property
    def enabled(self) -> bool:
        return self.command is not None and not self.skipped

    @property
    def install(self) -> tuple[str, ...]:
        """Everything installed for the test: test-requires, then the groups'."""
        return tuple(dict.fromkeys((*self.requires, *self.group_requires)))

    def key(self) -> dict[str, Any]:
        """The part of a cell's input key: another test must run again on the same wheel (the
        keys cibuildwheel's other test options add only when set, so a cell without them
        keeps the key it had)."""
        out: dict[str, Any] = {"requires": list(self.requires), "command": self.command}
        extra = {
            "before": self.before,
            "extras": list(self.extras),
            "sources": list(self.sources),
            "groups": list(self.groups),
            "group_requires": list(self.group_requires),
            "skipped": bool(self.skipped),
        }
        out.update({k: v for k, v in extra.items() if v})
        return out

    def record(self) -> dict[str, Any]:
        """What ``plan`` and the manifest show of the cell's test, with the sources."""
        sources = {
            k: v
            for k, v in ((REQUIRES_KEY, self.requires_origin), (COMMAND_KEY, self.command_origin))
            if v
        }
        return {
            "command": self.command,
            "requires": list(self.requires),
            "before_test": self.before,
            "extras": list(self.extras),
            "test_sources": list(self.sources),
            "groups": list(self.groups),
            "group_requires": list(self.group_requires),
            "run": self.enabled,
            "skipped": self.skipped or None,
            "sources": dict(sorted({**sources, **self.origins}.items())),
        }

    def command_for(self, project: str) -> str:
        """The command with ``{project}``/``{package}`` naming *project* (a path inside the
        verification environment), quoted for ``sh``."""
        assert self.command is not None
        return expand(self.command, project=project, package=project)

    def before_for(self, project: str) -> Optional[str]:
        """before-test with its placeholders naming *project*, as :meth:`command_for`."""
        return expand(self.before, project=project, package=project) if self.before else None

    def describe(self) -> str:
        if self.command is None:
            return "none (the wheel's modules are imported)"
        parts = [f"{self.command!r} ({self.command_origin})"]
        if self.requires:
            parts.append(f"test-requires {' '.join(self.requires)}")
        for key, value in (
            (BEFORE_KEY, self.before),
            (EXTRAS_KEY, ",".join(self.extras)),
            (SOURCES_KEY, " ".join(self.sources)),
            (GROUPS_KEY, " ".join(self.groups)),
        ):
            if value:
                parts.append(f"{key} {value!r} ({self.origins.get(key, '?')})")
        if self.skipped:
            parts.append(f"not run: {self.skipped}")
        return "; ".join(parts)


#: No test beyond the import of the wheel's modules (the default).
NO_TEST = ProjectTest()


def parse_command(value: Any) -> str:
    """A shell command (or a list of them, joined with ``&&``); raises ValueError."""
    if isinstance(value, (list, tuple)):
        if not value or not all(isinstance(v, str) for v in value):
            raise ValueError(
                f"{brief(value)} is not a command or a list of commands; expected a "
                f"non-empty string, {_EXAMPLE}"
            )
        value = " && ".join(parse_command(v) for v in value)
    if not isinstance(value, str):
        raise ValueError(f"{brief(value)} is not a command; expected a string, {_EXAMPLE}")
    if not value.strip():
        raise ValueError(
            f"empty command; expected a shell command, {_EXAMPLE} (leave the key out for no test)"
        )
    unknown = sorted({m.group(1) for m in _PLACEHOLDER.finditer(value)} - set(PLACEHOLDERS))
    if unknown:
        names = ", ".join("{" + n + "}" for n in unknown)
        raise ValueError(
            f"unknown placeholder {names} in {brief(value)}; expected only "
            f"{{project}} (the project's root) and {{package}} (the package built)"
        )
    return value.strip()


def parse_requires(value: Any) -> tuple[str, ...]:
    """Requirements: a space-separated string (as cibuildwheel's) or a list; raises ValueError."""
    if isinstance(value, str):
        if not value.strip():
            raise ValueError(
                "empty value; expected requirements such as 'pytest numpy>=1.26' "
                "(leave the key out for none)"
            )
        items: Sequence[Any] = value.split()
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        raise ValueError(
            f"{brief(value)} is not a list of requirements; expected e.g. ['pytest', 'numpy>=1.26']"
        )
    out = []
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise ValueError(f"{brief(item)} is not a requirement; expected e.g. 'pytest>=8'")
        try:
            Requirement(item)
        except InvalidRequirement as exc:
            raise ValueError(
                f"{brief(item)} is not a requirement ({clip(exc)}); expected e.g. 'pytest>=8'"
            ) from None
        out.append(item.strip())
    return tuple(out)


def expand(command: str, *, project: str, package: str) -> str:
    """``{project}`` and ``{package}`` replaced by shell-quoted paths (unchanged when the path
    needs no quoting); any other text, braces included, as written."""
    values = {"project": shlex.quote(project), "package": shlex.quote(package)}
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), command)


_EXTRA = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")


def parse_extras(value: Any) -> tuple[str, ...]:
    """``"test,cuda"`` (cibuildwheel's comma-separated string) or a list; raises ValueError."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items:
        raise ValueError(
            f"{brief(value)} is not a list of extras; expected e.g. 'test' or ['test', 'cuda']"
        )
    out = []
    for item in items:
        if not isinstance(item, str) or not _EXTRA.fullmatch(item.strip()):
            raise ValueError(f"{brief(item)} is not an extra's name; expected e.g. 'test'")
        out.append(item.strip())
    return tuple(out)


def _words(value: Any, what: str, example: str) -> tuple[str, ...]:
    items = value.split() if isinstance(value, str) else value
    if (
        not isinstance(items, (list, tuple))
        or not items
        or not all(isinstance(i, str) and i.strip() for i in items)
    ):
        raise ValueError(f"{brief(value)} is not a list of {what}; expected e.g. {example}")
    return tuple(i.strip() for i in items)


def parse_sources(value: Any) -> tuple[str, ...]:
    """Project-relative paths (space-separated or a list); raises ValueError for one that is
    absolute or climbs out of the project."""
    paths = _words(value, "paths", "'tests pytest.ini' or ['tests']")
    for path in paths:
        if Path(path).is_absolute() or ".." in Path(path).parts:
            raise ValueError(
                f"{brief(path)} is not inside the project; expected a path "
                "relative to its root, e.g. 'tests'"
            )
    return paths


def parse_groups(value: Any) -> tuple[str, ...]:
    return _words(value, "dependency groups", "'test' or ['test', 'typing']")


#: key -> (ProjectTest attribute, parser); inherit's append/prepend combines two values (layer).
#: (Any: each parser returns its own attribute's type.)
_FIELDS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    REQUIRES_KEY: ("requires", parse_requires),
    COMMAND_KEY: ("command", parse_command),
    BEFORE_KEY: ("before", parse_command),
    EXTRAS_KEY: ("extras", parse_extras),
    SOURCES_KEY: ("sources", parse_sources),
    GROUPS_KEY: ("groups", parse_groups),
}
#: The keys a build config file and the command line set (the others: pyproject.toml only).
CONFIG_KEYS = (REQUIRES_KEY, COMMAND_KEY)


def origin_of(test: ProjectTest, key: str) -> str:
    """Where *test*'s value of *key* came from ("" when not set)."""
    if key == REQUIRES_KEY:
        return test.requires_origin
    if key == COMMAND_KEY:
        return test.command_origin if test.command is not None else ""
    return test.origins.get(key, "")


def _set(test: ProjectTest, key: str, value: Any, origin: str) -> ProjectTest:
    attr = _FIELDS[key][0]
    if key == REQUIRES_KEY:
        return replace(test, requires=value, requires_origin=origin)
    if key == COMMAND_KEY:
        return replace(test, command=value, command_origin=origin)
    return replace(test, **{attr: value}, origins={**test.origins, key: origin})


def from_pyproject(
    project: Path, identifiers: Optional[Sequence[str]] = None, table: Any = None
) -> ProjectTest:
    """The project's ``[tool.cibuildwheel]`` test keys, ``[tool.cibuildwheel.linux]``'s over
    them, then the overrides that select the cell named *identifiers* (none when it has no
    pyproject.toml); test-sources checked against the project, test-groups resolved."""
    table = table if table is not None else read_table(project)
    out = NO_TEST
    for lay in table.layers(identifiers):
        out = layer(
            lay.data,
            origin=lay.origin,
            file=table.file,
            key_prefix=lay.key_prefix,
            base=out,
            inherit=lay.inherit,
        )
    for path in out.sources:
        found = project / path
        if not found.exists() or not is_inside(project, found):
            raise ConfigError(
                f"{path!r} (set in {out.origins.get(SOURCES_KEY)}) is not in "
                f"the project {project}; expected a path relative to its root "
                "that the tests need (it is copied into their working folder)",
                file=table.file,
                key=SOURCES_KEY,
            )
    if out.groups:
        from builder.config.depgroups import resolve_groups  # noqa: PLC0415

        doc = pp.load_pyproject(project / "pyproject.toml", table.file) or {}
        try:
            out = replace(out, group_requires=resolve_groups(doc, out.groups))
        except ValueError as exc:
            raise ConfigError(
                f"{exc} (test-groups set in {out.origins.get(GROUPS_KEY)})",
                file=table.file,
                key=GROUPS_KEY,
            ) from None
    return out


def is_inside(root: Path, path: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
    except ValueError:
        return False
    return True


def layer(
    data: Mapping[str, Any],
    *,
    origin: str,
    file: Optional[str] = None,
    key_prefix: str = "",
    lines: Optional[Mapping[str, Optional[int]]] = None,
    base: Optional[ProjectTest] = None,
    inherit: Optional[Mapping[str, str]] = None,
) -> ProjectTest:
    """*base* (default: nothing) with the test keys *data* sets replaced (absent or null: not
    set here); *inherit*: key -> append | prepend, as cibuildwheel's overrides (commands
    joined with ``&&``, lists concatenated). ConfigError (exit 2) naming the file, line and
    key."""
    out = base if base is not None else ProjectTest()
    for key, (attr, parse) in _FIELDS.items():
        if data.get(key) is None:
            continue
        try:
            parsed = parse(data[key])
        except ValueError as exc:
            raise ConfigError(
                str(exc), file=file, line=(lines or {}).get(key), key=key_prefix + key
            ) from None
        source = origin
        rule = (inherit or {}).get(key)
        if rule is not None and origin_of(out, key):
            before = getattr(out, attr)
            first, second = (before, parsed) if rule == "append" else (parsed, before)
            parsed = first + second if isinstance(first, tuple) else f"{first} && {second}"
            source = f"{origin_of(out, key)} {rule}ed by {origin}"
        out = _set(out, key, parsed, source)
    return out


def combine(*layers: ProjectTest) -> ProjectTest:
    """Later layers replace earlier ones, key by key."""
    out = ProjectTest()
    for one in layers:
        for key, (attr, _parse) in _FIELDS.items():
            if origin_of(one, key):
                out = _set(out, key, getattr(one, attr), origin_of(one, key))
        if GROUPS_KEY in one.origins:
            out = replace(out, group_requires=one.group_requires)
    return out


def upper_test(
    config_layer: ProjectTest, requires: Optional[str], command: Optional[str]
) -> ProjectTest:
    """The layers above the project's: the config file's, then the command line's."""
    cli = ProjectTest()
    if requires is not None:
        try:
            cli = ProjectTest(
                parse_requires(requires), requires_origin="command line --test-requires"
            )
        except ValueError as exc:
            raise ConfigError(str(exc), key="--test-requires") from None
    if command is not None:
        try:
            cli = replace(
                cli, command=parse_command(command), command_origin="command line --test-command"
            )
        except ValueError as exc:
            raise ConfigError(str(exc), key="--test-command") from None
    return combine(config_layer, cli)


def resolve_project_test(
    project: Path,
    config_layer: ProjectTest,
    requires: Optional[str],
    command: Optional[str],
    identifiers: Optional[Sequence[str]] = None,
) -> ProjectTest:
    """The three layers for *project* (see the module docstring); *identifiers*: the cell
    whose overrides apply (none: the global test)."""
    return combine(
        from_pyproject(project, identifiers), upper_test(config_layer, requires, command)
    )
