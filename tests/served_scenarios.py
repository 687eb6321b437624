"""Served prefill -> decode in the suite (tests/test_vllm_served.py runs this under .venv-vllm):
two vLLM OpenAI servers with KvcacheExtConnector (block 64 -> 32) behind vllm-router, driven by
vLLM's load generator, against a third server alone; then two faults under load: clients that
hang up while their reads are in flight, and the producer killed and restarted under the same
engine id; and, during a load, hostile requests (a test hook, forged block ids, a producer not
allowed; straight to the decode server and through the router) while a peer holds a silent
connection to the producer's side channel. `python tests/served_scenarios.py OUT.json`."""
from __future__ import annotations

import http.client
import json
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

from kvc_harness.served import (Router, Server, compare, divergence, free_port, load,
                                make_served_model, metrics, post, start_all, tie_gap)

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


def complete(url: str, prompt: str, params: dict | None = None) -> dict:
    """One greedy completion: its text, or the HTTP error it got."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": OUTPUT_LEN, "temperature": 0,
            "ignore_eos": True}
    if params is not None:
        body["kv_transfer_params"] = params
    try:
        r = post(f"{url}/v1/completions", body)
    except OSError as e:  # urllib's HTTPError: the server refused the request
        return {"error": str(e)}
    return {"text": r["choices"][0]["text"], "params": r.get("kv_transfer_params")}


def hostile(p: Server, d: Server, router: Router, alone: Server) -> dict:
    """Each hostile request against one engine's text for its prompt: equal, a near tie, or an
    error (never another prompt's answer)."""
    words = lambda i: " ".join(f"w{(i * 13 + k) % 126 + 1}" for k in range(600))  # noqa: E731
    pre = {i: complete(p.url, words(i), {"do_remote_decode": True})["params"] for i in range(8)}
    y = pre[5]["remote_block_ids"]  # prompt 5's blocks, held for its reader (last)
    complete(d.url, words(6), pre[6])  # prompt 6 read: its blocks freed
    cases = {
        "freed blocks, direct": (d.url, 7, pre[7] | {"remote_block_ids": pre[6]["remote_block_ids"]}),
        "hook, direct": (d.url, 0, pre[0] | {"kvc_debug_corrupt": True}),
        "another request's blocks, direct": (d.url, 1, pre[1] | {"remote_block_ids": y}),
        "blocks past the cache, direct": (d.url, 2, pre[2] | {
            "remote_block_ids": [[10 ** 6 + b for b in g] for g in pre[2]["remote_block_ids"]]}),
        "producer not allowed, direct": (d.url, 3, pre[3] | {"remote_host": "10.255.255.1"}),
        "forged blocks, router": (router.url, 4, pre[4] | {"remote_block_ids": y}),
        "hook, router": (router.url, 0, pre[0] | {"kvc_debug_corrupt": True}),
    }
    out = {}
    for name, (url, i, params) in cases.items():
        got = complete(url, words(i), params)
        ref = complete(alone.url, words(i))["text"]
        at = divergence(got.get("text", ""), ref) if "text" in got else None
        out[name] = {"error": got.get("error"), "at": at,
                     "gap": tie_gap(alone.url, words(i), ref, at) if at not in (None, -1) else None}
    for i in (3, 4, 5):  # read as they should be: the producer frees what it still holds
        complete(d.url, words(i), pre[i])
    return out


def silent_peers(port: int, stop: threading.Event, n: int = 4) -> dict:
    """n connections to the producer's side channel that never send a byte, each opened again
    as the producer cuts it (its whole-message deadline), until stop."""
    cut = opened = 0
    socks = []
    while not stop.is_set():
        socks = [x for x in socks if x.fileno() >= 0]
        while len(socks) < n:
            socks.append(socket.create_connection(("127.0.0.1", port)))
            socks[-1].settimeout(0.0)
            opened += 1
        for x in socks:
            try:
                if x.recv(1) == b"":
                    cut += 1
                    x.close()
            except BlockingIOError:
                pass
        stop.wait(0.2)
    for x in socks:
        x.close()
    return {"opened": opened, "cut": cut}


def main(out_path: str) -> None:
    t0 = time.time()
    model = make_served_model(tempfile.mkdtemp(prefix="kvc-served-"))
    stats = str(Path(tempfile.mkdtemp()) / "reads.jsonl")
    refusals = str(Path(tempfile.mkdtemp()) / "refused.jsonl")
    p = Server("prefill", model, free_port(), 64, 0, free_port(), extra={"stats_path": refusals})
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
        bg: dict = {}

        # hostile requests during a load, a silent peer holding a side-channel connection
        loader = threading.Thread(target=lambda: bg.update(r=load(router.url, model, seed=5, **kw)))
        stop, silent = threading.Event(), {}
        peers = threading.Thread(target=lambda: silent.update(silent_peers(p.side_port, stop)))
        peers.start()
        hits = metrics(d.url).get("vllm:external_prefix_cache_hits_total", 0.0)
        loader.start()
        res["hostile"] = hostile(p, d, router, alone)
        loader.join()
        stop.set()
        peers.join()
        res["silent_peers"] = silent
        res["hostile_load"] = compare(bg["r"], load(alone.url, model, seed=5, **kw), alone.url)
        res["hostile_load"]["prompt_tokens"] = sum(bg["r"]["input_lens"])
        res["hostile_load"]["external_hits"] = metrics(d.url).get(
            "vllm:external_prefix_cache_hits_total", 0.0) - hits
        res["refused"] = [json.loads(x) for x in Path(refusals).read_text().splitlines()] \
            if Path(refusals).exists() else []

        # clients that hang up while their reads are in flight, during a load
        prompts = [" ".join(f"w{(i * 7 + k) % 126 + 1}" for k in range(1500)) for i in range(8)]
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
