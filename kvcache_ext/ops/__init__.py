"""Layer 4, the ops: the compiled library (library.py loads it and its fakes), and thin typed
wrappers over torch.ops.kvcache_ext -- writes.py and gathers.py for DeepSeek-V3.2's rows and plain
K/V rows, v4.py for DeepSeek-V4's (also importable as `kvcache_ext.ops_v4`)."""
from .checks import check_slot_mapping
from .gathers import (INDEXER_DIM, MLA_DIM, MLA_ROW_BYTES, gather_indexer, gather_indexer_slots,
                      gather_kv, gather_kv_slots, gather_mla, gather_mla_slots)
from .library import ops as _ops  # noqa: F401  (torch.ops.kvcache_ext)
from .writes import (concat_and_cache_mla, dsa_write, indexer_k_quant_and_cache,
                     reshape_and_cache, reshape_and_cache_kv, reshape_and_cache_kv_split)

__all__ = ["INDEXER_DIM", "MLA_DIM", "MLA_ROW_BYTES", "check_slot_mapping", "concat_and_cache_mla",
           "dsa_write", "gather_indexer", "gather_indexer_slots", "gather_kv", "gather_kv_slots",
           "gather_mla", "gather_mla_slots", "indexer_k_quant_and_cache", "reshape_and_cache",
           "reshape_and_cache_kv", "reshape_and_cache_kv_split"]
