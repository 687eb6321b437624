"""The V4 engines' harness (benchmarks/v4_site/sitecustomize.py) replaces two of vLLM's Triton
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
    kw = dict(swa_indices_stride=stride, window_size=window, index_width=width,
              left_visible_ptr=left, right_visible_ptr=right, query_start_loc_ptr=qsl,
              seq_lens_ptr=seq, token_to_req_indices_ptr=tok, is_valid_token_ptr=valid,
              block_table_ptr=table, block_table_stride=table.stride(0), block_size=bs,
              replay_start_ptr=replay, token_offset=offset, HAS_IMAGE=has_image,
              TRITON_BLOCK_SIZE=64)
    outs = []
    for run in (kernel.run.interpreted, kernel.run):
        idx = torch.full(((n + 1) * stride,), 12345, dtype=torch.int32)[1:]  # offset 1
        lens = torch.full((n + 2,), 777, dtype=torch.int32)
        run(grid=(n,), warmup=False, swa_indices_ptr=idx, swa_lens_ptr=lens, **kw)
        outs.append((idx.clone(), lens.clone()))
    (i0, l0), (i1, l1) = outs
    assert torch.equal(l0, l1), (case, l0, l1)
    assert torch.equal(i0, i1), (case, (i0 != i1).nonzero()[:5])
    assert (l0[:n] > 0).any() and (i0 == -1).any() and l0[n] == 777, case  # cases that test
    cases += 1

# the block zeroer: segments of different strides and pages over one buffer, memset against the
# interpreted kernel's stores
buf = [torch.randint(-2**31, 2**31 - 1, (64 * 1024,), dtype=torch.int32) for _ in range(2)]
base = buf[0].data_ptr()
addrs = torch.tensor([base, base + 4096, base + 12], dtype=torch.uint64)
strides = torch.tensor([1024, 1024, 2048], dtype=torch.int64)
pages = torch.tensor([256, 512, 1000], dtype=torch.int64)
blk = 1024
meta = (addrs, strides, pages, (1000 + blk - 1) // blk, blk, 3)
class Z: pass
z = Z(); z._meta = meta; z.device = torch.device("cpu")
ids = [0, 5, 17, 30]
original = buf[0].clone()
utils._zero_kv_blocks_kernel[(len(ids), 3, meta[3])](addrs, strides, pages,
    torch.tensor(ids, dtype=torch.int64), BLOCK_SIZE=blk)
want = buf[0].clone()
buf[0].copy_(original)
utils.KVBlockZeroer.zero_block_ids(z, ids)
assert not torch.equal(want, original)
assert torch.equal(buf[0], want), (buf[0] != want).nonzero()[:5]
print("swa cases", cases, "zeroer ok")
'''


def test_the_harness_replacements_write_the_interpreted_kernels_bytes() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(TREE / "benchmarks" / "v4_site")
    proc = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert "swa cases 24 zeroer ok" in proc.stdout, proc.stdout[-2000:]
