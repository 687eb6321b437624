"""kvcache_ext.hf (integration, needs transformers): a transformers Cache backed by one
kvcache_ext plan, model.generate(..., past_key_values=PagedCache(config, num_blocks=...))."""
from ..cache import CacheFullError
from .paged_cache import KV_CACHE_DTYPES, BlockPager, PagedCache, PagedLayer

__all__ = ["KV_CACHE_DTYPES", "BlockPager", "CacheFullError", "PagedCache", "PagedLayer"]
