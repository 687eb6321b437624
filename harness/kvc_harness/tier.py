"""The fast test tier's guard on this side: under KVC_TEST_TIER=fast (set by tests/tiers.py for
every test outside the engine tier, and inherited by the processes it starts) nothing here starts
an engine or a server. vllm_plugin is registered as a vLLM general plugin (harness/pyproject.toml),
which vLLM loads in every process it starts for an engine, so an engine started any other way
(vllm.LLM, the OpenAI server) is refused too."""
from __future__ import annotations

import os

ENV = "KVC_TEST_TIER"  # tests/tiers.py sets it (keep the two names the same)


class TierError(RuntimeError):
    """An engine or a server started by a test outside the engine tier."""


def check(what: str) -> None:
    if os.environ.get(ENV) == "fast":
        raise TierError(f"{what} started under {ENV}=fast: the test that started it is outside "
                        f"the engine tier; mark it @pytest.mark.engine (run by "
                        f"`.venv/bin/python -m pytest -q -m engine`)")


def vllm_plugin() -> None:
    """vLLM general plugin: refuse to go on in an engine's process under the fast tier."""
    check("a vLLM engine")
