"""A step that runs nothing while the worker reads a prompt (consumer) or holds one for a
reader (producer): vLLM steps again about 1 ms after such a step while a request waits for its
cache or to be freed, so the worker's results() waits (up to idle_wait_ms) for a read to end or a
hold to be released instead of answering at once. The reads here are stand-ins
held by an Event, so when each ends is ours to choose."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace as NS

import pytest

from kvcache_ext.vllm import worker as W
from kvcache_ext.vllm.config import ConnectorConfig
from kvcache_ext.vllm.protocol import KvcacheExtMetadata, RecvSpec, SendSpec
from kvcache_ext.vllm.scheduler import SchedulerSide


class Gates(dict):
    """go[r]: the Event that ends read r. The reading thread and the test may ask for it first
    at the same moment: setdefault makes them share one (a defaultdict could make two)."""

    def __missing__(self, key: str) -> threading.Event:
        return self.setdefault(key, threading.Event())


def consumer(idle_wait_ms: float) -> tuple[W.WorkerSide, dict[str, threading.Event]]:
    """A WorkerSide whose read of request r ends (done, or failed for ids starting "bad") once
    go[r] is set."""
    cfg = NS(kv_transfer_config=NS(engine_id="consumer"), parallel_config=NS(),
             model_config=NS(max_model_len=64))
    kv = NS(kv_cache_groups=[NS(layer_names=["model.layers.0.self_attn.attn"])])
    ws = W.WorkerSide(cfg, kv, ConnectorConfig(idle_wait_ms=idle_wait_ms))
    go = Gates()

    def read(rs: RecvSpec) -> None:  # what _load_one does at its end, once the bytes are in
        go[rs.request_id].wait(30)
        with ws._cond:
            (ws._recv_failed if rs.request_id.startswith("bad") else ws._recv_done).add(
                rs.request_id)
            ws._cond.notify_all()
    ws._load_one = read
    return ws, go


def step(*rids: str, idle: bool) -> KvcacheExtMetadata:
    return KvcacheExtMetadata(recv={r: RecvSpec(r, None, [[1]], 0, 1) for r in rids}, idle=idle)


def test_an_idle_step_answers_with_the_read_that_ends_during_its_wait():
    ws, go = consumer(idle_wait_ms=30_000)
    ws.start(step("a", idle=True))
    threading.Timer(0.05, go["a"].set).start()
    assert ws.results() == (set(), {"a"}, set())  # without the wait: nothing yet


def test_a_failed_read_ends_the_wait_too_and_is_reported_failed():
    ws, go = consumer(idle_wait_ms=30_000)
    ws.start(step("bad", idle=True))
    threading.Timer(0.05, go["bad"].set).start()
    assert ws.results() == (set(), {"bad"}, {"bad"})


def test_a_step_that_runs_something_never_waits():
    ws, go = consumer(idle_wait_ms=30_000)
    ws.start(step("a", idle=False))
    threading.Timer(0.5, go["a"].set).start()
    assert ws.results() == (set(), set(), set())  # an idle step would wait and get "a"


@pytest.mark.parametrize("idle_wait_ms", [0.0, 20.0])
def test_the_wait_is_bounded_and_the_read_is_reported_by_a_later_step(idle_wait_ms):
    ws, go = consumer(idle_wait_ms=idle_wait_ms)
    ws.start(step("a", idle=True))
    assert ws.results() == (set(), set(), set())  # the read is held: the wait ran out
    go["a"].set()
    for _ in range(500):  # until the reading thread has run
        if not ws._loading:
            break
        time.sleep(0.01)
    ws.start(step(idle=True))  # a later step
    assert ws.results() == (set(), {"a"}, set())


def test_an_idle_step_without_reads_in_flight_answers_at_once():
    ws, go = consumer(idle_wait_ms=30_000)
    ws.start(step(idle=True))
    threading.Timer(0.5, go["a"].set).start()  # (never asked for: no read of "a" is started)
    assert ws.results() == (set(), set(), set())


def test_one_wait_per_step():
    """results() called twice in one step (vLLM may ask get_finished and
    get_transfer_results) waits in the first call only."""
    ws, go = consumer(idle_wait_ms=30_000)
    ws.start(step("a", "b", idle=True))
    threading.Timer(0.05, go["a"].set).start()
    assert ws.results() == (set(), {"a"}, set())
    threading.Timer(0.5, go["b"].set).start()
    assert ws.results() == (set(), set(), set())  # a second wait would get "b"


def test_a_producer_s_idle_step_answers_with_the_hold_released_during_its_wait():
    """A producer holding a finished prompt's blocks for a reader: vLLM steps while it waits
    to free them; an idle step waits for the reader's release and reports it sent."""
    ws, _ = consumer(idle_wait_ms=30_000)
    ws.start(KvcacheExtMetadata(send={"p": SendSpec("p", 7, time.time() + 60, ((3,),), 9)},
                                idle=True))
    threading.Timer(0.05, lambda: ws._serve({"op": "release", "request_id": "p",
                                             "generation": 7, "block_ids": [[3]]})).start()
    t = time.monotonic()
    assert ws.results() == ({"p"}, set(), set())  # without the wait: nothing yet
    assert time.monotonic() - t < 10, "the release did not wake the wait (it ran out)"
    ws.start(KvcacheExtMetadata(idle=True))
    assert ws.results() == (set(), set(), set())  # nothing held: no wait


def test_the_scheduler_marks_a_step_that_schedules_no_token_idle():
    s = SchedulerSide(NS(kv_transfer_config=NS(engine_id="d")), ConnectorConfig())
    assert s.build_connector_meta(NS(total_num_scheduled_tokens=0)).idle is True
    assert s.build_connector_meta(NS(total_num_scheduled_tokens=3)).idle is False
    assert s.build_connector_meta().idle is False  # no scheduler output: never wait
    # the connector hands vLLM's scheduler output on
    from kvcache_ext.vllm.connector import KvcacheExtConnector
    assert KvcacheExtConnector.build_connector_meta(
        NS(scheduler=s), NS(total_num_scheduled_tokens=0)).idle is True


def test_under_data_parallelism_no_step_is_idle():
    """A rank whose step runs nothing runs a dummy batch that the other ranks' forwards wait
    for: its step must not wait."""
    s = SchedulerSide(NS(kv_transfer_config=NS(engine_id="d"),
                         parallel_config=NS(data_parallel_size=2)), ConnectorConfig())
    assert s.build_connector_meta(NS(total_num_scheduled_tokens=0)).idle is False


def test_idle_wait_ms_is_checked():
    for bad in (-1, float("inf"), float("nan"), 5000):
        with pytest.raises(ValueError, match=r"\['idle_wait_ms'\] must be in \[0, 1000\], got"):
            ConnectorConfig.from_extra({"idle_wait_ms": bad})
    assert ConnectorConfig.from_extra({"idle_wait_ms": "0"}).idle_wait_ms == 0.0
