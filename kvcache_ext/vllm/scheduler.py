"""The connector's scheduler half (in vLLM's EngineCore process): which prompts to read from a
producer and into which blocks (consumer), and which finished prompts' blocks to hold for a
reader (producer). Side-effect free where vLLM asks it to be; the state it gathers goes to the
worker in each step's metadata."""
from __future__ import annotations

import itertools
import logging
import time

from vllm.v1.request import RequestStatus

from .config import ConnectorConfig
from .params import ParamLimits, allowed_of, remote_of
from .protocol import KvcacheExtMetadata, RecvSpec, Remote, SendSpec, WorkerAddress

_FINISHED_OK = (RequestStatus.FINISHED_LENGTH_CAPPED, RequestStatus.FINISHED_STOPPED)
log = logging.getLogger("kvcache_ext.vllm")


class SchedulerSide:
    def __init__(self, vllm_config, cfg: ConnectorConfig) -> None:
        self.cfg = cfg
        self.engine_id = vllm_config.kv_transfer_config.engine_id
        self.address: WorkerAddress | None = None  # the worker's, from its handshake metadata
        self._generations = itertools.count(1)
        self._meta = KvcacheExtMetadata()
        self._local_hit: dict[str, int] = {}  # tokens a request holds locally, when last asked
        # data parallel: a rank whose step runs nothing runs a dummy batch the other ranks'
        # forwards wait for, so its step must not wait (worker.results)
        par = getattr(vllm_config, "parallel_config", None)
        self._may_idle = int(getattr(par, "data_parallel_size", 1) or 1) == 1
        model = getattr(vllm_config, "model_config", None)
        self._max_tokens = int(getattr(model, "max_model_len", 0) or 0)
        self._allowed = allowed_of(cfg.allowed_producers, cfg.host())

    def remote(self, p: dict, num_groups: int = 0) -> Remote:
        """The producer a request's parameters name, every field checked (ParamError)."""
        return remote_of(p, ParamLimits(self._max_tokens, num_groups, self._allowed))

    def set_worker_address(self, address: WorkerAddress) -> None:
        self.address = address

    # ---- consumer ------------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int, bool]:
        """A decode request with a producer's parameters: the prompt tokens past the local
        prefix hit come from the producer, asynchronously."""
        p = request.kv_transfer_params
        if not isinstance(p, dict) or not p.get("do_remote_prefill"):
            return 0, False
        self._local_hit[request.request_id] = num_computed_tokens
        count = len(request.prompt_token_ids or ()) - num_computed_tokens
        return (count, True) if count > 0 else (0, False)

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        p = request.kv_transfer_params
        local_hit = self._local_hit.pop(request.request_id, 0)
        if not isinstance(p, dict) or not p.get("do_remote_prefill"):
            return
        p["do_remote_prefill"] = False  # one read per request
        block_ids = [list(g) for g in blocks.get_block_ids()]
        try:  # nothing of a bad field is used: the read fails at once, naming it
            remote, error = self.remote(p, len(block_ids)), ""
        except Exception as e:  # noqa: BLE001 - ParamError, or what no check foresaw: never
            remote, error = None, str(e)  # an exception in vLLM's engine loop
            log.warning("KvcacheExtConnector: request %s: %s: nothing is read",
                        request.request_id, e)
        if num_external_tokens == 0:  # the whole prompt was held locally: free the producer's
            if remote is not None:
                self._meta.release[request.request_id] = remote
            return
        hooks = sorted(k for k in p if isinstance(k, str) and k.startswith("kvc_debug_"))
        if hooks and not self.cfg.test_only_hooks:  # a request body never pulls a test hook
            refused = (f"kv_transfer_params carry test hook(s) {hooks}, which run only in an "
                       f"engine started with kv_connector_extra_config['test_only_hooks'] = "
                       f"true: nothing is read")
            log.warning("KvcacheExtConnector: request %s: %s", request.request_id, refused)
            error, hooks = error or refused, []
        # every group's block table (a window group's blocks before its window are vLLM's
        # null block): the worker reads the rows each group keeps of tokens past the local hit
        self._meta.recv[request.request_id] = RecvSpec(
            request.request_id, remote, block_ids, local_hit, num_external_tokens, error,
            {k[len("kvc_debug_"):]: p[k] for k in hooks})

    # ---- producer ------------------------------------------------------------------------------
    def request_finished(self, request,
                         block_ids: tuple[list[int], ...]) -> tuple[bool, dict | None]:
        """A finished prefill asked for a remote decode: hold its blocks (every group's) for
        the reader, and say where they are (NixlConnector's keys, one block list per group,
        and the hand-off's instance and generation)."""
        p = request.kv_transfer_params
        self._local_hit.pop(request.request_id, None)  # ended (aborted) before its allocation
        if not isinstance(p, dict):
            return False, None
        if p.get("do_remote_prefill"):  # a decode request that ended before its read: the
            p["do_remote_prefill"] = False  # producer may free the prompt's blocks now
            try:
                self._meta.release[request.request_id] = self.remote(p)
            except Exception:  # noqa: BLE001 - bad parameters name no producer to tell
                pass
            return False, None
        if not p.get("do_remote_decode"):
            return False, None
        held = sum(b != 0 for g in block_ids for b in g)  # block 0: vLLM's null block
        if request.status not in _FINISHED_OK or not held or self.address is None:
            log.warning("KvcacheExtConnector: request %s asked for a remote decode but ends with "
                        "status %s, %d block(s), worker side channel %s: no kv_transfer_params "
                        "(the decode computes the prompt itself)", request.request_id,
                        request.status, held, self.address)
            return False, None
        generation = next(self._generations)
        expiry = time.time() + self.cfg.hold_timeout_s
        self._meta.send[request.request_id] = SendSpec(
            request.request_id, generation, expiry, tuple(tuple(g) for g in block_ids),
            request.num_computed_tokens)
        return True, {
            "do_remote_prefill": True, "do_remote_decode": False,
            "remote_block_ids": [list(g) for g in block_ids], "remote_engine_id": self.engine_id,
            "remote_request_id": request.request_id, "remote_host": self.address.host,
            "remote_port": self.address.port, "tp_size": 1, "dcp_size": 1, "pp_size": 1,
            "remote_num_tokens": request.num_computed_tokens,
            "remote_blocks_expiry_time": expiry, "transfer_mode": "pull",
            "remote_instance": self.address.instance, "remote_generation": generation,
        }

    def build_connector_meta(self, scheduler_output=None) -> KvcacheExtMetadata:
        meta, self._meta = self._meta, KvcacheExtMetadata()
        # vLLM steps again about 1 ms after a step that ran nothing while a request waits
        # for its cache (or to be freed); such a step tells the worker it may wait for the
        # read (or the release) instead of answering at once (worker.results)
        meta.idle = self._may_idle and getattr(
            scheduler_output, "total_num_scheduled_tokens", 1) == 0
        return meta
