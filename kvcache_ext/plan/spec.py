"""What a plan is made of: cache specs, the placement of one spec (KVCacheTensor), the pages of a
block, and what every plan answers by spec name (SpecLookup: addresses and views).

All numbers are plain Python ints (arbitrary precision, so > 4 GiB plans are exact).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class CacheSpec:
    """One cache group: `num_layers` layers of `num_heads` heads, `row_bytes` per (token, head)."""

    name: str
    row_bytes: int
    num_layers: int = 1
    num_heads: int = 1
    # (a, b): a page (one block of one layer and head) holds the first a bytes of every token,
    # then the last b bytes of every token (the indexer's "split" placement is (128, 4)); None:
    # token rows one after another. With num_heads > 1 every head's page must be contiguous,
    # which the HNC layouts give (LBHNC, LHBNC, BLHNC, BHLNC).
    split: tuple[int, int] | None = None
    # logical tokens per stored row (DeepSeek-V4 C4 / C128 caches): a group of block size B
    # holds B / compress_ratio rows of this spec per block (SPEC 10); 1 = one row per token
    compress_ratio: int = 1
    # pages (one block of one layer) padded to a multiple of this many bytes (576 or 512 B in
    # the V4 layouts); 1 = unpadded. Only plans made from CacheGroups pad (plan_cache(groups=))
    page_align: int = 1
    # the split's first part stored channel-major in elements of this many bytes: element c of
    # row n at (c x rows + n) x channel_major (vLLM's CPU attention keeps K so, and V, the second
    # part, token-major); None: the first part token-major too
    channel_major: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"CacheSpec.name must be a non-empty string, got {self.name!r}")
        for arg in ("row_bytes", "num_layers", "num_heads", "compress_ratio", "page_align"):
            value = getattr(self, arg)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"CacheSpec.{arg} must be a positive int, got {value!r}")
        if self.split is not None:
            split = self.split
            if (not isinstance(split, (tuple, list)) or len(split) != 2
                    or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in split)):
                raise ValueError(f"CacheSpec.split must be None or two positive ints (a, b), got "
                                 f"{split!r}")
            if split[0] + split[1] != self.row_bytes:
                raise ValueError(f"CacheSpec.split {tuple(split)} must add up to row_bytes = "
                                 f"{self.row_bytes} (spec {self.name!r})")
            object.__setattr__(self, "split", (int(split[0]), int(split[1])))
        e = self.channel_major
        if e is not None:
            if isinstance(e, bool) or not isinstance(e, int) or e <= 0:
                raise ValueError(f"CacheSpec.channel_major must be None or a positive int, got {e!r}")
            if self.split is None or self.split[0] % e:
                raise ValueError(f"CacheSpec.channel_major = {e} needs a split whose first part is a "
                                 f"whole number of {e}-byte elements, got split = {self.split} (spec "
                                 f"{self.name!r})")
        if self.page_align != 1 and self.num_heads != 1:
            raise ValueError(f"CacheSpec.page_align needs num_heads == 1 (a padded page is one "
                             f"head's), got num_heads = {self.num_heads} (spec {self.name!r})")


@dataclass(frozen=True)
class KVCacheTensor:
    """Where one spec's views live in the flat buffer (mirrors vLLM's KVCacheTensor)."""

    size: int                 # bytes of the whole flat allocation (= plan.total_bytes)
    layers: list[str]         # layer names, in layer order
    layer_stride: int
    block_stride: int
    offset: int               # byte offset of layer 0, block 0, head 0, token 0
    head_stride: int
    token_stride: int
    row_bytes: int            # C
    num_heads: int

    def address(self, layer: int, block: int, pos: int, head: int = 0, byte: int = 0) -> int:
        return (self.offset + layer * self.layer_stride + block * self.block_stride
                + head * self.head_stride + pos * self.token_stride + byte)


@dataclass(frozen=True)
class BlockPage:
    """Contiguous bytes of one block: (spec, layer[, head]), at `start + block * block_stride`."""

    spec: str
    layer: int
    head: int | None  # None: the page holds every head
    start: int        # in block 0
    length: int
    block_stride: int


def split_address(s: "CacheSpec", t: KVCacheTensor, rows: int, layer: int, block: int, pos: int,
                  head: int = 0, byte: int = 0) -> int:
    """Address of (layer, block, row pos, head, byte). A split page (one contiguous page of
    `rows` rows per head) holds the first `a` bytes of every row, then the last `b` bytes; with
    channel_major = e the first part is e-byte elements, element c of row n at (c x rows + n) x e."""
    if s.split is None:
        return t.address(layer, block, pos, head, byte)
    a, b = s.split
    page = t.address(layer, block, 0, head, 0)
    if byte >= a:
        return page + rows * a + pos * b + (byte - a)
    e = s.channel_major
    if e is None:
        return page + pos * a + byte
    return page + ((byte // e) * rows + pos) * e + byte % e


def check_split_pages(s: CacheSpec, t: KVCacheTensor, layout: str) -> None:
    """A split page is one head's rows one after another: with H > 1 only the HNC layouts give
    that (in NHC layouts a head's rows interleave with the other heads')."""
    if s.split is not None and t.token_stride != s.row_bytes:
        raise ValueError(f"spec {s.name!r} splits its pages and has {s.num_heads} heads: each "
                         f"head's page must be contiguous, which {layout} does not give (token "
                         f"stride {t.token_stride}); use LBHNC, LHBNC, BLHNC or BHLNC")


def check_positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class SpecLookup:
    """What every plan answers by spec name (CachePlan in layout.py, GroupPlan in groups.py):
    needs `specs`, `tensors` and `layout`."""

    @property
    def block_outer(self) -> bool:
        return self.layout[0] == "B"

    def spec(self, name: str) -> CacheSpec:
        for s in self.specs:
            if s.name == name:
                return s
        raise KeyError(f"no spec named {name!r}; the plan has {[s.name for s in self.specs]}")

    def tensor(self, name: str) -> KVCacheTensor:
        self.spec(name)
        return self.tensors[name]

    def _check_layer(self, name: str, layer: int) -> None:
        n = self.spec(name).num_layers
        if not 0 <= layer < n:
            raise IndexError(f"layer must be in [0, {n}) for spec {name!r}, got {layer}")

    def rows_per_block(self, name: str) -> int:
        """Rows of spec `name` in one block (a slot counts rows: block x rows + row)."""
        raise NotImplementedError

    def block_pages(self) -> list[BlockPage]:
        """The pages of block 0 in address order (unpadded lengths; overlaid groups may overlap);
        block b's are `block_stride * b` further on.

        A (spec, layer) page is contiguous when heads are stored inside the layer and the block
        (H after L and B in the layout); in LHBNC and BHLNC each head's rows x C bytes are a page.
        """
        pages = []
        for s in self.specs:
            t = self.tensors[s.name]
            whole = s.num_heads == 1 or self.layout.index("H") > max(self.layout.index("L"),
                                                                    self.layout.index("B"))
            heads: list[int | None] = [None] if whole else list(range(s.num_heads))
            length = self.rows_per_block(s.name) * s.row_bytes * (s.num_heads if whole else 1)
            for layer in range(s.num_layers):
                for h in heads:
                    start = t.offset + layer * t.layer_stride + (h or 0) * t.head_stride
                    pages.append(BlockPage(s.name, layer, h, start, length, t.block_stride))
        return sorted(pages, key=lambda pg: pg.start)

    def address(self, name: str, layer: int, slot: int, head: int = 0, byte: int = 0) -> int:
        """Byte offset in the flat buffer of (spec, layer, slot, head, byte)."""
        s = self.spec(name)
        self._check_layer(name, layer)
        rows = self.rows_per_block(name)
        if not 0 <= slot < self.num_blocks * rows:
            raise IndexError(f"slot must be in [0, {self.num_blocks * rows}) for spec {name!r} "
                             f"({rows} rows per block), got {slot}")
        if not 0 <= head < s.num_heads:
            raise IndexError(f"head must be in [0, {s.num_heads}), got {head}")
        if not 0 <= byte < s.row_bytes:
            raise IndexError(f"byte must be in [0, {s.row_bytes}), got {byte}")
        block, row = divmod(slot, rows)
        return split_address(s, self.tensors[name], rows, layer, block, row, head, byte)

    def view(self, buffer: torch.Tensor, name: str, layer: int) -> torch.Tensor:
        """uint8 [num_blocks, H, rows per block, C] view of one layer of one spec in `buffer`."""
        if buffer.dtype != torch.uint8 or buffer.dim() != 1:
            raise TypeError(f"buffer must be a 1-D torch.uint8 tensor, got {buffer.dtype} "
                            f"with shape {tuple(buffer.shape)}")
        if buffer.numel() < self.total_bytes or buffer.stride(0) != 1:
            raise ValueError(f"buffer must be contiguous and hold {self.total_bytes} bytes, "
                             f"got {buffer.numel()}")
        self._check_layer(name, layer)
        s, t = self.spec(name), self.tensors[name]
        return torch.as_strided(
            buffer, (self.num_blocks, s.num_heads, self.rows_per_block(name), s.row_bytes),
            (t.block_stride, t.head_stride, t.token_stride, 1),
            buffer.storage_offset() + t.offset + layer * t.layer_stride)
