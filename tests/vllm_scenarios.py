"""Every KvcacheExtConnector case that needs real vLLM engines, run once under .venv-vllm by
tests/test_vllm.py (which asserts on what this writes): `python tests/vllm_scenarios.py OUT.json`.

Engines (a tiny random fp32 Llama, one process each, each pinned to a core):
  a: block 32, b: block 64, c: block 96 -- kv_both, kv_load_failure_policy "recompute", NaN
     poured into a request's rows before every read (poison_before_load), reads logged;
  f: block 64, policy "fail" (vLLM's default);
  g then g2: block 32 on one fixed side-channel port, g2 a restart of g under the same engine id.
Cases: the block-size pairs 32 -> 64, 64 -> 32, 32 -> 96, 96 -> 64 for prompts of 1, 31, 33 and
230 tokens (tokens vs the consumer's own, salted baseline; external prefix-cache hits; bytes
read), a consumer holding part of the prompt, a read delayed while other prompts fill the
producer, the faults (producer gone, restarted, read that fails, read that times out, metadata
that does not match, parameters that expired, block ids forged (another prompt's, freed ones,
past the cache: the producer refuses each and counts it), a consumer request aborted mid-read, corrupted
bytes), each under both policies, and the producer's blocks back where they started."""
from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from dataclasses import asdict

from kvc_harness.engines import Engines, Prompt, external_hits, free_port, make_model, read_stats
from kvc_harness.engines import refusals as producer_refusals

LENGTHS = (1, 31, 33, 230)
A_BLOCKS = 64  # the producer a's whole cache: the delayed-read case cycles every free block
TOKEN_BYTES = 2 * 2 * 2 * 32 * 4  # layers x KV heads x (K, V) x head_dim x fp32
PAIRS = (("a", "b"), ("b", "a"), ("a", "c"), ("c", "b"))


def ids(n: int, seed: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(1, 128) for _ in range(n)]


def usage(e) -> float:
    """The engine's cache usage (vLLM's gauge, after a one-token probe request)."""
    return e.metrics(probe=True).get("vllm:kv_cache_usage_perc", -1.0)




def handoff(p, d, prompt: list[int], max_tokens: int = 8, tamper=None, debug=None):
    """Prefill on p, decode on d with p's parameters (tampered / with test hooks if asked)."""
    pre = p.generate([Prompt(prompt, 1, {"do_remote_decode": True})])[0]
    params = dict(pre.params or {})
    if tamper:
        params = tamper(params)
    if debug:
        params.update({f"kvc_debug_{k}": v for k, v in debug.items()})
    out = d.generate([Prompt(prompt, max_tokens, params)])[0]
    return pre, out


def refusals() -> dict[str, str]:
    """What the connector refuses before any engine runs, and the messages (each must name the
    field or layer): check_supported at start-up, cache_of at register_kv_caches, the config."""
    from types import SimpleNamespace as NS

    import torch

    from kvcache_ext.vllm.cache_plan import cache_of
    from kvcache_ext.vllm.config import ConnectorConfig, check_supported
    out = {}

    def attempt(name, fn):
        try:
            fn()
            out[name] = "accepted"
        except (ValueError, TypeError) as e:
            out[name] = str(e)

    def cfg(dtype="auto", tp=1, pp=1):
        return NS(cache_config=NS(cache_dtype=dtype),
                  parallel_config=NS(tensor_parallel_size=tp, pipeline_parallel_size=pp))
    one = NS(kv_cache_groups=[NS()])
    attempt("fp8 cache", lambda: check_supported(cfg("fp8"), one))
    # a hybrid cache of K | V layers (a sliding-window Llama): not a record a group plan knows
    kv = NS(num_kv_heads=2, num_head_slots=None, dtype=torch.float32, head_size=64,
            head_size_v=64, state_content_bytes=None, block_size=32, tokens_per_state=1)
    hybrid = NS(num_blocks=8, kv_cache_groups=[
        NS(layer_names=[f"model.layers.{i}.self_attn.attn"],
           kv_cache_spec=NS(kv_cache_specs={f"model.layers.{i}.self_attn.attn": kv}))
        for i in range(2)])
    attempt("two groups", lambda: check_supported(cfg(), hybrid))
    attempt("tp 2", lambda: check_supported(cfg(tp=2), one))
    attempt("pp 2", lambda: check_supported(cfg(pp=2), one))
    attempt("supported", lambda: check_supported(cfg(), one))
    attempt("unknown key", lambda: ConnectorConfig.from_extra({"hold_timeout": 3}))
    attempt("bad value", lambda: ConnectorConfig.from_extra({"read_timeout_s": "soon"}))
    buf = torch.zeros(2 * 8 * 2 * 32 * 64, dtype=torch.float32)
    good = buf.view(2, 8, 2, 32, 64)
    names = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
    attempt("vllm's tensors", lambda: cache_of({n: good[i] for i, n in enumerate(names)}, names))
    attempt("layer in another storage", lambda: cache_of(
        {names[0]: good[0], names[1]: good[1].clone()}, names))
    other_strides = buf.view(2, 8, 32, 2, 64).transpose(2, 3)[1]  # same bytes, head-inner
    attempt("layer strided", lambda: cache_of({names[0]: good[0], names[1]: other_strides},
                                              names))
    attempt("layers out of order", lambda: cache_of({names[0]: good[1], names[1]: good[0]},
                                                    names))
    attempt("3-d layer", lambda: cache_of({n: good[i, 0] for i, n in enumerate(names)}, names))
    attempt("layer missing", lambda: cache_of({names[0]: good[0]}, names))
    return out


def main(out_path: str) -> None:
    t_start = time.time()
    res: dict = {"cases": {}, "engines": {}, "lengths": list(LENGTHS),
                 "pairs": ["->".join(p) for p in PAIRS], "refusals": refusals()}
    model = make_model(tempfile.mkdtemp(prefix="kvc-tiny-llama-"))
    stats = {n: os.path.join(tempfile.mkdtemp(), f"reads-{n}.jsonl") for n in "abcfg"}
    common = {"poison_before_load": True, "test_only_hooks": True}  # the fault cases' kvc_debug_*
    g_port = free_port()
    import kvcache_ext._C
    res["extension"] = kvcache_ext._C.__file__
    with Engines(model) as eng:
        # two at a time: the engine start-up is mostly one core's work
        # a packs prompts for its unlike consumers (b, c) in 1 MiB: most of a's reads are
        # packed reads, and of eight at once some find the buffer full (read unpacked instead)
        a = eng.start("a", 32, 0, extra=common | {"stats_path": stats["a"], "pack_buffer_mb": 1.0},
                      wait=False, num_blocks=A_BLOCKS)
        b = eng.start("b", 64, 1, extra=common | {"stats_path": stats["b"]}, wait=False)
        eng.wait(a), eng.wait(b)
        c = eng.start("c", 96, 0, extra=common | {"stats_path": stats["c"],
                                                   "hold_timeout_s": 8.0}, wait=False)
        f = eng.start("f", 64, 1, policy="fail", extra=common | {"stats_path": stats["f"]},
                      wait=False)
        eng.wait(c), eng.wait(f)
        byname = {"a": a, "b": b, "c": c, "f": f}
        res["engines"] = {n: e.start_s for n, e in byname.items()}
        usage0 = {n: usage(e) for n, e in byname.items()}

        # ---- the block-size pairs ----------------------------------------------------------
        for k, (pn, dn) in enumerate(PAIRS):
            p, d = byname[pn], byname[dn]
            for n in LENGTHS:
                prompt = ids(n, seed=1000 * k + n)
                base = d.generate([Prompt(prompt, 8, salt=f"base-{k}-{n}")])[0]
                hits0 = external_hits(d)
                pre, out = handoff(p, d, prompt)
                res["cases"][f"pair {pn}->{dn} len {n}"] = {
                    "tokens": out.tokens, "baseline": base.tokens,
                    "producer_baseline": p.generate([Prompt(prompt, 8, salt=f"pb-{k}-{n}")])[0].tokens,
                    "finish": out.finish_reason, "params": pre.params,
                    "external_hits": external_hits(d) - hits0, "prompt_len": n, "consumer": dn,
                    "producer": pn}

        # ---- several prompts in one call: their reads in flight together --------------------
        for pn, dn in (("b", "a"), ("a", "c")):
            p, d = byname[pn], byname[dn]
            prompts = [ids(40 + 37 * i, seed=500 + i) for i in range(8)]
            base = d.together([Prompt(x, 8, salt=f"tog-{pn}{dn}-{i}") for i, x in enumerate(prompts)])
            pre = p.together([Prompt(x, 1, {"do_remote_decode": True}) for x in prompts])
            hits0 = external_hits(d)
            # a -> c: each read keeps its pack range 2 s after it ends, so the eight overlap
            # whatever the timing and those that find a's 1 MiB full are read unpacked
            hold = {"kvc_debug_release_delay_s": 2.0} if (pn, dn) == ("a", "c") else {}
            outs = d.together([Prompt(x, 8, q.params | hold) for x, q in zip(prompts, pre)])
            res["cases"][f"together {pn}->{dn}"] = {
                "tokens": [o.tokens for o in outs], "baseline": [o.tokens for o in base],
                "finish": [o.finish_reason for o in outs], "external_hits": external_hits(d) - hits0,
                "prompt_tokens": sum(len(x) for x in prompts)}

        # ---- a consumer that holds part of the prompt --------------------------------------
        shared = ids(150, seed=7)
        b.generate([Prompt(shared, 1)])  # b (block 64) caches 2 whole blocks of it
        prompt = shared[:140] + ids(60, seed=8)
        base = b.generate([Prompt(prompt, 8, salt="partial")])[0]
        hits0 = external_hits(b)
        pre, out = handoff(a, b, prompt)
        res["cases"]["partial local hit a->b"] = {
            "tokens": out.tokens, "baseline": base.tokens, "prompt_len": len(prompt),
            "external_hits": external_hits(b) - hits0, "read": read_stats(stats["b"])[-1]}

        # ---- a read delayed while other prompts fill the producer --------------------------
        prompt = ids(230, seed=9)
        base = b.generate([Prompt(prompt, 8, salt="delayed")])[0]
        pre = a.generate([Prompt(prompt, 1, {"do_remote_decode": True})])[0]
        params = dict(pre.params) | {"kvc_debug_delay_s": 6.0}
        got = {}
        reader = threading.Thread(target=lambda: got.update(
            out=b.generate([Prompt(prompt, 8, params)])[0]))
        reader.start()
        fill = [ids(230, seed=100 + i) for i in range(12)]  # 12 x 8 blocks > A_BLOCKS
        a.generate([Prompt(x, 2) for x in fill])
        reader.join(120)
        res["cases"]["delayed read while the producer fills"] = {
            "tokens": got["out"].tokens, "baseline": base.tokens,
            "fill_blocks": sum(-(-(len(x) + 2) // 32) for x in fill), "a_blocks": A_BLOCKS}

        # ---- faults, under both policies ---------------------------------------------------
        # forged block ids: another prompt's, held for a reader (y); a read prompt's, freed (z)
        pre_y = a.generate([Prompt(ids(200, seed=31), 1, {"do_remote_decode": True})])[0]
        z = ids(200, seed=32)
        pre_z = a.generate([Prompt(z, 1, {"do_remote_decode": True})])[0]
        b.generate([Prompt(z, 2, dict(pre_z.params))])  # read: a frees z's blocks
        forged = {"another request's blocks": pre_y.params["remote_block_ids"],
                  "freed blocks": pre_z.params["remote_block_ids"]}
        res["forged"] = forged
        faults = {
            **{f"forged: {k}": (lambda q, ids_=v: q | {"remote_block_ids": ids_}, None)
               for k, v in forged.items()},
            "read fails (block id past the producer's cache)":
                (lambda q: q | {"remote_block_ids": [[10 ** 7] * len(q["remote_block_ids"][0])]}, None),
            "metadata does not match (engine id)":
                (lambda q: q | {"remote_engine_id": "someone-else"}, None),
            "unknown hand-off (generation)":
                (lambda q: q | {"remote_generation": q["remote_generation"] + 1000}, None),
            "read times out": (None, {"acquire_delay_s": 4.0, "timeout_s": 1.5}),
        }
        for name, (tamper, debug) in faults.items():
            for consumer in ("b", "f"):
                prompt = ids(200, seed=hash((name, consumer)) % 10**6)
                d = byname[consumer]
                base = b.generate([Prompt(prompt, 8, salt=f"fault-{name}-{consumer}")])[0]
                t = time.time()
                pre, out = handoff(a, d, prompt, tamper=tamper, debug=debug)
                secs = time.time() - t
                again = d.generate([Prompt(prompt, 8)])[0]  # on the blocks vLLM recomputed
                res["cases"][f"fault {name} [{consumer}]"] = {
                    "tokens": out.tokens, "baseline": base.tokens, "finish": out.finish_reason,
                    "seconds": secs, "again": again.tokens, "read": read_stats(stats[consumer])[-1],
                    "params": pre.params, "policy": "fail" if consumer == "f" else "recompute"}
        b.generate([Prompt(ids(200, seed=31), 2, dict(pre_y.params))])  # y read at last: freed
        # parameters that expired: c holds for 8 s
        for consumer in ("b", "f"):
            prompt = ids(120, seed=11 if consumer == "b" else 12)
            d = byname[consumer]
            base = b.generate([Prompt(prompt, 8, salt=f"expired-{consumer}")])[0]
            pre = c.generate([Prompt(prompt, 1, {"do_remote_decode": True})])[0]
            time.sleep(10)
            out = d.generate([Prompt(prompt, 8, dict(pre.params))])[0]
            res["cases"][f"fault parameters expired [{consumer}]"] = {
                "tokens": out.tokens, "baseline": base.tokens, "finish": out.finish_reason,
                "policy": "fail" if consumer == "f" else "recompute",
                "producer_usage_after": usage(c)}
        # corrupted bytes: the read succeeds, the tokens must change
        prompt = ids(230, seed=13)
        base = b.generate([Prompt(prompt, 8, salt="corrupt")])[0]
        pre, out = handoff(a, b, prompt, debug={"corrupt": True})
        res["cases"]["corrupted bytes"] = {"tokens": out.tokens, "baseline": base.tokens}
        # a consumer request aborted while its read is in flight
        prompt = ids(230, seed=14)
        pre = a.generate([Prompt(prompt, 1, {"do_remote_decode": True})])[0]
        drain = b.abort_while_loading(Prompt(prompt, 8, dict(pre.params) | {
            "kvc_debug_acquire_delay_s": 3.0}))
        after = ids(100, seed=15)
        base = b.generate([Prompt(after, 8, salt="after-abort")])[0]
        pre2, out = handoff(a, b, after)
        res["cases"]["aborted mid-read"] = {"drain_s": drain, "tokens": out.tokens,
                                            "baseline": base.tokens}

        # ---- producer gone, and restarted under the same engine id --------------------------
        g = eng.start("g", 32, 0, extra=common | {"side_channel_port": g_port}, wait=False)
        n = eng.start("n", 32, 1, connector="NixlConnector", policy="fail", wait=False,
                      env={"VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())})
        eng.wait(g), eng.wait(n)
        # vLLM's own NixlConnector as a producer: the keys its parameters carry
        res["nixl_params"] = n.generate([Prompt(ids(40, seed=17), 1,
                                                {"do_remote_decode": True})])[0].params
        n.stop()
        prompt = ids(200, seed=16)
        base_b = b.generate([Prompt(prompt, 8, salt="gone")])[0]
        pre_g = g.generate([Prompt(prompt, 1, {"do_remote_decode": True})])[0]
        g.stop()
        for consumer in ("b", "f"):
            out = byname[consumer].generate([Prompt(prompt, 8, dict(pre_g.params))])[0]
            res["cases"][f"fault producer gone [{consumer}]"] = {
                "tokens": out.tokens, "baseline": base_b.tokens, "finish": out.finish_reason,
                "policy": "fail" if consumer == "f" else "recompute"}
        # restarted as an engine without test_only_hooks (as served): the test hook case below
        g2 = eng.start("g", 32, 0, extra={"poison_before_load": True, "side_channel_port": g_port,
                                          "stats_path": stats["g"]})
        for consumer in ("b", "f"):
            out = byname[consumer].generate([Prompt(prompt, 8, dict(pre_g.params))])[0]
            res["cases"][f"fault producer restarted [{consumer}]"] = {
                "tokens": out.tokens, "baseline": base_b.tokens, "finish": out.finish_reason,
                "policy": "fail" if consumer == "f" else "recompute"}
        # a request body pulling a test hook (kvc_debug_corrupt) in an engine without them:
        # nothing read, the load fails, and the recompute policy computes the prompt itself
        prompt = ids(230, seed=18)
        base = g2.generate([Prompt(prompt, 8, salt="hook")])[0]
        pre, out = handoff(a, g2, prompt, debug={"corrupt": True})
        res["cases"]["test hook refused [g]"] = {
            "tokens": out.tokens, "baseline": base.tokens, "finish": out.finish_reason,
            "read": read_stats(stats["g"])[-1:]}
        g2.stop()

        # ---- everything released: the producers' blocks are back where they started ----------
        time.sleep(2)
        res["usage_start"] = usage0
        res["usage_end"] = {n: usage(e) for n, e in byname.items()}
        res["reads"] = {n: read_stats(p) for n, p in stats.items()}
        res["refused"] = {n: producer_refusals(p) for n, p in stats.items()}
    res["seconds"] = time.time() - t_start
    with open(out_path, "w") as fh:
        json.dump(res, fh, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o))


if __name__ == "__main__":
    main(sys.argv[1])
