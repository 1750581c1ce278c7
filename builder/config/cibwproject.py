"""What a project's ``[tool.cibuildwheel]`` decides, once per build and per cell.

Once (cibuildwheel's global options, from the global keys and the ``linux`` table):

* ``build`` / ``skip`` -- identifier globs narrowing the cells (after the matrix and the
  command-line selection: builder.plan.cibwselect drops the others, with the key named);
* ``test-skip`` -- cells whose test is not run (built, repaired and import-checked all the same);
* ``archs`` -- the arches, when neither ``--arch`` nor ``BUILDER_ARCH`` names them;
* ``container-engine`` -- ``docker`` (the default: ``DOCKER_HOST`` or dockerd's socket) or
  ``podman`` (its API socket, found or started: builder.engines.podman).

Per cell (the overrides that select it applied, builder.config.cibwtable): the build options
(builder.config.buildoptions), the test keys (builder.config.projecttest) and
``manylinux-<arch>-image``. The layers above the project's (config file, ``BUILDER_*``,
command line) replace those key by key, for every cell alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from builder.arch import ARCHES
from builder.config import buildoptions, projecttest
from builder.config.buildoptions import CibwOptions
from builder.config.cibwtable import EMPTY_TABLE, CibwTable, Layer, read_table
from builder.config.projecttest import ProjectTest
from builder.config.values import cp_tag, image_ref
from builder.config.yamlfile import brief
from builder.errors import ConfigError
from builder.plan.selectors import Selector, parse

#: cibuildwheel's ``archs`` words for Linux -> the builder's arches (None: this host's).
ARCH_WORDS: dict[str, Optional[tuple[str, ...]]] = {
    "x86_64": ("X86",),
    "aarch64": ("ARM",),
    "auto": None,
    "native": None,
    "auto64": None,
    "all": ("X86", "ARM"),
}
#: cibuildwheel's image shorthands -> the pypa image (its tag and digest: the registry's).
IMAGE_NAMES = ("manylinux2014", "manylinux_2_28", "manylinux_2_34")
ENGINES = ("docker", "podman")


@dataclass(frozen=True)
class Globs:
    """``build``, ``skip`` or ``test-skip``: the text as written, its patterns, its source."""

    key: str
    text: str
    selectors: tuple[Selector, ...]
    origin: str

    def matches(self, identifiers: Sequence[str]) -> bool:
        return any(s.matches(i) for s in self.selectors for i in identifiers)

    def describe(self) -> str:
        return f"{self.key} = {self.text!r} ({self.origin})"


@dataclass(frozen=True)
class CibwProject:
    """A project's ``[tool.cibuildwheel]``, with the layers above it for the per-cell keys."""

    root: Path
    table: CibwTable = EMPTY_TABLE
    upper_options: CibwOptions = buildoptions.NO_OPTIONS
    upper_test: ProjectTest = projecttest.NO_TEST
    build: Optional[Globs] = None
    skip: Optional[Globs] = None
    test_skip: Optional[Globs] = None
    #: The builder's arches ``archs`` names (None: not set) and where.
    archs: Optional[tuple[str, ...]] = None
    archs_origin: str = ""
    warnings: tuple[str, ...] = field(default=())
    #: ``container-engine``'s engine (None: not set) and (file, key) where it is set.
    engine: Optional[str] = None
    engine_where: tuple[str, str] = ("", "")

    def options_for(self, identifiers: Sequence[str]) -> CibwOptions:
        return buildoptions.over(
            buildoptions.from_pyproject(self.root, identifiers, self.table), self.upper_options
        )

    def test_for(self, identifiers: Sequence[str]) -> ProjectTest:
        test = projecttest.combine(
            projecttest.from_pyproject(self.root, identifiers, self.table), self.upper_test
        )
        if self.test_skip is not None and self.test_skip.matches(identifiers) and test.command:
            return replace(test, skipped=self.test_skip.describe())
        return test

    def image_for(
        self, identifiers: Sequence[str], machine: str, current: str
    ) -> Optional[tuple[str, str]]:
        """``manylinux-<machine>-image`` for the cell (its overrides applied): (the image
        reference, where it is set), None when the project does not set it. *current*: the
        config's image for the arch (a shorthand naming its own repository keeps its pin)."""
        key = f"manylinux-{machine}-image"
        found = None
        for lay in self.table.layers(identifiers):
            if lay.data.get(key) not in (None, ""):
                found = (lay.data[key], lay)
        if found is None:
            return None
        value, lay = found
        return _image(
            value, machine, current, file=self.table.file, key=lay.key_prefix + key
        ), f"{lay.origin} {key}"


def _image(value: Any, machine: str, current: str, *, file: str, key: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(
            f"is {brief(value)}; expected an image reference or one of {', '.join(IMAGE_NAMES)}",
            file=file,
            key=key,
        )
    if value in IMAGE_NAMES:
        repo = f"quay.io/pypa/{value}_{machine}"
        # The config's pinned image of the same repository: the pin is kept (the shorthand
        # names the image family, the config says which build of it).
        return current if current.split("@")[0].split(":")[0] == repo else repo
    try:
        return image_ref(value)
    except ValueError as exc:
        raise ConfigError(
            f"{exc}, or one of {', '.join(IMAGE_NAMES)}", file=file, key=key
        ) from None


def _globs(table: CibwTable, key: str) -> Optional[Globs]:
    found = table.global_value(key)
    if found is None:
        return None
    value, lay = found
    text = _text(value, table.file, lay, key, "identifier globs such as 'cp311-* cp312-*'")
    return Globs(key, text, parse([text]), lay.origin)


def _text(value: Any, file: str, lay: Layer, key: str, expected: str) -> str:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        value = " ".join(value)
    if not isinstance(value, str):
        raise ConfigError(
            f"is {brief(value)}; expected {expected} (a string or a list of strings)",
            file=file,
            key=lay.key_prefix + key,
        )
    return value


def parse_archs(text: str, host_arch: Optional[str], *, file: str, key: str) -> tuple[str, ...]:
    """cibuildwheel's ``archs`` words -> the builder's arches, in the matrix's spelling;
    ConfigError naming an unsupported word and the supported ones."""
    out: list[str] = []
    for word in text.split():
        if word not in ARCH_WORDS:
            raise ConfigError(
                f"{word!r} is not an architecture the builder makes wheels for; "
                f"expected {', '.join(ARCH_WORDS)} (the builder makes x86_64 "
                "and aarch64 manylinux wheels)",
                file=file,
                key=key,
            )
        arches = ARCH_WORDS[word]
        if arches is None:
            if host_arch is None:
                raise ConfigError(
                    f"{word!r} names this host's arch, which is neither x86_64 "
                    "nor aarch64; expected x86_64 or aarch64",
                    file=file,
                    key=key,
                )
            arches = (host_arch,)
        out += [a for a in arches if a not in out]
    if not out:
        raise ConfigError(
            "names no architecture; expected e.g. 'x86_64' or 'all'", file=file, key=key
        )
    return tuple(out)


def _engine(table: CibwTable) -> tuple[Optional[str], tuple[str, str], list[str]]:
    """(the engine ``container-engine`` names or None, (file, key), warnings)."""
    found = table.global_value("container-engine")
    if found is None:
        return None, ("", ""), []
    value, lay = found
    key = lay.key_prefix + "container-engine"
    name, rest = (
        (value.get("name"), {k: v for k, v in value.items() if k != "name"})
        if isinstance(value, dict)
        else (value, {})
    )
    if isinstance(name, str) and ";" in name:
        name, _, more = name.partition(";")
        rest = {"options": more.strip()} if more.strip() else {}
    name = name.strip() if isinstance(name, str) else name
    if name not in ENGINES:
        raise ConfigError(
            f"is {brief(value)}; expected docker or podman (the engines the "
            "builder builds cells with)",
            file=table.file,
            key=key,
        )
    lines = []
    if rest:
        lines.append(
            f"{table.file}: {key}: {brief(rest)} not used: the builder makes its own "
            "container per cell (--network, the config's build section)"
        )
    return name, (table.file, key), lines


def read_project(
    root: Path,
    *,
    host_arch: Optional[str] = None,
    upper_options: CibwOptions = buildoptions.NO_OPTIONS,
    upper_test: ProjectTest = projecttest.NO_TEST,
) -> CibwProject:
    """The project's table read and its global keys checked (ConfigError, exit 2, naming the
    key of a bad value); *host_arch*: what ``archs = "auto"`` means here."""
    table = read_table(root)
    archs, archs_origin = None, ""
    found = table.global_value("archs")
    if found is not None:
        value, lay = found
        text = _text(value, table.file, lay, "archs", "arches such as 'x86_64 aarch64'")
        archs = parse_archs(text, host_arch, file=table.file, key=lay.key_prefix + "archs")
        archs_origin = f"{lay.origin} archs = {text!r}"
    engine, engine_where, engine_warnings = _engine(table)
    return CibwProject(
        root=root,
        table=table,
        upper_options=upper_options,
        upper_test=upper_test,
        build=_globs(table, "build"),
        skip=_globs(table, "skip"),
        test_skip=_globs(table, "test-skip"),
        archs=archs,
        archs_origin=archs_origin,
        warnings=tuple(engine_warnings),
        engine=engine,
        engine_where=engine_where,
    )


def cibw_identifier(cp: str, machine: str) -> str:
    """cibuildwheel's identifier of a cell: ``cp311-manylinux_x86_64``."""
    return f"{cp}-manylinux_{machine}"


def identifiers_of(cell: Any) -> tuple[str, str]:
    """A cell's or a dropped cell's (cibuildwheel identifier, builder identifier): what
    ``select``, ``build``, ``skip`` and ``test-skip`` globs are matched with."""
    return cibw_identifier(cp_tag(cell.python), ARCHES[cell.arch].machine), cell.identifier
