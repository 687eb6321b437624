"""The fast test tier's guard inside vLLM: kvc_harness registers a vLLM general plugin, which vLLM
loads in every process that starts an engine (EngineArgs, the engine core, each worker); under
KVC_TEST_TIER=fast it refuses, so no engine starts outside the engine tier (tests/tiers.py)."""
from __future__ import annotations

import pytest


def test_the_guard_is_one_of_vllms_general_plugins():
    from importlib.metadata import entry_points
    names = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert names.get("kvc_tier_guard") == "kvc_harness.tier:vllm_plugin", names


def test_vllms_plugin_loading_refuses_under_the_fast_tier_only(monkeypatch):
    """load_general_plugins is what EngineArgs, the engine core and every worker call first."""
    import vllm.plugins as plugins
    from kvc_harness.tier import TierError
    monkeypatch.setenv("KVC_TEST_TIER", "fast")
    monkeypatch.setattr(plugins, "plugins_loaded", False)
    with pytest.raises(TierError, match="engine tier"):
        plugins.load_general_plugins()
    monkeypatch.delenv("KVC_TEST_TIER")
    monkeypatch.setattr(plugins, "plugins_loaded", False)
    plugins.load_general_plugins()  # outside the fast tier: nothing refused
