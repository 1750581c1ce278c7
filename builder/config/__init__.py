"""The build configuration: four layers (built-in defaults < config file < environment <
command line) merged into one validated :class:`Settings`, each value with its source.

* :mod:`builder.config.model` -- the types;
* :mod:`builder.config.checks` -- schema and value checks of a document;
* :mod:`builder.config.load` -- the layers and their precedence;
* :mod:`builder.config.schema`, ``values``, ``support``, ``proxy``, ``yamlfile`` -- their parts;
* ``defaults.yaml`` -- the built-in defaults.
"""

from builder.config.checks import load_config_file, parse_config_text
from builder.config.load import load_settings
from builder.config.model import (
    DEFAULT_CONFIG,
    DEFAULTS_FILE,
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
    default_project,
    display_path,
)

__all__ = [
    "DEFAULT_CONFIG",
    "DEFAULTS_FILE",
    "REPO_ROOT",
    "BaseImage",
    "BuildConfig",
    "BuildOptions",
    "CliOverrides",
    "default_project",
    "MatrixRule",
    "MatrixSpec",
    "OfflineOptions",
    "PipOptions",
    "PublishOptions",
    "Selection",
    "Settings",
    "display_path",
    "load_config_file",
    "load_settings",
    "parse_config_text",
]
