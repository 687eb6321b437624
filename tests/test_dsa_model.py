"""A DeepSeek sparse-attention model on the cache (kvcache_ext.models.dsa): prefill of several
requests then decode steps, per-request block tables, against a dense reference that keeps no
cache but applies the same quantization round trip (reference.mla_fp8_rows / mla_dequant and
indexer_rows / indexer_dequant). The reference attends without the absorbed W_UK / W_UV (keys
and values expanded per head), so it checks the model's attention as well as its cache reads.

Tolerances (fp32 compute, so model and reference differ by summation order, ~1e-6, and by what
that order does to the bf16 rows: a k_pe or kv_c value next to a bf16 rounding boundary is
cached one bf16 ulp (2^-8) apart -- a handful of rope values per layer-1 prefill here -- which
moves a logit by up to ~1e-3 of the largest):
- top-k: every position whose reference score beats the k-th best by more than GAP is chosen,
  none that trails it by more than GAP is, and as many are chosen as the reference chooses;
  swaps are allowed only among scores within GAP of the k-th best;
- logits: |model - reference| <= ATOL + RTOL x |reference|.
"""
from __future__ import annotations

import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext import reference as ref
from kvcache_ext.models.dsa import DSAConfig, DSAModel, DSARunner, StepOutput, last_tokens

GAP = 1e-4          # indexer scores are O(0.1 .. 1)
ATOL, RTOL = 1e-4, 4e-4  # one-ulp bf16 flips of cached values (module docstring)
CFG = DSAConfig()   # hidden 256, 4 heads, 16 indexer heads, top-16, 2 layers
PROMPTS = (37, 20, 9)  # longer than top-k: prefill and decode really choose
DECODE_STEPS = 4


def prompts(seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, CFG.vocab_size, (n,), generator=g).tolist() for n in PROMPTS]


def runner(model: DSAModel, layout: str, block_size: int, device: str,
           seed: int = 0) -> DSARunner:
    r = DSARunner.build(model, num_blocks=16, block_size=block_size, layout=layout, device=device,
                        max_requests=len(PROMPTS), max_blocks=64 // block_size)
    # Shuffled free list: requests' blocks are scattered and interleaved, as in an engine.
    r.free = torch.randperm(16, generator=torch.Generator().manual_seed(seed)).tolist()
    return r


# ---- the dense reference: one request, all its tokens at once, no cache -----------------------
def dense(model: DSAModel, seq: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """-> logits [S, vocab], per layer the indexer scores [S, S] (-inf where not causal)."""
    cfg = model.cfg
    dev = model.embed.device
    pos = torch.arange(len(seq), device=dev)
    x = model.embed[torch.tensor(seq, device=dev)]
    all_scores = []
    for layer in model.layers:
        p = layer.project(x, pos)
        rows = ref.mla_fp8_rows(p.kv_c.cpu(), p.k_pe.cpu())
        latent = ref.mla_dequant(rows, torch.float32).to(dev)
        codes, scales = ref.indexer_rows(p.k_idx.cpu())
        keys = ref.indexer_dequant(codes, scales, torch.float32).to(dev)
        scores = torch.einsum("ihd,jd->ihj", p.q_idx, keys).relu()
        scores = (scores * p.w_idx[:, :, None]).sum(1)
        scores = scores.masked_fill(pos[None, :] > pos[:, None], float("-inf"))
        all_scores.append(scores)
        best, chosen = scores.topk(min(cfg.index_topk, len(seq)), dim=-1)
        keep = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, chosen, best > float("-inf"))
        # Expanded (not absorbed) MLA: per head K = [latent W_UK^T, k_pe], V = latent W_UV.
        k_nope = torch.einsum("jc,hnc->hjn", latent[:, :512], layer.w_uk)
        v = torch.einsum("jc,hcv->hjv", latent[:, :512], layer.w_uv)
        logits = (torch.einsum("ihn,hjn->hij", p.q_nope, k_nope)
                  + torch.einsum("ihr,jr->hij", p.q_pe, latent[:, 512:]))
        logits = logits / (cfg.qk_nope_head_dim + 64) ** 0.5
        att = torch.softmax(logits.masked_fill(~keep[None], float("-inf")), dim=-1)
        x = x + torch.einsum("hij,hjv->ihv", att, v).flatten(1) @ layer.wo.T
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * model.norm
    return h @ model.head.T, all_scores


def check_topk(chosen: torch.Tensor, scores: torch.Tensor, k: int) -> int:
    """chosen: a query's positions (-1 = none); scores: its reference scores. Returns how many
    boundary swaps were allowed."""
    chosen = set(chosen[chosen >= 0].tolist())
    valid = scores > float("-inf")
    want = min(k, int(valid.sum()))
    assert len(chosen) == want
    if want == int(valid.sum()):
        assert chosen == set(torch.nonzero(valid).squeeze(1).tolist())
        return 0
    thr = scores.topk(want).values[-1].item()
    must = set(torch.nonzero(scores > thr + GAP).squeeze(1).tolist())
    never = set(torch.nonzero(valid & (scores < thr - GAP)).squeeze(1).tolist())
    assert must <= chosen and not (chosen & never), (sorted(chosen), thr)
    return len(chosen - set(scores.topk(want).indices.tolist()))


def compare(out: StepOutput, model: DSAModel, seqs: list[list[int]], queries: list[list[int]]):
    """queries[r]: request r's positions in this step, in the step's query order."""
    at = 0
    for r, seq in enumerate(seqs):
        logits, scores = dense(model, seq)
        for q in queries[r]:
            got = out.logits[at].cpu()
            want = logits[q].cpu()
            assert (got - want).abs().max() <= ATOL + RTOL * want.abs().max(), (r, q)
            for layer in range(model.cfg.num_layers):
                check_topk(out.topk[layer][at].cpu(), scores[layer][q].cpu(), model.cfg.index_topk)
            at += 1


@pytest.mark.parametrize("layout,block_size", [(lay, 16 if i % 2 else 8)
                                               for i, lay in enumerate(kvc.LAYOUTS)])
def test_prefill_then_decode_matches_the_dense_reference(layout, block_size, device):
    model = DSAModel(CFG).to(device)
    run = runner(model, layout, block_size, device)
    seqs = prompts()
    out = run.prefill(seqs)
    compare(out, model, seqs, [list(range(len(s))) for s in seqs])
    nxt = last_tokens(out, [len(s) for s in seqs])
    for _ in range(DECODE_STEPS):
        seqs = [s + [t] for s, t in zip(seqs, nxt)]
        out = run.decode(nxt)
        compare(out, model, seqs, [[len(s) - 1] for s in seqs])
        nxt = last_tokens(out, [1] * len(seqs))
    # Blocks were taken as the sequences grew, and only as many as they need.
    for r, s in enumerate(seqs):
        need = -(-len(s) // block_size)
        row = run.block_table[r].tolist()
        assert all(b >= 0 for b in row[:need]) and all(b == -1 for b in row[need:])
    used = [b for row in run.block_table.tolist() for b in row if b >= 0]
    assert len(set(used)) == len(used) and len(run.free) == 16 - len(used)


def test_decode_chooses_a_sparse_set():
    """The test's sizes make the indexer matter: decode queries see more tokens than top-k, and
    the chosen set differs between layers and steps."""
    model = DSAModel(CFG)
    run = runner(model, "BLHNC", 16, "cpu")
    out = run.prefill(prompts())
    out = run.decode(last_tokens(out, list(PROMPTS)))
    assert PROMPTS[0] + 1 > CFG.index_topk
    first = out.topk[0][0]
    assert (first >= 0).all() and len(set(first.tolist())) == CFG.index_topk
    assert set(first.tolist()) != set(out.topk[1][0].tolist())


def test_out_of_blocks_is_a_clear_error():
    model = DSAModel(CFG)
    run = DSARunner.build(model, num_blocks=3, block_size=16, max_requests=2, max_blocks=4)
    with pytest.raises(RuntimeError, match="num_blocks = 3"):
        run.prefill([[1] * 40, [2] * 20])
    with pytest.raises(ValueError, match="max_blocks = 4"):
        DSARunner.build(model, num_blocks=8, block_size=16, max_blocks=4).prefill([[1] * 65])


# ---- compiled ------------------------------------------------------------------------------
def _decode_inputs(run: DSARunner, nxt: list[int]) -> dict:
    return run.step_inputs([[t] for t in nxt])


def test_decode_step_compiles_without_graph_breaks():
    """Writes, gathers (num_tokens/out, validate=False) and attention under
    torch.compile(fullgraph=True): the same tokens, logits and cache bytes as eager."""
    torch._dynamo.reset()
    model = DSAModel(CFG)
    eager, comp = runner(model, "BLNHC", 16, "cpu"), runner(model, "BLNHC", 16, "cpu")
    nxt = last_tokens(eager.prefill(prompts()), list(PROMPTS))
    comp.prefill(prompts())
    step = torch.compile(model.forward, backend="aot_eager", fullgraph=True, dynamic=False)
    for _ in range(3):
        want = eager.decode(nxt)
        got = step(**_decode_inputs(comp, nxt), views=comp.views)
        torch.testing.assert_close(got.logits, want.logits, atol=1e-5, rtol=1e-5)
        assert all(torch.equal(a, b) for a, b in zip(got.topk, want.topk))
        assert torch.equal(comp.cache.buffer, eager.cache.buffer)
        nxt = last_tokens(want, [1] * len(nxt))


@pytest.mark.xfail(reason="CachePlan.view calls buffer.storage_offset(), which Dynamo (torch "
                          "2.14) does not trace: take the views outside the compiled function",
                   raises=torch._dynamo.exc.Unsupported, strict=False)
def test_views_can_be_taken_inside_a_compiled_function():
    """Whether cache.view (an as_strided of the flat buffer) traces: if it does, a compiled step
    may take the buffer and build its layers' views itself. Today it does not (see xfail)."""
    torch._dynamo.reset()
    model = DSAModel(CFG)
    eager, comp = runner(model, "LHBNC", 16, "cpu"), runner(model, "LHBNC", 16, "cpu")
    plan = comp.cache.plan
    nxt = last_tokens(eager.prefill(prompts()), list(PROMPTS))
    comp.prefill(prompts())

    def step(buffer: torch.Tensor, **inputs) -> StepOutput:
        views = [(plan.view(buffer, "mla", i), plan.view(buffer, "indexer", i))
                 for i in range(CFG.num_layers)]
        return model(**inputs, views=views)

    got = torch.compile(step, backend="aot_eager", fullgraph=True, dynamic=False)(
        comp.cache.buffer, **_decode_inputs(comp, nxt))
    want = eager.decode(nxt)
    torch.testing.assert_close(got.logits, want.logits, atol=1e-5, rtol=1e-5)
    assert torch.equal(comp.cache.buffer, eager.cache.buffer)
