"""Served prefill -> decode in the suite (tests/test_vllm_served.py runs this under .venv-vllm):
two vLLM OpenAI servers with KvcacheExtConnector (block 64 -> 32) behind vllm-router, driven by
vLLM's load generator, against a third server alone; then two faults under load: clients that
hang up while their reads are in flight, and the producer killed and restarted under the same
engine id. `python tests/served_scenarios.py OUT.json`."""
from __future__ import annotations

import http.client
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

from kvc_harness.served import (Router, Server, compare, free_port, load, make_served_model,
                    metrics, post, start_all)

REQUESTS, IN_FLIGHT = 32, 8
INPUT_LEN, OUTPUT_LEN = 1500, 12   # prompts of 15 .. 2985 tokens


def usage(s: Server) -> float:
    """The server's cache usage after a one-token probe (the gauge moves only on steps)."""
    post(f"{s.url}/v1/completions", {"model": "tiny", "prompt": "w3", "max_tokens": 1})
    return metrics(s.url).get("vllm:kv_cache_usage_perc", -1.0)


def hang_up(url: str, prompt: str, after_s: float) -> str:
    """A client that sends a completion and closes its connection after after_s."""
    host, port = url.split("//")[1].split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=30)
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 64, "temperature": 0,
                       "ignore_eos": True})
    c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    time.sleep(after_s)
    c.close()
    return "closed"


def main(out_path: str) -> None:
    t0 = time.time()
    model = make_served_model(tempfile.mkdtemp(prefix="kvc-served-"))
    stats = str(Path(tempfile.mkdtemp()) / "reads.jsonl")
    p = Server("prefill", model, free_port(), 64, 0, free_port())
    d = Server("decode", model, free_port(), 32, 1, free_port(), extra={"stats_path": stats})
    alone = Server("alone", model, free_port(), 32, 1, free_port())
    res: dict = {"requests": REQUESTS, "in_flight": IN_FLIGHT}
    router = None
    try:
        start_all([p, d, alone])
        router = Router(free_port(), p.url, d.url).start()
        res["start_s"] = time.time() - t0
        usage0 = {"prefill": usage(p), "decode": usage(d)}
        kw = dict(num_prompts=REQUESTS, concurrency=IN_FLIGHT, input_len=INPUT_LEN,
                  output_len=OUTPUT_LEN)
        ref = load(alone.url, model, **kw)
        hits0 = metrics(d.url).get("vllm:external_prefix_cache_hits_total", 0.0)
        first = load(router.url, model, **kw)
        res["external_hits"] = metrics(d.url).get("vllm:external_prefix_cache_hits_total", 0.0) - hits0
        rss1 = {"prefill": p.rss(), "decode": d.rss()}
        second = load(router.url, model, **kw)
        rss2 = {"prefill": p.rss(), "decode": d.rss()}
        res["input_lens"] = first["input_lens"]
        res["served"] = [compare(first, ref, alone.url), compare(second, ref, alone.url)]
        res["rss"] = [rss1, rss2]
        time.sleep(2)
        res["usage"] = [usage0, {"prefill": usage(p), "decode": usage(d)}]

        # clients that hang up while their reads are in flight, during a load
        prompts = [" ".join(f"w{(i * 7 + k) % 126 + 1}" for k in range(1500)) for i in range(8)]
        bg = {}
        loader = threading.Thread(target=lambda: bg.update(r=load(router.url, model, seed=1, **kw)))
        loader.start()
        hangers = [threading.Thread(target=hang_up, args=(router.url, x, 0.3 + 0.1 * i))
                   for i, x in enumerate(prompts)]
        for h in hangers:
            h.start()
        for h in hangers:
            h.join()
        loader.join()
        ref1 = load(alone.url, model, seed=1, **kw)
        res["hang_up"] = {"during": compare(bg["r"], ref1, alone.url),
                          "after": compare(load(router.url, model, seed=2, **kw),
                                           load(alone.url, model, seed=2, **kw), alone.url)}
        time.sleep(3)
        res["hang_up"]["usage"] = {"prefill": usage(p), "decode": usage(d)}

        # the producer killed during a load, and restarted under the same engine id and port
        loader = threading.Thread(target=lambda: bg.update(r=load(router.url, model, seed=3, **kw)))
        hits = metrics(d.url).get("vllm:external_prefix_cache_hits_total", 0.0)
        loader.start()
        deadline = time.monotonic() + 60  # some of its requests moved: kill the producer then
        while (metrics(d.url).get("vllm:external_prefix_cache_hits_total", 0.0) < hits + 8000
               and time.monotonic() < deadline):
            time.sleep(0.05)
        p.kill()
        time.sleep(1.0)
        p.proc = None
        p.start()
        loader.join()
        ref3 = load(alone.url, model, seed=3, **kw)
        res["restart"] = {"during": compare(bg["r"], ref3, alone.url)}
        time.sleep(6)  # the router's health check sees the producer back
        res["restart"]["after"] = compare(load(router.url, model, seed=4, **kw),
                                          load(alone.url, model, seed=4, **kw), alone.url)
        res["reads"] = [json.loads(x) for x in Path(stats).read_text().splitlines()] \
            if Path(stats).exists() else []
    finally:
        if router is not None:
            router.stop()
        for s in (p, d, alone):
            s.stop()
    res["logs"] = {s.name: s.log for s in (p, d, alone)} | {"router": router.log if router else ""}
    res["seconds"] = time.time() - t0
    Path(out_path).write_text(json.dumps(res))


if __name__ == "__main__":
    main(sys.argv[1])
