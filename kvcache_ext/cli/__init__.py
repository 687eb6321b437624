"""Layer 8, the command line: python -m kvcache_ext {layout, capacity, demo, transfer}. Each
subcommand module gives add_parser(sub); dispatch.py builds the parser from them and runs one."""
from .dispatch import build_parser, main

__all__ = ["build_parser", "main"]
