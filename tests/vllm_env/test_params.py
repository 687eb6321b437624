"""A decode request's kv_transfer_params are a request body: every field is checked before use
(kvcache_ext/vllm/params.py), the producer they name must be one the operator allows, and the
producer names the blocks a read may take. Random and mutated parameters go through both halves
of a consumer -- its scheduler half, then its worker half against a real producer's side channel
-- and no read ever takes blocks other than those the producer holds for the request named."""
from __future__ import annotations

import itertools
import time
from collections import Counter
from types import SimpleNamespace as NS

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from vllm.v1.request import RequestStatus

import kvcache_ext as kvc
from kvcache_ext.vllm import worker as W
from kvcache_ext.vllm.config import ConnectorConfig
from kvcache_ext.vllm.params import (ParamError, ParamLimits, allowed_of, check_blocks,
                                     producer_allowed, remote_of)
from kvcache_ext.vllm.producer import MIN_PART_BYTES, Hold
from kvcache_ext.vllm.scheduler import SchedulerSide
from kvcache_ext.vllm.side_channel import Server

GOOD = {"do_remote_prefill": True, "remote_block_ids": [[3, 4, 5]], "remote_engine_id": "p",
        "remote_request_id": "r", "remote_host": "127.0.0.1", "remote_port": 5600,
        "remote_num_tokens": 40, "remote_instance": "i", "remote_generation": 1,
        "remote_blocks_expiry_time": 2e9, "tp_size": 1, "transfer_mode": "pull"}
LIMITS = ParamLimits(max_tokens=4096, num_groups=1, allowed=allowed_of("", "127.0.0.1"))


@pytest.mark.parametrize("field,value", [
    ("remote_block_ids", "3,4"), ("remote_block_ids", []), ("remote_block_ids", [[3], [4]]),
    ("remote_block_ids", [[3, -1]]), ("remote_block_ids", [[3, 2**40]]),
    ("remote_block_ids", [[3, True]]), ("remote_block_ids", [[3.0]]),
    ("remote_block_ids", [list(range(41))]),  # more blocks than 40 tokens fill
    ("remote_port", 0), ("remote_port", 70000), ("remote_port", "5600"), ("remote_port", True),
    ("remote_host", ""), ("remote_host", "10.0.0.9"), ("remote_host", "evil.example"),
    ("remote_host", "127.0.0.1 x"), ("remote_host", 127),
    ("remote_num_tokens", 0), ("remote_num_tokens", 5000), ("remote_num_tokens", 40.0),
    ("remote_generation", 0), ("remote_generation", "1"), ("remote_generation", 2**64),
    ("remote_request_id", ""), ("remote_request_id", "x" * 300), ("remote_request_id", 5),
    ("remote_engine_id", None), ("remote_instance", "a\nb"),
    ("remote_blocks_expiry_time", float("nan")), ("remote_blocks_expiry_time", "soon"),
    ("remote_blocks_expiry_time", 10 ** 400),  # json takes it; float() would overflow
    ("tp_size", 2), ("transfer_mode", "push"),
])
def test_each_bad_field_is_refused_by_name(field, value):
    with pytest.raises(ParamError, match=f"kv_transfer_params\\['{field}'\\]") as e:
        remote_of(GOOD | {field: value}, LIMITS)
    assert e.value.field == field


def test_an_int_past_strs_digit_limit_is_refused_by_name():
    """(LLM.generate takes any int; its repr would raise ValueError in the message.)"""
    with pytest.raises(ParamError, match="remote_num_tokens.*too long to show"):
        remote_of(GOOD | {"remote_num_tokens": 10 ** 5000}, LIMITS)


def test_a_missing_field_is_refused_by_name():
    for field in ("remote_block_ids", "remote_host", "remote_port", "remote_num_tokens",
                  "remote_generation", "remote_instance", "remote_request_id", "remote_engine_id"):
        with pytest.raises(ParamError, match=field):
            remote_of({k: v for k, v in GOOD.items() if k != field}, LIMITS)


def test_good_parameters_pass():
    r = remote_of(GOOD, LIMITS)
    assert (r.host, r.port, r.block_ids, r.num_tokens, r.generation) == \
        ("127.0.0.1", 5600, ((3, 4, 5),), 40, 1)


@pytest.mark.parametrize("setting,host,port,ok", [
    ("", "127.0.0.1", 1, True), ("", "127.9.9.9", 1, True), ("", "::1", 1, True),
    ("", "localhost", 1, True), ("", "10.1.2.3", 1, False), ("", "own.host", 1, True),
    ("10.1.0.0/16", "10.1.2.3", 1, True), ("10.1.0.0/16", "10.2.2.3", 1, False),
    ("10.1.0.0/16", "127.0.0.1", 1, False),  # an operator's list replaces the default
    ("p1:5600,p2", "p1", 5600, True), ("p1:5600,p2", "p1", 5601, False), ("p1:5600,p2", "p2", 9, True),
    ("[::1]:7", "::1", 7, True), ("[::1]:7", "::1", 8, False), ("*", "anything", 1, True),
    ("bad:entry:x, 10.0.0.1", "10.0.0.1", 1, True),
])
def test_the_allow_list(setting, host, port, ok):
    assert producer_allowed(host, port, allowed_of(setting, "own.host")) is ok


def test_block_lists_against_the_producers_plan():
    r = remote_of(GOOD, LIMITS)
    check_blocks(r, [16], 6)  # 40 tokens at 16: 3 blocks, all below 6
    for sizes, nb, why in (([16], 5, "below the producer's 5"), ([32], 64, "at most 2"),
                           ([16, 16], 64, "2 list")):
        with pytest.raises(ParamError, match=why):
            check_blocks(r, sizes, nb)


# ---- both halves, under random and mutated parameters ------------------------------------------
BLOCK, NUM_BLOCKS, TOKENS = 16, 12, 40
SPEC = kvc.CacheSpec("kv", 64, 1)
HELD = {"r": [[3, 4, 5]], "y": [[7, 8, 9]]}  # the producer's two held prompts
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c,
                                                                          max_size=3),
                    max_leaves=10)
BLOCK_LISTS = st.sampled_from([HELD["y"], [[3, 4]], [[3, 4, 5, 6]], [[5, 4, 3]], [[3, 4, 10**7]],
                               [[3, 4, 5], [7]], [[0, 0, 0]], [[-1, 4, 5]]]) | JSON
FIELD_VALUES = {
    "remote_block_ids": BLOCK_LISTS, "remote_request_id": st.sampled_from(["y", "zz"]) | JSON,
    "remote_generation": st.sampled_from([0, 2, 10**30]) | JSON,
    "remote_instance": st.sampled_from(["old"]) | JSON,
    "remote_port": st.sampled_from([1, 65535, 99999]) | JSON,
    "remote_host": st.sampled_from(["localhost", "10.0.0.1", "", "evil"]) | JSON,
    "remote_num_tokens": st.sampled_from([1, 17, 41, 48, 10**9, -3]) | JSON,
    "remote_engine_id": JSON,
    "remote_blocks_expiry_time": st.sampled_from([0, 1.0, 10**400, float("inf")]) | JSON,
    "tp_size": JSON, "transfer_mode": JSON, "do_remote_prefill": JSON,
    "kvc_debug_corrupt": JSON, "kvc_debug_timeout_s": JSON,
}


@st.composite
def parameters(draw) -> object:
    """A producer's own parameters for r with 1-3 fields changed or dropped, or anything."""
    if draw(st.integers(0, 9)) == 0:
        return draw(JSON)
    p = {"do_remote_prefill": True}
    for _ in range(draw(st.integers(1, 3))):
        field = draw(st.sampled_from(sorted(FIELD_VALUES)))
        if draw(st.booleans()) and field != "do_remote_prefill":
            p[field] = None if draw(st.booleans()) else draw(FIELD_VALUES[field])
        else:
            p[field] = draw(FIELD_VALUES[field])
        p = {k: v for k, v in p.items() if v is not None or k == field}
    return p


class Reads:
    """A consumer Endpoint stand-in: records the producer block table of every read posted."""

    def __init__(self, plan) -> None:
        self.plan = plan
        self.cache = NS(buffer=torch.zeros(plan.total_bytes, dtype=torch.uint8))
        self.tables: list[list[int]] = []

    def read_tokens(self, peer, src, dst, count, start, dst_start):
        self.tables.append(src.tolist())
        stats = NS(plan_s=0.0, plan_cpu_s=0.0, runs=0, spans=0, bytes=0, path="", pieces=0,
                   staged_bytes=0)
        return NS(stats=stats, wait=lambda timeout: None, cancel=lambda: None)

    def transfer_plan(self, peer):
        return kvc.TransferPlan(peer.plan, self.plan)


@pytest.fixture(scope="module")
def pair():
    """A real producer's side channel holding r and y; a consumer's two halves pointed at it."""
    plan = kvc.plan_cache([SPEC], NUM_BLOCKS, BLOCK, "LBHNC")
    vcfg = NS(kv_transfer_config=NS(engine_id="p"), parallel_config=NS(),
              model_config=NS(max_model_len=4096))
    prod = W.WorkerSide(vcfg, NS(kv_cache_groups=[NS(layer_names=["l0"])]),
                        ConnectorConfig(acquire_wait_s=0.02))
    prod.ep = NS(metadata=lambda: b"")
    server = Server("127.0.0.1", 0, prod._serve, message_timeout_s=2.0)
    cons = W.WorkerSide(NS(kv_transfer_config=NS(engine_id="d"), parallel_config=NS(),
                           model_config=NS(max_model_len=4096)),
                        NS(kv_cache_groups=[NS(layer_names=["l0"])]),
                        ConnectorConfig(read_timeout_s=2.0))
    cons.ep = Reads(plan)
    cons._peer = lambda r, timeout_s: NS(plan=plan, exposed_nbytes=0)
    sched = SchedulerSide(vcfg, ConnectorConfig())
    yield prod, server, cons, sched
    server.close()


GENERATIONS = itertools.count(100)


@settings(max_examples=600, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(mutated=parameters())
@example(mutated={"do_remote_prefill": True})  # the producer's own: read (the harness reads)
@example(mutated={"remote_request_id": "y", "remote_block_ids": HELD["y"]})  # y's, whole: read
def test_no_parameters_read_outside_the_requests_own_blocks(pair, mutated):
    prod, server, cons, sched = pair
    gen = next(GENERATIONS)  # a fresh hand-off: late releases of earlier ones match nothing
    with prod._cond:
        prod._holds.clear()
        for rid, blocks in HELD.items():
            prod._holds[rid] = Hold(gen, time.time() + 60, tuple(tuple(g) for g in blocks),
                                    TOKENS)
    good = {"do_remote_prefill": True, "remote_block_ids": HELD["r"], "remote_engine_id": "p",
            "remote_request_id": "r", "remote_host": server.host, "remote_port": server.port,
            "remote_num_tokens": TOKENS, "remote_instance": prod.instance,
            "remote_generation": gen, "remote_blocks_expiry_time": time.time() + 60}
    params = good | mutated if isinstance(mutated, dict) else mutated
    req = NS(request_id="x", prompt_token_ids=list(range(TOKENS)), status=RequestStatus.WAITING,
             kv_transfer_params=params)
    cons.ep.tables.clear()
    count, is_async = sched.get_num_new_matched_tokens(req, 0)  # never raises
    if not is_async:
        assert not (isinstance(params, dict) and params.get("do_remote_prefill"))
        req.status = RequestStatus.FINISHED_ABORTED  # ended before its read: never raises
        assert sched.request_finished(req, ([1, 2, 6],)) == (False, None)
        return
    sched.update_state_after_alloc(req, NS(get_block_ids=lambda: ([1, 2, 6],)), count)
    rs = sched.build_connector_meta().recv["x"]
    assert rs.remote is not None or rs.error  # parameters refused say why
    cons._loading += 1
    cons._load(rs)  # the worker half: every failure is the request's, never raised
    done, failed = cons._recv_done, cons._recv_failed
    assert ("x" in done) != ("x" in failed)
    done.discard("x"), failed.discard("x")
    for table in cons.ep.tables:  # a read took exactly the named request's held blocks
        r = rs.remote
        assert r.instance == prod.instance and r.generation == gen and r.request_id in HELD
        assert table == HELD[r.request_id][0]
    assert len(cons.ep.tables) <= 1 and not (rs.error and cons.ep.tables)  # refused: no read
    if isinstance(mutated, dict) and mutated.keys() <= {"do_remote_prefill", "remote_request_id",
                                                        "remote_block_ids"} and \
            isinstance(params["remote_request_id"], str) and params["remote_request_id"] in HELD and \
            HELD[params["remote_request_id"]] == params["remote_block_ids"]:
        assert cons.ep.tables == params["remote_block_ids"], mutated  # a whole hand-off: read


def test_the_producer_counts_each_forgery(pair):
    """Another request's blocks, blocks no one holds (freed ones), out-of-range ones: each
    acquire refused before anything moves, counted by reason."""
    prod, server, cons, sched = pair
    with prod._cond:
        prod._holds.clear()
        for rid, blocks in HELD.items():
            prod._holds[rid] = Hold(1, time.time() + 60, tuple(tuple(g) for g in blocks), TOKENS)
    before = Counter(prod.refused)
    ask = {"op": "acquire", "request_id": "r", "generation": 1, "instance": prod.instance,
           "num_tokens": TOKENS}
    for forged in (HELD["y"], [[10, 11, 12]], [[3, 4, 10**7]]):
        reply, _ = prod._serve(ask | {"block_ids": forged})
        assert reply["ok"] is False and "holds [[3, 4, 5]]" in reply["why"]
    # the blocks' last rows past the prompt's 40 tokens: whatever the blocks held before
    reply, _ = prod._serve(ask | {"block_ids": HELD["r"], "num_tokens": 48})
    assert reply["ok"] is False and "holds 40" in reply["why"]
    assert prod.refused - before == Counter(blocks=3, tokens=1)
    assert prod._holds["r"].read_deadline == 0  # nothing granted
    reply, _ = prod._serve(ask | {"block_ids": HELD["r"]})
    assert reply["ok"] and reply["block_ids"] == HELD["r"] and reply["lease"]


def grant(prod, rid: str = "r", timeout_s: float = 30.0) -> dict:
    return prod._serve({"op": "acquire", "request_id": rid, "generation": 5,
                        "instance": prod.instance, "block_ids": HELD[rid], "num_tokens": TOKENS,
                        "timeout_s": timeout_s})[0]


def release(prod, rid: str = "r", **fields) -> dict:
    return prod._serve({"op": "release", "request_id": rid, "generation": 5} | fields)[0]


def test_blocks_under_a_granted_read_are_freed_only_by_the_reads_leases(pair):
    """Two reads granted (a router's retry, a duplicate): the first to end does not free the
    blocks under the other; a peer that knows the request id and hand-off -- even one that
    asks for a grant of its own with a zero timeout -- neither shortens a read's deadline nor
    frees the blocks under it; the last read's release does."""
    prod, *_ = pair
    with prod._cond:
        prod._holds["r"] = Hold(5, time.time() + 60, ((3, 4, 5),), TOKENS)
    first, second = grant(prod), grant(prod)
    deadline = prod._holds["r"].read_deadline
    peer = grant(prod, timeout_s=0)
    assert prod._holds["r"].read_deadline >= deadline  # never moved earlier
    for lease in (None, "guess", 7):
        assert release(prod, lease=lease, block_ids=HELD["r"])["ok"] is False
    assert release(prod, lease=peer["lease"])["ok"] and "r" in prod._holds
    assert release(prod, lease=second["lease"])["ok"] and "r" in prod._holds  # first reads on
    assert release(prod, lease=first["lease"])["ok"] and "r" not in prod._holds


def test_before_a_grant_a_release_must_name_the_blocks(pair):
    """A consumer that holds the prompt itself (or whose read failed before it asked) frees the
    blocks with the parameters' block ids; a forged request naming a victim's request id with
    other blocks frees nothing."""
    prod, *_ = pair
    with prod._cond:
        prod._holds["r"] = Hold(5, time.time() + 60, ((3, 4, 5),), TOKENS)
    assert release(prod, block_ids=HELD["y"])["ok"] is False and "r" in prod._holds
    assert release(prod)["ok"] is False and "r" in prod._holds
    assert release(prod, block_ids=HELD["r"])["ok"] and "r" not in prod._holds


def test_a_peers_pack_request_is_bounded_and_packs_the_held_blocks(pair):
    """A pack's tokens within the prompt held, its parts at least MIN_PART_BYTES; the blocks it
    packs are the producer's own list, whatever the ask names."""
    prod, *_ = pair
    asked = []

    def pack(buf, plan, rid, ask, alive):  # PackBuffer.pack's first reply, recorded
        asked.append(ask)
        yield {"ok": True, "packed": {"offset": 0}}, b""
    prod.pack = NS(pack=pack)
    prod.ep = NS(metadata=lambda: b"", cache=NS(buffer=None), plan=None)
    try:
        for bad, why in (({"start": 0, "count": 41}, "within the 40 held"),
                         ({"start": -1, "count": 5}, "within the 40 held"),
                         ({"part_bytes": 1}, "at least"), ({"count": "5"}, "integers")):
            with prod._cond:
                prod._holds["r"] = Hold(5, time.time() + 60, ((3, 4, 5),), TOKENS)
            ask = {"start": 0, "count": 40, "part_bytes": MIN_PART_BYTES,
                   "block_ids": [99]} | bad
            reply, _ = prod._serve({"op": "acquire", "request_id": "r", "generation": 5,
                                    "instance": prod.instance, "block_ids": HELD["r"],
                                    "num_tokens": TOKENS, "pack": ask})
            assert reply["ok"] and reply["packed"] is None and why in reply["why"], reply
        assert asked == []
        with prod._cond:
            prod._holds["r"] = Hold(5, time.time() + 60, ((3, 4, 5),), TOKENS)
        replies = prod._serve({"op": "acquire", "request_id": "r", "generation": 5,
                               "instance": prod.instance, "block_ids": HELD["r"],
                               "num_tokens": TOKENS,
                               "pack": {"start": 0, "count": 40, "part_bytes": MIN_PART_BYTES,
                                        "block_ids": [99]}})
        (first, _), = list(replies)
        assert first["packed"] == {"offset": 0} and first["lease"] and first["block_ids"] == HELD["r"]
        assert asked[0]["block_ids"] == [3, 4, 5]  # the held list, not the ask's
    finally:
        prod.pack = None
        prod.ep = NS(metadata=lambda: b"")


def test_an_acquire_after_the_hold_expired_never_frees_blocks_under_a_granted_read(pair):
    """A read granted before the hold's expiry runs to its own deadline: a later acquire (a
    retry, a duplicate, any peer with the request id) is refused as expired and frees nothing;
    with no read granted, the expired hold is freed at once."""
    prod, *_ = pair
    with prod._cond:
        prod._holds["r"] = Hold(5, time.time() + 60, ((3, 4, 5),), TOKENS)
    first = grant(prod)
    with prod._cond:
        prod._holds["r"].expiry_time = time.time() - 1
    late = grant(prod)
    assert late["ok"] is False and "timed out" in late["why"] and "r" in prod._holds
    assert release(prod, lease=first["lease"])["ok"] and "r" not in prod._holds
    with prod._cond:
        prod._holds["r"] = Hold(5, time.time() - 1, ((3, 4, 5),), TOKENS)
    assert grant(prod)["ok"] is False and "r" not in prod._holds
