"""Test hooks only where a test turned them on (kv_connector_extra_config['test_only_hooks']):
a request body carrying a kvc_debug_* key has nothing read for it in any other engine (the error
names the keys; the load then fails, so vLLM's kv_load_failure_policy decides), a producer
refuses a peer's acquire that asks it to sleep, and a peer's read timeout is held to the
producer's own read_timeout_s."""
from __future__ import annotations

import time
from types import SimpleNamespace as NS

import pytest
from vllm.v1.request import RequestStatus

from kvcache_ext.vllm import worker as W
from kvcache_ext.vllm.config import ConnectorConfig
from kvcache_ext.vllm.peer_input import bounded_seconds
from kvcache_ext.vllm.producer import Hold
from kvcache_ext.vllm.scheduler import SchedulerSide

PARAMS = {"do_remote_prefill": True, "remote_block_ids": [[1, 2]], "remote_engine_id": "p",
          "remote_request_id": "r", "remote_host": "127.0.0.1", "remote_port": 1,
          "remote_num_tokens": 40, "remote_instance": "i", "remote_generation": 1}


def recv_spec(cfg: ConnectorConfig, hooks: dict):
    s = SchedulerSide(NS(kv_transfer_config=NS(engine_id="d")), cfg)
    req = NS(request_id="x", prompt_token_ids=list(range(40)), status=RequestStatus.WAITING,
             kv_transfer_params=dict(PARAMS, **hooks))
    assert s.get_num_new_matched_tokens(req, 0) == (40, True)
    s.update_state_after_alloc(req, NS(get_block_ids=lambda: ([5, 6],)), 40)
    return s.build_connector_meta().recv["x"]


@pytest.mark.parametrize("hooks", [{"kvc_debug_corrupt": True},
                                   {"kvc_debug_acquire_delay_s": 30.0, "kvc_debug_delay_s": 1},
                                   {"kvc_debug_timeout_s": 1e9}])
def test_a_request_cannot_pull_a_test_hook_in_an_engine_without_them(hooks, caplog):
    rs = recv_spec(ConnectorConfig(), hooks)
    assert rs.debug == {}  # nothing of the hook reaches the worker
    for key in hooks:
        assert key in rs.error and key in caplog.text
    assert "test_only_hooks" in rs.error and "nothing is read" in rs.error


def test_the_hooks_run_where_a_test_turned_them_on():
    rs = recv_spec(ConnectorConfig(test_only_hooks=True), {"kvc_debug_corrupt": "mla"})
    assert rs.error == "" and rs.debug == {"corrupt": "mla"}
    assert recv_spec(ConnectorConfig(), {}).error == ""  # no hook, nothing refused


def producer(cfg: ConnectorConfig) -> W.WorkerSide:
    vcfg = NS(kv_transfer_config=NS(engine_id="producer"), parallel_config=NS(),
              model_config=NS(max_model_len=4096))
    ws = W.WorkerSide(vcfg, NS(kv_cache_groups=[NS(layer_names=["l0"])]), cfg)
    ws._holds["r"] = Hold(generation=1, expiry_time=time.time() + 60, block_ids=((1, 2),),
                          num_tokens=40)
    return ws


def acquire(ws: W.WorkerSide, **fields) -> dict:
    m = {"op": "acquire", "request_id": "r", "generation": 1, "instance": ws.instance,
         "block_ids": [[1, 2]], "num_tokens": 40} | fields
    return ws._serve(m)[0]


def test_a_peer_cannot_make_the_producer_sleep():
    ws = producer(ConnectorConfig())
    t = time.monotonic()
    reply = acquire(ws, debug_delay_s=30.0)
    assert time.monotonic() - t < 5.0  # refused at once, not after 30 s
    assert reply["ok"] is False and "test hook" in reply["why"]


@pytest.mark.parametrize("delay", [None, 0, "soon", [], False])
def test_a_delay_that_is_no_number_sleeps_not_at_all(delay):
    """(The fuzz of tests/vllm_env/test_side_channel_peers.py found "debug_delay_s": null
    taken as the 30-s cap.)"""
    for cfg in (ConnectorConfig(), ConnectorConfig(test_only_hooks=True)):
        t = time.monotonic()
        reply = acquire(producer(cfg), debug_delay_s=delay)
        assert time.monotonic() - t < 5.0
        # without the hooks any value given is refused; with them a non-number is no delay
        assert reply["ok"] is (cfg.test_only_hooks or not delay), reply


def test_with_the_hooks_on_the_delay_is_held_to_the_read_timeout():
    ws = producer(ConnectorConfig(test_only_hooks=True, read_timeout_s=0.2))
    t = time.monotonic()
    assert acquire(ws, debug_delay_s=1e9)["ok"] is True
    assert time.monotonic() - t < 5.0


@pytest.mark.parametrize("asked", [1e9, float("inf"), float("nan"), "soon", True, None, -5])
def test_a_peers_read_timeout_never_holds_blocks_past_the_producers_own(asked):
    ws = producer(ConnectorConfig(read_timeout_s=2.0))
    before = time.time()
    assert acquire(ws, timeout_s=asked)["ok"] is True
    assert before <= ws._holds["r"].read_deadline <= time.time() + 2.0


def test_a_peers_seconds_are_held_to_the_engines_own_bound():
    assert [bounded_seconds(v, 3.0) for v in (1, 2.5, 9, -1, float("inf"), float("nan"), "1", None, True)] \
        == [1.0, 2.5, 3.0, 0.0, 3.0, 3.0, 3.0, 3.0, 3.0]
    assert [bounded_seconds(v, 3.0, 0.0) for v in (None, "9", float("nan"), 2)] == [0.0, 0.0, 0.0, 2.0]
