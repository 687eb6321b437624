"""KvcacheExtConnector between two vLLM engines of a DeepSeek-V3-architecture model (MLA latent
rows), run under .venv-vllm by tests/test_vllm_mla.py: `python tests/vllm_mla_scenarios.py OUT`.

vLLM-CPU picks its MLA backend by the host: AMX_MLA where the CPU has AMX (bf16, block sizes
multiples of 32, prefix caching on), CPU_MLA elsewhere (block 16 forced, prefix caching off).
On an AMX host the pairs are 32->128, 128->32, 64->96 and 128->128, and a consumer that holds
part of a prompt reads only the rest; elsewhere the one pair the backend allows, 16->16, and the
report says why the others are absent. Prompts of 1, 31, 33, 129 and 300 tokens go together
(several reads in flight at once); tokens are compared with the consumer engine's own, with the
top-2 log-probability gaps to tell a near tie."""
from __future__ import annotations

import json
import random
import sys
import tempfile
import time
from pathlib import Path

from kvc_harness.engines import (Engines, Prompt, external_hits, has_amx, make_mla_model,
                     read_stats)

LENGTHS = (1, 31, 33, 129, 300)
ROW_BYTES = 576 * 2   # bf16 latent row
LAYERS = 2


def ids(n: int, seed: int) -> list[int]:
    r = random.Random(seed)
    return [r.randrange(1, 128) for _ in range(n)]




def main(out_path: str) -> None:
    amx = has_amx()
    res: dict = {"backend": "AMX_MLA" if amx else "CPU_MLA", "lengths": list(LENGTHS), "cases": {}}
    if amx:
        blocks = {"a": 32, "b": 128, "c": 64, "d": 96, "e": 128}
        pairs = [("a", "b"), ("b", "a"), ("c", "d"), ("b", "e")]
    else:
        blocks = {"f": 16, "g": 16}
        pairs = [("f", "g")]
        res["absent"] = ("this host has no AMX, so vLLM-CPU runs MLA on its CPU_MLA backend, "
                         "which forces block size 16 and turns prefix caching off: the unlike "
                         "pairs (32->128, 128->32, 64->96) and the partial prefix hit run on an "
                         "AMX host; engine-free, tests/vllm_env/test_cache_plans.py moves MLA "
                         "rows between those block sizes")
    model = make_mla_model(tempfile.mkdtemp(prefix="kvc-tiny-v3-"))
    stats = {n: str(Path(tempfile.mkdtemp()) / f"reads-{n}.jsonl") for n in blocks}
    t0 = time.time()
    with Engines(model) as eng:
        started = {}
        names = list(blocks)
        for i in range(0, len(names), 2):  # two at a time: start-up is mostly one core's work
            for k, n in enumerate(names[i:i + 2]):
                started[n] = eng.start(n, blocks[n], k, dtype="bfloat16", wait=False,
                                       extra={"poison_before_load": True, "stats_path": stats[n]})
            for n in names[i:i + 2]:
                eng.wait(started[n])
        res["start_s"] = time.time() - t0
        for k, (pn, dn) in enumerate(pairs):
            p, d = started[pn], started[dn]
            prompts = [ids(n, 100 * k + n) for n in LENGTHS]
            base = d.together([Prompt(x, 8, salt=f"base-{k}-{i}") for i, x in enumerate(prompts)])
            pre = p.together([Prompt(x, 1, {"do_remote_decode": True}) for x in prompts])
            hits0 = external_hits(d)
            outs = d.together([Prompt(x, 8, o.params) for x, o in zip(prompts, pre)])
            res["cases"][f"{pn}->{dn}"] = {
                "blocks": [blocks[pn], blocks[dn]], "external_hits": external_hits(d) - hits0,
                "prompts": [{"len": len(x), "tokens": o.tokens, "baseline": b.tokens,
                             "finish": o.finish_reason, "baseline_gaps": b.top2_gaps,
                             "params_blocks": len((q.params or {}).get("remote_block_ids", [[]])[0])}
                            for x, o, b, q in zip(prompts, outs, base, pre)]}
        if amx:  # a consumer holding part of the prompt (prefix caching on AMX_MLA)
            b, a = started["b"], started["a"]
            shared = ids(300, 7)
            b.generate([Prompt(shared, 1)])          # b (block 128) caches 2 whole blocks
            prompt = shared[:280] + ids(60, 8)
            base = b.generate([Prompt(prompt, 8, salt="partial")])[0]
            pre = a.generate([Prompt(prompt, 1, {"do_remote_decode": True})])[0]
            hits0 = external_hits(b)
            out = b.generate([Prompt(prompt, 8, pre.params)])[0]
            res["cases"]["partial a->b"] = {"len": len(prompt), "tokens": out.tokens,
                                            "baseline": base.tokens, "local": 256,
                                            "external_hits": external_hits(b) - hits0,
                                            "read": read_stats(stats["b"])[-1]}
    res["reads"] = {n: read_stats(path) for n, path in stats.items()}
    res["seconds"] = time.time() - t0
    Path(out_path).write_text(json.dumps(res))


if __name__ == "__main__":
    main(sys.argv[1])
