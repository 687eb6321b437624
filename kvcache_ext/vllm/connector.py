"""KvcacheExtConnector: a vLLM v1 KV connector that moves a prompt's cache from a prefill engine
to a decode engine whose plan differs (any block sizes either way), loaded out of tree:

    KVTransferConfig(kv_connector="KvcacheExtConnector", kv_connector_module_path="kvcache_ext.vllm",
                     kv_role="kv_producer" | "kv_consumer" | "kv_both",
                     kv_load_failure_policy="recompute", kv_connector_extra_config={...})

vLLM makes one instance per role: the scheduler half (scheduler.py) in the EngineCore process,
the worker half (worker.py) in the worker process; they speak through each step's metadata and,
once at start-up, the worker's handshake metadata (its side channel's address).

It supports vLLM's hybrid KV-cache manager (SupportsHMA): a model with several KV-cache groups
(DeepSeek-V4's window, compressed and compressor-state groups overlaid on one allocation) is
moved group by group, each at its own block size and token-per-row ratio (group_plan.py)."""
from __future__ import annotations

import logging

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                               KVConnectorRole,
                                                               KVConnectorTransferResults,
                                                               SupportsHMA)

from .config import ConnectorConfig, check_supported
from .scheduler import SchedulerSide
from .worker import WorkerSide

log = logging.getLogger("kvcache_ext.vllm")


class KvcacheExtConnector(KVConnectorBase_V1, SupportsHMA):
    def __init__(self, vllm_config, role, kv_cache_config) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        vplan = check_supported(vllm_config, kv_cache_config)
        tc = vllm_config.kv_transfer_config
        self.cfg = ConnectorConfig.from_extra(tc.kv_connector_extra_config)
        if (role == KVConnectorRole.SCHEDULER and tc.is_kv_consumer
                and getattr(tc, "kv_load_failure_policy", "fail") != "recompute"):
            log.warning("KvcacheExtConnector: kv_load_failure_policy is %r: a prompt whose cache "
                        "cannot be read ends with an error; 'recompute' computes it instead",
                        getattr(tc, "kv_load_failure_policy", "fail"))
        self.scheduler = SchedulerSide(vllm_config, self.cfg) if role == KVConnectorRole.SCHEDULER else None
        self.worker = WorkerSide(vllm_config, kv_cache_config, self.cfg, vplan) if role == KVConnectorRole.WORKER else None

    # ---- scheduler half --------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self.scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self.scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        return self.scheduler.build_connector_meta(scheduler_output)

    def request_finished(self, request, block_ids):  # one KV-cache group (HMA off)
        return self.scheduler.request_finished(request, (block_ids,))

    def request_finished_all_groups(self, request, block_ids):  # SupportsHMA: every group's
        return self.scheduler.request_finished(request, block_ids)

    def set_xfer_handshake_metadata(self, metadata) -> None:
        if self.scheduler is not None and metadata:
            self.scheduler.set_worker_address(next(iter(metadata.values())))

    # ---- worker half -----------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches) -> None:
        self.worker.register(kv_caches)

    def get_handshake_metadata(self):
        return self.worker.address() if self.worker is not None else None

    def start_load_kv(self, forward_context, **kwargs) -> None:
        self.worker.start(self._get_connector_metadata())

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None  # a prompt's rows are read before its request is scheduled

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        return None  # consumers pull: nothing is pushed

    def wait_for_save(self) -> None:
        return None

    def get_transfer_results(self, finished_req_ids) -> KVConnectorTransferResults:
        sent, recved, failed = self.worker.results()
        return KVConnectorTransferResults(sent, recved, failed)

    def get_finished(self, finished_req_ids):
        sent, recved, _ = self.worker.results()
        return sent or None, recved or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.worker.bad_blocks() if self.worker is not None else set()

    def shutdown(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()
