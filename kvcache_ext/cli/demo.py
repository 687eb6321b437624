"""The main job: plan the DSA pair (MLA fp8_ds_mla 656 B + indexer 132 B, one block table) in
BLHNC and LBNHC, write every layer with the fused op, check the bytes against the torch
reference, read everything back with the gathers, and time each op. Then run a model on the
cache: the DeepSeek sparse-attention model (default) or a tiny transformers Llama on PagedCache,
prefill then decode, with tokens per second and the share of step time spent in cache ops."""
from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import ops
from .. import reference as ref
from ..cache import allocate
from ..plan import CacheSpec, plan_cache, slot_mapping
from ..transfer import copy_blocks
from ..viz.model import address_walk
from ..viz.text import byte_map, views_table, walk_lines
from .args import CliError, demo_tokens, device_name
from .timing import sync, time_calls

LAYERS, BLOCK = 2, 64


def request_lengths(num_tokens: int) -> list[int]:
    """Up to three requests of uneven length; request 0 is the longest (4096: 2048, 1365, 683).
    Empty requests are left out, so any num_tokens >= 1 gives at least request 0."""
    if num_tokens < 1:
        raise ValueError(f"num_tokens must be >= 1, got {num_tokens}")
    first = -(-num_tokens // 2)
    lens = [first, num_tokens // 3, num_tokens - first - num_tokens // 3]
    return [n for n in lens if n > 0]


def make_requests(num_tokens: int, num_blocks: int, gen: torch.Generator):
    """The requests' block tables; request 0's starts 0, 1, 5 (seed 000)."""
    lens = request_lengths(num_tokens)
    width = max(-(-n // BLOCK) for n in lens)
    rest = [b for b in torch.randperm(num_blocks, generator=gen).tolist() if b not in (0, 1, 5)]
    ids = [0, 1, 5] + rest
    table = torch.full((len(lens), width), -1, dtype=torch.int32)
    at = 0
    for r, n in enumerate(lens):
        need = -(-n // BLOCK)
        table[r, :need] = torch.tensor(ids[at:at + need], dtype=torch.int32)
        at += need
    req = torch.cat([torch.full((n,), r, dtype=torch.int64) for r, n in enumerate(lens)])
    pos = torch.cat([torch.arange(n) for n in lens])
    cu = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    return table, cu, slot_mapping(table, pos, BLOCK, req)


def walked_token(num_tokens: int) -> int:
    """Token 130 of request 0 (the seed's walk), or request 0's last token when it is shorter."""
    return min(130, request_lengths(num_tokens)[0] - 1)


def run_layout(layout: str, device: torch.device, num_tokens: int) -> bool:
    gen = torch.Generator().manual_seed(0)
    num_blocks = max(8, -(-num_tokens // BLOCK) + 8)
    specs = [CacheSpec("mla", 656, LAYERS), CacheSpec("indexer", 132, LAYERS)]
    plan = plan_cache(specs, num_blocks, BLOCK, layout)
    cache = allocate(plan, device, fill=0)
    expected = allocate(plan, "cpu", fill=0)
    table, cu, slots = make_requests(num_tokens, num_blocks, gen)

    print("\n".join(views_table(plan)))
    walk = address_walk(plan, walked_token(num_tokens), table[0].tolist(), 1)
    print("\n".join(byte_map(plan, walk.physical_block) + walk_lines(walk)))

    x = (torch.randn(num_tokens, 576, generator=gen) * 2).to(torch.bfloat16)
    k = torch.randn(num_tokens, 128, generator=gen).to(torch.bfloat16)
    dx, dk, dslots = x.to(device), k.to(device), slots.to(device)
    for layer in range(LAYERS):
        ops.dsa_write(dx[:, :512], dx[:, 512:], cache.view("mla", layer), dk,
                      cache.view("indexer", layer), dslots)
        ref.dsa_write(x[:, :512], x[:, 512:], expected.view("mla", layer), k,
                      expected.view("indexer", layer), slots)
    ok_write = torch.equal(cache.buffer.cpu(), expected.buffer)

    dtable, dcu = table.to(device), cu.to(device)
    got = ops.gather_mla(cache.view("mla", 1), dtable, dcu)
    codes, scales = ops.gather_indexer(cache.view("indexer", 1), dtable, dcu)
    want = ref.mla_dequant(ref.mla_fp8_rows(x[:, :512], x[:, 512:]))
    want_codes, want_scales = ref.indexer_rows(k)
    ok_read = (torch.equal(got.cpu().view(torch.int16), want.view(torch.int16))
               and torch.equal(codes.cpu(), want_codes) and torch.equal(scales.cpu(), want_scales))
    print(f"{layout}: fused write of {num_tokens} tokens x {LAYERS} layers "
          f"{'matches' if ok_write else 'DIFFERS FROM'} the reference byte for byte; "
          f"gathers {'return' if ok_read else 'DO NOT return'} what was written")

    mla_v, idx_v = cache.view("mla", 0), cache.view("indexer", 0)
    nt = num_tokens
    bytes_mla = nt * (1152 + 656 + 8)
    bytes_idx = nt * (256 + 132 + 8)
    other = allocate(plan, device, fill=0)
    mapping = torch.stack([torch.arange(0, num_blocks, 2), torch.arange(0, num_blocks, 2)], 1)
    timings = {
        "dsa_write (fused)": (lambda: ops.dsa_write(dx[:, :512], dx[:, 512:], mla_v, dk, idx_v, dslots),
                              bytes_mla + bytes_idx - 8 * nt),
        "concat_and_cache_mla": (lambda: ops.concat_and_cache_mla(dx[:, :512], dx[:, 512:], mla_v, dslots),
                                 bytes_mla),
        "indexer_k_quant_and_cache": (lambda: ops.indexer_k_quant_and_cache(dk, idx_v, dslots), bytes_idx),
        "gather_mla (bf16)": (lambda: ops.gather_mla(mla_v, dtable, dcu, num_tokens=nt, validate=False),
                              nt * (656 + 1152)),
        "gather_indexer": (lambda: ops.gather_indexer(idx_v, dtable, dcu, num_tokens=nt, validate=False),
                           nt * (132 + 132)),
        "copy_blocks (half the blocks)": (lambda: copy_blocks(cache, other, mapping),
                                          2 * len(mapping) * plan.total_bytes // num_blocks),
    }
    print(f"{'op':<32}{'us/call':>10}{'GB/s':>10}")
    for name, (fn, nbytes) in timings.items():
        us = time_calls([fn], device, repeats=20, use_graph=False)
        print(f"{name:<32}{us:>10.1f}{nbytes / us / 1e3:>10.1f}")
    print()
    return ok_write and ok_read


# ---- models on the cache --------------------------------------------------------------------
class CacheOpTimer(TorchDispatchMode):
    """Seconds spent in kvcache_ext ops while active (synchronised around each call on a GPU).
    Other ops run untimed; the step time it is compared with is measured without the timer."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device, self.seconds, self.calls = device, 0.0, Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace != "kvcache_ext":
            return func(*args, **(kwargs or {}))
        sync(self.device)
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        sync(self.device)
        self.seconds += time.perf_counter() - start
        self.calls[func._opname] += 1
        return out


def timed(fn, device: torch.device):
    sync(device)
    start = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - start


def clock(device: torch.device) -> str:
    return "CUDA, synchronised per op" if device.type == "cuda" else "CPU wall clock"


def run_dsa_model(dev: torch.device, steps: int = 8) -> bool:
    from ..models.dsa import DSAConfig, DSAModel, DSARunner, last_tokens
    cfg = DSAConfig(index_topk=64)
    model = DSAModel(cfg)
    lens = [256, 192, 128, 64]
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=gen).tolist() for n in lens]
    build = lambda: DSARunner.build(model, 32, BLOCK, "BLHNC", dev, len(lens), 6)  # noqa: E731
    run = build()
    print(f"DSA model on {dev}: DeepSeek-V3.2 attention scaled down (hidden {cfg.hidden_size}, "
          f"{cfg.num_heads} heads, latent 512 + rope 64, {cfg.index_n_heads} indexer heads x 128, "
          f"top-{cfg.index_topk}), {cfg.num_layers} layers, BLHNC, block {BLOCK}")
    out, secs = timed(lambda: run.prefill(prompts), dev)
    print(f"  prefill: {len(lens)} requests, {sum(lens)} tokens in {secs:.2f} s "
          f"({sum(lens) / secs:.0f} tokens/s)")
    nxt = last_tokens(out, lens)
    tokens, logits = [nxt], []

    def decode() -> None:
        o = run.decode(tokens[-1])
        logits.append(o.logits)
        tokens.append(last_tokens(o, [1] * len(lens)))

    decode()  # warm-up
    # Steps alternate between plain and timed-ops runs; medians keep a busy machine's spikes out.
    timer, plain, cache = CacheOpTimer(dev), [], []
    for _ in range(steps):
        plain.append(timed(decode, dev)[1])
        before = timer.seconds
        with timer:
            decode()
        cache.append(timer.seconds - before)
    step, in_cache = statistics.median(plain), statistics.median(cache)
    print(f"  decode: {2 * steps} steps x {len(lens)} requests, {step * 1e3:.2f} ms/step, "
          f"{len(lens) / step:.0f} tokens/s")
    print(f"  cache ops ({', '.join(sorted(timer.calls))}): {100 * in_cache / step:.1f} % of "
          f"decode step time, {in_cache * 1e3:.2f} ms/step ({clock(dev)}; medians)")
    # Decoding from the cache must agree with a fresh prefill of the whole sequences.
    gen_tokens = torch.tensor(tokens[:-1]).T.tolist()  # [R, steps]: tokens fed back
    full = build().prefill([p + g for p, g in zip(prompts, gen_tokens)])
    at = torch.tensor([0] + [n + len(g) for n, g in zip(lens, gen_tokens)]).cumsum(0)
    ok, diff = True, 0.0
    for r, n in enumerate(lens):
        for i, step_logits in enumerate(logits):
            want = full.logits[int(at[r]) + n + i]
            diff = max(diff, float((step_logits[r] - want).abs().max()))
            # The token decoded is the prefill's best, or ties with it (GPU rounding).
            ok &= float(want.max() - want[tokens[i + 1][r]]) <= 1e-4
    print(f"  check: decode from the cache gives the greedy tokens of a fresh prefill of the "
          f"whole sequences (largest logit difference {diff:.1e}): {'yes' if ok else 'NO'}\n")
    return ok


def run_llama_model(dev: torch.device, new_tokens: int = 32) -> bool:
    import transformers
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    from ..hf import PagedCache
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    config = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, pad_token_id=0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(dev, dtype).eval()
    lens = [48, 12, 30, 21]
    gen = torch.Generator().manual_seed(0)
    ids = torch.zeros(len(lens), max(lens), dtype=torch.int64)
    for r, n in enumerate(lens):  # left padding
        ids[r, max(lens) - n:] = torch.randint(1, 512, (n,), generator=gen)
    ids, mask = ids.to(dev), (ids != 0).to(torch.int64).to(dev)

    def generate(cache):
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                              do_sample=False, pad_token_id=0, past_key_values=cache)

    paged = lambda: PagedCache(config, num_blocks=64, block_size=16, layout="BLHNC",  # noqa: E731
                               device=dev, dtype=dtype)
    print(f"Llama on {dev} (transformers {transformers.__version__}, random weights: hidden 128, "
          f"4 layers, 4 heads / 2 KV heads, head_dim 32, {str(dtype)[6:]}), PagedCache BLHNC, "
          f"block 16")
    generate(paged())  # warm-up
    timer, plain, dyn, cache = CacheOpTimer(dev), [], [], []
    for _ in range(3):  # alternating runs, medians (see run_dsa_model)
        want, secs = timed(lambda: generate(DynamicCache(config=config)), dev)
        dyn.append(secs)
        got, secs = timed(lambda: generate(paged()), dev)
        plain.append(secs)
        before = timer.seconds
        with timer:
            generate(paged())
        cache.append(timer.seconds - before)
    secs, dyn_secs = statistics.median(plain), statistics.median(dyn)
    n = len(lens) * new_tokens
    print(f"  generate: {len(lens)} prompts of {min(lens)}-{max(lens)} tokens (left-padded), "
          f"{new_tokens} new tokens each: {secs:.2f} s, {n / secs:.0f} tokens/s (DynamicCache: "
          f"{n / dyn_secs:.0f} tokens/s)")
    print(f"  cache ops ({', '.join(sorted(timer.calls))}): "
          f"{100 * statistics.median(cache) / secs:.1f} % of generate time ({clock(dev)}; medians)")
    ok = torch.equal(got, want)
    print(f"  check: the same greedy tokens as transformers' DynamicCache: "
          f"{'yes' if ok else 'NO'}\n")
    return ok


def run_demo(device: str = "cpu", num_tokens: int = 4096, model: str = "dsa") -> None:
    request_lengths(num_tokens)  # a bad --tokens fails before the first line is printed
    if model not in ("dsa", "llama"):
        raise ValueError(f"model must be dsa or llama, got {model!r}")
    dev = torch.device(device)
    print(f"kvcache_ext demo on {dev} ({torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'CPU'}), "
          f"torch {torch.__version__}\n")
    results = [run_layout(lay, dev, num_tokens) for lay in ("BLHNC", "LBNHC")]
    results.append(run_dsa_model(dev) if model == "dsa" else run_llama_model(dev))
    if not all(results):
        raise SystemExit("demo: a check FAILED")
    print("demo: all checks passed")


def cmd_demo(args: argparse.Namespace) -> None:
    if args.model == "llama":  # checked before anything is printed
        import importlib.util
        if importlib.util.find_spec("transformers") is None:
            raise CliError("--model llama needs transformers (pip install transformers==5.23.0)")
    run_demo(device=args.device, num_tokens=args.tokens, model=args.model)


def add_parser(sub) -> None:
    d = sub.add_parser("demo", help="plan, write and read the DSA pair; check and time it; "
                                     "run a model on the cache")
    d.add_argument("--device", type=device_name,
                   default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cpu or cuda[:N] (default: cuda when available, else cpu; here "
                        "%(default)s)")
    d.add_argument("--tokens", type=demo_tokens, default=4096,
                   help="tokens written, split over three requests (default: %(default)s)")
    d.add_argument("--model", choices=("dsa", "llama"), default="dsa",
                   help="model run on the cache after the checks: dsa (DeepSeek sparse attention "
                        "from the cache ops) or llama (a tiny transformers Llama on "
                        "kvcache_ext.hf.PagedCache; needs transformers) (default: %(default)s)")
    d.set_defaults(func=cmd_demo)
