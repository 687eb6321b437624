"""What travels between the connector's halves and between engines: the request protocol of vLLM's
NixlConnector (a prefill request asks for `do_remote_decode`; its RequestOutput.kv_transfer_params,
handed unchanged to the decode request, say where the prompt's blocks are), and the metadata the
scheduler hands its worker each step."""
from __future__ import annotations

from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorHandshakeMetadata,
                                                               KVConnectorMetadata)

# Every key NixlConnector's producer returns (proxies written for it pass them through), and the
# connector's own: which instance of the producer's worker holds the blocks, and which hand-off.
NIXL_PARAM_KEYS = ("do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_engine_id",
                   "remote_request_id", "remote_host", "remote_port", "tp_size", "dcp_size",
                   "pp_size", "remote_num_tokens", "remote_blocks_expiry_time", "transfer_mode")
OWN_PARAM_KEYS = ("remote_instance", "remote_generation")


@dataclass(frozen=True)
class Remote:
    """Where a prompt's cache is: the producer's side channel and worker instance, its block ids
    (one tuple per KV-cache group, in the producer's group order), and which hand-off of which
    request. Made from a request's parameters by params.remote_of, which checks each field."""

    host: str
    port: int
    engine_id: str
    instance: str
    request_id: str
    generation: int
    block_ids: tuple[tuple[int, ...], ...]
    num_tokens: int
    expiry_time: float


@dataclass
class RecvSpec:
    """Consumer: read tokens start .. start + count of a prompt into local_block_ids (one list
    per KV-cache group). `error`: the parameters were refused before any read (the load fails
    at once)."""

    request_id: str
    remote: Remote | None
    local_block_ids: list[list[int]]
    start: int
    count: int
    error: str = ""
    debug: dict = field(default_factory=dict)  # kvc_debug_* keys of the parameters (config.py)


@dataclass
class SendSpec:
    """Producer: a finished prompt whose blocks wait for a consumer's read."""

    request_id: str
    generation: int
    expiry_time: float  # time.time() after which they are freed unread
    block_ids: tuple[tuple[int, ...], ...] = ()  # every group's: the only blocks a read of
    #                                               this hand-off may take
    num_tokens: int = 0  # the prompt's tokens in them (the parameters' remote_num_tokens)


@dataclass
class KvcacheExtMetadata(KVConnectorMetadata):
    recv: dict[str, RecvSpec] = field(default_factory=dict)
    send: dict[str, SendSpec] = field(default_factory=dict)
    release: dict[str, Remote] = field(default_factory=dict)  # prompts held locally: free theirs
    idle: bool = False  # the step schedules no token (and no data parallelism): the worker may
    #                     wait for a read to end or a hold to be released before it answers
    #                     (config idle_wait_ms)


@dataclass
class WorkerAddress(KVConnectorHandshakeMetadata):
    """A worker's side channel and instance, for its scheduler's kv_transfer_params."""

    host: str
    port: int
    instance: str
