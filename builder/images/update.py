"""``update-images``: move each base image's pin to the digest its tag names now.

Per arch: pull ``repository:tag`` through the engine (its daemon reaches the registry, with its
own proxy: :mod:`builder.engines.pull` explains a failure), read the digest the registry served
from the image's ``RepoDigests``, and rewrite ``images.<ARCH>.base`` to ``repository:tag@digest``
in the file that set it. Every pull comes first; the files are written only when all of them
succeeded, each checked again and written atomically, so a failure leaves every file as it was.

Which file: the config file, for each image it names (an image it leaves to the built-in
defaults is not the user's to pin: name it in the config file). In a checkout the built-in
defaults (``builder/config/defaults.yaml``) move too when they hold the very pin the config
file's does, so the repository's two copies of the default images never drift apart; an
installed builder's own files are never rewritten.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from builder.arch import ARCHES
from builder.atomicfile import atomic_write
from builder.backends.docker import LOCAL_PREFIX
from builder.config import DEFAULTS_FILE, display_path
from builder.config.checks import load_config_file, parse_config_text
from builder.config.pins import ImageRef, parse_ref, repo_digest, rewrite_scalar
from builder.config.proxy import ProxySettings
from builder.config.roots import INSTALLED, INSTALLED_DATA
from builder.config.yamlfile import YamlDocument
from builder.engines.docker import PullError
from builder.engines.pull import PullFailed, explain, pull_image
from builder.errors import ConfigError

if TYPE_CHECKING:
    from builder.engines.docker import DockerEngine


@dataclass(frozen=True)
class Site:
    """Where one arch's ``images.<ARCH>.base`` is written."""

    arch: str
    path: Path
    doc: YamlDocument
    old: str

    @property
    def line(self) -> int:
        line = self.doc.line(("images", self.arch, "base"))
        assert line is not None, "the value was read from this document"
        return line

    @property
    def where(self) -> str:
        return f"{self.doc.file}:{self.line}"


@dataclass(frozen=True)
class Change:
    arch: str
    old: str
    new: str
    sites: tuple[Site, ...]

    @property
    def changed(self) -> bool:
        return self.old != self.new


def _base(doc: YamlDocument, arch: str) -> Optional[str]:
    image = ((doc.data or {}).get("images") or {}).get(arch) or {}
    value = image.get("base")
    return value if isinstance(value, str) else None


def sites(
    config: Path, arches: Optional[Sequence[str]], say: Callable[[str], None]
) -> dict[str, list[Site]]:
    """Per arch the config file names (or *arches* of them), the files to rewrite: the config
    file, and the built-in defaults too when they hold the same pin (checkout only)."""
    if INSTALLED and INSTALLED_DATA in config.resolve().parents:
        raise ConfigError(
            f"{config} is the installed builder's own copy of the default config, "
            "which update-images does not rewrite; expected your config file: "
            "--config FILE (copy that one to start)",
            key="--config",
        )
    defaults, doc = load_config_file(config)
    named = (doc.data or {}).get("images") or {}
    found: dict[str, list[Site]] = {}
    for arch in sorted(set((defaults.data or {}).get("images") or {}) | set(named)):
        if arches is not None and arch not in arches:
            continue
        mine, builtin = _base(doc, arch), _base(defaults, arch)
        if mine is None:
            if arches is not None:
                say(
                    f"images.{arch}.base comes from the built-in defaults ({builtin}), which "
                    f"update-images does not rewrite on their own: name the image in "
                    f"{doc.file} to pin your own"
                )
            continue
        found[arch] = [Site(arch, config, doc, mine)]
        if builtin == mine and not INSTALLED and config.resolve() != DEFAULTS_FILE:
            found[arch].append(Site(arch, DEFAULTS_FILE, defaults, builtin))
    return found


def newest_digest(
    engine: DockerEngine,
    ref: ImageRef,
    proxy: ProxySettings,
    say: Callable[[str], None],
    *,
    native: bool = True,
) -> str:
    """The digest the registry serves for *ref*'s tag now. An image of this host's arch is
    pulled: it is then in the engine under its pin, and the next build needs no network. One of
    another arch (*native* false) is only asked for its manifest: it is as big, and this host
    runs it only under emulation (its builds come from ``base-image --arch`` or a bundle)."""
    if not native:
        try:
            digest = engine.registry_digest(ref.tagged)
        except PullError as exc:
            raise PullFailed(explain(engine, ref.tagged, exc.message, proxy)) from exc
        say(f"registry: {ref.tagged} is {digest} (another arch's image: not pulled)")
        return digest
    pull_image(engine, ref.tagged, proxy, say)
    pulled = repo_digest(ref.repository, engine.repo_digests(ref.tagged))
    if pulled is None:
        raise PullFailed(
            f"pulled {ref.tagged}, but the engine records no registry digest for "
            f"{ref.repository} (RepoDigests: "
            f"{', '.join(engine.repo_digests(ref.tagged)) or 'none'}); expected "
            "an image served by a registry"
        )
    return pulled


def plan_changes(
    engine: DockerEngine,
    found: Mapping[str, Sequence[Site]],
    proxy: ProxySettings,
    say: Callable[[str], None],
) -> list[Change]:
    """Every arch's new pin (pulls only; nothing is written)."""
    host_machine = platform.machine()
    changes = []
    for arch, here in found.items():
        old = here[0].old
        if old.startswith(LOCAL_PREFIX):
            say(
                f"images.{arch}.base: {old} is built on this machine (base-image), not "
                "pulled: left as it is"
            )
            continue
        ref = parse_ref(old)
        tagged = ref if ref.tag else ImageRef(ref.repository, "latest", ref.digest)
        digest = newest_digest(
            engine, tagged, proxy, say, native=ARCHES[arch].machine == host_machine
        )
        changes.append(Change(arch, old, str(tagged.with_digest(digest)), tuple(here)))
    return changes


def write_changes(changes: Sequence[Change]) -> list[Path]:
    """Rewrite every changed pin in place; each file is checked before it is replaced."""
    texts: dict[Path, str] = {}
    for change in changes:
        if not change.changed:
            continue
        for site in change.sites:
            text = texts.get(site.path) or site.path.read_text("utf-8")
            try:
                text = rewrite_scalar(text, site.line, change.old, change.new)
            except ValueError as exc:
                raise ConfigError(
                    f"cannot rewrite images.{change.arch}.base in place: {exc}; "
                    f"expected `base: {change.old}` on one line -- write "
                    f"{change.new} there by hand",
                    file=site.doc.file,
                    line=site.line,
                    key=f"images.{change.arch}.base",
                ) from None
            texts[site.path] = text
    for path, text in texts.items():
        # The same checks a load makes: a rewrite that broke the file is never written.
        parse_config_text(text, display_path(path), require_matrix=path != DEFAULTS_FILE)
    for path, text in texts.items():
        atomic_write(path, text.encode("utf-8"))
    return list(texts)
