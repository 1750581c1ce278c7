"""pip's settings on this host (host backend, cross downloads): indexes, proxies and a CA bundle
merged with the system's trust store, as the docker recipe gives them inside containers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from helpers.builder_testlib import BASE_CONFIG, write_config, write_pem

from builder.backends.pipenv import merged_ca_bundle, pip_env
from builder.config import CliOverrides, load_settings


def _config(tmp_path: Path, extra: str = "", **cli):
    cfg = write_config(tmp_path, BASE_CONFIG + extra)
    return load_settings(CliOverrides(config=str(cfg), **cli), {}).config


def test_indexes_and_proxies_reach_pip(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        "pip:\n  index_url: http://idx.example/simple\n"
        "  extra_index_urls: [http://a.example/simple, http://b.example/simple]\n",
        https_proxy="http://u:pw@proxy.example:3128",
    )
    env = pip_env(config, config.proxy.build_args(), tmp_path / "ca")
    assert env["PIP_INDEX_URL"] == "http://idx.example/simple"
    assert env["PIP_EXTRA_INDEX_URL"] == "http://a.example/simple http://b.example/simple"
    assert env["HTTPS_PROXY"] == env["https_proxy"] == "http://u:pw@proxy.example:3128"
    assert "PIP_CERT" not in env
    # Offline: the wheelhouse is the only source, so no index is given to pip.
    offline = replace(config, offline=replace(config.offline, enabled=True))
    assert "PIP_INDEX_URL" not in pip_env(offline, {}, tmp_path / "ca")


def test_ca_bundle_is_merged_with_the_system_trust_store(tmp_path: Path) -> None:
    pem = write_pem(tmp_path / "corp.pem", "corp")
    config = _config(tmp_path, ca_bundle=str(pem))
    env = pip_env(config, {}, tmp_path / "ca")
    bundle = Path(env["PIP_CERT"])
    assert env["SSL_CERT_FILE"] == env["REQUESTS_CA_BUNDLE"] == str(bundle)
    text = bundle.read_text()
    assert text.endswith(pem.read_text())  # the user's CA ...
    # ... after the system's certificates (pointing pip at the user's file alone would drop
    # every public CA): more than one certificate in the merged file.
    assert text.count("-----BEGIN CERTIFICATE-----") > pem.read_text().count(
        "-----BEGIN CERTIFICATE-----"
    )
    assert merged_ca_bundle(pem, tmp_path / "again").read_text() == text  # deterministic
