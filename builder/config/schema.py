"""JSON schema of a build configuration file (structure only).

Values that need more than a type (versions, image references, URLs, paths) are checked
by ``builder.config.values`` afterwards, with messages that say what was expected.
"""

from __future__ import annotations

from typing import Any

from builder import backend_kinds

_STR_OR_LIST: dict[str, Any] = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}, "minItems": 1},
    ]
}

_RULE_KEYS = {
    "arch": _STR_OR_LIST,
    "python": _STR_OR_LIST,
    "torch": _STR_OR_LIST,
    "cuda": _STR_OR_LIST,
}

_NULLABLE_STRING: dict[str, Any] = {"type": ["string", "null"]}

#: The most compile jobs a cell takes (MAX_JOBS): ninja reads -j as a C int, and no machine
#: has more CPUs; a larger number fails the build instead of the configuration.
JOBS_MAX = 4096

IMAGE: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "base": {"type": "string"},
        "family": {"enum": ["manylinux", "debian"]},
        "plat": {"type": "string"},
        "python_path": {"type": "string"},
    },
}

CONFIG_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["matrix"],
    "properties": {
        "support": {"type": "string"},
        "matrix": {
            "type": "object",
            "additionalProperties": False,
            "required": ["arch", "python", "torch"],
            "properties": {
                "arch": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                "python": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                "torch": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                # optional: ["cpu"] when absent (docs/cuda-wheels.md)
                "cuda": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                "include": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["arch", "python", "torch"],
                        "properties": {
                            "arch": {"type": "string"},
                            "python": {"type": "string"},
                            "torch": {"type": "string"},
                            "cuda": {"type": "string"},
                            # this cell's TORCH_CUDA_ARCH_LIST (a CUDA cell only)
                            "cuda_arch_list": {"type": "string"},
                        },
                    },
                },
                "exclude": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "minProperties": 1,
                        "properties": _RULE_KEYS,
                    },
                },
            },
        },
        "images": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"X86": IMAGE, "ARM": IMAGE},
        },
        "build": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "jobs": {
                    "anyOf": [
                        {"type": "integer", "minimum": 1, "maximum": JOBS_MAX},
                        {"type": "null"},
                    ]
                },
                "extra_cflags": {"type": "array", "items": {"type": "string"}},
                "auditwheel_exclude": {"type": "array", "items": {"type": "string"}},
                "backend": {"enum": list(backend_kinds.CHOICES)},
                "network": _NULLABLE_STRING,
                "pull": {"enum": ["missing", "always", "never"]},
            },
        },
        "runners": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"x86_64": {"type": "string"}, "aarch64": {"type": "string"}},
        },
        "pip": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "index_url": _NULLABLE_STRING,
                "extra_index_urls": {"type": "array", "items": {"type": "string"}},
                "retries": {"type": "integer", "minimum": 0, "maximum": 100},
                "timeout": {"type": "number", "exclusiveMinimum": 0, "maximum": 3600},
            },
        },
        "proxy": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "http_proxy": _NULLABLE_STRING,
                "https_proxy": _NULLABLE_STRING,
                "no_proxy": _NULLABLE_STRING,
                "all_proxy": _NULLABLE_STRING,
            },
        },
        "ca_bundle": _NULLABLE_STRING,
        # CUDA cells (builder.config.cudaconfig): per CUDA version, the index that serves torch's
        # build for it (a mirror) and the TORCH_CUDA_ARCH_LIST replacing the support table's.
        "cuda": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "index_urls": {"type": "object", "additionalProperties": {"type": "string"}},
                "arch_list": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        # cibuildwheel's keys and spelling (builder.config.projecttest checks the values).
        "test-requires": {
            "anyOf": [
                {"type": "string"},
                {"type": "null"},
                {"type": "array", "items": {"type": "string"}},
            ]
        },
        "test-command": {
            "anyOf": [
                {"type": "string"},
                {"type": "null"},
                {"type": "array", "items": {"type": "string"}},
            ]
        },
        # cibuildwheel's build options (builder.config.buildoptions checks the values).
        "environment": {
            "anyOf": [
                {"type": "string"},
                {"type": "null"},
                {"type": "object", "additionalProperties": {"type": ["string", "number"]}},
            ]
        },
        "environment-pass": {
            "anyOf": [
                {"type": "string"},
                {"type": "null"},
                {"type": "array", "items": {"type": "string"}},
            ]
        },
        "before-all": {
            "anyOf": [
                {"type": "string"},
                {"type": "null"},
                {"type": "array", "items": {"type": "string"}},
            ]
        },
        "before-build": {
            "anyOf": [
                {"type": "string"},
                {"type": "null"},
                {"type": "array", "items": {"type": "string"}},
            ]
        },
        "config-settings": {"anyOf": [{"type": "string"}, {"type": "null"}, {"type": "object"}]},
        "build-frontend": {"anyOf": [{"type": "string"}, {"type": "null"}, {"type": "object"}]},
        "repair-wheel-command": {
            "anyOf": [
                {"type": "string"},
                {"type": "null"},
                {"type": "array", "items": {"type": "string"}},
            ]
        },
        "publish": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"repository_url": _NULLABLE_STRING},
        },
        "offline": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "enabled": {"type": "boolean"},
                "wheelhouse": {"type": "string"},
                "bundle": _NULLABLE_STRING,
            },
        },
    },
}
