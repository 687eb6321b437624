"""Reading a packed read's "part p is packed" notices beside a thread busy in Python, as a vLLM
worker's main thread is (run in .venv-vllm: kvcache_ext.vllm needs vLLM):

    .venv-vllm/bin/python benchmarks/bench_side_channel.py [--notices 8] [--repeats 15] [--out DIR]

Every socket call (recv, settimeout, a peek) lets go of the GIL; beside a thread busy in Python
the caller gets it back only after a switch interval (sys.getswitchinterval(), 5 ms), when it
asks the busy thread to drop it. The notices are sent before the reading starts (as when the
producer packs faster than the consumer reads): side_channel.Reader parses all of them from one
recv; "a recv per message" is how the stream read them before (a peek, then a recv for the
header and one for the JSON, the timeout set each time). Both interleaved, with and without the
busy thread; medians. Writes side_channel_cpu.json / .md under --out (default
benchmarks/results)."""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

from kvcache_ext.vllm.side_channel import HEADER, Reader, send

from bench_transfer_report import meta


def _exactly(sock: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        got += sock.recv(n - len(got))
    return got


def per_message(sock: socket.socket, count: int) -> None:
    """The former stream(): per message a timeout, a peek, a recv of the header, one of the JSON."""
    for _ in range(count):
        sock.settimeout(5.0)
        sock.recv(1, socket.MSG_PEEK)
        n_head, n_blob = HEADER.unpack(_exactly(sock, HEADER.size))
        json.loads(_exactly(sock, n_head))


def with_reader(sock: socket.socket, count: int) -> None:
    reader = Reader(sock, lambda: 5.0)
    for _ in range(count):
        reader.message()


def one(read, count: int) -> float:
    a, b = socket.socketpair()
    with a, b:
        for p in range(count):
            send(a, {"ok": True, "part": p, "pack_s": 0.01, "pack_cpu_s": 0.008})
        t = time.perf_counter()
        read(b, count)
        return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--notices", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()
    ways = {"a recv per message": per_message, "side_channel.Reader": with_reader}
    rows = []
    for busy in (False, True):
        stop = threading.Event()
        if busy:  # Python work that never blocks: the GIL changes hands only when asked
            threading.Thread(target=lambda: [sum(range(20000)) for _ in iter(stop.is_set, True)],
                             daemon=True).start()
        times: dict[str, list[float]] = {w: [] for w in ways}
        for _ in range(args.repeats):
            for w, read in ways.items():
                times[w].append(one(read, args.notices))
        stop.set()
        rows += [{"busy_thread": busy, "way": w, "median_ms": 1e3 * statistics.median(t),
                  "min_ms": 1e3 * min(t), "max_ms": 1e3 * max(t)} for w, t in times.items()]
        time.sleep(0.05)
    res = {"meta": meta("cpu") | {"switch_interval_s": sys.getswitchinterval()},
           "notices": args.notices, "repeats": args.repeats, "rows": rows}
    m = res["meta"]
    lines = [f"# Reading {args.notices} notices that have arrived, beside a busy Python thread", "",
             f"commit {m.get('commit')}, {m.get('date')}, {m['host']}, switch interval "
             f"{1e3 * m['switch_interval_s']:.0f} ms; medians of {args.repeats}", "",
             "| busy Python thread | way | median | min | max |", "|---|---|---:|---:|---:|"]
    lines += [f"| {'yes' if r['busy_thread'] else 'no'} | {r['way']} | {r['median_ms']:.2f} ms | "
              f"{r['min_ms']:.2f} ms | {r['max_ms']:.2f} ms |" for r in rows]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "side_channel_cpu.json").write_text(json.dumps(res, indent=1))
    (out / "side_channel_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
