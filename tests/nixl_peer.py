"""The other process of the NIXL tests (started with multiprocessing "spawn"): it owns a DSA
cache in BLHNC / block 64, writes one request into it, publishes its Endpoint's metadata and then
answers commands from a queue. While the test process reads or writes its memory it makes no
call at all: it waits on the queue (bounded), and only its Endpoint's poller runs."""
from __future__ import annotations

import os
import queue

os.environ.setdefault("UCX_NET_DEVICES", "lo")  # loopback only

TOKENS = 150
TABLE = [4, 1, 3]          # the request's blocks (block size 64)
BACK_TABLE = [0, 5, 2]     # where the test writes the request back
NUM_BLOCKS = 256
LAYERS = 2
IDLE_S = 120               # a peer whose test process went away exits after this long


def specs():
    import kvcache_ext as kvc
    return [kvc.CacheSpec("mla", 656, LAYERS),
            kvc.CacheSpec("indexer", 132, LAYERS, split=(128, 4))]


def gathers(cache, table):
    """Every layer's dequantized MLA rows and split-placement indexer codes and scales."""
    import torch
    import kvcache_ext as kvc
    t = torch.tensor(table, dtype=torch.int32)[None]
    cu = torch.tensor([0, TOKENS], dtype=torch.int32)
    out = []
    for layer in range(LAYERS):
        codes, scales = kvc.ops.gather_indexer(cache.view("indexer", layer), t, cu,
                                               placement="split")
        out.append((kvc.ops.gather_mla(cache.view("mla", layer), t, cu), codes, scales))
    return out


def serve(commands, replies) -> None:
    import torch
    import kvcache_ext as kvc
    import kvcache_ext.nixl as kn

    plan = kvc.plan_cache(specs(), NUM_BLOCKS, 64, "BLHNC")
    cache = kvc.allocate(plan, fill=0)
    g = torch.Generator().manual_seed(7)
    slots = kvc.slot_mapping(torch.tensor(TABLE, dtype=torch.int32), torch.arange(TOKENS), 64)
    for layer in range(LAYERS):
        kvc.ops.dsa_write(torch.randn(TOKENS, 512, generator=g).to(torch.bfloat16),
                          torch.randn(TOKENS, 64, generator=g).to(torch.bfloat16),
                          cache.view("mla", layer),
                          torch.randn(TOKENS, 128, generator=g).to(torch.bfloat16),
                          cache.view("indexer", layer), slots, placement="split")
    ep = kn.Endpoint("owner", cache)
    still = kn.Endpoint("owner-no-progress", kvc.allocate(plan, fill=1), poll_interval_s=None)
    replies.put(("ready", ep.metadata(), still.metadata(), gathers(cache, TABLE)))
    while True:
        try:
            cmd, *args = commands.get(timeout=IDLE_S)
        except queue.Empty:
            cmd = "exit"
        if cmd == "check_back":  # did the test's write land where the gathers find it?
            want, got = gathers(cache, TABLE), gathers(cache, BACK_TABLE)
            ok = all(torch.equal(a, b) for w, g_ in zip(want, got) for a, b in zip(w, g_))
            replies.put(("checked", ok))
        elif cmd == "exit":
            ep.close()
            still.close()
            replies.put(("bye",))
            return
        elif cmd == "die":  # go away without closing anything
            os._exit(0)
