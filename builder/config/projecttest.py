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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from packaging.requirements import InvalidRequirement, Requirement

from builder.config import pyproject as pp
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


@dataclass(frozen=True)
class ProjectTest:
    """What verification runs beyond importing the wheel's modules (nothing by default)."""

    requires: tuple[str, ...] = ()
    command: Optional[str] = None
    #: Where each value came from (for messages), e.g. "command line --test-command".
    requires_origin: str = ""
    command_origin: str = ""

    @property
    def enabled(self) -> bool:
        return self.command is not None

    def key(self) -> dict[str, Any]:
        """The part of a cell's input key: another test must run again on the same wheel."""
        return {"requires": list(self.requires), "command": self.command}

    def command_for(self, project: str) -> str:
        """The command with ``{project}``/``{package}`` naming *project* (a path inside the
        verification environment), quoted for ``sh``."""
        assert self.command is not None
        return expand(self.command, project=project, package=project)

    def describe(self) -> str:
        if self.command is None:
            return "none (the wheel's modules are imported)"
        reqs = f"; test-requires {' '.join(self.requires)}" if self.requires else ""
        return f"{self.command!r} ({self.command_origin}){reqs}"


#: No test beyond the import of the wheel's modules (the default).
NO_TEST = ProjectTest()


def parse_command(value: Any) -> str:
    """A shell command (or a list of them, joined with ``&&``); raises ValueError."""
    if isinstance(value, (list, tuple)):
        if not value or not all(isinstance(v, str) for v in value):
            raise ValueError(f"{brief(value)} is not a command or a list of commands; expected a "
                             f"non-empty string, {_EXAMPLE}")
        value = " && ".join(parse_command(v) for v in value)
    if not isinstance(value, str):
        raise ValueError(f"{brief(value)} is not a command; expected a string, {_EXAMPLE}")
    if not value.strip():
        raise ValueError(f"empty command; expected a shell command, {_EXAMPLE} (leave the key "
                         "out for no test)")
    unknown = sorted({m.group(1) for m in _PLACEHOLDER.finditer(value)} - set(PLACEHOLDERS))
    if unknown:
        names = ", ".join("{" + n + "}" for n in unknown)
        raise ValueError(f"unknown placeholder {names} in {brief(value)}; expected only "
                         f"{{project}} (the project's root) and {{package}} (the package built)")
    return value.strip()


def parse_requires(value: Any) -> tuple[str, ...]:
    """Requirements: a space-separated string (as cibuildwheel's) or a list; raises ValueError."""
    if isinstance(value, str):
        if not value.strip():
            raise ValueError("empty value; expected requirements such as 'pytest numpy>=1.26' "
                             "(leave the key out for none)")
        items: Sequence[Any] = value.split()
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        raise ValueError(f"{brief(value)} is not a list of requirements; expected e.g. "
                         "['pytest', 'numpy>=1.26']")
    out = []
    for item in items:
        if not isinstance(item, str) or not item.strip():
            raise ValueError(f"{brief(item)} is not a requirement; expected e.g. 'pytest>=8'")
        try:
            Requirement(item)
        except InvalidRequirement as exc:
            raise ValueError(f"{brief(item)} is not a requirement ({clip(exc)}); expected e.g. "
                             "'pytest>=8'") from None
        out.append(item.strip())
    return tuple(out)


def expand(command: str, *, project: str, package: str) -> str:
    """``{project}`` and ``{package}`` replaced by shell-quoted paths (unchanged when the path
    needs no quoting); any other text, braces included, as written."""
    values = {"project": shlex.quote(project), "package": shlex.quote(package)}
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), command)


def cibuildwheel_section(project: Path) -> tuple[dict[str, Any], str]:
    """The project's ``pyproject.toml`` ``[tool.cibuildwheel]`` table (empty without one) and
    the file's name; ConfigError (exit 2) when it cannot be read as one."""
    path = project / "pyproject.toml"
    doc = pp.load_pyproject(path, str(path))
    if doc is None:
        return {}, str(path)
    return pp.table(doc, "tool.cibuildwheel", str(path)), str(path)


#: cibuildwheel's platform table the builder reads (it makes Linux wheels only).
LINUX = "linux"


def linux_section(section: dict[str, Any], file: str) -> dict[str, Any]:
    """``[tool.cibuildwheel.linux]`` of *section*: its keys replace the global ones, as in
    cibuildwheel; ConfigError when it is not a table."""
    value = section.get(LINUX, {})
    if not isinstance(value, dict):
        raise ConfigError(f"is {type(value).__name__} ({brief(value)}); expected a table of "
                          "the same keys as [tool.cibuildwheel]", file=file,
                          key=f"tool.cibuildwheel.{LINUX}")
    return value


def from_pyproject(project: Path) -> ProjectTest:
    """The project's ``[tool.cibuildwheel]`` test keys, ``[tool.cibuildwheel.linux]``'s over
    them (none when it has no pyproject.toml)."""
    section, file = cibuildwheel_section(project)
    return combine(
        layer(section, origin=f"{file} [tool.cibuildwheel]", file=file,
              key_prefix="tool.cibuildwheel."),
        layer(linux_section(section, file), origin=f"{file} [tool.cibuildwheel.{LINUX}]",
              file=file, key_prefix=f"tool.cibuildwheel.{LINUX}."))


def layer(data: dict[str, Any], *, origin: str, file: Optional[str] = None,
          key_prefix: str = "", lines: Optional[dict[str, Optional[int]]] = None) -> ProjectTest:
    """One layer's values from a mapping holding ``test-requires``/``test-command`` (absent or
    null: not set here); ConfigError (exit 2) naming the file, line and key."""
    out = ProjectTest()
    for key, parse in ((REQUIRES_KEY, parse_requires), (COMMAND_KEY, parse_command)):
        if data.get(key) is None:
            continue
        try:
            parsed = parse(data[key])
        except ValueError as exc:
            raise ConfigError(str(exc), file=file, line=(lines or {}).get(key),
                              key=key_prefix + key) from None
        if key == REQUIRES_KEY:
            out = ProjectTest(parsed, out.command, origin, out.command_origin)  # type: ignore
        else:
            out = ProjectTest(out.requires, parsed, out.requires_origin, origin)  # type: ignore
    return out


def combine(*layers: ProjectTest) -> ProjectTest:
    """Later layers replace earlier ones, key by key."""
    out = ProjectTest()
    for one in layers:
        if one.requires_origin:
            out = ProjectTest(one.requires, out.command, one.requires_origin, out.command_origin)
        if one.command is not None:
            out = ProjectTest(out.requires, one.command, out.requires_origin, one.command_origin)
    return out


def resolve_project_test(project: Path, config_layer: ProjectTest, requires: Optional[str],
                         command: Optional[str]) -> ProjectTest:
    """The three layers for *project* (see the module docstring)."""
    cli = ProjectTest()
    if requires is not None:
        try:
            cli = ProjectTest(parse_requires(requires), requires_origin="command line "
                                                                     "--test-requires")
        except ValueError as exc:
            raise ConfigError(str(exc), key="--test-requires") from None
    if command is not None:
        try:
            cli = ProjectTest(cli.requires, parse_command(command), cli.requires_origin,
                              "command line --test-command")
        except ValueError as exc:
            raise ConfigError(str(exc), key="--test-command") from None
    return combine(from_pyproject(project), config_layer, cli)
