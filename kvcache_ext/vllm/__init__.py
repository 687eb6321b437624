"""kvcache_ext.vllm (integration, needs vllm): KvcacheExtConnector, a vLLM v1 KV connector moving a
prompt's cache between two engines whose plans differ (connector.py). `import kvcache_ext` never
imports this package or vllm."""
from .connector import KvcacheExtConnector

__all__ = ["KvcacheExtConnector"]
