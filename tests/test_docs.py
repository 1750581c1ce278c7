"""The documentation holds together: the docs/ site builds with ``mkdocs build --strict`` (a
broken link between pages, a link to a missing heading, a page left out of the nav all fail),
README.md's links into docs/ reach real files and headings, and docs/reference.md lists exactly
the builder's commands and options (read from its argument parser), the configuration file's
keys (its schema), the ``BUILDER_*`` variables and the Makefile's targets and variables -- so
none of them can change without the reference following."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import markdown

from builder.cli import build_parser
from builder.config import buildoptions, load
from builder.config.schema import CONFIG_SCHEMA

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
REFERENCE = ROOT / "docs" / "reference.md"
COMMAND_HEADING = re.compile(r"^### `python -m builder ([a-z-]+)`$", re.M)
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def test_mkdocs_builds_the_site_with_no_warning(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "index.html").is_file()


def heading_ids(page: Path) -> set[str]:
    """The anchors of *page*'s headings, as mkdocs makes them (Markdown's toc extension)."""
    md = markdown.Markdown(extensions=["toc", "tables", "fenced_code"])
    md.convert(page.read_text())

    def ids(tokens: list[dict]) -> set[str]:
        return {t["id"] for t in tokens} | {i for t in tokens for i in ids(t["children"])}

    return ids(md.toc_tokens)  # type: ignore[attr-defined]


def _links(page: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)  # no code blocks
    return [t for t in LINK.findall(text) if "://" not in t and not t.startswith("mailto:")]


def test_the_readmes_links_reach_real_pages_and_headings() -> None:
    links = _links(README)
    assert len([t for t in links if t.startswith("docs/")]) >= 15, links
    broken = []
    for target in links:
        path, _, anchor = unquote(target).partition("#")
        page = (README.parent / path) if path else README
        if not page.is_file():
            broken.append(f"{target}: no such file")
        elif anchor and anchor not in heading_ids(page):
            broken.append(f"{target}: {page.relative_to(ROOT)} has no heading #{anchor}")
    assert not broken, "README.md: " + "; ".join(broken)


# ------------------------------------------------------------------ the reference


def _first_column_flags(section: str) -> set[str]:
    """The options a section's tables name in their first column."""
    flags: set[str] = set()
    for row in re.findall(r"^\|([^|\n]*)\|", section, re.M):
        flags |= set(FLAG.findall(row))
    return flags


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    nxt = re.compile(r"^#{1,3} ", re.M).search(text, start + len(heading))
    return text[start : nxt.start() if nxt else len(text)]


def _parser_flags() -> dict[str, set[str]]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: _flags_of(p) for name, p in sub.choices.items()}


def _flags_of(parser: argparse.ArgumentParser) -> set[str]:
    """A command's options, its own subcommands' too (``cache list|prune``: one section)."""
    flags = {
        o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"
    }
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for p in a.choices.values():
                flags |= _flags_of(p)
    return flags


def _documented_flags() -> dict[str, set[str]]:
    text = REFERENCE.read_text()
    shared = {
        "#selection-options": _first_column_flags(_section(text, "### Selection options")),
        "#configuration-options": _first_column_flags(_section(text, "### Configuration options")),
    }
    documented: dict[str, set[str]] = {}
    for m in COMMAND_HEADING.finditer(text):
        section = _section(text, m.group(0))
        flags = _first_column_flags(section)
        for anchor, group in shared.items():
            if f"]({anchor})" in section:  # "Takes the [selection options](#selection-options)"
                flags |= group
        documented[m.group(1)] = flags
    return documented


def test_the_reference_lists_every_command_and_option_the_parser_has() -> None:
    actual, documented = _parser_flags(), _documented_flags()
    assert set(documented) == set(actual), (
        f"docs/reference.md: commands without a '### `python -m builder NAME`' section: "
        f"{sorted(set(actual) - set(documented))}; sections for no command: "
        f"{sorted(set(documented) - set(actual))}"
    )
    drift = {
        name: {
            "missing from the reference": sorted(actual[name] - documented[name]),
            "not an option of the command": sorted(documented[name] - actual[name]),
        }
        for name in actual
        if actual[name] != documented[name]
    }
    assert not drift, f"docs/reference.md differs from `python -m builder CMD --help`: {drift}"


def _schema_keys(schema: dict, prefix: str = "") -> set[str]:
    """Every key of the configuration file, as dotted paths (``images.ARCH.base``)."""
    keys: set[str] = set()
    for name, sub in schema.get("properties", {}).items():
        path = prefix + ("ARCH" if prefix == "images." else name)
        keys |= _schema_keys(sub, path + ".") if "properties" in sub else {path}
    return keys


def test_the_reference_lists_every_key_of_the_configuration_file() -> None:
    section = _section(REFERENCE.read_text(), "## Configuration file keys")
    documented = {
        k
        for row in re.findall(r"^\|([^|\n]*)\|", section, re.M)
        for k in re.findall(r"`([a-z][\w.-]*(?:\.ARCH\.[a-z_]+)?)`", row)
    }
    actual = _schema_keys(CONFIG_SCHEMA)
    assert {"matrix.python", "images.ARCH.base", "build.backend"} <= actual
    assert documented == actual, (
        f"docs/reference.md, Configuration file keys: missing {sorted(actual - documented)}; "
        f"not in builder/config/schema.py {sorted(documented - actual)}"
    )


def test_the_reference_lists_every_builder_variable() -> None:
    section = _section(REFERENCE.read_text(), "## Environment variables")
    documented = set(re.findall(r"`(BUILDER_[A-Z_]+)`", section))
    actual = set(load.ENV.values()) | set(buildoptions.ENV.values())
    assert documented == actual, (
        f"docs/reference.md, Environment variables: missing {sorted(actual - documented)}; "
        f"read by no setting {sorted(documented - actual)}"
    )


MAKEFILE = (ROOT / "Makefile").read_text()


def _make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z0-9-]*)\s*:(?!=)", MAKEFILE, re.M))


def test_the_reference_lists_every_make_target() -> None:
    section = _section(REFERENCE.read_text(), "## Make targets")
    documented = set(re.findall(r"^\| `make ([a-z][a-z0-9-]*)`", section, re.M))
    actual = _make_targets()
    assert {"wheel", "matrix", "test", "docs"} <= actual
    assert documented == actual, (
        f"docs/reference.md, Make targets: missing {sorted(actual - documented)}; "
        f"not in the Makefile {sorted(documented - actual)}"
    )


def test_the_reference_lists_every_make_variable() -> None:
    section = _section(REFERENCE.read_text(), "## Make variables")
    documented = set(re.findall(r"^\| `([A-Z][A-Z0-9_]*)`", section, re.M))
    settable = set(re.findall(r"^([A-Z][A-Z0-9_]*) \?=", MAKEFILE, re.M))
    assert {"ARCH", "PY", "TORCH", "BACKEND", "CONFIG"} <= settable
    missing = settable - documented
    unknown = {v for v in documented if not re.search(rf"\b{v}\b", MAKEFILE)}
    assert not missing and not unknown, (
        f"docs/reference.md, Make variables: missing {sorted(missing)}; "
        f"not in the Makefile {sorted(unknown)}"
    )


def test_where_things_live_names_every_folder_and_only_real_ones() -> None:
    """docs/development.md's map: one line per folder of the repository as git has it (the top
    level, and one level down in amp/, builder/ and tests/), none for a folder that is gone."""
    text = (ROOT / "docs" / "development.md").read_text()
    section = text.split("## Where things live", 1)[1].split("\n## ", 1)[0]
    listed = {m.rstrip("/") for m in re.findall(r"^- `([^`]+/)`", section, re.M)}
    files = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    parts = [f.split("/") for f in files]
    folders = {p[0] for p in parts if len(p) > 1}
    folders |= {
        "/".join(p[:2]) for p in parts if len(p) > 2 and p[0] in ("amp", "builder", "tests")
    }
    assert sorted(folders - listed) == [], "folders missing from the map"
    assert sorted(listed - folders) == [], "the map names folders the repository lacks"
