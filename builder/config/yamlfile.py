"""Load a YAML file into plain data plus the line of every key and item.

Validation messages must name the file and the line (``configs/matrix.yaml:12``), which
``yaml.safe_load`` forgets. We compose the node tree once, construct the data from it,
and walk the nodes in parallel to record where each path starts. Duplicate mapping keys,
which PyYAML silently resolves to the last one, are reported as errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import yaml

from builder.errors import ConfigError

PathKey = tuple[Union[str, int], ...]


@dataclass(frozen=True)
class YamlDocument:
    """The data of one YAML file and the (1-based) line of each path inside it."""

    file: str
    data: Any
    lines: dict[PathKey, int] = field(default_factory=dict)

    def line(self, path: PathKey) -> int | None:
        """Line of *path*, or of its nearest ancestor that exists in the file."""
        p = tuple(path)
        while p:
            if p in self.lines:
                return self.lines[p]
            p = p[:-1]
        return self.lines.get((), None)


def format_path(path: PathKey) -> str:
    """``("matrix", "exclude", 0, "torch")`` -> ``matrix.exclude[0].torch``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _walk(node: yaml.Node, path: PathKey, lines: dict[PathKey, int], file: str) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key == "<<":
                # Merge keys: walk the merged mapping's keys as if written here.
                sub = (
                    value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                )
                for s in sub:
                    _walk(s, path, lines, file)
                continue
            line = key_node.start_mark.line + 1
            if key in seen:
                raise ConfigError(
                    f"duplicate key {key!r} (first defined on line {seen[key]}); "
                    "expected each key once",
                    file=file,
                    line=line,
                    key=format_path(path + (str(key),)),
                )
            seen[key] = line
            child = path + (str(key),)
            lines[child] = line
            _walk(value_node, child, lines, file)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[path + (i,)] = item.start_mark.line + 1
            _walk(item, path + (i,), lines, file)


def parse_yaml(text: str, file: str) -> YamlDocument:
    """Parse *text* (named *file* in messages); raises ConfigError on bad YAML."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return YamlDocument(file=file, data=None, lines={})
        lines: dict[PathKey, int] = {}
        _walk(node, (), lines, file)
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or str(exc)
        raise ConfigError(f"invalid YAML: {problem}", file=file, line=line) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", file=file) from None
    finally:
        loader.dispose()
    return YamlDocument(file=file, data=data, lines=lines)


def load_yaml(path: Path, display: str | None = None) -> YamlDocument:
    """Read and parse *path*; *display* is the name used in messages (default: the path)."""
    name = display if display is not None else str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("file not found; expected a YAML configuration file", file=name) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read ({exc}); expected a UTF-8 YAML file", file=name) from None
    return parse_yaml(text, name)
