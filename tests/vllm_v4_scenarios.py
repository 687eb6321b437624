"""KvcacheExtConnector between two vLLM-CPU engines of a tiny DeepSeek-V4 (five KV-cache groups
overlaid on one BLHNC allocation: two window groups, the main group of compressed rows and
indexer rows, two compressor-state groups), run under .venv-vllm by tests/test_vllm_v4.py:
`python tests/vllm_v4_scenarios.py OUT`.

vllm-cpu 0.32 forces V4 to block 256 on both engines (no unlike pair). Prompts of 1, 31, 300
and 2,200 tokens (the long one: 2,200 // 4 = 550 compressed rows > index_topk 512, so the
indexer picks) go through the pair together; the consumer's tokens and log-probabilities are
compared with its own. Then one spec at a time, the moved rows are corrupted on the consumer
(every byte set to 0x3F: fp8 codes 1.875, UE8M0 scales 2^-64, bf16 and fp32 values ~0.75 --
finite, as a NaN logit stops vLLM-CPU's sampler and the engine) and the log-probabilities must
change: a 384-token prompt's last token (383, which the consumer recomputes) closes a ratio-4
and a ratio-128 compression window, so the window, ratio-4, ratio-128 and state rows are all
read, and the new compressed rows from the moved states are read by all 8 decode steps; the indexer's rows and its compressor's states only matter once it selects, so their
cases are the long prompt (its decode crosses the ratio-4 boundary at 2,203)."""
from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from engines import Engines, Prompt, external_hits, make_v4_model, read_stats  # noqa: E402

LENGTHS = (1, 31, 300, 2200)
CORRUPT_LEN, LONG = 384, 2200
MAX_TOKENS = 8
# vLLM's groups (kvcache_ext/vllm/group_plan.py names them g<i>.<j>): g0.0 / g1.0 the window
# rows of layers {0, 2} / {1, 3}, g2.0 the indexer rows, g2.1 the ratio-4 rows, g2.2 the
# ratio-128 rows, g3.0 / g3.1 the ratio-4 indexer / main compressor states, g4.0 the ratio-128
# compressor states
CORRUPT = (("g0.0", CORRUPT_LEN), ("g1.0", CORRUPT_LEN), ("g2.0", LONG), ("g2.1", CORRUPT_LEN),
           ("g2.2", CORRUPT_LEN), ("g3.0", LONG), ("g3.1", CORRUPT_LEN),
           ("g4.0", CORRUPT_LEN))


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
        prod = e.start("p", 256, 0, extra={"hold_timeout_s": 900}, **kw)
        cons = e.start("c", 256, 1, extra={"poison_before_load": True, "stats_path": stats},
                       **kw)
        res["start_s"] = time.time() - t0
        prompts = {n: ids(n, n) for n in LENGTHS + (CORRUPT_LEN,)}
        # the consumer's own tokens (its weights: vLLM's seeded dummy loader, as the producer's)
        base = cons.together([Prompt(prompts[n], MAX_TOKENS, salt="own") for n in
                              LENGTHS + (CORRUPT_LEN,)], timeout_s=900)
        own = {n: o for n, o in zip(LENGTHS + (CORRUPT_LEN,), base)}

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
        # one spec's moved rows corrupted a request, all cases in one batch each way (a
        # request's corruption touches its own rows only), and a clean move beside them
        cases = [(spec, n) for spec, n in CORRUPT] + [("none", CORRUPT_LEN)]
        firsts = prod.together([Prompt(prompts[n], 1, {"do_remote_decode": True}, f"c-{spec}")
                                for spec, n in cases], timeout_s=900)
        outs = cons.together([Prompt(prompts[n], MAX_TOKENS, {
            **f.params, **({} if spec == "none" else {"kvc_debug_corrupt": spec})}, f"c-{spec}")
            for (spec, n), f in zip(cases, firsts)], timeout_s=900)
        res["cases"]["corrupt"] = {
            spec: {"len": n, "tokens": o.tokens, "baseline": own[n].tokens,
                   "logprobs": o.logprobs, "baseline_logprobs": own[n].logprobs,
                   "baseline_gaps": own[n].top2_gaps}
            for (spec, n), o in zip(cases, outs)}
        res["reads"] = read_stats(stats)
    res["seconds"] = time.time() - t0
    Path(out_path).write_text(json.dumps(res))


if __name__ == "__main__":
    main(sys.argv[1])
