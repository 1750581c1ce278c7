"""YAML for CI files: keys in the order written, multi-line scripts as literal blocks."""

from __future__ import annotations

from typing import Any

import yaml


class _Dumper(yaml.SafeDumper):
    pass


class Row(dict):
    """A mapping written on one line (``{cell: ..., arch: ...}``): a matrix row."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


def _row(dumper: yaml.SafeDumper, value: Row) -> yaml.MappingNode:
    return dumper.represent_mapping("tag:yaml.org,2002:map", value.items(), flow_style=True)


_Dumper.add_representer(str, _str)
_Dumper.add_representer(Row, _row)


def dump(doc: Any) -> str:
    return yaml.dump(
        doc,
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=False,
        width=200,
        allow_unicode=True,
    )
