"""Load, validate and merge the build configuration.

Precedence, lowest to highest (each layer overrides the ones before it):

1. built-in defaults -- ``builder/config/defaults.yaml`` (everything but the matrix);
2. the config file -- ``--config FILE``, default ``configs/matrix.yaml``;
3. the environment -- the builder's own variables are namespaced (``BUILDER_ARCH``,
   ``BUILDER_PYTHON``, ``BUILDER_TORCH``, ``BUILDER_JOBS``, ``BUILDER_OFFLINE``,
   ``BUILDER_BUNDLE``, ``BUILDER_BACKEND``, ``BUILDER_BASE_IMAGE``, ``BUILDER_NETWORK``,
   ``BUILDER_PULL``, ``BUILDER_CA_BUNDLE``, ``BUILDER_PIP_RETRIES``, ``BUILDER_PIP_TIMEOUT``: see
   :data:`ENV`), so a shell whose ``ARCH`` means
   something else (conda-forge sets ``ARCH=64``) does not steer a build; the standard proxy
   variables ``HTTP_PROXY``, ``HTTPS_PROXY``, ``NO_PROXY``, ``ALL_PROXY`` in either case
   (lower case wins when both are set); empty variables count as unset;
4. the command line -- ``--arch``, ``--python``, ``--torch``, ``--jobs``,
   ``--offline/--no-offline``, ``--bundle``, ``--backend``, ``--base-image``, ``--network``,
   ``--pull``, ``--ca-bundle``, ``--http-proxy`` ... (``make wheel ARCH=ARM PY=3.9`` passes
   these flags).

Mappings merge key by key between layers 1 and 2; lists replace. The file is checked
against ``builder.config.schema`` (structure) and then value by value (``builder.config.values``);
every error names the file, the line, the key and what was expected, and exits 2.
Relative paths in a file are relative to that file; on the command line or in the
environment, to the working directory.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from builder import backend_kinds
from builder.arch import arch_name
from builder.config import buildoptions, cudaconfig, projecttest, values
from builder.config.cabundle import ca_bundle_problem
from builder.config.checks import _AXIS_WORDS, _as_tuple, _merge, load_config_file
from builder.config.cuda import parse_arch_list
from builder.config.model import (
    DEFAULT_CONFIG,
    INSTALLED,
    REPO_ROOT,
    BaseImage,
    BuildConfig,
    BuildOptions,
    CliOverrides,
    MatrixRule,
    MatrixSpec,
    OfflineOptions,
    PipOptions,
    PublishOptions,
    Selection,
    Settings,
    display_path,
)
from builder.config.proxy import PROXY_KEYS, ProxySettings, proxies_from_env
from builder.config.schema import JOBS_MAX
from builder.config.support import SupportTable, load_support
from builder.config.yamlfile import YamlDocument, brief, clip, format_path, path_problem
from builder.errors import ConfigError
from builder.netpip import NetworkOptions
from builder.redact import redact_url_credentials

# ------------------------------------------------------------------ layers


def _split(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _parse_selection_axis(raw: str, axis: str, origin: str) -> tuple[str, ...]:
    parse = {
        "arch": arch_name,
        "python": values.python_version,
        "torch": values.torch_version,
        "cuda": values.cuda_version,
    }[axis]
    items = _split(raw)
    if not items:
        raise ConfigError(f"empty value; expected a {_AXIS_WORDS[axis]}", key=origin)
    out = []
    for item in items:
        try:
            out.append(parse(item))
        except ValueError as exc:
            # arch_name quotes the whole value: a shorter quote of a long one
            raise ConfigError(str(exc).replace(repr(item), brief(item)), key=origin) from None
    return tuple(dict.fromkeys(out))


def _parse_bool(raw: str, origin: str) -> bool:
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"expected 1/0, true/false or yes/no, got {brief(raw)}", key=origin)


def _parse_jobs(raw: str, origin: str) -> int:
    try:
        jobs = int(raw)
    except ValueError:
        jobs = 0
    if not 1 <= jobs <= JOBS_MAX:
        more = f" (at most {JOBS_MAX} compile jobs a cell takes)" if jobs > JOBS_MAX else ""
        raise ConfigError(f"expected a positive integer{more}, got {brief(raw)}", key=origin)
    return jobs


def _parse_retries(raw: str, origin: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if not 0 <= value <= 100:
        raise ConfigError(
            f"expected a whole number of retries from 0 to 100, got {brief(raw)}", key=origin
        )
    return value


def _parse_timeout(raw: str, origin: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 0 < value <= 3600:  # NaN fails this too
        raise ConfigError(
            f"expected a timeout in seconds above 0 and at most 3600, got {brief(raw)}", key=origin
        )
    return value


def _ca_bundle(path: Path, origin: str, doc: YamlDocument | None = None) -> Path:
    """A readable PEM file (builder.config.cabundle); resolved to an absolute path."""
    line = doc.line(("ca_bundle",)) if doc is not None else None
    file = doc.file if doc is not None else None
    problem = ca_bundle_problem(path)
    if problem is not None:
        raise ConfigError(problem, file=file, line=line, key=origin)
    return Path(os.path.abspath(path))


#: Setting -> the environment variable that sets it (the third layer).
ENV: dict[str, str] = {
    "arch": "BUILDER_ARCH",
    "python": "BUILDER_PYTHON",
    "torch": "BUILDER_TORCH",
    "jobs": "BUILDER_JOBS",
    "offline": "BUILDER_OFFLINE",
    "bundle": "BUILDER_BUNDLE",
    "backend": "BUILDER_BACKEND",
    "base_image": "BUILDER_BASE_IMAGE",
    "network": "BUILDER_NETWORK",
    "ca_bundle": "BUILDER_CA_BUNDLE",
    "pull": "BUILDER_PULL",
    "pip_retries": "BUILDER_PIP_RETRIES",
    "pip_timeout": "BUILDER_PIP_TIMEOUT",
    # pip.index_url: a CI variable names the index without editing the config file
    "index_url": "BUILDER_INDEX_URL",
    "cuda": "BUILDER_CUDA",
}
BACKENDS = backend_kinds.CHOICES
#: When the engine pulls a cell's base image: the ones it lacks, every build, or never.
PULL_POLICIES = ("missing", "always", "never")


def _env(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    return value if value else None


def _layered(
    name: str,
    file_value: Any,
    file_origin: str,
    env: Mapping[str, str],
    cli_value: Any,
    parse: Any = None,
) -> tuple[Any, str]:
    """One setting through the layers after the file: (value, where it came from)."""
    value, origin = file_value, file_origin
    var = ENV[name]
    if _env(env, var):
        origin = f"environment {var}"
        value = parse(env[var], origin) if parse else env[var]
    if cli_value is not None:
        flag = "--" + name.replace("_", "-")
        origin = f"command line {flag}"
        value = parse(str(cli_value), flag) if parse else cli_value
    return value, origin


def _parse_backend(raw: str, origin: str) -> str:
    if raw not in BACKENDS:
        raise ConfigError(
            f"unknown backend {brief(raw)}; expected one of {', '.join(BACKENDS)}", key=origin
        )
    return raw


def _parse_index_url(raw: str, origin: str) -> str:
    try:
        return values.index_url(raw)
    except ValueError as exc:
        raise ConfigError(str(exc), key=origin) from None


def _parse_pull(raw: str, origin: str) -> str:
    if raw not in PULL_POLICIES:
        raise ConfigError(
            f"unknown pull policy {brief(raw)}; expected one of {', '.join(PULL_POLICIES)}",
            key=origin,
        )
    return raw


@dataclass
class _Layers:
    """What every section of :func:`load_settings` reads: the two documents merged, the
    environment and command line above them, and the origins the sections fill in."""

    cli: CliOverrides
    env: Mapping[str, str]
    defaults: YamlDocument
    doc: YamlDocument
    merged: dict[str, Any]
    origins: dict[str, str] = field(default_factory=dict)

    @property
    def file_origin(self) -> str:
        return f"config file {self.doc.file}"

    def origin_of(self, *path: str) -> tuple[str, YamlDocument]:
        """Which document supplied *path* (for relative paths and line numbers)."""
        node: Any = self.doc.data
        for p in path:
            if not isinstance(node, dict) or p not in node:
                return "built-in default", self.defaults
            node = node[p]
        return self.file_origin, self.doc

    def folder_of(self, *path: str) -> Path:
        """The folder of the document that supplied *path*: its relative paths start there."""
        file = Path(self.origin_of(*path)[1].file)
        return (file if file.is_absolute() else REPO_ROOT / file).parent


def load_settings(
    cli: CliOverrides | None = None,
    env: Mapping[str, str] | None = None,
) -> Settings:
    """Merge all four layers into validated Settings; raises ConfigError (exit 2)."""
    cli = cli or CliOverrides()
    env = os.environ if env is None else env
    config_path = Path(cli.config) if cli.config else DEFAULT_CONFIG
    defaults, doc = load_config_file(config_path)
    src = _Layers(cli, env, defaults, doc, _merge(defaults.data, doc.data))
    # The sections in this order: the first bad value found is the one said.
    support = _support(src)
    matrix = _matrix(src, support)
    images = _images(src.merged)
    build = _build(src)
    pip = _pip(src)
    offline = _offline(src)
    proxy = _proxy(src)
    ca = _ca(src)
    where = _where(src, images)
    project = _project_layers(src)
    cuda = cudaconfig.layer(src.merged, doc, support.cuda, src.file_origin)
    config = BuildConfig(
        cuda=cuda,
        source=Path(os.path.abspath(config_path)),
        source_name=doc.file,
        matrix=matrix,
        images=where.images,
        build=build,
        pip=pip,
        proxy=proxy,
        ca_bundle=ca,
        offline=offline,
        support=support,
        origins=src.origins,
        publish=PublishOptions(repository_url=src.merged["publish"]["repository_url"]),
        backend=where.backend,
        network=where.network,
        pull=where.pull,
        base_image=where.base_image,
        runners=dict(src.merged["runners"]),
        **project,
    )
    if src.merged["publish"]["repository_url"] is not None:
        src.origins["publish.repository_url"] = src.origin_of("publish", "repository_url")[0]
    if offline.enabled:
        config = never_pull(config, src.origins["offline"])
    return Settings(config=config, selection=_selection(cli, env))


def _support(src: _Layers) -> SupportTable:
    """The support table, relative to whichever file named it."""
    origin, sup_doc = src.origin_of("support")
    support_path = (src.folder_of("support") / src.merged["support"]).resolve()
    if origin == "built-in default" and INSTALLED:
        # The default names the checkout's layout (builder/config/ -> configs/); the installed
        # tool carries configs/ under builder/_data (REPO_ROOT there), so a project's config
        # with no `support:` gets the table the tool ships.
        support_path = REPO_ROOT / "configs" / Path(src.merged["support"]).name
    found = path_problem(support_path, "not found")
    if found:
        raise ConfigError(
            f"support table {brief(src.merged['support'])} {found} (looked for "
            f"{clip(support_path)}); "
            "expected a YAML file like configs/support.yaml",
            file=sup_doc.file,
            line=sup_doc.line(("support",)),
            key="support",
        )
    return load_support(support_path, display_path(support_path))


def _matrix(src: _Layers, support: SupportTable) -> MatrixSpec:
    """The matrix: its torches known to the support table, its include/exclude rules."""
    m, doc = src.merged["matrix"], src.doc
    for i, torch in enumerate(m["torch"]):
        if not support.knows(torch):
            raise _unknown_torch(
                torch, support, doc, ("matrix", "torch", i), " (add a line there for a new release)"
            )
    rules = {kind: _rules(kind, m.get(kind, []), doc, support) for kind in ("include", "exclude")}
    return MatrixSpec(
        arches=tuple(m["arch"]),
        pythons=tuple(m["python"]),
        torches=tuple(m["torch"]),
        include=rules["include"],
        exclude=rules["exclude"],
        cudas=tuple(dict.fromkeys(values.cuda_version(c) for c in m.get("cuda", ["cpu"]))),
    )


def _rules(
    kind: str, raws: list[dict[str, Any]], doc: YamlDocument, support: SupportTable
) -> tuple[MatrixRule, ...]:
    """The matrix's ``include`` or ``exclude`` entries (*kind*); an include's torch known."""
    rules = []
    for i, raw in enumerate(raws):
        rule = MatrixRule(
            kind=kind,
            index=i,
            arch=_as_tuple(raw.get("arch")),
            python=_as_tuple(raw.get("python")),
            torch=_as_tuple(raw.get("torch")),
            file=doc.file,
            line=doc.line(("matrix", kind, i)),
            cuda=_cuda_tuple(raw.get("cuda")),
            cuda_arch_list=_include_arch_list(raw, doc, ("matrix", kind, i), support),
        )
        if kind == "include" and rule.torch and not support.knows(rule.torch[0]):
            raise _unknown_torch(rule.torch[0], support, doc, ("matrix", kind, i, "torch"))
        rules.append(rule)
    return tuple(rules)


def _unknown_torch(
    torch: str, support: SupportTable, doc: YamlDocument, path: tuple, hint: str = ""
) -> ConfigError:
    """The error for a matrix torch the support table lacks, at *path* of the file."""
    return ConfigError(
        f"torch {torch} is not in the support table {support.file}; expected "
        f"one of {', '.join(support.wheels)}{hint}",
        file=doc.file,
        line=doc.line(path),
        key=format_path(path),
    )


def _images(merged: Mapping[str, Any]) -> dict[str, BaseImage]:
    """Each arch's base image as the file says (the pull policy is applied by :func:`_where`)."""
    return {
        name: BaseImage(
            ref=img["base"], family=img["family"], plat=img["plat"], python_path=img["python_path"]
        )
        for name, img in merged["images"].items()
    }


def _build(src: _Layers) -> BuildOptions:
    """Build options: jobs has all four layers."""
    build = src.merged["build"]
    jobs, src.origins["jobs"] = _layered(
        "jobs", build["jobs"], src.origin_of("build", "jobs")[0], src.env, src.cli.jobs, _parse_jobs
    )
    return BuildOptions(
        jobs=jobs,
        extra_cflags=tuple(build["extra_cflags"]),
        auditwheel_exclude=tuple(build["auditwheel_exclude"]),
    )


def _pip(src: _Layers) -> PipOptions:
    """pip's index and its retries and timeout (file, then environment)."""
    pip = src.merged["pip"]
    net = {}
    for key, parse in (("retries", _parse_retries), ("timeout", _parse_timeout)):
        net[key], src.origins[f"pip_{key}"] = _layered(
            f"pip_{key}", pip[key], src.origin_of("pip", key)[0], src.env, None, parse
        )
    index_url, src.origins["index_url"] = _layered(
        "index_url",
        pip["index_url"],
        src.origin_of("pip", "index_url")[0],
        src.env,
        None,
        _parse_index_url,
    )
    return PipOptions(
        index_url=index_url,
        extra_index_urls=tuple(pip["extra_index_urls"]),
        network=NetworkOptions(retries=int(net["retries"]), timeout=float(net["timeout"])),
    )


def _offline(src: _Layers) -> OfflineOptions:
    """Offline on or off, the wheelhouse (relative to the file naming it) and the bundle."""
    off, origins = src.merged["offline"], src.origins
    enabled, origins["offline"] = _layered(
        "offline",
        off["enabled"],
        src.origin_of("offline", "enabled")[0],
        src.env,
        None,
        _parse_bool,
    )
    if src.cli.offline is not None:
        enabled, origins["offline"] = src.cli.offline, "command line --offline"
    bundle: Path | None = None
    if off.get("bundle"):
        bundle = Path(os.path.normpath(src.folder_of("offline", "bundle") / off["bundle"]))
        origins["bundle"] = src.origin_of("offline", "bundle")[0]
    raw_bundle, bundle_origin = _layered("bundle", None, "", src.env, src.cli.bundle)
    if raw_bundle is not None:
        bundle, origins["bundle"] = Path(os.path.abspath(raw_bundle)), bundle_origin
    wheelhouse = src.folder_of("offline", "wheelhouse") / off["wheelhouse"]
    return OfflineOptions(
        enabled=enabled, wheelhouse=Path(os.path.normpath(wheelhouse)), bundle=bundle
    )


def _proxy(src: _Layers) -> ProxySettings:
    """The proxies through the file, the standard variables and the flags; each checked."""
    proxy_values: dict[str, str | None] = {}
    proxy_origins: dict[str, str] = {}
    proxy_notes: dict[str, str] = {}  # per key: only the winning layer's note is said

    def set_proxy(key: str, value: str | None, origin: str) -> None:
        proxy_values[key], proxy_origins[key] = value, origin
        proxy_notes.pop(key, None)
        if value:
            proxy_values[key] = _check_proxy(key, value, origin)
            if proxy_values[key] != value:
                proxy_notes[key] = (
                    f"{key.upper()} ({origin}) has no scheme; taken as "
                    f"{redact_url_credentials(proxy_values[key] or '')}, as pip and curl "
                    "read it"
                )

    for key in PROXY_KEYS:
        set_proxy(key, src.merged["proxy"][key], src.origin_of("proxy", key)[0])
    for key, (value, name) in proxies_from_env(src.env).items():
        set_proxy(key, value, f"environment {name}")
    for key in PROXY_KEYS:
        value = getattr(src.cli, key)
        if value is not None:
            set_proxy(key, value or None, "command line --" + key.replace("_", "-"))
    return ProxySettings(
        values=proxy_values,
        origins=proxy_origins,
        notes=tuple(proxy_notes[k] for k in PROXY_KEYS if k in proxy_notes),
    )


def _ca(src: _Layers) -> Path | None:
    """The CA bundle: the file's (relative to it), else the environment's or the flag's."""
    ca: Path | None = None
    if src.merged["ca_bundle"] is not None:
        ca_origin, ca_doc = src.origin_of("ca_bundle")
        ca = _ca_bundle(src.folder_of("ca_bundle") / src.merged["ca_bundle"], "ca_bundle", ca_doc)
        src.origins["ca_bundle"] = ca_origin
    raw_ca, ca_origin = _layered("ca_bundle", None, "", src.env, src.cli.ca_bundle)
    if raw_ca is not None:
        ca = _ca_bundle(Path(raw_ca), ca_origin)
        src.origins["ca_bundle"] = ca_origin
    return ca


@dataclass(frozen=True)
class _Where:
    backend: str
    network: str | None
    pull: str
    images: dict[str, BaseImage]  # with the pull policy
    base_image: str | None


def _where(src: _Layers, images: Mapping[str, BaseImage]) -> _Where:
    """Where and how: backend, network, pull policy, base image override, runners."""
    build, cli, env, origins = src.merged["build"], src.cli, src.env, src.origins
    backend, origins["backend"] = _layered(
        "backend",
        build["backend"],
        src.origin_of("build", "backend")[0],
        env,
        cli.backend,
        _parse_backend,
    )
    network, origins["network"] = _layered(
        "network", build["network"], src.origin_of("build", "network")[0], env, cli.network
    )
    # A bundle implies offline too; that is decided where the bundle is opened, and the
    # build applies never_pull() there.
    pull, origins["pull"] = _layered(
        "pull", build["pull"], src.origin_of("build", "pull")[0], env, cli.pull, _parse_pull
    )
    base_image, origins["base_image"] = _layered(
        "base_image", None, "config file images.<ARCH>.base", env, cli.base_image
    )
    if base_image is not None and base_image != "local":
        try:
            values.image_ref(base_image)
        except ValueError as exc:
            raise ConfigError(str(exc), key=origins["base_image"]) from None
    origins["runners"] = src.origin_of("runners")[0]
    return _Where(
        backend=backend,
        network=network,
        pull=pull,
        base_image=base_image,
        images={arch: replace(image, pull=pull) for arch, image in images.items()},
    )


def _project_layers(src: _Layers) -> dict[str, Any]:
    """The file's layer of a project's own tests (builder.config.projecttest) and of
    cibuildwheel's build options (builder.config.buildoptions); those modules have the others."""
    doc = src.doc
    return {
        "test": projecttest.layer(
            src.merged,
            origin=src.file_origin,
            file=doc.file,
            lines={k: doc.line((k,)) for k in (projecttest.REQUIRES_KEY, projecttest.COMMAND_KEY)},
        ),
        "build_options": buildoptions.layer(
            src.merged,
            origin=src.file_origin,
            file=doc.file,
            lines={k: doc.line((k,)) for k in buildoptions.KEYS},
        ),
    }


def never_pull(config: BuildConfig, origin: str) -> BuildConfig:
    """*config* with pulls off, for an offline build (*origin*: what made it offline). ``always``
    asked for in this run (command line, environment) contradicts it (exit 2); a config file's
    policy, or the default, yields."""
    asked = config.origins.get("pull", "").startswith(("command line", "environment"))
    if config.pull == "always" and asked:
        raise ConfigError(
            f"pull always ({config.origins['pull']}) and {origin} contradict "
            "each other: an offline build reaches no registry; drop one",
            key=config.origins["pull"],
        )
    images = {arch: replace(image, pull="never") for arch, image in config.images.items()}
    return replace(
        config,
        pull="never",
        images=images,
        origins={**config.origins, "pull": f"{origin} (offline: nothing is pulled)"},
    )


def _cuda_tuple(value: str | list[str] | None) -> tuple[str, ...] | None:
    found = _as_tuple(value)
    return None if found is None else tuple(values.cuda_version(c) for c in found)


def _include_arch_list(
    raw: dict[str, Any], doc: YamlDocument, path: tuple, support: Any
) -> str | None:
    """An include's ``cuda_arch_list``, checked against its CUDA's toolkit (exit 2 otherwise)."""
    text = raw.get("cuda_arch_list")
    if text is None:
        return None
    p = (*path, "cuda_arch_list")
    cuda = values.cuda_version(raw.get("cuda", "cpu"))
    toolkit = support.cuda.toolkit(cuda)
    if toolkit is None:
        raise ConfigError(
            f"cuda_arch_list {brief(text)} needs the entry's cuda to be a CUDA "
            f"version of {support.file} (cuda.toolkits), got cuda {cuda!r}",
            file=doc.file,
            line=doc.line(p),
            key=format_path(p),
        )
    try:
        return parse_arch_list(text, toolkit).text
    except ValueError as exc:
        raise ConfigError(
            f"{brief(text)}: {exc}", file=doc.file, line=doc.line(p), key=format_path(p)
        ) from None


def _check_proxy(key: str, value: str, origin: str) -> str:
    """The value checked; a proxy URL gets ``http://`` when it has no scheme."""
    try:
        return (values.no_proxy if key == "no_proxy" else values.proxy_url)(value)
    except ValueError as exc:
        # The message never repeats the value: it may carry a password.
        raise ConfigError(str(exc), key=origin) from None


def _selection(cli: CliOverrides, env: Mapping[str, str]) -> Selection:
    picked: dict[str, tuple[str, ...] | None] = {}
    origins: dict[str, str] = {}
    for axis, env_name, cli_value in (
        ("arch", ENV["arch"], cli.arch),
        ("python", ENV["python"], cli.python),
        ("torch", ENV["torch"], cli.torch),
        ("cuda", ENV["cuda"], cli.cuda),
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
        cuda=picked["cuda"],
        patterns=tuple(cli.patterns),
        origins=origins,
    )
