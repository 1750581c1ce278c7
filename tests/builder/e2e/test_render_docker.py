"""A rendered recipe built for real by Docker: the image has the cell's interpreter, the
build user, the tools and the injected CA, and the proxies passed as build arguments
appear nowhere in the image's history or configuration.

Needs a Docker engine (CI starts one; elsewhere the test is skipped when none answers) and
the local manylinux-shaped base image (built once by builder.images.base_image, cached by content).
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest
from helpers.builder_testlib import SUPPORT

from builder.config import CliOverrides, load_settings
from builder.engines.docker import DockerEngine
from builder.errors import EngineUnavailable
from builder.images.base_image import build_base_image
from builder.images.render import render_all
from builder.plan.cells import expand, select

pytestmark = [pytest.mark.docker, pytest.mark.slow]

SENTINEL = "Pr0xySentinel-7731"


def _engine():
    try:
        return DockerEngine()
    except EngineUnavailable as exc:
        if os.environ.get("CI"):
            raise  # CI provisions an engine: its absence is a failure there
        pytest.skip(f"no container engine: {exc}")


def _real_ca(path: Path) -> Path:
    """One genuine CA certificate (from pip's vendored certifi), so the trust-store tools
    accept it."""
    from pip._vendor import certifi  # noqa: PLC0415 (pip's internals: only this helper needs them)

    text = Path(certifi.where()).read_text()
    start = text.index("-----BEGIN CERTIFICATE-----")
    end = text.index("-----END CERTIFICATE-----", start) + len("-----END CERTIFICATE-----")
    path.write_text(text[start:end] + "\n")
    return path


def _base_image(engine) -> tuple[str, str, str]:
    """(tag, python tag, plat) of the base image. AMPFORGE_TEST_BASE_IMAGE names an image
    already loaded (labelled by builder.images.base_image) to test against instead of building."""
    tag = os.environ.get("AMPFORGE_TEST_BASE_IMAGE")
    if tag:
        labels = engine.api.inspect_image(tag)["Config"]["Labels"]
        return tag, labels["org.ampforge.base.python"], labels["org.ampforge.base.plat"]
    base = build_base_image(engine)
    return base.tag, base.python_tag, base.auditwheel_plat


def test_rendered_recipe_builds_and_keeps_proxies_out(tmp_path: Path) -> None:
    engine = _engine()
    base_tag, cp, plat = _base_image(engine)  # cp: the image's interpreter, e.g. cp311
    python = f"{cp[2]}.{cp[3:]}"
    cfg = tmp_path / "local.yaml"
    cfg.write_text(
        f"support: {SUPPORT}\n"
        f"matrix: {{arch: [X86], python: ['{python}'], torch: ['2.13.0']}}\n"
        "images:\n"
        f"  X86: {{base: '{base_tag}', family: debian, plat: {plat}}}\n"
    )
    ca = _real_ca(tmp_path / "corp-ca.pem")
    env = {
        # Nothing listens on port 9: the recipe must not need the network on this base.
        "HTTP_PROXY": f"http://alice:{SENTINEL}@127.0.0.1:9",
        "https_proxy": f"http://alice:{SENTINEL}@127.0.0.1:9",
        "NO_PROXY": "localhost",
        "BUILDER_CA_BUNDLE": str(ca),
    }
    settings = load_settings(CliOverrides(config=str(cfg)), env)
    (recipe,) = render_all(
        select(expand(settings.config), settings.selection).cells, settings.config
    )
    assert SENTINEL in recipe.build_args["HTTP_PROXY"]
    folder = recipe.write(tmp_path / "out")
    tag = f"ampforge-test/render:{uuid.uuid4().hex[:12]}"
    try:
        engine.build_image(recipe.dockerfile, tag, context=folder, build_args=recipe.build_args)
        history = json.dumps(engine.api.history(tag))
        config = json.dumps(engine.api.inspect_image(tag))
        assert SENTINEL not in history and "127.0.0.1:9" not in history
        assert SENTINEL not in config and "127.0.0.1:9" not in config
        labels = engine.api.inspect_image(tag)["Config"]["Labels"]
        assert labels["io.ampforge.cell"] == recipe.cell.identifier
        assert labels["io.ampforge.torch"] == "2.13.0"
        with engine.container(tag, workdir="/") as box:
            script = (
                'set -e; test "$(id -u builder)" -gt 0; '
                'test "$(stat -c %U "$AMPFORGE_VENV")" = builder; '
                "python -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])' > /tmp/v; "
                f'test "$(cat /tmp/v)" = {python}; '
                'test "$(command -v python)" = "$AMPFORGE_VENV/bin/python"; '
                "command -v auditwheel patchelf g++ >/dev/null; "
                'test "$SSL_CERT_FILE" = "$PIP_CERT"; test "$PIP_CERT" = "$REQUESTS_CA_BUNDLE"; '
                'grep -qF "$(sed -n 2p /usr/local/share/ampforge/extra-ca.pem)" "$SSL_CERT_FILE"; '
                'test "$(grep -c "BEGIN CERTIFICATE" "$SSL_CERT_FILE")" -gt 1; '
                "! env | grep -qi _proxy"
            )
            box.run(["sh", "-c", script], step="inspect rendered image")
    finally:
        engine.remove_image(tag)
