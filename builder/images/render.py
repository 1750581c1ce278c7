"""Render a cell's Dockerfile from ``docker/<ARCH>/Dockerfile.j2`` into a Recipe.

A Recipe is everything an engine needs to build the cell's image: the Dockerfile text,
the files that must sit next to it in the build context (the CA bundle), and the build
arguments (proxies -- kept out of the text and out of ``repr``).

Rendering is deterministic: same cell and config give byte-identical text (no clocks, no
host paths, sorted inputs). Jinja2 runs with ``StrictUndefined`` so a template typo fails
instead of rendering empty. Values are checked twice: ``builder.config.values`` validated them on
load, and here every value that reaches the text goes through ``finalize`` (which refuses
control characters such as newlines, so no value can start a new Dockerfile instruction)
and through a filter for its context: ``dq`` (a Dockerfile double-quoted word), ``sh``
(a shell word) or ``comment``.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from builder.atomicfile import atomic_write
from builder.config import REPO_ROOT, BuildConfig, display_path
from builder.errors import BuilderError
from builder.plan.cells import Cell

if TYPE_CHECKING:  # imported when a recipe is rendered (builder.deps)
    import jinja2


def _jinja2() -> ModuleType:  # the jinja2 module
    from builder.deps import require  # noqa: PLC0415

    return require("jinja2", "Jinja2", "rendering the cells' Dockerfiles")


TEMPLATE_DIR = REPO_ROOT / "docker"
CA_CONTEXT_NAME = "ampforge-ca.pem"
DOCKERFILE_NAME = "Dockerfile"

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class RenderError(BuilderError):
    """A value or template cannot be rendered safely (exit 2: it is a configuration fault)."""

    return_code = 2


def _finalize(value: Any) -> Any:
    if isinstance(value, str) and _CONTROL.search(value):
        raise RenderError(
            f"refusing to render {value!r}: it contains a control character (newline, tab, ...); "
            "expected a single-line value"
        )
    return value


def _dq(value: Any) -> str:
    """A Dockerfile double-quoted word (LABEL/ENV): escape backslash, quote and '$'."""
    text = str(value)
    _finalize(text)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def _sh(value: Any) -> str:
    text = str(value)
    _finalize(text)
    return shlex.quote(text)


def _comment(value: Any) -> str:
    """Text inside a '#' comment: control characters shown escaped, never a line break."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def make_environment(template_dir: Path = TEMPLATE_DIR) -> jinja2.Environment:
    jinja2 = _jinja2()
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir)),
        undefined=jinja2.StrictUndefined,
        finalize=_finalize,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(dq=_dq, sh=_sh, comment=_comment)
    return env


@dataclass(frozen=True)
class Recipe:
    """A rendered, reviewable build recipe for one cell."""

    cell: Cell
    dockerfile: str
    template: str  # e.g. docker/X86/Dockerfile.j2
    context_files: Mapping[str, Path] = field(default_factory=dict)  # name in context -> source
    build_args: Mapping[str, str] = field(default_factory=dict, repr=False)  # proxies: secret

    @property
    def digest(self) -> str:
        """sha256 over the Dockerfile and the context files: the recipe's content key."""
        h = hashlib.sha256(self.dockerfile.encode())
        for name in sorted(self.context_files):
            h.update(b"\0" + name.encode() + b"\0")
            h.update(self.context_files[name].read_bytes())
        return h.hexdigest()

    @property
    def image_tag(self) -> str:
        """A content-addressed tag for the cell's image: same recipe, same tag."""
        return f"ampforge/cell:{self.cell.identifier}-{self.digest[:16]}"

    def write(self, out_dir: Path) -> Path:
        """Write ``out_dir/<cell id>/Dockerfile`` (+ context files) atomically; returns the folder.

        The folder is a complete build context for the image.
        """
        folder = out_dir / self.cell.identifier
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write(folder / DOCKERFILE_NAME, self.dockerfile.encode())
        for name, src in sorted(self.context_files.items()):
            atomic_write(folder / name, src.read_bytes())
        if CA_CONTEXT_NAME not in self.context_files:
            (folder / CA_CONTEXT_NAME).unlink(missing_ok=True)  # stale from an earlier render
        return folder


def template_for(cell: Cell) -> str:
    return f"{cell.arch}/Dockerfile.j2"


def render_recipe(
    cell: Cell,
    config: BuildConfig,
    template_dir: Path = TEMPLATE_DIR,
    env: jinja2.Environment | None = None,
) -> Recipe:
    jinja2 = _jinja2()
    env = env or make_environment(template_dir)
    name = template_for(cell)
    context_files: dict[str, Path] = {}
    if config.ca_bundle is not None:
        context_files[CA_CONTEXT_NAME] = config.ca_bundle
    variables = {
        "cell": cell,
        "source": config.source_name,
        "template": display_path(template_dir / name),
        "offline": config.offline.enabled,
        "pip": config.pip,
        "family": cell.image.family,
        "ca_bundle": config.ca_bundle is not None,
        "ca_context_name": CA_CONTEXT_NAME,
    }
    try:
        text = env.get_template(name).render(**variables)
    except jinja2.TemplateNotFound:
        raise RenderError(
            f"template {display_path(template_dir / name)} not found; expected one per arch "
            f"in {display_path(template_dir)}/<ARCH>/Dockerfile.j2"
        ) from None
    except jinja2.UndefinedError as exc:
        raise RenderError(f"template {name}: {exc.message}") from None
    # Collapse runs of blank lines left by conditional blocks: readable and stable.
    text = re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n"
    return Recipe(
        cell=cell,
        dockerfile=text,
        template=display_path(template_dir / name),
        context_files=context_files,
        build_args=config.proxy.build_args(),
    )


def render_all(
    cells: Iterable[Cell], config: BuildConfig, template_dir: Path = TEMPLATE_DIR
) -> list[Recipe]:
    env = make_environment(template_dir)
    return [render_recipe(c, config, template_dir, env) for c in cells]


def write_recipes(recipes: Iterable[Recipe], out_dir: Path) -> list[Path]:
    """Write every recipe; callers render all of them first, so a bad one writes nothing."""
    return [r.write(out_dir) for r in recipes]


__all__ = ["Recipe", "RenderError", "render_recipe", "render_all", "write_recipes"]
