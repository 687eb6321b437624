"""Layer 2, the cache: one flat uint8 buffer per plan, the strided per-layer views handed to
kernels, and the one block allocator."""
from .buffer import KVCache, allocate
from .pool import BlockPool, CacheFullError

__all__ = ["BlockPool", "CacheFullError", "KVCache", "allocate"]
