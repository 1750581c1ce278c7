"""Load a YAML file into plain data plus the line of every key and item.

Validation messages must name the file and the line (``configs/matrix.yaml:12``), which
``yaml.safe_load`` forgets. We compose the node tree once, construct the data from it,
and walk the nodes in parallel to record where each path starts. Duplicate mapping keys,
which PyYAML silently resolves to the last one, are reported as errors.

Any text is either a document or a ConfigError naming the file and the line: nesting deeper
than :data:`MAX_NESTING` (PyYAML's composer recurses), aliases that expand past
:data:`MAX_NODES` values ("billion laughs") or contain themselves, and values its constructor
cannot build (an integer past Python's 4300-digit limit, a date such as 2020-13-45) are refused
before anything walks the data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

import yaml

from builder.errors import ConfigError

PathKey = tuple[Union[str, int], ...]

#: How deep mappings and lists may nest, aliases expanded (the real files use five levels).
MAX_NESTING = 64
#: How many values a file may hold with its aliases expanded (configs/support.yaml, which uses
#: aliases for its Python lists, holds about 2000).
MAX_NODES = 100_000
_EXPECTED_SIZE = (
    "expected a configuration of ordinary size (aliases of small values, as "
    "configs/support.yaml has)"
)


def brief(value: object, limit: int = 100) -> str:
    """``repr(value)`` for a message, shortened to about *limit* characters."""
    try:
        text = repr(value)
    except ValueError:  # an int past Python's int-to-text limit
        text = "an integer of thousands of digits"
    if len(text) <= limit:
        return text
    return f"{text[: limit - 25]}... ({len(text)} characters)"


def clip(text: object, limit: int = 200) -> str:
    """``str(text)`` (an exception's message, which may quote the whole input) for a message,
    shortened to about *limit* characters."""
    said = str(text)
    return said if len(said) <= limit else f"{said[: limit - 25]}... ({len(said)} characters)"


def path_problem(path: Path, missing: str = "not found") -> str | None:
    """Why *path* is not a readable file ("is a folder", *missing*, ...), None when it is one;
    never raises (a name too long for the file system is such a reason, not an OSError)."""
    try:
        if path.is_file():
            return None
        return "is a folder" if path.is_dir() else missing
    except OSError as exc:
        return f"cannot be looked up ({exc.strerror or exc})"
    except ValueError:  # a NUL byte
        return "holds a NUL character, which no path can"


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses nesting deeper than MAX_NESTING while it composes, and turns a
    value its constructors cannot build into a YAML error at the value's line."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_NESTING:
                # (PyYAML's stubs leave peek_event unannotated)
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"nested more than {MAX_NESTING} levels deep; expected a "
                    "configuration's few levels of mappings and lists",
                    mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: Any, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError, AttributeError, KeyError, TypeError) as exc:
            # ValueError: int() past 4300 digits, a date like 2020-13-45, !!float on text;
            # AttributeError, KeyError: an explicit !!timestamp or !!bool on a value not one
            if node.tag == "tag:yaml.org,2002:int" and isinstance(exc, ValueError):
                problem = (
                    f"an integer of {len(node.value)} characters, more than Python reads; "
                    "expected at most 4300 digits (quote it to make it a string)"
                )
            elif node.tag == "tag:yaml.org,2002:timestamp":
                why = f" ({exc})" if isinstance(exc, ValueError) else ""
                problem = (
                    f"{brief(node.value)} is not a date{why}; expected YYYY-MM-DD "
                    "(quote it to make it a string)"
                )
            else:
                tag = node.tag.replace("tag:yaml.org,2002:", "!!")
                problem = (
                    f"cannot read {brief(node.value)} as {tag}; expected a value of "
                    "that type (or no tag)"
                )
            raise yaml.constructor.ConstructorError(None, None, problem, node.start_mark) from None


def _labelled_children(node: yaml.Node) -> list[tuple[Union[str, int, None], yaml.Node]]:
    if isinstance(node, yaml.MappingNode):
        out: list[tuple[Union[str, int, None], yaml.Node]] = []
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            out += [(None, key_node), (key, value_node)]
        return out
    if isinstance(node, yaml.SequenceNode):
        return list(enumerate(node.value))
    return []


def _check_expansion(root: yaml.Node, file: str) -> None:
    """Refuse a node graph whose aliases expand past MAX_NODES values or MAX_NESTING levels, or
    that holds a value containing itself, before anything walks it (linear in distinct nodes)."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_nodes: set[int] = set()  # started, not finished: the ancestors of what is popped
    stack: list[tuple[yaml.Node, PathKey, bool]] = [(root, (), False)]
    while stack:
        node, path, finished = stack.pop()
        nid = id(node)
        line = node.start_mark.line + 1
        kids = _labelled_children(node)
        if finished:
            open_nodes.discard(nid)
            size[nid] = 1 + sum(size[id(k)] for _, k in kids)
            depth[nid] = 1 + max((depth[id(k)] for _, k in kids), default=0)
            if size[nid] > MAX_NODES:
                raise ConfigError(
                    f"aliases expand this value to more than {MAX_NODES} values "
                    f"(an alias bomb); {_EXPECTED_SIZE}",
                    file=file,
                    line=line,
                    key=format_path(path) or None,
                )
            if depth[nid] > MAX_NESTING:
                raise ConfigError(
                    f"aliases nest this value more than {MAX_NESTING} levels "
                    f"deep; {_EXPECTED_SIZE}",
                    file=file,
                    line=line,
                    key=format_path(path) or None,
                )
            continue
        if nid in size:
            continue  # an alias of a value already measured
        if nid in open_nodes:
            raise ConfigError(
                "an alias refers to a value that contains it (the value would "
                "contain itself); expected an alias of a finished value",
                file=file,
                line=line,
                key=format_path(path) or None,
            )
        open_nodes.add(nid)
        stack.append((node, path, True))
        for key, kid in reversed(kids):  # visited in document order: the first path is named
            stack.append((kid, path if key is None else path + (key,), False))


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
    """``("matrix", "exclude", 0, "torch")`` -> ``matrix.exclude[0].torch`` (a key of more
    than 80 characters shortened)."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            name = clip(part, 80)
            out += f".{name}" if out else name
    return out


def _walk(node: yaml.Node, path: PathKey, lines: dict[PathKey, int], file: str) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            scalar = isinstance(key_node, yaml.ScalarNode)
            key = key_node.value if scalar else None
            if key == "<<":
                # Merge keys: walk the merged mapping's keys as if written here.
                sub = (
                    value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
                )
                for s in sub:
                    _walk(s, path, lines, file)
                continue
            line = key_node.start_mark.line + 1
            if scalar and key in seen:  # a complex key is the constructor's to refuse
                raise ConfigError(
                    f"duplicate key {brief(key)} (first defined on line {seen[key]}); "
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
    loader: _Loader | None = None
    try:
        loader = _Loader(text)  # checks that every character is printable
        node = loader.get_single_node()
        if node is None:
            return YamlDocument(file=file, data=None, lines={})
        _check_expansion(node, file)
        lines: dict[PathKey, int] = {}
        _walk(node, (), lines, file)
        data = loader.construct_document(node)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or str(exc)
        if exc.problem and exc.context and exc.context.startswith("expected"):
            # "expected a single document in the stream", "but found another document"
            problem = f"{exc.context}, {exc.problem}"
        # PyYAML quotes the token it stopped at, which may be the size of the file
        raise ConfigError(f"invalid YAML: {clip(problem, 300)}", file=file, line=line) from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise ConfigError(
            f"invalid YAML: character {chr(exc.character)!r} is not allowed; "
            "expected printable text (write it as an escape in a double-quoted "
            "string)",
            file=file,
            line=line,
        ) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {clip(exc, 300)}", file=file) from None
    finally:
        if loader is not None:
            loader.dispose()
    return YamlDocument(file=file, data=data, lines=lines)


def load_yaml(path: Path, display: str | None = None) -> YamlDocument:
    """Read and parse *path*; *display* is the name used in messages (default: the path)."""
    name = display if display is not None else str(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError("file not found; expected a YAML configuration file", file=name) from None
    except IsADirectoryError:
        raise ConfigError("is a folder; expected a YAML file", file=name) from None
    except OSError as exc:
        raise ConfigError(
            f"cannot read ({exc.strerror or exc}); expected a readable UTF-8 YAML file", file=name
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"byte {raw[exc.start]:#04x} is not UTF-8 ({exc.reason}); expected a UTF-8 YAML file",
            file=name,
            line=raw.count(b"\n", 0, exc.start) + 1,
        ) from None
    return parse_yaml(text, name)
