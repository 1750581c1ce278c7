"""Load, validate and merge the build configuration.

Precedence, lowest to highest (each layer overrides the ones before it):

1. built-in defaults -- ``builder/config/defaults.yaml`` (everything but the matrix);
2. the config file -- ``--config FILE``, default ``configs/matrix.yaml``;
3. the environment -- ``ARCH``, ``PY``, ``TORCH`` (selection), ``JOBS``, ``OFFLINE``,
   ``BUILDER_CA_BUNDLE`` and the proxy variables ``HTTP_PROXY``, ``HTTPS_PROXY``,
   ``NO_PROXY``, ``ALL_PROXY`` in either case (lower case wins when both are set);
   empty variables count as unset, so ``make`` can pass ``ARCH=`` harmlessly;
4. the command line -- ``--arch``, ``--python``, ``--torch``, ``--jobs``,
   ``--offline/--no-offline``, ``--ca-bundle``, ``--http-proxy`` ...

Mappings merge key by key between layers 1 and 2; lists replace. The file is checked
against ``builder.config.schema`` (structure) and then value by value (``builder.config.values``);
every error names the file, the line, the key and what was expected, and exits 2.
Relative paths in a file are relative to that file; on the command line or in the
environment, to the working directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import jsonschema

from builder.arch import ARCHES, arch_name
from builder.config import values
from builder.config.proxy import PROXY_KEYS, ProxySettings, proxies_from_env
from builder.config.schema import CONFIG_SCHEMA
from builder.config.support import SupportTable, load_support
from builder.config.yamlfile import PathKey, YamlDocument, format_path, load_yaml
from builder.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_CONFIG = REPO_ROOT / "configs" / "matrix.yaml"
DEFAULTS_FILE = Path(__file__).resolve().with_name("defaults.yaml")


def display_path(path: Path) -> str:
    """A stable name for messages and rendered headers: repository-relative when inside it."""
    path = Path(os.path.abspath(path))
    try:
        return path.relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return str(path)


# --------------------------------------------------------------------------- types


@dataclass(frozen=True)
class MatrixRule:
    """One ``include`` or ``exclude`` entry; ``None`` on an axis matches anything."""

    kind: str  # "include" | "exclude"
    index: int
    arch: tuple[str, ...] | None
    python: tuple[str, ...] | None
    torch: tuple[str, ...] | None
    file: str
    line: int | None

    @property
    def key(self) -> str:
        return f"matrix.{self.kind}[{self.index}]"

    def matches(self, arch: str, python: str, torch: str) -> bool:
        return (
            (self.arch is None or arch in self.arch)
            and (self.python is None or python in self.python)
            and (self.torch is None or torch in self.torch)
        )

    def describe(self) -> str:
        parts = [
            f"{name}={','.join(vals)}"
            for name, vals in (("arch", self.arch), ("python", self.python), ("torch", self.torch))
            if vals is not None
        ]
        return f"{self.key} ({' '.join(parts)})"


@dataclass(frozen=True)
class MatrixSpec:
    arches: tuple[str, ...]
    pythons: tuple[str, ...]
    torches: tuple[str, ...]
    include: tuple[MatrixRule, ...] = ()
    exclude: tuple[MatrixRule, ...] = ()


@dataclass(frozen=True)
class BaseImage:
    """The image a cell's recipe starts FROM, and how to drive it."""

    ref: str
    family: str  # "manylinux" (dnf/yum, update-ca-trust) | "debian" (apt, update-ca-certificates)
    plat: str  # manylinux tag the repaired wheel gets, e.g. manylinux_2_28_x86_64
    python_path: str  # with {cp} / {version} placeholders


@dataclass(frozen=True)
class BuildOptions:
    jobs: int | None
    extra_cflags: tuple[str, ...]
    auditwheel_exclude: tuple[str, ...]


@dataclass(frozen=True)
class PipOptions:
    index_url: str | None
    extra_index_urls: tuple[str, ...]


@dataclass(frozen=True)
class OfflineOptions:
    enabled: bool
    wheelhouse: Path
    #: ``fetch --bundle`` folder (config offline.bundle < env BUNDLE < --bundle); None: none
    bundle: Path | None = None


@dataclass(frozen=True)
class PublishOptions:
    repository_url: str | None  # where `publish` uploads; credentials never live here


@dataclass(frozen=True)
class BuildConfig:
    """The fully merged, validated configuration (everything but the selection)."""

    source: Path | None
    source_name: str
    matrix: MatrixSpec
    images: Mapping[str, BaseImage]
    build: BuildOptions
    pip: PipOptions
    proxy: ProxySettings
    ca_bundle: Path | None
    offline: OfflineOptions
    support: SupportTable
    origins: Mapping[str, str] = field(default_factory=dict)
    publish: PublishOptions = PublishOptions(repository_url=None)


@dataclass(frozen=True)
class Selection:
    """Which cells a command acts on; ``None`` on an axis means 'not named'."""

    arch: tuple[str, ...] | None = None
    python: tuple[str, ...] | None = None
    torch: tuple[str, ...] | None = None
    patterns: tuple[str, ...] = ()  # fnmatch patterns on cell identifiers
    origins: Mapping[str, str] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return (
            self.arch is None and self.python is None and self.torch is None and not self.patterns
        )


@dataclass(frozen=True)
class CliOverrides:
    """The command-line layer; ``None`` means 'option not given'."""

    config: str | None = None
    arch: str | None = None
    python: str | None = None
    torch: str | None = None
    patterns: tuple[str, ...] = ()
    jobs: int | None = None
    offline: bool | None = None
    bundle: str | None = None  # --bundle (build, fetch)
    ca_bundle: str | None = None
    http_proxy: str | None = None
    https_proxy: str | None = None
    no_proxy: str | None = None
    all_proxy: str | None = None


@dataclass(frozen=True)
class Settings:
    config: BuildConfig
    selection: Selection


# ------------------------------------------------------------------ schema errors

_TYPE_WORDS = {
    "string": "a string",
    "array": "a list",
    "object": "a mapping",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "null": "null",
}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "mapping"
    return type(value).__name__


def _schema_message(err: jsonschema.ValidationError) -> tuple[PathKey, str]:
    """Translate one jsonschema error into (path of the offending key, message)."""
    path: PathKey = tuple(err.absolute_path)
    v = err.validator
    inst = err.instance
    if v == "additionalProperties":
        allowed = sorted(err.schema.get("properties", {}))
        extra = sorted(str(k) for k in inst if k not in err.schema.get("properties", {}))
        key = extra[0]
        return path + (key,), f"unknown key {key!r}; expected one of: {', '.join(allowed)}"
    if v == "required":
        missing = [k for k in err.validator_value if k not in inst]
        need = ", ".join(err.validator_value)
        return path, f"missing required key {missing[0]!r}; expected all of: {need}"
    if v == "type":
        want = err.validator_value
        want_list = want if isinstance(want, list) else [want]
        words = " or ".join(_TYPE_WORDS.get(w, w) for w in want_list)
        msg = f"expected {words}, got {_kind(inst)} {inst!r}"
        if "string" in want_list and isinstance(inst, (int, float)) and not isinstance(inst, bool):
            msg += " (quote versions: YAML reads 3.10 as the number 3.1)"
        return path, msg
    if v == "enum":
        choices = ", ".join(str(c) for c in err.validator_value)
        return path, f"expected one of {choices}, got {inst!r}"
    if v == "uniqueItems":
        return path, "has duplicate items; expected each value once"
    if v == "minProperties":
        return path, "an empty rule; expected at least one of arch, python, torch"
    if v == "anyOf":
        last = path[-1] if path else ""
        if last == "jobs":
            return path, f"expected a positive integer or null, got {_kind(inst)} {inst!r}"
        return path, f"expected a string or a non-empty list of strings, got {_kind(inst)} {inst!r}"
    if v == "minimum":
        return path, f"expected at least {err.validator_value}, got {inst!r}"
    return path, err.message  # pragma: no cover - every validator used is handled above


def _check_schema(doc: YamlDocument, require_matrix: bool) -> None:
    data = doc.data
    if data is None:
        raise ConfigError(
            "the file is empty; expected a mapping with at least 'matrix'", file=doc.file
        )
    if not isinstance(data, dict):
        raise ConfigError(
            f"expected a mapping at the top level, got {_kind(data)}",
            file=doc.file,
            line=doc.line(()),
        )
    schema = CONFIG_SCHEMA if require_matrix else {**CONFIG_SCHEMA, "required": []}
    errors = []
    for err in jsonschema.Draft202012Validator(schema).iter_errors(data):
        path, msg = _schema_message(err)
        errors.append((doc.line(path) or 0, format_path(path), msg))
    if errors:
        errors.sort()
        line, key, msg = errors[0]
        more = ""
        if len(errors) > 1:
            rest = "; ".join(f"line {ln}: {k}: {m}" for ln, k, m in errors[1:4])
            more = f" (and {len(errors) - 1} more: {rest})"
        raise ConfigError(msg + more, file=doc.file, line=line or None, key=key or None)


# ------------------------------------------------------------------ value checks


def _strict_arch(value: str) -> str:
    if value not in ARCHES:
        raise ValueError(f"unknown arch {value!r}; expected one of {', '.join(ARCHES)}")
    return value


_AXIS_PARSERS: dict[str, Callable[[str], str]] = {
    "arch": _strict_arch,
    "python": values.python_version,
    "torch": values.torch_version,
}
_AXIS_WORDS = {"arch": "arch", "python": "Python version", "torch": "torch version"}


def _check_values(doc: YamlDocument) -> None:
    """Value-level checks of a schema-valid document (file or defaults)."""
    data: dict[str, Any] = doc.data

    def check(path: PathKey, parse: Callable[[str], Any], value: str) -> None:
        try:
            parse(value)
        except ValueError as exc:
            raise ConfigError(
                str(exc), file=doc.file, line=doc.line(path), key=format_path(path)
            ) from None

    matrix = data.get("matrix")
    if matrix is not None:
        for axis, parse in _AXIS_PARSERS.items():
            items = matrix[axis]
            if not items:
                p = ("matrix", axis)
                raise ConfigError(
                    f"empty list; expected at least one {_AXIS_WORDS[axis]} "
                    "(an empty axis means an empty matrix)",
                    file=doc.file,
                    line=doc.line(p),
                    key=format_path(p),
                )
            for i, item in enumerate(items):
                check(("matrix", axis, i), parse, item)
        for kind in ("include", "exclude"):
            for i, rule in enumerate(matrix.get(kind, [])):
                for axis, value in rule.items():
                    items = [value] if isinstance(value, str) else value
                    for item in items:
                        check(("matrix", kind, i, axis), _AXIS_PARSERS[axis], item)
    for name, image in (data.get("images") or {}).items():
        machine = ARCHES[name].machine
        if "base" in image:
            check(("images", name, "base"), values.image_ref, image["base"])
        if "plat" in image:
            check(("images", name, "plat"), lambda v, m=machine: values.plat(v, m), image["plat"])
        if "python_path" in image:
            check(("images", name, "python_path"), values.python_path, image["python_path"])
    build = data.get("build") or {}
    for i, flag in enumerate(build.get("extra_cflags", [])):
        check(("build", "extra_cflags", i), values.cflag, flag)
    for i, lib in enumerate(build.get("auditwheel_exclude", [])):
        check(("build", "auditwheel_exclude", i), values.lib_pattern, lib)
    pip = data.get("pip") or {}
    if pip.get("index_url") is not None:
        check(("pip", "index_url"), values.index_url, pip["index_url"])
    for i, url in enumerate(pip.get("extra_index_urls", [])):
        check(("pip", "extra_index_urls", i), values.index_url, url)
    repository_url = (data.get("publish") or {}).get("repository_url")
    if repository_url is not None:
        # Same rules as an index URL: plain http(s), no user:password in a config file.
        check(("publish", "repository_url"), values.index_url, repository_url)
    for key, value in (data.get("proxy") or {}).items():
        if value is not None:
            parse = values.no_proxy if key == "no_proxy" else values.proxy_url
            check(("proxy", key), parse, value)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Mappings merge key by key; anything else (lists included) is replaced."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _as_tuple(value: str | list[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return (value,) if isinstance(value, str) else tuple(value)


# ------------------------------------------------------------------ layers


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _parse_selection_axis(raw: str, axis: str, origin: str) -> tuple[str, ...]:
    parse = {"arch": arch_name, "python": values.python_version, "torch": values.torch_version}[
        axis
    ]
    items = _split(raw)
    if not items:
        raise ConfigError(f"empty value; expected a {_AXIS_WORDS[axis]}", key=origin)
    out = []
    for item in items:
        try:
            out.append(parse(item))
        except ValueError as exc:
            raise ConfigError(str(exc), key=origin) from None
    return tuple(dict.fromkeys(out))


def _parse_bool(raw: str, origin: str) -> bool:
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"expected 1/0, true/false or yes/no, got {raw!r}", key=origin)


def _parse_jobs(raw: str, origin: str) -> int:
    try:
        jobs = int(raw)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise ConfigError(f"expected a positive integer, got {raw!r}", key=origin)
    return jobs


def _ca_bundle(path: Path, origin: str, doc: YamlDocument | None = None) -> Path:
    """A readable PEM file; resolved to an absolute path."""
    line = doc.line(("ca_bundle",)) if doc is not None else None
    file = doc.file if doc is not None else None
    if not path.is_file():
        raise ConfigError(
            f"CA bundle {str(path)!r} does not exist; expected a PEM file",
            file=file,
            line=line,
            key=origin,
        )
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError as exc:
        raise ConfigError(
            f"cannot read CA bundle {str(path)!r}: {exc}", file=file, line=line, key=origin
        ) from None
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise ConfigError(
            f"{str(path)!r} holds no certificate; "
            "expected a PEM file with '-----BEGIN CERTIFICATE-----'",
            file=file,
            line=line,
            key=origin,
        )
    return Path(os.path.abspath(path))


def _env(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    return value if value else None


def load_config_file(path: Path) -> tuple[YamlDocument, YamlDocument]:
    """Parse and check the defaults and the config file; returns both documents."""
    defaults = load_yaml(DEFAULTS_FILE, display_path(DEFAULTS_FILE))
    _check_schema(defaults, require_matrix=False)
    _check_values(defaults)
    doc = load_yaml(path, display_path(path))
    _check_schema(doc, require_matrix=True)
    _check_values(doc)
    return defaults, doc


def load_settings(
    cli: CliOverrides | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Merge all four layers into validated Settings; raises ConfigError (exit 2)."""
    cli = cli or CliOverrides()
    env = os.environ if env is None else env
    config_path = Path(cli.config) if cli.config else DEFAULT_CONFIG
    defaults, doc = load_config_file(config_path)
    merged = _merge(defaults.data, doc.data)
    origins: dict[str, str] = {}
    file_origin = f"config file {doc.file}"

    def origin_of(*path: str) -> tuple[str, YamlDocument]:
        """Which document supplied *path* (for relative paths and line numbers)."""
        node: Any = doc.data
        for p in path:
            if not isinstance(node, dict) or p not in node:
                return "built-in default", defaults
            node = node[p]
        return file_origin, doc

    # support table: relative to whichever file named it
    sup_origin, sup_doc = origin_of("support")
    base_dir = Path(
        sup_doc.file if Path(sup_doc.file).is_absolute() else REPO_ROOT / sup_doc.file
    ).parent
    support_path = (base_dir / merged["support"]).resolve()
    if not support_path.is_file():
        raise ConfigError(
            f"support table {merged['support']!r} not found (looked for {support_path}); "
            "expected a YAML file like configs/support.yaml",
            file=sup_doc.file,
            line=sup_doc.line(("support",)),
            key="support",
        )
    support = load_support(support_path, display_path(support_path))

    # matrix
    m = merged["matrix"]
    for i, torch in enumerate(m["torch"]):
        if not support.knows(torch):
            p = ("matrix", "torch", i)
            raise ConfigError(
                f"torch {torch} is not in the support table {support.file}; expected one of "
                f"{', '.join(support.wheels)} (add a line there for a new release)",
                file=doc.file,
                line=doc.line(p),
                key=format_path(p),
            )
    rules: dict[str, list[MatrixRule]] = {"include": [], "exclude": []}
    for kind in rules:
        for i, raw in enumerate(m.get(kind, [])):
            rule = MatrixRule(
                kind=kind,
                index=i,
                arch=_as_tuple(raw.get("arch")),
                python=_as_tuple(raw.get("python")),
                torch=_as_tuple(raw.get("torch")),
                file=doc.file,
                line=doc.line(("matrix", kind, i)),
            )
            if kind == "include" and rule.torch and not support.knows(rule.torch[0]):
                p = ("matrix", kind, i, "torch")
                raise ConfigError(
                    f"torch {rule.torch[0]} is not in the support table {support.file}; "
                    f"expected one of {', '.join(support.wheels)}",
                    file=doc.file,
                    line=doc.line(p),
                    key=format_path(p),
                )
            rules[kind].append(rule)
    matrix = MatrixSpec(
        arches=tuple(m["arch"]),
        pythons=tuple(m["python"]),
        torches=tuple(m["torch"]),
        include=tuple(rules["include"]),
        exclude=tuple(rules["exclude"]),
    )

    images = {
        name: BaseImage(
            ref=img["base"], family=img["family"], plat=img["plat"], python_path=img["python_path"]
        )
        for name, img in merged["images"].items()
    }

    # build options: jobs has all four layers
    jobs = merged["build"]["jobs"]
    origins["jobs"] = origin_of("build", "jobs")[0]
    if _env(env, "JOBS"):
        jobs, origins["jobs"] = _parse_jobs(env["JOBS"], "environment JOBS"), "environment JOBS"
    if cli.jobs is not None:
        jobs, origins["jobs"] = _parse_jobs(str(cli.jobs), "--jobs"), "command line --jobs"
    build = BuildOptions(
        jobs=jobs,
        extra_cflags=tuple(merged["build"]["extra_cflags"]),
        auditwheel_exclude=tuple(merged["build"]["auditwheel_exclude"]),
    )
    pip = PipOptions(
        index_url=merged["pip"]["index_url"],
        extra_index_urls=tuple(merged["pip"]["extra_index_urls"]),
    )

    # offline
    off = merged["offline"]
    offline_enabled = off["enabled"]
    origins["offline"] = origin_of("offline", "enabled")[0]
    if _env(env, "OFFLINE"):
        offline_enabled = _parse_bool(env["OFFLINE"], "environment OFFLINE")
        origins["offline"] = "environment OFFLINE"
    if cli.offline is not None:
        offline_enabled, origins["offline"] = cli.offline, "command line --offline"
    wh_doc = origin_of("offline", "wheelhouse")[1]
    wh_base = (
        (REPO_ROOT / wh_doc.file).parent
        if not Path(wh_doc.file).is_absolute()
        else Path(wh_doc.file).parent
    )
    bundle: Path | None = None
    if off.get("bundle"):
        b_doc = origin_of("offline", "bundle")[1]
        b_file = Path(b_doc.file)
        bundle = Path(os.path.normpath(
            (b_file if b_file.is_absolute() else REPO_ROOT / b_file).parent / off["bundle"]))
        origins["bundle"] = origin_of("offline", "bundle")[0]
    if _env(env, "BUNDLE"):
        bundle, origins["bundle"] = Path(os.path.abspath(env["BUNDLE"])), "environment BUNDLE"
    if cli.bundle is not None:
        bundle, origins["bundle"] = Path(os.path.abspath(cli.bundle)), "command line --bundle"
    offline = OfflineOptions(
        enabled=offline_enabled, wheelhouse=Path(os.path.normpath(wh_base / off["wheelhouse"])),
        bundle=bundle,
    )

    # proxies
    proxy_values: dict[str, str | None] = {}
    proxy_origins: dict[str, str] = {}
    for key in PROXY_KEYS:
        proxy_values[key] = merged["proxy"][key]
        proxy_origins[key] = origin_of("proxy", key)[0]
    for key, (value, name) in proxies_from_env(env).items():
        _check_proxy(key, value, f"environment {name}")
        proxy_values[key], proxy_origins[key] = value, f"environment {name}"
    for key in PROXY_KEYS:
        value = getattr(cli, key)
        if value is not None:
            opt = "--" + key.replace("_", "-")
            _check_proxy(key, value, opt)
            proxy_values[key], proxy_origins[key] = value or None, f"command line {opt}"
    proxy = ProxySettings(values=proxy_values, origins=proxy_origins)

    # CA bundle
    ca: Path | None = None
    if merged["ca_bundle"] is not None:
        ca_origin, ca_doc = origin_of("ca_bundle")
        base = (
            Path(ca_doc.file).parent
            if Path(ca_doc.file).is_absolute()
            else (REPO_ROOT / ca_doc.file).parent
        )
        ca = _ca_bundle(base / merged["ca_bundle"], "ca_bundle", ca_doc)
        origins["ca_bundle"] = ca_origin
    if _env(env, "BUILDER_CA_BUNDLE"):
        ca = _ca_bundle(Path(env["BUILDER_CA_BUNDLE"]), "environment BUILDER_CA_BUNDLE")
        origins["ca_bundle"] = "environment BUILDER_CA_BUNDLE"
    if cli.ca_bundle is not None:
        ca = _ca_bundle(Path(cli.ca_bundle), "--ca-bundle")
        origins["ca_bundle"] = "command line --ca-bundle"

    config = BuildConfig(
        source=Path(os.path.abspath(config_path)),
        source_name=doc.file,
        matrix=matrix,
        images=images,
        build=build,
        pip=pip,
        proxy=proxy,
        ca_bundle=ca,
        offline=offline,
        support=support,
        origins=origins,
        publish=PublishOptions(repository_url=merged["publish"]["repository_url"]),
    )
    if merged["publish"]["repository_url"] is not None:
        origins["publish.repository_url"] = origin_of("publish", "repository_url")[0]
    return Settings(config=config, selection=_selection(cli, env))


def _check_proxy(key: str, value: str, origin: str) -> None:
    if value == "":
        return
    try:
        (values.no_proxy if key == "no_proxy" else values.proxy_url)(value)
    except ValueError as exc:
        # The message never repeats the value: it may carry a password.
        raise ConfigError(str(exc), key=origin) from None


def _selection(cli: CliOverrides, env: Mapping[str, str]) -> Selection:
    picked: dict[str, tuple[str, ...] | None] = {}
    origins: dict[str, str] = {}
    for axis, env_name, cli_value in (
        ("arch", "ARCH", cli.arch),
        ("python", "PY", cli.python),
        ("torch", "TORCH", cli.torch),
    ):
        picked[axis] = None
        if _env(env, env_name):
            origins[axis] = f"environment {env_name}"
            picked[axis] = _parse_selection_axis(env[env_name], axis, origins[axis])
        if cli_value is not None:
            origins[axis] = f"command line --{axis}"
            picked[axis] = _parse_selection_axis(cli_value, axis, origins[axis])
    return Selection(
        arch=picked["arch"],
        python=picked["python"],
        torch=picked["torch"],
        patterns=tuple(cli.patterns),
        origins=origins,
    )


def parse_config_text(text: str, name: str = "<config>") -> YamlDocument:
    """Parse and check a configuration given as text (used by tests and tools)."""
    from builder.config.yamlfile import parse_yaml

    doc = parse_yaml(text, name)
    _check_schema(doc, require_matrix=True)
    _check_values(doc)
    return doc


__all__: Sequence[str] = (
    "BaseImage",
    "BuildConfig",
    "BuildOptions",
    "CliOverrides",
    "MatrixRule",
    "MatrixSpec",
    "OfflineOptions",
    "PipOptions",
    "PublishOptions",
    "Selection",
    "Settings",
    "load_settings",
    "display_path",
)
