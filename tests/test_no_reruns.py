"""A test that fails and then passes on a rerun must fail the run (issue #40): no plugin in
this session reruns failures. pyproject.toml blocks pytest-rerunfailures and flaky by name
(``-p no:...``); this catches any other rerunner that a conftest or an install brings in."""

from __future__ import annotations

import pytest

RERUNNER_WORDS = ("rerun", "flaky", "retry", "retries")


def test_no_plugin_reruns_failed_tests(pytestconfig: pytest.Config) -> None:
    names = set()
    for name, plugin in pytestconfig.pluginmanager.list_name_plugin():
        if plugin is None:  # a name blocked with -p no:NAME (listed, never loaded)
            continue
        names.add(str(name))
        names.add(getattr(plugin, "__name__", ""))  # a module plugin's import name
    rerunners = sorted(n for n in names if any(w in n.lower() for w in RERUNNER_WORDS))
    assert not rerunners, f"a plugin that reruns failed tests is loaded: {rerunners}"
    # ... and none added its command-line option under another name.
    for option in ("reruns", "force_flaky", "retries"):
        assert not hasattr(pytestconfig.option, option), option
