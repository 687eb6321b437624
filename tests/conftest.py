"""Shared fixtures: devices to run on, and caches surrounded by guard bytes."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import kvcache_ext as kvc
import tiers

ROOT = Path(__file__).resolve().parent.parent
# tests/vllm_env runs inside .venv-vllm (tests/test_vllm_env.py starts it), never here
collect_ignore = ["vllm_env"]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
GUARD = 256  # bytes of poison on each side of the plan's buffer


def import_nixl():
    """kvcache_ext.nixl for a NIXL test module, UCX kept on loopback; without nixl the module
    skips, unless KVC_REQUIRE_NIXL=1 (CI), where a missing nixl fails."""
    import os
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
    try:
        import kvcache_ext.nixl as kn
    except ImportError as e:  # pragma: no cover
        if os.environ.get("KVC_REQUIRE_NIXL") == "1":
            raise
        pytest.skip(f"nixl is not installed ({e}); pip install nixl==1.5.1",
                    allow_module_level=True)
    return kn


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "gpu: runs CUDA code on a GPU (benchmarks/gpu_check.sh runs "
                                       "`pytest -m gpu` first on the device machine)")
    if not config.pluginmanager.has_plugin("tiers"):  # the two tiers and the fast tier's guard
        config.pluginmanager.register(tiers, "tiers")
    config.pluginmanager.import_plugin("pytester")  # tests/test_tiers.py runs pytest on pytest


def _needs_gpu(item) -> bool:
    """A case on the cuda device, or a test that skips without a GPU."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    if any(str(v) == "cuda" or (isinstance(v, tuple) and "cuda" in map(str, v)) for v in params.values()):
        return True
    return any(m.name == "skipif" and "needs" in str(m.kwargs.get("reason", ""))
               and "GPU" in str(m.kwargs.get("reason", "")) for m in item.iter_markers())


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        if _needs_gpu(item):
            item.add_marker(pytest.mark.gpu)


def pytest_collection_finish(session) -> None:
    """The vLLM environment's tests start in the background now (test_vllm_env.start)."""
    if any(i.nodeid.startswith("tests/test_vllm_env.py::") for i in session.items):
        import test_vllm_env
        test_vllm_env.start(session.config)


@pytest.fixture(scope="session")
def simt():
    """The CUDA kernels built for the host (tests/simt/simt_host.h): one fiber per lane."""
    from torch.utils.cpp_extension import load
    # One folder per Python and torch: an environment never waits on another's lock (torch
    # versions lock the folder differently) nor loads another's build.
    env = f"py{sys.version_info.major}{sys.version_info.minor}-torch{torch.__version__}"
    build = ROOT / "build" / f"simt_host-{env}"
    build.mkdir(parents=True, exist_ok=True)
    return load(name="kvc_simt_host",
                sources=[str(ROOT / "tests/simt/simt_ops.cpp")]
                + [str(ROOT / "csrc/ops" / f) for f in ("tensor_args.cpp", "host_checks.cpp",
                                                       "spans.cpp", "runs.cpp", "overlap.cpp",
                                                       "write_args.cpp", "gather_args.cpp",
                                                       "v4_args.cpp")],
                extra_include_paths=[str(ROOT / "csrc"), str(ROOT / "tests/simt")],
                extra_cflags=["-O1", "-std=c++20", "-ffp-contract=off", "-fno-trapping-math"],
                build_directory=str(build), verbose=False)


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


@dataclass
class GuardedCache:
    """A cache whose buffer sits inside a larger poisoned allocation.

    `cache` is what ops write into; `expected` is a CPU copy of the same bytes that the
    reference ops update. `assert_matches` compares every byte of both allocations, guard
    bytes included, so a stray write anywhere shows.
    """

    plan: kvc.CachePlan
    whole: torch.Tensor
    cache: kvc.KVCache
    whole_expected: torch.Tensor
    expected: kvc.KVCache

    def view(self, name: str, layer: int) -> torch.Tensor:
        return self.cache.view(name, layer)

    def expected_view(self, name: str, layer: int) -> torch.Tensor:
        return self.expected.view(name, layer)

    def assert_matches(self) -> None:
        got, want = self.whole.cpu(), self.whole_expected
        if not torch.equal(got, want):
            diff = torch.nonzero(got != want).squeeze(1)
            raise AssertionError(f"{diff.numel()} bytes differ, first at {diff[:8].tolist()} "
                                 f"(guard = {GUARD}, plan bytes = {self.plan.total_bytes})")

    def assert_unchanged(self) -> None:
        """Nothing was written: the allocation still holds its poison."""
        self.assert_matches()


def guarded(plan: kvc.CachePlan, device: str = "cpu", seed: int = 0) -> GuardedCache:
    g = torch.Generator().manual_seed(seed)
    whole = torch.randint(0, 256, (plan.total_bytes + 2 * GUARD,), dtype=torch.uint8, generator=g)
    expected_whole = whole.clone()
    whole = whole.to(device)
    cache = kvc.KVCache(plan, whole[GUARD:GUARD + plan.total_bytes])
    expected = kvc.KVCache(plan, expected_whole[GUARD:GUARD + plan.total_bytes])
    return GuardedCache(plan, whole, cache, expected_whole, expected)


def dsa_plan(layout: str, block_size: int, num_blocks: int, layers: int = 2,
             mla_row: int = 656) -> kvc.CachePlan:
    specs = [kvc.CacheSpec("mla", mla_row, layers), kvc.CacheSpec("indexer", 132, layers)]
    return kvc.plan_cache(specs, num_blocks=num_blocks, block_size=block_size, layout=layout)


def random_slots(num_tokens: int, num_slots: int, seed: int = 0, pad_every: int = 0) -> torch.Tensor:
    """Distinct random slots; every `pad_every`-th token is padding (-1)."""
    g = torch.Generator().manual_seed(seed)
    slots = torch.randperm(num_slots, generator=g)[:num_tokens].to(torch.int64)
    if pad_every:
        slots[::pad_every] = -1
    return slots


def requests(block_size: int, num_blocks: int, lens: list[int], seed: int = 0):
    """A shuffled block table for requests of the given lengths, and their cu_seq_lens."""
    g = torch.Generator().manual_seed(seed)
    need = [-(-n // block_size) for n in lens]
    width = max(need + [1])
    perm = torch.randperm(num_blocks, generator=g).to(torch.int32)
    assert sum(need) <= num_blocks
    table = torch.full((len(lens), width), -1, dtype=torch.int32)  # unused entries are invalid
    at = 0
    for r, n in enumerate(need):
        table[r, :n] = perm[at:at + n]
        at += n
    cu = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    return table, cu
