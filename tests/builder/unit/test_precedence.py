"""Configuration precedence: built-in defaults < config file < environment < command line.
Each setting is checked at every layer it has, with the origin the builder reports."""

from __future__ import annotations

from pathlib import Path

from helpers.builder_testlib import BASE_CONFIG, run_cli, write_config, write_pem

from builder.config import REPO_ROOT, CliOverrides, load_settings


def _settings(cfg: Path, env: dict[str, str] | None = None, **cli):
    return load_settings(CliOverrides(config=str(cfg), **cli), env or {})


def test_jobs_every_layer(tmp_path: Path) -> None:
    bare = write_config(tmp_path, BASE_CONFIG, "bare.yaml")
    s = _settings(bare)
    assert (s.config.build.jobs, s.config.origins["jobs"]) == (None, "built-in default")
    cfg = write_config(tmp_path, BASE_CONFIG + "build:\n  jobs: 3\n")
    s = _settings(cfg)
    assert (s.config.build.jobs, s.config.origins["jobs"]) == (3, f"config file {cfg}")
    s = _settings(cfg, {"BUILDER_JOBS": "5"})
    assert (s.config.build.jobs, s.config.origins["jobs"]) == (5, "environment BUILDER_JOBS")
    s = _settings(cfg, {"BUILDER_JOBS": "5"}, jobs=7)
    assert (s.config.build.jobs, s.config.origins["jobs"]) == (7, "command line --jobs")
    # empty variables (make may pass BUILDER_JOBS=) count as unset
    assert _settings(cfg, {"BUILDER_JOBS": ""}).config.build.jobs == 3


def test_offline_every_layer(tmp_path: Path) -> None:
    bare = write_config(tmp_path, BASE_CONFIG, "bare.yaml")
    assert _settings(bare).config.offline.enabled is False
    cfg = write_config(tmp_path, BASE_CONFIG + "offline:\n  enabled: true\n")
    assert _settings(cfg).config.offline.enabled is True
    assert _settings(cfg, {"BUILDER_OFFLINE": "0"}).config.offline.enabled is False
    s = _settings(cfg, {"BUILDER_OFFLINE": "0"}, offline=True)
    assert s.config.offline.enabled is True
    assert s.config.origins["offline"] == "command line --offline"
    # the wheelhouse is relative to the file that names it
    assert _settings(cfg).config.offline.wheelhouse == REPO_ROOT / "wheelhouse"  # default's
    named = write_config(tmp_path, BASE_CONFIG + "offline:\n  wheelhouse: wh\n", "named.yaml")
    assert _settings(named).config.offline.wheelhouse == tmp_path / "wh"


def test_proxies_every_layer_and_lower_case_wins(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, BASE_CONFIG + "proxy:\n  http_proxy: http://file.example:1\n")
    p = _settings(cfg).config.proxy
    assert (p.get("http_proxy"), p.origins["http_proxy"]) == (
        "http://file.example:1",
        f"config file {cfg}",
    )
    env = {"HTTP_PROXY": "http://upper.example:2"}
    p = _settings(cfg, env).config.proxy
    assert (p.get("http_proxy"), p.origins["http_proxy"]) == (
        "http://upper.example:2",
        "environment HTTP_PROXY",
    )
    env["http_proxy"] = "http://lower.example:3"
    p = _settings(cfg, env).config.proxy
    assert (p.get("http_proxy"), p.origins["http_proxy"]) == (
        "http://lower.example:3",
        "environment http_proxy",
    )
    p = _settings(cfg, env, http_proxy="http://cli.example:4").config.proxy
    assert (p.get("http_proxy"), p.origins["http_proxy"]) == (
        "http://cli.example:4",
        "command line --http-proxy",
    )
    assert p.build_args()["HTTP_PROXY"] == p.build_args()["http_proxy"] == "http://cli.example:4"


def test_ca_bundle_every_layer(tmp_path: Path) -> None:
    file_ca, env_ca, cli_ca = (write_pem(tmp_path / f"{n}.pem", n) for n in ("file", "env", "cli"))
    cfg = write_config(tmp_path, BASE_CONFIG + "ca_bundle: file.pem\n")
    assert _settings(cfg).config.ca_bundle == file_ca
    s = _settings(cfg, {"BUILDER_CA_BUNDLE": str(env_ca)})
    assert (s.config.ca_bundle, s.config.origins["ca_bundle"]) == (
        env_ca,
        "environment BUILDER_CA_BUNDLE",
    )
    s = _settings(cfg, {"BUILDER_CA_BUNDLE": str(env_ca)}, ca_bundle=str(cli_ca))
    assert (s.config.ca_bundle, s.config.origins["ca_bundle"]) == (
        cli_ca,
        "command line --ca-bundle",
    )


def test_selection_environment_then_command_line(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, BASE_CONFIG)
    env = {"BUILDER_ARCH": "ARM", "BUILDER_PYTHON": "3.9"}
    sel = _settings(cfg, env).selection
    assert (sel.arch, sel.python, sel.torch) == (("ARM",), ("3.9",), None)
    assert sel.origins == {
        "arch": "environment BUILDER_ARCH",
        "python": "environment BUILDER_PYTHON",
    }
    sel = _settings(cfg, env, arch="X86").selection
    assert sel.arch == ("X86",) and sel.origins["arch"] == "command line --arch"
    # through the CLI: environment ARM, command line X86 -> only x86_64 cells
    res = run_cli(
        "plan",
        "--config",
        str(cfg),
        "--arch",
        "X86",
        "--format",
        "github",
        env={"BUILDER_ARCH": "ARM", "BUILDER_PYTHON": "3.11"},
    )
    assert res.rc == 0 and '"machine":"x86_64"' in res.out and "aarch64" not in res.out


def test_file_merges_over_defaults_key_by_key(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, BASE_CONFIG + "images:\n  X86:\n    base: my.registry/base:1\n")
    images = _settings(cfg).config.images
    assert images["X86"].ref == "my.registry/base:1"
    assert images["X86"].family == "manylinux"  # from the built-in defaults
    assert images["X86"].plat == "manylinux_2_28_x86_64"
    assert images["ARM"].ref.startswith("quay.io/pypa/manylinux_2_28_aarch64:")
    # lists replace rather than merge
    cfg2 = write_config(
        tmp_path, BASE_CONFIG + "build:\n  auditwheel_exclude: ['libfoo.so']\n", "b.yaml"
    )
    assert _settings(cfg2).config.build.auditwheel_exclude == ("libfoo.so",)
    assert _settings(cfg).config.build.auditwheel_exclude == (
        "libtorch*.so",
        "libc10*.so",
        "libgomp.so.1",
    )


def test_backend_network_and_base_image_every_layer(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, BASE_CONFIG + "build:\n  backend: host\n  network: isolated\n")
    c = _settings(cfg).config
    assert (c.backend, c.origins["backend"]) == ("host", f"config file {cfg}")
    assert (c.network, c.origins["network"]) == ("isolated", f"config file {cfg}")
    assert c.base_image is None
    env = {"BUILDER_BACKEND": "docker", "BUILDER_NETWORK": "n2", "BUILDER_BASE_IMAGE": "img:1"}
    c = _settings(cfg, env).config
    assert (c.backend, c.origins["backend"]) == ("docker", "environment BUILDER_BACKEND")
    assert (c.network, c.origins["network"]) == ("n2", "environment BUILDER_NETWORK")
    assert (c.base_image, c.origins["base_image"]) == ("img:1", "environment BUILDER_BASE_IMAGE")
    c = _settings(cfg, env, backend="cross", network="n3", base_image="local").config
    assert (c.backend, c.origins["backend"]) == ("cross", "command line --backend")
    assert (c.network, c.origins["network"]) == ("n3", "command line --network")
    assert (c.base_image, c.origins["base_image"]) == ("local", "command line --base-image")
    # The plain names are not the builder's: they change nothing.
    c = _settings(cfg, {"BACKEND": "docker", "ARCH": "64", "BASE_IMAGE": "x"}).config
    assert (c.backend, c.base_image) == ("host", None)


def test_bundle_every_layer(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, BASE_CONFIG + "offline:\n  bundle: b1\n")
    o = _settings(cfg).config
    assert o.offline.bundle == tmp_path / "b1" and o.origins["bundle"] == f"config file {cfg}"
    o = _settings(cfg, {"BUILDER_BUNDLE": str(tmp_path / "b2")}).config
    assert o.offline.bundle == tmp_path / "b2"
    assert o.origins["bundle"] == "environment BUILDER_BUNDLE"
    o = _settings(cfg, {"BUILDER_BUNDLE": str(tmp_path / "b2")}, bundle=str(tmp_path / "b3")).config
    assert o.offline.bundle == tmp_path / "b3" and o.origins["bundle"] == "command line --bundle"
