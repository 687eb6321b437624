"""The V4 engines' harness (harness/kvc_harness/v4_site/sitecustomize.py) replaces two of vLLM's Triton
kernels that the interpreter runs slowly on CPU: each replacement writes the bytes the
interpreted kernel writes, on random cases (run in a process of its own, as an engine's: the
harness sets TRITON_INTERPRET and hooks vLLM's imports there)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TREE = Path(os.environ.get("KVC_TREE", Path(__file__).resolve().parents[2]))

CHECK = r'''
import random, torch
from vllm.v1.attention.backends.mla import sparse_swa
from vllm.v1.worker import utils
import sitecustomize as site

kernel = sparse_swa._compute_swa_indices_and_lens_kernel
assert kernel.run.__name__ == "run" and hasattr(kernel.run, "interpreted"), "not patched"
rng = random.Random(7)
torch.manual_seed(7)  # the tensors' draws too: every run checks the same 24 cases
cases = 0
for case in range(24):
    reqs = rng.randint(1, 4)
    qlens = [rng.randint(1, 40) for _ in range(reqs)]
    prefix = [rng.choice([0, rng.randint(0, 700)]) for _ in range(reqs)]
    T, bs, window = sum(qlens), rng.choice([16, 64, 256]), rng.choice([8, 128])
    has_image = case % 3 == 2
    width = window + (24 if has_image else 0)
    qsl = torch.tensor([0] + [sum(qlens[:i + 1]) for i in range(reqs)], dtype=torch.int32)
    seq = torch.tensor([p + q for p, q in zip(prefix, qlens)], dtype=torch.int32)
    tok = torch.repeat_interleave(torch.arange(reqs, dtype=torch.int32), torch.tensor(qlens))
    pad = rng.randint(0, 3)  # padded tokens past the batch: invalid
    tok = torch.cat([tok, torch.zeros(pad, dtype=torch.int32)])
    valid = torch.cat([torch.rand(T) > 0.1, torch.zeros(pad, dtype=torch.bool)])
    cols = (max(seq.tolist()) + 24) // bs + 2
    table = torch.randint(0, 5000, (reqs, cols + rng.randint(0, 3)), dtype=torch.int32)
    replay = torch.tensor([rng.choice([0, max(0, s - rng.randint(1, 300))]) for s in seq.tolist()],
                          dtype=torch.int32)
    left = torch.randint(0, 40, (T + pad,), dtype=torch.int32)
    right = torch.randint(0, 24, (T + pad,), dtype=torch.int32)
    offset = rng.randint(0, 2)
    n = T + pad - offset
    stride = width + rng.randint(0, 5)
    case_kw = dict(swa_indices_stride=stride, window_size=window, index_width=width,
                   left_visible_ptr=left, right_visible_ptr=right, query_start_loc_ptr=qsl,
                   seq_lens_ptr=seq, token_to_req_indices_ptr=tok, is_valid_token_ptr=valid,
                   block_table_ptr=table, block_table_stride=table.stride(0), block_size=bs,
                   replay_start_ptr=replay, token_offset=offset, HAS_IMAGE=has_image,
                   TRITON_BLOCK_SIZE=64)
    outs = []
    for run in (kernel.run.interpreted, kernel.run):
        idx = torch.full(((n + 1) * stride,), 12345, dtype=torch.int32)[1:]  # offset 1
        lens = torch.full((n + 2,), 777, dtype=torch.int32)
        run(grid=(n,), warmup=False, swa_indices_ptr=idx, swa_lens_ptr=lens, **case_kw)
        outs.append((idx.clone(), lens.clone()))
    (i0, l0), (i1, l1) = outs
    assert torch.equal(l0, l1), (case, l0, l1)
    assert torch.equal(i0, i1), (case, (i0 != i1).nonzero()[:5])
    assert (l0[:n] > 0).any() and (i0 == -1).any() and l0[n] == 777, case  # cases that test
    cases += 1

# through vLLM's own launcher (its keyword names, its grid): the replacement runs, not the
# interpreter, and writes what the interpreter writes
calls = []
interpreted = kernel.run.interpreted
kernel.run.interpreted = lambda *a, **k: calls.append(1) or interpreted(*a, **k)
launch = sparse_swa._COMPUTE_SWA_INDICES_AND_LENS_KERNEL
got = []
for use_interpreter in (True, False):
    idx = torch.full((n, stride), 12345, dtype=torch.int32)
    lens = torch.full((n,), 777, dtype=torch.int32)
    args = (idx, lens, window, width, left, right, qsl, seq, tok, valid, table, bs, replay)
    kw = dict(num_tokens=n, token_offset=offset, has_image=has_image)
    if use_interpreter:
        interpreted(grid=(n,), warmup=False, swa_indices_ptr=idx, swa_lens_ptr=lens,
                    **{**case_kw, "TRITON_BLOCK_SIZE": 1024})  # the last case's, as launched
    else:
        launch(*args, **kw)
    got.append((idx, lens))
assert calls == [], "vLLM's launcher ran the interpreter"
assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1])
# a block table the replacement does not cover (not contiguous) runs interpreted
launch(torch.zeros((n, stride), dtype=torch.int32), torch.zeros(n, dtype=torch.int32), window,
       width, left, right, qsl, seq, tok, valid, torch.cat([table, table], 1)[:, ::2], bs, replay,
       num_tokens=n, token_offset=offset, has_image=has_image)
assert calls == [1], calls

# the block zeroer vLLM builds over two layers' caches (one with its heads outside the block:
# a segment per head), memset against the interpreted kernel's stores
from types import SimpleNamespace as NS
from vllm.v1.kv_cache_interface import FullAttentionSpec
nb, bs = 40, 16
a = torch.randn(nb, 2, bs, 8)
b = torch.randn(2, nb, bs, 8).permute(1, 0, 2, 3)  # heads outer
spec = FullAttentionSpec(block_size=bs, num_kv_heads=2, head_size=8, dtype=torch.float32)
group = NS(kv_cache_spec=spec, kv_cache_group_id=0, layer_names=["a", "b"],
           kernel_block_stride=0)
z = utils.KVBlockZeroer(torch.device("cpu"), [group], [bs],
                        {"a": NS(kv_cache=a), "b": NS(kv_cache=b)}, nb)
assert z._meta is not None and z._meta[5] == 3, z._meta  # a's segment, b's two
ids = [0, 5, 17, nb - 1]
before = (a.clone(), b.clone())
utils.KVBlockZeroer.zero_block_ids.interpreted(z, ids)
want = (a.clone(), b.clone())
a.copy_(before[0]); b.copy_(before[1])
z.zero_block_ids(ids)
assert not torch.equal(want[0], before[0]) and not torch.equal(want[1], before[1])
assert bool((want[0][ids] == 0).all()) and bool((want[1][ids] == 0).all())
assert torch.equal(a, want[0]) and torch.equal(b, want[1])
print("swa cases", cases, "zeroer ok")
'''


def test_the_harness_replacements_write_the_interpreted_kernels_bytes() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(TREE / "harness" / "kvc_harness" / "v4_site")
    proc = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "swa cases 24 zeroer ok" in proc.stdout, proc.stdout[-2000:]
