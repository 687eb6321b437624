"""A transformers Cache backed by one kvcache_ext plan:
model.generate(..., past_key_values=PagedCache(config, num_blocks=..., block_size=...)).

`import kvcache_ext.hf` needs transformers (5.x); `import kvcache_ext` never imports this module.

Every layer keeps K and V in the plan's specs "k" and "v" (H = the config's KV heads, row =
head_dim x itemsize, or head_dim e4m3 codes with kv_cache_dtype="fp8"). All layers share one
block table per batch row: block b holds the same tokens in every layer, as in a serving engine.
Blocks are taken from a free list as the sequences grow. update() writes the new K/V of all rows
with one reshape_and_cache_kv launch and reads the whole history back with gather_kv, as the
[B, H, S, D] tensors transformers' attention expects (dequantized to the model dtype for fp8).

Left padding works as with DynamicCache: pad tokens are cached like any other and the attention
mask hides them, so every row of the batch has the same length.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.configuration_utils import PreTrainedConfig
from transformers.cache_utils import Cache, CacheLayerMixin

from .. import ops
from ..cache import BlockPool, CacheFullError, KVCache, allocate
from ..plan import DEFAULT_LAYOUT, CacheSpec, plan_cache, slot_mapping

KV_CACHE_DTYPES = ("auto", "fp8")


@dataclass
class _Step:
    """Where one update's tokens go and what the gathers read; shared by every layer."""

    slots: torch.Tensor        # int64 [B * q], rows in (batch row, position) order
    block_table: torch.Tensor  # int32 [B, max_blocks]
    cu_seq_lens: torch.Tensor  # int32 [B + 1]: every row holds `length` tokens
    length: int                # tokens per row after this update


@dataclass
class BlockPager:
    """Per-row block tables over one pool of `num_blocks` blocks (cache.BlockPool)."""

    num_blocks: int
    block_size: int
    device: torch.device
    pool: BlockPool = field(init=False)
    tables: list[list[int]] = field(default_factory=list)
    _last: tuple[tuple[int, int, int], _Step] | None = None

    def __post_init__(self) -> None:
        self.pool = BlockPool(self.num_blocks)
        self.reset()

    @property
    def free(self) -> list[int]:
        return self.pool.free

    def reset(self) -> None:
        self.pool.reset()
        self.tables = []
        self._last = None

    def step(self, batch: int, start: int, q: int) -> _Step:
        """Blocks for tokens start..start+q-1 of every row. The first layer allocates and
        builds the tensors; the other layers of the same forward reuse them."""
        key = (batch, start, q)
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        if self.tables and len(self.tables) != batch:
            raise ValueError(f"PagedCache holds {len(self.tables)} sequences, got a batch of "
                             f"{batch} (call reset() before generating for another batch)")
        tables = self.tables or [[] for _ in range(batch)]  # the pager's own after the check
        length = start + q
        need = -(-length // self.block_size)
        missing = sum(max(0, need - len(t)) for t in tables)
        if missing > self.pool.num_free:  # checked before any state changes or any byte is written
            raise CacheFullError(
                f"PagedCache is out of blocks: {batch} sequence(s) of {length} tokens need "
                f"{batch * need} blocks of {self.block_size} tokens, num_blocks = "
                f"{self.num_blocks} ({self.pool.num_free} free); this length alone needs "
                f"num_blocks >= {batch * need}")
        self.tables = tables
        for t in self.tables:
            t += self.pool.allocate(max(0, need - len(t)))
        table = torch.tensor(self.tables, dtype=torch.int32)
        positions = torch.arange(start, length, dtype=torch.int64).repeat(batch)
        rows = torch.arange(batch, dtype=torch.int64).repeat_interleave(q)
        slots = slot_mapping(table, positions, self.block_size, rows)  # on the host: no syncs
        cu = torch.arange(batch + 1, dtype=torch.int32) * length
        st = _Step(slots.to(self.device), table.to(self.device), cu.to(self.device), length)
        self._last = (key, st)
        return st


class PagedLayer(CacheLayerMixin):
    """One model layer's K and V, in the views "k" and "v" of layer `index` of the plan."""

    is_compileable = False  # the block tables grow on the host
    is_sliding = False
    is_croppable = True

    def __init__(self, owner: PagedCache, index: int) -> None:
        super().__init__()
        self.owner, self.index = owner, index
        self.length = 0
        self.dtype, self.device = owner.dtype, owner.kv.buffer.device
        self.k_view, self.v_view = owner.kv.view("k", index), owner.kv.view("v", index)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        o = self.owner
        if key_states.dtype != o.dtype:
            raise TypeError(f"PagedCache was built for {o.dtype} K/V (dtype=), the model gives "
                            f"{key_states.dtype}; build it with dtype={key_states.dtype}")
        self.lazy_initialization(key_states, value_states)
        b, h, q, d = key_states.shape
        st = o.pager.step(b, self.length, q)
        k_view, v_view = self.k_view, self.v_view
        # [B, H, q, D] -> [B*q, H, D] token rows, batch-row major like the slots.
        key = key_states.transpose(1, 2).reshape(b * q, h, d)
        value = value_states.transpose(1, 2).reshape(b * q, h, d)
        ops.reshape_and_cache_kv(key, value, k_view, v_view, st.slots, o.kv_cache_dtype,
                                 o.k_scale, o.v_scale)
        self.length = st.length
        return o.read(k_view, st, o.k_scale, b, h, d), o.read(v_view, st, o.v_scale, b, h, d)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1  # grows block by block until the pool is empty

    def reset(self) -> None:
        self.length = 0
        self.is_initialized = False
        self.owner.pager.reset()

    def crop(self, tokens_to_remove: int) -> None:
        # Blocks stay allocated: the next update overwrites the cropped slots.
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative number of tokens to remove, got "
                             f"{tokens_to_remove}")
        self.length = max(0, self.length + tokens_to_remove)
        self.owner.pager._last = None

    def _no_reorder(self, *args, **kwargs) -> None:
        raise NotImplementedError("PagedCache does not reorder, repeat or select batch rows (beam "
                                  "search, contrastive search); use greedy or sampling")

    reorder_cache = batch_repeat_interleave = batch_select_indices = _no_reorder


def _scale_arg(name: str, scale: float | torch.Tensor, heads: int,
               device: torch.device) -> float | torch.Tensor:
    """A per-tensor scale as a float; a per-head one as float32 [H] on the cache's device."""
    if isinstance(scale, torch.Tensor):
        if scale.numel() == 1:
            scale = float(scale)
        elif scale.numel() != heads:
            raise ValueError(f"{name} must be one value or one per KV head ({heads}), got "
                             f"{tuple(scale.shape)}")
        else:
            scale = scale.detach().reshape(heads).to(device, torch.float32)
    if isinstance(scale, (int, float)) and not (float(scale) > 0 and float(scale) < float("inf")):
        raise ValueError(f"{name} must be finite and > 0, got {scale}")
    if isinstance(scale, torch.Tensor) and not bool(((scale > 0) & scale.isfinite()).all()):
        raise ValueError(f"{name} must be finite and > 0, got {scale.tolist()}")
    return float(scale) if isinstance(scale, (int, float)) else scale


class PagedCache(Cache):
    """A transformers Cache whose layers keep K and V in one kvcache_ext plan (`.kv`).

    config: the model's config (KV heads, head_dim, layers). dtype: the model's K/V dtype
    (default: config.dtype, else torch's default dtype). kv_cache_dtype "auto" stores the rows
    as they are; "fp8" stores e4m3 codes of x / k_scale (v_scale), a float or one per KV head.
    """

    def __init__(self, config: PreTrainedConfig, num_blocks: int, block_size: int = 16,
                 layout: str = DEFAULT_LAYOUT, device: str | torch.device = "cpu",
                 dtype: torch.dtype | None = None, kv_cache_dtype: str = "auto",
                 k_scale: float | torch.Tensor = 1.0, v_scale: float | torch.Tensor = 1.0) -> None:
        text = config.get_text_config(decoder=True)
        kinds = set(getattr(text, "layer_types", None) or ["full_attention"])
        if kinds != {"full_attention"}:
            raise ValueError(f"PagedCache holds full-attention layers only, the config has "
                             f"layer_types {sorted(kinds)}")
        if kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got "
                             f"{kv_cache_dtype!r}")
        cfg_dtype = getattr(text, "dtype", None)
        self.dtype = dtype or (cfg_dtype if isinstance(cfg_dtype, torch.dtype)
                               else torch.get_default_dtype())
        if self.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise TypeError(f"dtype must be float32, bfloat16 or float16, got {self.dtype}")
        heads = text.num_attention_heads
        self.num_kv_heads = getattr(text, "num_key_value_heads", None) or heads
        self.head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        layers = text.num_hidden_layers
        self.kv_cache_dtype = kv_cache_dtype
        fp8 = kv_cache_dtype == "fp8"
        row = self.head_dim * (1 if fp8 else self.dtype.itemsize)
        specs = [CacheSpec("k", row, layers, self.num_kv_heads),
                 CacheSpec("v", row, layers, self.num_kv_heads)]
        self.kv: KVCache = allocate(plan_cache(specs, num_blocks, block_size, layout), device)
        dev = self.kv.buffer.device
        self.k_scale = _scale_arg("k_scale", k_scale, self.num_kv_heads, dev) if fp8 else None
        self.v_scale = _scale_arg("v_scale", v_scale, self.num_kv_heads, dev) if fp8 else None
        self.pager = BlockPager(num_blocks, block_size, dev)
        super().__init__(layers=[PagedLayer(self, i) for i in range(layers)])

    def read(self, view: torch.Tensor, st: _Step, scale: float | torch.Tensor | None,
             b: int, h: int, d: int) -> torch.Tensor:
        """Every row's history as [B, H, S, D] in the model dtype (one gather_kv launch)."""
        rows = ops.gather_kv(view, st.block_table, st.cu_seq_lens, dtype=self.dtype, scale=scale,
                             num_tokens=b * st.length, validate=False)
        # Contiguous like DynamicCache's tensors, so attention sees the same layout and sums in
        # the same order: token-for-token equality does not hinge on a kernel's stride handling.
        return rows.view(b, st.length, h, d).transpose(1, 2).contiguous()

    def block_tables(self) -> list[list[int]]:
        """Each batch row's physical blocks, in token order."""
        return [list(t) for t in self.pager.tables]

    def reset(self) -> None:
        super().reset()
        self.pager.reset()
