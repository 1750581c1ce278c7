"""Fuzzing the builder's configuration parsers (issue #38): for ANY input -- a build-matrix file,
a support table, a project's ``pyproject.toml`` (``[tool.cibuildwheel]``, ``[tool.ampforge]``,
``[project]``), the ``BUILDER_*`` and proxy variables -- a parser either produces a configuration
or raises ConfigError (exit 2) whose message names the file and the key (or the line) and says
what was expected; never another exception, which the command line would print as a traceback.

Inputs: structured mutations of real files (``configs/*.yaml``, ``configs/support.yaml``, this
repository's ``pyproject.toml`` and the seed corpus ``tests/builder/fuzz_corpus/``: a value
replaced by another type, a key deleted, added or renamed, a value wrapped in a list or a
mapping, huge numbers, unicode, null), raw text mutations of the same files (YAML and TOML
syntax, anchors and aliases, tabs, control characters, duplicated lines), and every corpus file
as it is. The bounded run (the suite; under CI derandomized) draws a few examples per target;
``make fuzz`` runs the same targets for minutes (``FUZZ_MINUTES``, ``FUZZ_EXAMPLES``) and writes
the input of a failure to ``build/fuzz/`` (``AMPFORGE_FUZZ_SAVE``) for ``fuzz_corpus/``.

The second half: explicit cases the brief names -- alias bombs, deep nesting, huge numbers,
duplicate keys, bytes that are not UTF-8, an empty file, a file that is a folder.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tracemalloc
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any, Callable

import pytest
import tomllib
import yaml
from helpers.builder_testlib import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from builder.config import CliOverrides, buildoptions, load_settings, projecttest
from builder.config.load import ENV as BUILDER_ENV
from builder.config.model import REPO_ROOT, display_path
from builder.config.proxy import PROXY_KEYS
from builder.config.schema import CONFIG_SCHEMA
from builder.config.support import load_support
from builder.config.yamlfile import MAX_NESTING, parse_yaml
from builder.errors import ConfigError
from builder.offline.preflight import cell_requirements
from builder.plan.project import read_bounds

CORPUS = Path(__file__).resolve().parents[1] / "fuzz_corpus"
CONFIGS = REPO_ROOT / "configs"
SUPPORT = CONFIGS / "support.yaml"
#: Examples per target: a few in the bounded run, AMPFORGE_FUZZ_EXAMPLES in `make fuzz`.
EXAMPLES = int(os.environ.get("AMPFORGE_FUZZ_EXAMPLES") or 0)
#: Where `make fuzz` writes the input of a failing example (the last one written is the
#: shrunk one Hypothesis reports): copy it into fuzz_corpus/<target>/ to keep it.
SAVE = os.environ.get("AMPFORGE_FUZZ_SAVE")
#: A message longer than this buries what was expected under the value it echoes.
MAX_MESSAGE = 1200
#: What is said of a whole file, which has no key or line to name.
WHOLE_FILE = ("the file is empty", "is a folder", "file not found", "cannot read")


def fuzz_settings(bounded: int) -> settings:
    return settings(
        max_examples=EXAMPLES or bounded,
        deadline=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
            HealthCheck.function_scoped_fixture,
        ],
    )


# ------------------------------------------------------------------ the invariant


def _save_failure(target: str, payload: bytes, suffix: str) -> None:
    if SAVE:
        folder = Path(SAVE)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{target}{suffix}").write_bytes(payload)


def check_outcome(
    parse: Callable[[], object],
    files: set[str],
    *,
    structured: bool,
    target: str,
    payload: bytes,
    suffix: str,
) -> ConfigError | None:
    """Run *parse*: a result, or a ConfigError that names one of *files* (or, for a setting,
    the variable in its key), says where (key or line) and, for structured inputs, what was
    expected. Anything else fails the example, and the input is saved when `make fuzz` runs."""
    try:
        parse()
    except ConfigError as exc:
        try:
            _check_refusal(exc, files, structured=structured)
        except AssertionError:
            _save_failure(target, payload, suffix)
            raise
        return exc
    except BaseException:
        _save_failure(target, payload, suffix)
        raise
    return None


def said(exc: ConfigError) -> str:
    """What a ConfigError says after where it is (``file:line: key: ``)."""
    where = "" if exc.file is None else exc.file + ("" if exc.line is None else f":{exc.line}")
    if exc.key is not None:
        where = f"{where}: {exc.key}" if where else exc.key
    assert str(exc).startswith(f"{where}: " if where else "")
    return str(exc)[len(where) + 2 :] if where else str(exc)


def _check_refusal(exc: ConfigError, files: set[str], *, structured: bool) -> None:
    text = str(exc)
    assert "Traceback" not in text
    assert len(said(exc)) <= MAX_MESSAGE, f"a message of {len(said(exc))} characters: {text:.300}"
    if exc.file is None:
        # A setting (environment, command line): its key names it.
        assert exc.key and any(name in exc.key for name in files), text
    else:
        assert exc.file in files, f"names {exc.file!r}, not one of {sorted(files)}: {text}"
        assert text.startswith(exc.file)
        assert (
            exc.key is not None
            or exc.line is not None
            or re.search(r"line \d+", said(exc))
            or said(exc).startswith(WHOLE_FILE)
        ), f"neither key nor line: {text}"
    if structured:
        assert "expected" in said(exc), f"does not say what was expected: {text}"


# ------------------------------------------------------------------ mutations of data

#: Key names a mutation may add or rename to: the schema's, the support table's, plausible typos.
KNOWN_KEYS = sorted(
    {
        *CONFIG_SCHEMA["properties"],
        *CONFIG_SCHEMA["properties"]["matrix"]["properties"],
        *CONFIG_SCHEMA["properties"]["build"]["properties"],
        *CONFIG_SCHEMA["properties"]["pip"]["properties"],
        "X86",
        "ARM",
        "base",
        "family",
        "plat",
        "python_path",
        "torch",
        "cuda_builds",
        "torch_glibc",
        "torch_npu",
        "unsupported",
        "cross_host_torch",
        "torch_cxx11_abi",
        "torch_setuptools",
        "toolkits",
        "capabilities",
        "default_arch_list",
        "packages",
        "version",
        "sha256",
        "default_index",
        "per_cuda_indexes",
        "release",
        "x86_64",
        "aarch64",
        "default",
        "*",
        "2.13.0",
        "2.8.0",
        "3.11",
        "13.0",
        "tool",
        "cibuildwheel",
        "ampforge",
        "stable-abi",
        "project",
        "dependencies",
        "requires-python",
        "name",
        "build-system",
        "requires",
        "test-requires",
        "test-command",
        "<<",
        "",
        " ",
        "matrixx",
        "Matrix",
        "ümlaut",
    }
)

ODD_STRINGS = [
    "",
    " ",
    "\t",
    "\n",
    "3.10",
    "3.1",
    "3.9.x",
    "2.13",
    "2.13.0",
    "2.13.0+cpu",
    "X86",
    "ARM",
    "x86_64",
    "cpu",
    "13.0",
    "cu130",
    "cu1",
    "9" * 60 + ".0.0",
    "3." + "9" * 60,
    "a\x00b",
    "$(rm -rf /)",
    "`id`",
    "a\nb",
    "ü",
    "\u202e",
    "\U0001f600",
    "~",
    "null",
    "*",
    "{cp}",
    "{nope}",
    "-march=native",
    "-O2",
    "2020-13-45",
    "http://[::1",
    "http://u:p@h:1",
    "https://h/simple",
    "proxy.corp:3128",
    "socks5://h:1080",
    "file:///x",
    "libtorch*.so",
    "/opt/python/{cp}-{cp}/bin/python",
    "manylinux_2_28_x86_64",
    "quay.io/a/b:1@sha256:" + "0" * 64,
    "a@sha256:" + "f" * 64,
    "<70",
    ">=3.9",
    "torch>=2.8",
    "a[[[",
    "A=1 B=2",
    "A='unclosed",
    "pip",
    "build",
    "auditwheel repair -w {dest_dir} {wheel}",
    "8.0;9.0+PTX",
    "99.9",
    "..",
    "../..",
    "/",
    "/dev/null",
    "x" * 3000,
]


def _nested(depth: int) -> Any:
    value: Any = "x"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


def odd_values(toml: bool = False) -> st.SearchStrategy[Any]:
    """Values of every type a YAML or TOML file can hold (TOML: no null), shapes included."""
    scalars = st.one_of(
        st.booleans(),
        st.integers(),
        st.sampled_from([10**30, -(10**30), 2**63, 2**31, 0, -1]),
        st.floats(),
        st.sampled_from([math.nan, math.inf, -math.inf, 2.0, 1e300, 0.0, -0.0]),
        st.text(max_size=12),
        st.sampled_from(ODD_STRINGS),
        st.dates(),
        *([] if toml else [st.none()]),
    )
    small = st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(
                st.one_of(st.sampled_from(KNOWN_KEYS), st.text(max_size=6)), inner, max_size=4
            ),
        ),
        max_leaves=8,
    )
    return st.one_of(
        small,
        st.integers(1, 120).map(_nested),
        st.lists(st.sampled_from(ODD_STRINGS), min_size=50, max_size=400),
    )


def _paths(data: Any, prefix: tuple = ()) -> Iterator[tuple]:
    yield prefix
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            yield from _paths(value, prefix + (i,))


def _get(data: Any, path: tuple) -> Any:
    for part in path:
        data = data[part]
    return data


MUTATIONS = (
    "replace",
    "delete",
    "add",
    "rename",
    "wrap_list",
    "wrap_dict",
    "to_list",
    "to_dict",
    "emptied",
    "duplicate_item",
)


@st.composite
def mutated(draw: st.DrawFn, seeds: list[Any], toml: bool = False) -> Any:
    """One seed with 1-3 structural mutations."""
    data = json.loads(json.dumps(draw(st.sampled_from(seeds)), default=str))  # a deep copy
    for _ in range(draw(st.integers(1, 3))):
        paths = list(_paths(data))
        path = draw(st.sampled_from(paths))
        op = draw(st.sampled_from(MUTATIONS))
        node = _get(data, path)
        if op == "replace":
            new: Any = draw(odd_values(toml))
        elif op == "wrap_list":
            new = [node]
        elif op == "wrap_dict":
            new = {draw(st.sampled_from(KNOWN_KEYS)): node}
        elif op == "to_list":
            new = list(node.values()) if isinstance(node, dict) else [node, node]
        elif op == "to_dict":
            new = (
                {str(i): v for i, v in enumerate(node)}
                if isinstance(node, list)
                else {"value": node}
            )
        elif op == "emptied":
            new = {} if isinstance(node, dict) else [] if isinstance(node, list) else ""
        elif op == "add" and isinstance(node, dict):
            node[draw(st.sampled_from(KNOWN_KEYS))] = draw(odd_values(toml))
            continue
        elif op == "rename" and isinstance(node, dict) and node:
            old = draw(st.sampled_from(sorted(node, key=str)))
            node[draw(st.sampled_from(KNOWN_KEYS))] = node.pop(old)
            continue
        elif op == "duplicate_item" and isinstance(node, list) and node:
            node.append(node[draw(st.integers(0, len(node) - 1))])
            continue
        elif op == "delete" and path:
            parent = _get(data, path[:-1])
            del parent[path[-1]]
            continue
        else:
            new = draw(odd_values(toml))
        if path:
            _get(data, path[:-1])[path[-1]] = new
        else:
            data = new
    return data


# ------------------------------------------------------------------ mutations of text

TOKENS_YAML = [
    ": ",
    "- ",
    "&a ",
    "*a",
    "&b [*a, *a, *a]",
    "<<: *a",
    "<<: 1",
    "!!binary ",
    "!!set ",
    "!!python/object:os.system ",
    "!!int ",
    "!!float ",
    "!!timestamp ",
    "!!str ",
    "? ",
    "{",
    "}",
    "[",
    "]",
    '"',
    "'",
    "#",
    "\t",
    "\n",
    "  ",
    "\x00",
    "\ufeff",
    "\x85",
    "\u2028",
    "%YAML 1.1\n",
    "---\n",
    "...\n",
    "|",
    ">",
    "@",
    "`",
    "9" * 5000,
    "1.0e+300",
    ".nan",
    ".inf",
    "-.inf",
    "0x1f",
    "0o17",
    "1_000",
    "2020-13-45",
    "2020-01-01",
    "~",
    "null",
    "yes",
    "no",
    "on",
    "\\x",
    "\\0",
    '"\\ud800"',
    "[[[[[[[[[[",
    "]]]]]]]]]]",
    "{a: 1, a: 2}",
    "matrix:",
    "torch:",
    "\r",
]
TOKENS_TOML = [
    " = ",
    "[",
    "]",
    "[[",
    "]]",
    "{",
    "}",
    '"',
    "'",
    '"""',
    "'''",
    "#",
    "\t",
    "\n",
    "\x00",
    "\ufeff",
    ".",
    ",",
    "tool.",
    "cibuildwheel",
    "ampforge",
    "9" * 5000,
    "1e400",
    "nan",
    "inf",
    "-inf",
    "0x1f",
    "1979-05-27",
    "1979-05-27T07:32:00Z",
    "true",
    "\\u0000",
    "\\ud800",
    "\\x",
    "[" * 40,
    "]" * 40,
    "a = 1\na = 2\n",
    "[tool]\n",
    "[tool.cibuildwheel]\n",
    "\r",
]


@st.composite
def text_mutated(draw: st.DrawFn, seeds: list[str], tokens: list[str]) -> str:
    """One seed text with 1-4 edits: tokens inserted, spans deleted or repeated, lines swapped."""
    text = draw(st.sampled_from(seeds))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(("insert", "delete", "repeat_line", "swap_lines", "char")))
        pos = draw(st.integers(0, len(text)))
        if op == "insert":
            text = text[:pos] + draw(st.sampled_from(tokens)) + text[pos:]
        elif op == "delete":
            text = text[:pos] + text[pos + draw(st.integers(1, 40)) :]
        elif op == "char":
            text = text[:pos] + draw(st.text(min_size=1, max_size=3)) + text[pos + 1 :]
        else:
            lines = text.splitlines(keepends=True) or [""]
            i = draw(st.integers(0, len(lines) - 1))
            j = draw(st.integers(0, len(lines) - 1))
            if op == "repeat_line":
                lines.insert(j, lines[i])
            else:
                lines[i], lines[j] = lines[j], lines[i]
            text = "".join(lines)
    return text


# ------------------------------------------------------------------ seeds and corpus


def _corpus(kind: str) -> list[Path]:
    return sorted(p for p in (CORPUS / kind).iterdir() if p.is_file())


def _yaml_seeds(paths: list[Path]) -> tuple[list[str], list[Any]]:
    texts, datas = [], []
    for p in paths:
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        texts.append(text)
        try:  # the builder's own loader: no alias bomb becomes a seed to copy
            data = parse_yaml(text, p.name).data
        except ConfigError:
            continue
        if isinstance(data, dict):
            datas.append(data)
    return texts, datas


MATRIX_TEXTS, MATRIX_DATA = _yaml_seeds(
    sorted(p for p in CONFIGS.glob("*.yaml") if p.name != "support.yaml") + _corpus("matrix")
)
SUPPORT_TEXTS, SUPPORT_DATA = _yaml_seeds([SUPPORT, *_corpus("support")])


def _toml_seeds() -> tuple[list[str], list[dict[str, Any]]]:
    texts, datas = [], []
    for p in [REPO_ROOT / "pyproject.toml", *_corpus("pyproject")]:
        try:
            text = p.read_text(encoding="utf-8")
            data = tomllib.loads(text)
        except (UnicodeDecodeError, tomllib.TOMLDecodeError, ValueError, RecursionError):
            try:
                texts.append(p.read_text(encoding="utf-8"))
            except UnicodeDecodeError:
                pass
            continue
        texts.append(text)
        datas.append(data)
    return texts, datas


TOML_TEXTS, TOML_DATA = _toml_seeds()


def _toml_string(text: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def toml_dumps(data: dict[str, Any]) -> str:
    """*data* as TOML: one ``"key" = value`` line per top-level key, tables inline."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float) and math.isnan(v):
            return "nan"
        if isinstance(v, float) and math.isinf(v):
            return "inf" if v > 0 else "-inf"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, date):
            return v.isoformat()
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return (
                "{" + ", ".join(f"{_toml_string(str(k))} = {value(x)}" for k, x in v.items()) + "}"
            )
        return _toml_string(str(v))

    return "".join(f"{_toml_string(str(k))} = {value(v)}\n" for k, v in data.items())


# ------------------------------------------------------------------ the targets


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a copy of the support table, where each example writes its files."""
    root = tmp_path_factory.mktemp("fuzz")
    shutil.copy(SUPPORT, root / "support.yaml")
    return root


def _load_matrix(work: Path, payload: bytes) -> tuple[Callable[[], object], set[str]]:
    path = work / "matrix.yaml"
    path.write_bytes(payload)
    files = {
        display_path(path),
        display_path(work / "support.yaml"),
        display_path(SUPPORT),
        "builder/config/defaults.yaml",
    }
    return (lambda: load_settings(CliOverrides(config=str(path)), env={})), files


def _load_support(work: Path, payload: bytes) -> tuple[Callable[[], object], set[str]]:
    path = work / "support-fuzzed.yaml"
    path.write_bytes(payload)
    return (lambda: load_support(path, display_path(path))), {display_path(path)}


def _dump_yaml(data: Any, unicode: bool) -> bytes:
    return yaml.safe_dump(data, allow_unicode=unicode, sort_keys=False).encode("utf-8")


@pytest.mark.promise(
    promise="any build-matrix file is either a configuration or refused as a configuration error "
    "(exit 2) naming the file, the key or line, and what was expected; never a traceback",
    fault="configs/*.yaml and the corpus mutated: values replaced by other types (null, huge and "
    "odd numbers, dates, unicode, 3000-character strings, 120-deep nesting, 400-item lists), "
    "keys deleted, added, renamed, values wrapped in lists and mappings; then as text: "
    "anchors, aliases, tags, tabs, control characters, lines repeated and swapped",
    result="load_settings returns settings or raises ConfigError naming the file (or the support "
    "table's) with a key or line, 'expected' in every message of a structured mutation, no "
    "message over 1200 characters; any other exception fails (make fuzz saves the input)",
)
@fuzz_settings(15)
@given(data=mutated(MATRIX_DATA), unicode=st.booleans())
def test_fuzz_matrix_structured(work: Path, data: Any, unicode: bool) -> None:
    payload = _dump_yaml(data, unicode)
    parse, files = _load_matrix(work, payload)
    check_outcome(parse, files, structured=True, target="matrix", payload=payload, suffix=".yaml")


@fuzz_settings(15)
@given(text=text_mutated(MATRIX_TEXTS, TOKENS_YAML))
def test_fuzz_matrix_text(work: Path, text: str) -> None:
    payload = text.encode("utf-8", "surrogatepass")
    parse, files = _load_matrix(work, payload)
    check_outcome(parse, files, structured=False, target="matrix", payload=payload, suffix=".yaml")


@fuzz_settings(15)
@given(data=mutated(SUPPORT_DATA), unicode=st.booleans())
def test_fuzz_support_structured(work: Path, data: Any, unicode: bool) -> None:
    payload = _dump_yaml(data, unicode)
    parse, files = _load_support(work, payload)
    check_outcome(parse, files, structured=True, target="support", payload=payload, suffix=".yaml")


@fuzz_settings(15)
@given(text=text_mutated(SUPPORT_TEXTS, TOKENS_YAML))
def test_fuzz_support_text(work: Path, text: str) -> None:
    payload = text.encode("utf-8", "surrogatepass")
    parse, files = _load_support(work, payload)
    check_outcome(parse, files, structured=False, target="support", payload=payload, suffix=".yaml")


def _pyproject_parsers(project: Path) -> list[Callable[[], object]]:
    """Every reader of a project's pyproject.toml, each used as the builder uses it."""

    def bounds() -> object:
        found = read_bounds(project)
        if found is not None:  # the bounds are compared with cells' versions later
            found.why_not("3.11", "2.13.0")
            if found.stable_abi is not None:
                found.stable_abi.serves("3.11", "2.13.0")
        return found

    return [
        lambda: buildoptions.from_pyproject(project),
        lambda: projecttest.from_pyproject(project),
        bounds,
        lambda: cell_requirements("2.13.0", project),
    ]


def _check_pyproject(work: Path, payload: bytes, *, structured: bool) -> int:
    """Each reader accepts the file or refuses it as it must; how many refused."""
    project = work / "project"
    project.mkdir(exist_ok=True)
    path = project / "pyproject.toml"
    path.write_bytes(payload)
    refused = 0
    for parse in _pyproject_parsers(project):
        refused += (
            check_outcome(
                parse,
                {str(path), display_path(path)},
                structured=structured,
                target="pyproject",
                payload=payload,
                suffix=".toml",
            )
            is not None
        )
    return refused


@pytest.mark.promise(
    promise="any pyproject.toml is read or refused naming the file and the key or line, by every "
    "reader: [tool.cibuildwheel], [tool.ampforge], [project], [build-system]",
    fault="this repository's pyproject.toml and the corpus mutated structurally (tables replaced "
    "by numbers, strings, arrays; huge numbers, nan, dates, unicode) and as text (brackets, "
    "quotes, 5000-digit integers, duplicate keys, NUL escapes)",
    result="each reader returns or raises ConfigError naming pyproject.toml with a key or line, "
    "saying what was expected; no other exception",
)
@fuzz_settings(30)
@given(data=mutated(TOML_DATA, toml=True))
def test_fuzz_pyproject_structured(work: Path, data: Any) -> None:
    if not isinstance(data, dict):
        data = {"tool": data}  # a TOML document is a table; the mutation made the root a value
    _check_pyproject(work, toml_dumps(data).encode("utf-8"), structured=True)


@fuzz_settings(30)
@given(text=text_mutated(TOML_TEXTS, TOKENS_TOML))
def test_fuzz_pyproject_text(work: Path, text: str) -> None:
    _check_pyproject(work, text.encode("utf-8", "surrogatepass"), structured=False)


#: Every variable a setting is read from (the builder's own, cibuildwheel's options, proxies).
VARIABLES = sorted(
    {
        *BUILDER_ENV.values(),
        *buildoptions.ENV.values(),
        *(k.upper() for k in PROXY_KEYS),
        *PROXY_KEYS,
    }
)
ENV_TEXT = st.one_of(
    st.sampled_from(ODD_STRINGS),
    st.text(max_size=20),
    # an environment's values come from bytes: what is not UTF-8 arrives as surrogate escapes
    st.binary(max_size=12).map(lambda b: b.decode("utf-8", "surrogateescape")),
    st.integers().map(str),
    st.floats().map(str),
    st.sampled_from(["9" * 5000, "1e400", "-0"]),
).filter(lambda v: "\x00" not in v)  # a real environment cannot hold NUL


def _load_env(project: Path, env: dict[str, str]) -> object:
    """The settings and the build options the environment *env* gives (project: no pyproject)."""
    settings_ = load_settings(CliOverrides(config=str(CONFIGS / "matrix.yaml")), env=env)
    return buildoptions.resolve_build_options(project, settings_.config.build_options, env, {})


@pytest.mark.promise(
    promise="any value of a BUILDER_* or proxy variable is taken or refused naming the variable "
    "and what was expected",
    fault="one to four of the builder's variables (its settings, cibuildwheel's options, the "
    "proxies in both cases) set to odd text: huge numbers, nan, unicode digits, bytes "
    "that are not UTF-8, broken URLs, unbalanced quotes",
    result="load_settings and resolve_build_options return or raise ConfigError whose key names "
    "the variable and whose message says what was expected, at most 1200 characters",
)
@fuzz_settings(15)
@given(env=st.dictionaries(st.sampled_from(VARIABLES), ENV_TEXT, min_size=1, max_size=4))
def test_fuzz_environment(work: Path, env: dict[str, str]) -> None:
    project = work / "no-pyproject"
    project.mkdir(exist_ok=True)
    payload = json.dumps(env, ensure_ascii=True).encode()

    check_outcome(
        lambda: _load_env(project, env),
        set(env),
        structured=True,
        target="env",
        payload=payload,
        suffix=".json",
    )


# ------------------------------------------------------------------ the corpus as it is

CORPUS_FILES = [p for kind in ("matrix", "support", "pyproject", "env") for p in _corpus(kind)]


@pytest.mark.parametrize(
    "path", CORPUS_FILES, ids=[f"{p.parent.name}/{p.name}" for p in CORPUS_FILES]
)
def test_corpus_file(work: Path, path: Path) -> None:
    """Each saved input as it is: one named ``ok-*`` is accepted, every other one refused as a
    ConfigError naming the file and the key or line (README.md lists them)."""
    kind = path.parent.name
    payload = path.read_bytes()
    if kind == "pyproject":
        refused = _check_pyproject(work, payload, structured=False)
    else:
        if kind == "matrix":
            parse, files = _load_matrix(work, payload)
        elif kind == "support":
            parse, files = _load_support(work, payload)
        else:
            env = json.loads(payload)
            files = set(env)
            (work / "no-pyproject").mkdir(exist_ok=True)

            def parse() -> object:
                return _load_env(work / "no-pyproject", env)

        refused = (
            check_outcome(
                parse, files, structured=False, target=kind, payload=payload, suffix=path.suffix
            )
            is not None
        )
    if path.name.startswith("ok-"):
        assert not refused, f"{path.name} is a valid input"
    else:
        assert refused, f"{path.name} was accepted; name it ok-* if it is valid"


def test_the_real_files_the_mutations_start_from_are_valid(work: Path) -> None:
    """A mutation of a broken seed would prove little: the seeds themselves load."""
    for config in sorted(CONFIGS.glob("*.yaml")):
        if config.name != "support.yaml":
            assert load_settings(CliOverrides(config=str(config)), env={}).config.matrix.torches
    assert load_support(SUPPORT).knows("2.13.0")
    assert projecttest.from_pyproject(REPO_ROOT).command == "python -m amp.selftest"
    bounds = read_bounds(REPO_ROOT)
    assert bounds is not None and bounds.stable_abi is not None
    assert "torch==2.13.0" in cell_requirements("2.13.0", REPO_ROOT)


def test_the_corpus_has_each_kind() -> None:
    for kind in ("matrix", "support", "pyproject", "env"):
        assert len(_corpus(kind)) >= 3, kind
    assert (CORPUS / "README.md").is_file()
    assert MATRIX_DATA and SUPPORT_DATA and TOML_DATA, "no seed parsed: the mutations need some"


# ------------------------------------------------------------------ explicit cases

MATRIX_OK = "matrix: {arch: [X86], python: ['3.11'], torch: ['2.13.0']}\n"


def _refusal(work: Path, text: str | bytes, name: str = "matrix.yaml") -> tuple[ConfigError, Path]:
    path = work / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    with pytest.raises(ConfigError) as info:
        load_settings(CliOverrides(config=str(path)), env={})
    return info.value, path


def _bomb(levels: int = 9, width: int = 10) -> str:
    lines = [f"l0: &l0 [{', '.join(['lol'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    return "\n".join(lines) + f"\nmatrix: *l{levels - 1}\n"


@pytest.mark.promise(
    promise="a configuration file that is an alias bomb (billion laughs) is refused at once, "
    "naming the file, the line and the key where the aliases blow up",
    fault="a matrix file whose nine anchors of ten aliases each expand to 10^9 values",
    result="ConfigError (exit 2) within 50 MB (the aliases are never expanded), naming file, "
    "line and key and the limit expected; the real support table's aliases still load",
)
def test_an_alias_bomb_is_refused_quickly(work: Path) -> None:
    # Memory, not time, shows the bomb was not expanded (no timed assertions: a loaded
    # machine would make them fail by chance); 10^9 values would take gigabytes.
    tracemalloc.start()
    try:
        exc, path = _refusal(work, _bomb())
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 50 * 2**20, f"{peak / 2**20:.0f} MB"
    assert exc.file == display_path(path) and exc.line is not None and exc.key
    assert "aliases" in said(exc) and "expected" in said(exc), said(exc)
    # ordinary aliases stay fine: the support table uses them for its Python lists
    assert load_support(SUPPORT).pythons("2.13.0", "x86_64")


def test_an_alias_bomb_in_the_support_table_is_refused(work: Path) -> None:
    path = work / "support-bomb.yaml"
    path.write_text(_bomb().replace("matrix:", "torch:"))
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match="aliases") as info:
            load_support(path, "support-bomb.yaml")
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 50 * 2**20, f"{peak / 2**20:.0f} MB"
    assert info.value.file == "support-bomb.yaml" and info.value.line is not None


def test_a_recursive_alias_is_refused(work: Path) -> None:
    exc, _ = _refusal(work, "matrix: &m {arch: *m, python: ['3.11'], torch: ['2.13.0']}\n")
    assert exc.line == 1 and "itself" in said(exc) and "expected" in said(exc)


@pytest.mark.promise(
    promise="deeply nested input (YAML or TOML) is refused with a message, not a Python "
    "RecursionError traceback",
    fault="10000 nested lists in a matrix file, a support table and a pyproject.toml; 10000 "
    "nested mappings in a matrix file",
    result="ConfigError (exit 2) naming the file and the line, saying how deep is allowed (64 "
    "levels)",
)
@pytest.mark.parametrize("opening", ["[", "{a: "])
def test_deep_nesting_is_refused(work: Path, opening: str) -> None:
    closing = "]" if opening == "[" else "}"
    exc, path = _refusal(work, "matrix: " + opening * 10000 + "1" + closing * 10000 + "\n")
    assert exc.file == display_path(path) and exc.line == 1
    assert f"nested more than {MAX_NESTING} levels" in said(exc) and "expected" in said(exc)
    support = work / "deep-support.yaml"
    support.write_text("torch: " + "[" * 10000 + "]" * 10000 + "\n")
    with pytest.raises(ConfigError, match=f"nested more than {MAX_NESTING}") as info:
        load_support(support)
    assert info.value.line == 1


def test_deep_nesting_in_pyproject_is_refused(work: Path) -> None:
    project = work / "deep"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        "[project]\nname = 'x'\nx = " + "[" * 10000 + "]" * 10000 + "\n"
    )
    for parse in _pyproject_parsers(project):
        with pytest.raises(ConfigError, match=f"nested more than {MAX_NESTING}") as info:
            parse()
        assert info.value.file is not None and info.value.file.endswith("pyproject.toml")
        assert info.value.line == 3


@pytest.mark.promise(
    promise="huge numbers in a configuration are refused naming the key, not crashed on",
    fault="an integer of 5000 digits (past Python's int-from-text limit) in a matrix file, a "
    "support table, a pyproject.toml and BUILDER_JOBS; build.jobs 1.0e+300, 2.0 and "
    "10^30; pip.timeout .nan",
    result="ConfigError (exit 2): the 5000-digit integers by file and line, the other values by "
    "file, line and key, BUILDER_JOBS by the variable; each says what was expected, and "
    "the echoed value is shortened",
)
def test_huge_numbers_are_refused(work: Path) -> None:
    exc, _ = _refusal(work, MATRIX_OK + "build: {jobs: " + "9" * 5000 + "}\n")
    assert exc.line == 2 and "digits" in said(exc) and "expected" in said(exc)
    assert len(said(exc)) < MAX_MESSAGE
    for jobs in ("1.0e+300", "2.0", str(10**30)):
        exc, _ = _refusal(work, MATRIX_OK + f"build: {{jobs: {jobs}}}\n")
        assert exc.key == "build.jobs" and exc.line == 2 and "expected" in said(exc), jobs
    exc, _ = _refusal(work, MATRIX_OK + "pip: {timeout: .nan}\n")
    assert exc.key == "pip.timeout" and "expected" in said(exc)
    support = work / "huge-support.yaml"
    support.write_text(
        'torch:\n  "2.13.0": {x86_64: ["3.11"]}\ncross_host_torch: ' + "9" * 5000 + "\n"
    )
    with pytest.raises(ConfigError, match="digits") as info:
        load_support(support)
    assert info.value.line == 3
    with pytest.raises(ConfigError) as info:
        load_settings(
            CliOverrides(config=str(CONFIGS / "matrix.yaml")), env={"BUILDER_JOBS": "9" * 5000}
        )
    assert info.value.key == "environment BUILDER_JOBS" and len(said(info.value)) < 300
    project = work / "huge"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        "[tool.cibuildwheel.environment]\nA = " + "9" * 5000 + "\n"
    )
    for parse in _pyproject_parsers(project):
        with pytest.raises(ConfigError, match="digits") as info:
            parse()
        assert info.value.line == 2


def test_huge_versions_are_refused(work: Path) -> None:
    huge = "9" * 1000  # a YAML key holds at most 1024 characters
    exc, _ = _refusal(work, f"matrix: {{arch: [X86], python: ['3.11'], torch: ['{huge}.0.0']}}\n")
    assert exc.key == "matrix.torch[0]" and "expected" in said(exc)
    support = work / "huge-version.yaml"
    support.write_text(f'torch:\n  "{huge}.0.0":\n    x86_64: ["3.11"]\n')
    with pytest.raises(ConfigError, match="torch release") as info:
        load_support(support)
    assert info.value.line == 2 and len(said(info.value)) < MAX_MESSAGE
    with pytest.raises(ConfigError) as info:
        load_settings(
            CliOverrides(config=str(CONFIGS / "matrix.yaml")), env={"BUILDER_CUDA": f"cu{huge}"}
        )
    assert info.value.key == "environment BUILDER_CUDA"


@pytest.mark.promise(
    promise="a key written twice is refused naming the key and both lines, never resolved "
    "silently to the last value",
    fault="a duplicated key at the top level, inside matrix, inside a support table's torch "
    "entry; a duplicated key in a pyproject.toml",
    result="ConfigError (exit 2) naming the file, the second line and the key path, and the "
    "first line in the message (TOML: the line tomllib reports)",
)
def test_duplicate_keys_are_refused_naming_both_lines(work: Path) -> None:
    exc, path = _refusal(work, MATRIX_OK + "pip: {retries: 1}\npip: {retries: 2}\n")
    assert (exc.file, exc.line, exc.key) == (display_path(path), 3, "pip")
    assert "first defined on line 2" in said(exc)
    exc, _ = _refusal(
        work, "matrix:\n  arch: [X86]\n  python: ['3.11']\n  arch: [ARM]\n  torch: ['2.13.0']\n"
    )
    assert (exc.line, exc.key) == (4, "matrix.arch") and "line 2" in said(exc)
    support = work / "dup-support.yaml"
    support.write_text('torch:\n  "2.13.0":\n    x86_64: ["3.11"]\n    x86_64: ["3.12"]\n')
    with pytest.raises(ConfigError, match="first defined on line 3") as info:
        load_support(support)
    assert (info.value.line, info.value.key) == (4, "torch.2.13.0.x86_64")
    project = work / "dup"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        "[tool.cibuildwheel]\ntest-command = 'a'\ntest-command = 'b'\n"
    )
    for parse in _pyproject_parsers(project):
        with pytest.raises(ConfigError) as info:
            parse()
        assert info.value.line == 3, str(info.value)


def test_two_complex_keys_are_not_reported_as_a_duplicate(work: Path) -> None:
    exc, _ = _refusal(work, MATRIX_OK + "? [a]\n: 1\n? [b]\n: 2\n")
    assert "duplicate" not in said(exc) and "None" not in str(exc), str(exc)
    assert "expected" in said(exc) or "unhashable" in said(exc)


@pytest.mark.promise(
    promise="a configuration file that is not UTF-8 is refused naming the file and the line of "
    "the first byte that is not, by every reader",
    fault="bytes 0xff 0xfe in a matrix file, a Latin-1 0xe9 in a support table's comment and in "
    "a pyproject.toml",
    result="ConfigError (exit 2) naming the file, line 2 and the byte, and that a UTF-8 file was "
    "expected, from the matrix and support loaders and all four pyproject readers",
)
def test_bytes_that_are_not_utf8_are_refused(work: Path) -> None:
    exc, path = _refusal(work, b"matrix:\n  arch: [\xff\xfe]\n")
    assert (exc.file, exc.line) == (display_path(path), 2)
    assert "0xff" in said(exc) and "expected a UTF-8" in said(exc), str(exc)
    support = work / "latin1-support.yaml"
    support.write_bytes(b'torch:\n  "2.13.0": {x86_64: ["3.11"]}  # caf\xe9\n')
    with pytest.raises(ConfigError, match="0xe9 is not UTF-8") as info:
        load_support(support)
    assert info.value.line == 2
    project = work / "latin1"
    project.mkdir()
    (project / "pyproject.toml").write_bytes(b"[project]\nname = 'caf\xe9'\n")
    for parse in _pyproject_parsers(project):
        with pytest.raises(ConfigError, match="expected a UTF-8") as info:
            parse()
        assert info.value.file is not None and info.value.file.endswith("pyproject.toml")
        assert info.value.line == 2 and "0xe9" in said(info.value)


def test_empty_files(work: Path) -> None:
    exc, _ = _refusal(work, "")
    assert "empty" in said(exc) and "expected" in said(exc)
    exc, _ = _refusal(work, "# only a comment\n")
    assert "empty" in said(exc)
    support = work / "empty-support.yaml"
    support.write_text("")
    with pytest.raises(ConfigError, match="expected a mapping with the key 'torch'"):
        load_support(support)
    project = work / "empty"
    project.mkdir()
    (project / "pyproject.toml").write_text("")
    assert buildoptions.from_pyproject(project) == buildoptions.NO_OPTIONS  # empty TOML: nothing
    assert projecttest.from_pyproject(project) == projecttest.NO_TEST
    assert read_bounds(project) is None


def test_a_folder_where_a_file_is_expected(work: Path) -> None:
    folder = work / "config-folder"
    folder.mkdir()
    res = run_cli("plan", "--config", str(folder))
    assert res.rc == 2 and "Traceback" not in res.err and str(folder) in res.err, res.err
    with pytest.raises(ConfigError, match="is a folder; expected") as info:
        load_settings(CliOverrides(config=str(folder)), env={})
    assert info.value.file == display_path(folder)
    (work / "support-folder").mkdir()
    exc, _ = _refusal(work, "support: support-folder\n" + MATRIX_OK)
    assert exc.key == "support" and "is a folder" in said(exc) and "expected" in said(exc)
    project = work / "folder-project"
    (project / "pyproject.toml").mkdir(parents=True)
    for parse in _pyproject_parsers(project):
        with pytest.raises(ConfigError, match="is a folder; expected") as info:
            parse()


def test_a_path_with_a_nul_byte_is_refused(work: Path) -> None:
    for key in ("support", "ca_bundle", "offline.wheelhouse", "offline.bundle"):
        head, _, last = key.rpartition(".")
        value = '"a\\0b"'
        text = f"{head}: {{{last}: {value}}}\n" if head else f"{last}: {value}\n"
        exc, _ = _refusal(work, text + MATRIX_OK)
        assert exc.key == key and exc.line == 1 and "expected" in said(exc), str(exc)


def test_pyproject_tables_of_the_wrong_type_name_the_key(work: Path) -> None:
    project = work / "types"
    project.mkdir()
    path = project / "pyproject.toml"
    cases = {
        "tool = 1\n": "tool",
        "[project]\nname = 'x'\n[tool]\nampforge = 1\n": "tool.ampforge",
        "[project]\nname = 'x'\ndependencies = 1\n": "project.dependencies",
        "[project]\nname = 'x'\n[tool.ampforge]\nstable-abi = [1]\n": "tool.ampforge.stable-abi",
    }
    for text, key in cases.items():
        path.write_text(text)
        refused = 0
        for parse in _pyproject_parsers(project):
            try:
                parse()
            except ConfigError as exc:
                refused += 1
                assert exc.key == key and "expected" in said(exc), (text, str(exc))
        assert refused, text


def test_url_errors_say_what_was_expected(work: Path) -> None:
    for text in (
        'pip: {index_url: "http://[::1"}\n',
        'proxy: {http_proxy: "http://[::1"}\n',
        'proxy: {http_proxy: "http://a\u2100b:1"}\n',
    ):
        exc, _ = _refusal(work, text + MATRIX_OK)
        assert exc.line == 1 and "expected" in said(exc), str(exc)
    with pytest.raises(ConfigError, match="expected") as info:
        load_settings(
            CliOverrides(config=str(CONFIGS / "matrix.yaml")), env={"HTTPS_PROXY": "http://[::1"}
        )
    assert info.value.key == "environment HTTPS_PROXY"


@pytest.mark.parametrize(
    "text",
    [
        _bomb(),
        "matrix: " + "[" * 10000 + "]" * 10000 + "\n",
        MATRIX_OK + "build: {jobs: " + "9" * 5000 + "}\n",
        "support: 2020-13-45\n" + MATRIX_OK,
    ],
    ids=["alias-bomb", "deep", "huge-int", "bad-date"],
)
def test_the_command_line_exits_2_without_a_traceback(work: Path, text: str) -> None:
    path = work / "cli.yaml"
    path.write_text(text)
    res = run_cli("plan", "--config", str(path))
    assert res.rc == 2, res.err
    assert res.err.startswith(f"error: {path}:"), res.err
    assert "Traceback" not in res.err and len(res.err) < MAX_MESSAGE + 200


def test_the_toml_writer_round_trips() -> None:
    data = {
        "tool": {
            "cibuildwheel": {"environment": {"A": 'x"\\\n\x7f\U0001f600'}},
            "n": [1, -2.5, True, date(2020, 1, 2)],
        }
    }
    assert tomllib.loads(toml_dumps(data)) == data
