"""Model code on the cache. `kvcache_ext.models.dsa`: a DeepSeek sparse-attention model whose
prefill and decode run from the cache ops alone (no transformers needed)."""
