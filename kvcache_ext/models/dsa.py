"""A DeepSeek sparse-attention (DSA) model that runs prefill and decode from the cache ops alone.

DeepSeek-V3.2's attention, scaled down (random weights): MLA with a 512-wide latent and a 64-wide
RoPE key (fixed by the 656-byte fp8_ds_mla row) and the lightning indexer (128-wide keys, fixed by
the 132-byte indexer row). Per layer and step:

  1. dsa_write stores each new token's MLA latent + RoPE key and its indexer key (one launch);
  2. gather_indexer reads the requests' cached indexer keys (dequantized), each query scores them
     (sum over indexer heads of w_h * relu(q_h . k)), causally masked, and keeps the top-k;
  3. gather_mla_slots reads the selected latent rows (dequantized) and the heads attend over them
     in the latent space (W_UK absorbed into the query, W_UV applied after).

Everything after the host builds a step's inputs has static shapes and no host synchronisation
(num_tokens= / validate=False), so `DSAModel.forward` runs under torch.compile(fullgraph=True) and
CUDA-graph capture. `DSARunner` is the small engine around it: block tables, free list, requests.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch
from torch import nn

from .. import ops
from ..cache import BlockPool, KVCache, allocate
from ..plan import DEFAULT_LAYOUT, CacheSpec, plan_cache

KV_LORA_RANK, ROPE_DIM, INDEX_DIM = 512, 64, 128  # fixed by the cache row formats
Views = Sequence[tuple[torch.Tensor, torch.Tensor]]  # per layer: (mla view, indexer view)


@dataclass(frozen=True)
class DSAConfig:
    """DeepSeek-V3.2's attention shapes; the defaults are scaled down (deepseek_v32() has the
    real ones). kv_lora_rank, qk_rope_head_dim and index_head_dim are fixed by the row formats."""

    vocab_size: int = 512
    hidden_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    q_lora_rank: int = 64
    qk_nope_head_dim: int = 32
    v_head_dim: int = 32
    index_n_heads: int = 16
    index_topk: int = 16
    rope_theta: float = 10000.0
    kv_lora_rank: int = KV_LORA_RANK
    qk_rope_head_dim: int = ROPE_DIM
    index_head_dim: int = INDEX_DIM

    def __post_init__(self) -> None:
        fixed = {"kv_lora_rank": KV_LORA_RANK, "qk_rope_head_dim": ROPE_DIM,
                 "index_head_dim": INDEX_DIM}
        for name, want in fixed.items():
            if getattr(self, name) != want:
                raise ValueError(f"{name} must be {want} (the cache's row format), got "
                                 f"{getattr(self, name)}")

    @classmethod
    def deepseek_v32(cls) -> DSAConfig:
        return cls(vocab_size=129280, hidden_size=7168, num_layers=61, num_heads=128,
                   q_lora_rank=1536, qk_nope_head_dim=128, v_head_dim=128, index_n_heads=64,
                   index_topk=2048)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE over the last dimension; x [Q, ..., d], positions [Q]."""
    d = x.shape[-1]
    inv = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    ang = positions.to(torch.float32)[:, None] * inv[None, :]  # [Q, d/2]
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (d // 2,)
    cos, sin = ang.cos().view(shape), ang.sin().view(shape)
    a, b = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def _linear(gen: torch.Generator, out: int, inp: int) -> nn.Parameter:
    return nn.Parameter(torch.randn(out, inp, generator=gen) * inp ** -0.5, requires_grad=False)


@dataclass
class Projections:
    """One layer's per-token tensors before the cache (fp32; cache inputs rounded to bf16)."""

    q_nope: torch.Tensor  # [Q, H, nope]
    q_pe: torch.Tensor    # [Q, H, 64], RoPE applied
    kv_c: torch.Tensor    # [Q, 512] bf16
    k_pe: torch.Tensor    # [Q, 64] bf16, RoPE applied
    q_idx: torch.Tensor   # [Q, Hi, 128]
    k_idx: torch.Tensor   # [Q, 128] bf16
    w_idx: torch.Tensor   # [Q, Hi], softmax scale of the indexer folded in


class DSALayer(nn.Module):
    def __init__(self, cfg: DSAConfig, gen: torch.Generator) -> None:
        super().__init__()
        self.cfg = cfg
        h, n, r = cfg.hidden_size, cfg.num_heads, cfg.q_lora_rank
        self.attn_norm = nn.Parameter(torch.ones(h), requires_grad=False)
        self.wq_a = _linear(gen, r, h)
        self.q_norm = nn.Parameter(torch.ones(r), requires_grad=False)
        self.wq_b = _linear(gen, n * (cfg.qk_nope_head_dim + ROPE_DIM), r)
        self.wkv_a = _linear(gen, KV_LORA_RANK + ROPE_DIM, h)
        self.kv_norm = nn.Parameter(torch.ones(KV_LORA_RANK), requires_grad=False)
        # W_UK [H, nope, 512] and W_UV [H, 512, v]: absorbed into query and output.
        self.w_uk = nn.Parameter(torch.randn(n, cfg.qk_nope_head_dim, KV_LORA_RANK, generator=gen)
                                 * KV_LORA_RANK ** -0.5, requires_grad=False)
        self.w_uv = nn.Parameter(torch.randn(n, KV_LORA_RANK, cfg.v_head_dim, generator=gen)
                                 * KV_LORA_RANK ** -0.5, requires_grad=False)
        self.wo = _linear(gen, h, n * cfg.v_head_dim)
        self.wq_idx = _linear(gen, cfg.index_n_heads * INDEX_DIM, r)
        self.wk_idx = _linear(gen, INDEX_DIM, h)
        self.k_idx_norm = nn.Parameter(torch.ones(INDEX_DIM), requires_grad=False)
        self.w_idx = _linear(gen, cfg.index_n_heads, h)

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> Projections:
        c = self.cfg
        hx = rms_norm(x, self.attn_norm)
        q_c = rms_norm(hx @ self.wq_a.T, self.q_norm)
        q = (q_c @ self.wq_b.T).view(-1, c.num_heads, c.qk_nope_head_dim + ROPE_DIM)
        kv = hx @ self.wkv_a.T
        q_idx = (q_c @ self.wq_idx.T).view(-1, c.index_n_heads, INDEX_DIM)
        k_idx = rms_norm(hx @ self.wk_idx.T, self.k_idx_norm)
        # The indexer ropes its first 64 dimensions (DeepSeek-V3.2's order: rope, then nope).
        q_idx = torch.cat([rope(q_idx[..., :ROPE_DIM], positions, c.rope_theta),
                           q_idx[..., ROPE_DIM:]], dim=-1)
        k_idx = torch.cat([rope(k_idx[..., :ROPE_DIM], positions, c.rope_theta),
                           k_idx[..., ROPE_DIM:]], dim=-1)
        w = (hx @ self.w_idx.T) * (c.index_n_heads ** -0.5 * INDEX_DIM ** -0.5)
        return Projections(
            q_nope=q[..., : c.qk_nope_head_dim],
            q_pe=rope(q[..., c.qk_nope_head_dim:], positions, c.rope_theta),
            kv_c=rms_norm(kv[:, :KV_LORA_RANK], self.kv_norm).to(torch.bfloat16),
            k_pe=rope(kv[:, KV_LORA_RANK:], positions, c.rope_theta).to(torch.bfloat16),
            q_idx=q_idx, k_idx=k_idx.to(torch.bfloat16), w_idx=w)

    @staticmethod
    def index_scores(p: Projections, keys: torch.Tensor) -> torch.Tensor:
        """[Q, T] indexer scores of every query against keys [T, 128]."""
        s = torch.relu(torch.einsum("qhd,td->qht", p.q_idx, keys))
        return (s * p.w_idx[:, :, None]).sum(1)

    def attend(self, p: Projections, rows: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """MLA over selected latent rows [Q, K, 576] (fp32; invalid ones masked) -> [Q, hidden]."""
        c = self.cfg
        lat, pe = rows[..., :KV_LORA_RANK], rows[..., KV_LORA_RANK:]
        q_lat = torch.einsum("qhn,hnc->qhc", p.q_nope, self.w_uk)
        logits = (torch.einsum("qhc,qkc->qhk", q_lat, lat)
                  + torch.einsum("qhr,qkr->qhk", p.q_pe, pe))
        logits = logits * (c.qk_nope_head_dim + ROPE_DIM) ** -0.5
        logits = logits.masked_fill(~valid[:, None, :], float("-inf"))
        o_lat = torch.einsum("qhk,qkc->qhc", torch.softmax(logits, dim=-1), lat)
        o = torch.einsum("qhc,hcv->qhv", o_lat, self.w_uv)
        return o.flatten(1) @ self.wo.T


@dataclass
class StepOutput:
    logits: torch.Tensor        # [Q, vocab]
    topk: list[torch.Tensor]    # per layer: int64 [Q, K] positions in the request, -1 = none


class DSAModel(nn.Module):
    """Embedding, DSA layers (attention + residual), final norm, LM head."""

    def __init__(self, cfg: DSAConfig, seed: int = 0) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.cfg = cfg
        self.embed = nn.Parameter(torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen),
                                  requires_grad=False)
        self.layers = nn.ModuleList(DSALayer(cfg, gen) for _ in range(cfg.num_layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden_size), requires_grad=False)
        self.head = _linear(gen, cfg.vocab_size, cfg.hidden_size)

    def cache_specs(self) -> list[CacheSpec]:
        return [CacheSpec("mla", 656, self.cfg.num_layers),
                CacheSpec("indexer", 132, self.cfg.num_layers)]

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, req: torch.Tensor,
                block_table: torch.Tensor, ctx_lens: torch.Tensor, views: Views) -> StepOutput:
        """One step for Q query tokens (prefill chunks or one decode token per request).

        tokens, positions, req: int64 [Q] (token id, position in its request, block-table row);
        block_table int32 [R, M] with this step's blocks already assigned; ctx_lens int32 [R]:
        tokens of each request in the cache after this step's writes. No host synchronisation."""
        bs = views[0][0].shape[2]
        num_req, width = block_table.shape
        max_ctx = width * bs  # static width of a request's context
        block = block_table[req, positions // bs].to(torch.int64)
        slots = torch.where(block >= 0, block * bs + positions % bs, torch.full_like(block, -1))
        cu = torch.cat([ctx_lens.new_zeros(1), ctx_lens.cumsum(0, dtype=torch.int32)])
        # Row of (request r, position p) in the gathered keys; the output is sized for the
        # worst case, so its shape never depends on the lengths.
        pos = torch.arange(max_ctx, device=tokens.device)
        rows = (cu[:-1, None].to(torch.int64) + pos[None, :]).clamp(max=num_req * max_ctx - 1)
        causal = pos[None, :] <= positions[:, None]  # [Q, max_ctx]; position < ctx_len holds
        k = min(self.cfg.index_topk, max_ctx)
        x = self.embed[tokens]
        topks = []
        for layer, (mla_view, idx_view) in zip(self.layers, views):
            p = layer.project(x, positions)
            ops.dsa_write(p.kv_c, p.k_pe, mla_view, p.k_idx, idx_view, slots)
            out = (torch.zeros(num_req * max_ctx, INDEX_DIM, dtype=torch.uint8, device=x.device),
                   torch.zeros(num_req * max_ctx, dtype=torch.float32, device=x.device))
            keys = ops.gather_indexer(idx_view, block_table, cu, dequant=torch.float32, out=out,
                                      validate=False)
            scores = layer.index_scores(p, keys).gather(1, rows[req])
            scores = scores.masked_fill(~causal, float("-inf"))
            best, chosen = scores.topk(k, dim=-1)
            valid = best > float("-inf")
            chosen = torch.where(valid, chosen, torch.full_like(chosen, -1))
            sel_block = block_table[req[:, None], chosen.clamp(min=0) // bs].to(torch.int64)
            sel_slots = torch.where(valid, sel_block * bs + chosen % bs,
                                    torch.full_like(chosen, -1))
            latent = ops.gather_mla_slots(mla_view, sel_slots, dtype=torch.float32, validate=False)
            x = x + layer.attend(p, latent, valid)
            topks.append(chosen)
        return StepOutput(rms_norm(x, self.norm) @ self.head.T, topks)


@dataclass
class DSARunner:
    """A small engine: requests, per-request block tables grown from one block pool, prefill and
    decode steps. The block table is one static tensor (updated in place) so a captured graph
    sees new blocks."""

    model: DSAModel
    cache: KVCache
    max_requests: int
    max_blocks: int                       # per request
    block_table: torch.Tensor = field(init=False)
    lens: list[int] = field(default_factory=list)
    pool: BlockPool = field(init=False)

    def __post_init__(self) -> None:
        self.pool = BlockPool(self.cache.plan.num_blocks)
        self.block_table = torch.full((self.max_requests, self.max_blocks), -1, dtype=torch.int32,
                                      device=self.cache.buffer.device)
        self._host_table = [[] for _ in range(self.max_requests)]
        self.views = [(self.cache.view("mla", i), self.cache.view("indexer", i))
                      for i in range(self.model.cfg.num_layers)]

    @classmethod
    def build(cls, model: DSAModel, num_blocks: int, block_size: int = 64,
              layout: str = DEFAULT_LAYOUT, device: str | torch.device = "cpu",
              max_requests: int = 4, max_blocks: int = 4) -> DSARunner:
        plan = plan_cache(model.cache_specs(), num_blocks, block_size, layout)
        return cls(model.to(device), allocate(plan, device, fill=0), max_requests, max_blocks)

    @property
    def free(self) -> list[int]:
        """The pool's free list (the next block handed out is its last entry)."""
        return self.pool.free

    @free.setter
    def free(self, blocks: list[int]) -> None:
        self.pool.free = list(blocks)

    @property
    def block_size(self) -> int:
        return self.cache.plan.block_size

    def _grow(self, r: int, length: int) -> None:
        need = -(-length // self.block_size)
        if need > self.max_blocks:
            raise ValueError(f"request {r} needs {need} blocks for {length} tokens, more than "
                             f"max_blocks = {self.max_blocks}")
        table = self._host_table[r]
        if need - len(table) > self.pool.num_free:
            raise RuntimeError(f"out of cache blocks: request {r} needs {need - len(table)} "
                               f"more, {self.pool.num_free} of num_blocks = "
                               f"{self.cache.plan.num_blocks} free")
        for block in self.pool.allocate(max(0, need - len(table))):
            table.append(block)
            self.block_table[r, len(table) - 1] = block

    def step_inputs(self, new_tokens: list[list[int]]) -> dict[str, torch.Tensor]:
        """Append new_tokens[r] to request r (starting a request when it has none yet):
        allocate blocks, and build the step's tensors on the cache's device."""
        if len(new_tokens) > self.max_requests:
            raise ValueError(f"at most {self.max_requests} requests, got {len(new_tokens)}")
        while len(self.lens) < len(new_tokens):
            self.lens.append(0)
        tok, pos, req = [], [], []
        for r, toks in enumerate(new_tokens):
            self._grow(r, self.lens[r] + len(toks))
            tok += toks
            pos += range(self.lens[r], self.lens[r] + len(toks))
            req += [r] * len(toks)
            self.lens[r] += len(toks)
        dev = self.cache.buffer.device
        lens = self.lens + [0] * (self.max_requests - len(self.lens))
        return dict(tokens=torch.tensor(tok, device=dev), positions=torch.tensor(pos, device=dev),
                    req=torch.tensor(req, device=dev), block_table=self.block_table,
                    ctx_lens=torch.tensor(lens, dtype=torch.int32, device=dev))

    def run(self, new_tokens: list[list[int]]) -> StepOutput:
        return self.model(**self.step_inputs(new_tokens), views=self.views)

    def prefill(self, prompts: list[list[int]]) -> StepOutput:
        return self.run(prompts)

    def decode(self, last: list[int]) -> StepOutput:
        return self.run([[t] for t in last])


def last_tokens(out: StepOutput, lens: list[int]) -> list[int]:
    """Greedy next token of each request from a step whose request r brought lens[r] queries."""
    ends = torch.tensor(lens).cumsum(0) - 1
    return out.logits[ends.to(out.logits.device)].argmax(-1).tolist()
