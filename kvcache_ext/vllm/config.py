"""The connector's settings (kv_connector_extra_config) and what it refuses at start-up.

Test hooks travel in a request's kv_transfer_params, so one engine serves every case, but run only
in an engine started with kv_connector_extra_config['test_only_hooks'] = true (tests do that);
anywhere else a request carrying one has nothing read for it (the log names the keys) and
follows kv_load_failure_policy, and a producer refuses a read that asks for one. The hooks:
kvc_debug_delay_s (the consumer waits before reading), kvc_debug_timeout_s (its read's timeout),
kvc_debug_acquire_delay_s (the producer answers the read's request this late),
kvc_debug_release_delay_s (the consumer releases the producer's blocks this late after its read:
a producer's pack ranges then stay lent while other reads ask), kvc_debug_corrupt
(the consumer negates every value it read -- in a grouped cache, sets every byte it read, or
given a spec name that spec's, to 0x3F: the tokens must change)."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any, Mapping


@dataclass(frozen=True)
class ConnectorConfig:
    """kv_connector_extra_config keys (all optional)."""

    hold_timeout_s: float = 30.0   # a producer frees a finished request's blocks after this long
    #                                 without a read (a read in progress holds them until done)
    read_timeout_s: float = 30.0   # a consumer gives up a read (handshake, read, release) after it
    side_channel_host: str = ""    # the producer's address in kv_transfer_params; default
    #                                 VLLM_NIXL_SIDE_CHANNEL_HOST, else 127.0.0.1
    side_channel_port: int = -1    # default VLLM_NIXL_SIDE_CHANNEL_PORT + data-parallel index
    #                                 when set, else a free port (two engines on one host)
    side_channel_timeout_s: float = 10.0  # producer: a request on the side channel must arrive
    #                                 whole within this long of its connection (a silent or
    #                                 byte-dripping peer is cut off), and each reply be taken
    #                                 within this long
    side_channel_max_connections: int = 128  # producer: connections served at once, at most
    #                                 half of them from one address (a packed read holds one
    #                                 for its whole read); one more is closed at once (each
    #                                 holds a thread for up to side_channel_timeout_s)
    acquire_wait_s: float = 5.0    # producer: an acquire for a request it does not hold yet waits
    #                                 up to this long (the read may ask before this worker has
    #                                 the step's metadata that holds it), at most the read's own
    #                                 timeout
    allowed_producers: str = ""    # consumer: the producers a request's parameters may name,
    #                                 comma-separated: host names, IP addresses, CIDR networks,
    #                                 each optionally ':port', or '*' for any. Default: this
    #                                 machine's only (loopback and this engine's side-channel
    #                                 host); docs/trust.md
    poison_before_load: bool = False  # fill a request's destination rows with NaN before reading
    #                                    (tests: a token computed from bytes never written shows)
    pack_buffer_mb: float = 0.0    # producer: a buffer of this many MiB (registered with NIXL)
    #                                 where it packs a prompt in the page form of a consumer
    #                                 with another block size while that consumer reads it (the
    #                                 re-tiling on the producer's core: the consumer reads whole
    #                                 pages); 0: consumers re-tile what they read themselves
    idle_wait_ms: float = 5.0      # a step that runs nothing while this worker reads a prompt
    #                                 (consumer) or holds one for a reader (producer) waits up to
    #                                 this long for the read to end or the hold to be released
    #                                 before it answers vLLM, instead of returning at once:
    #                                 vLLM would otherwise step again about 1 ms later, each
    #                                 empty step Python in the worker's process beside the read
    #                                 (or the producer's packing). A request that arrives
    #                                 meanwhile is scheduled this much later at most; 0: no
    #                                 wait; never under data parallelism (a rank's empty step
    #                                 runs a dummy batch the other ranks wait for)
    test_only_hooks: bool = False  # the kvc_debug_* keys of a request take effect (the fault and
    #                                 corruption tests); never in serving: a request could
    #                                 corrupt its own cache or make the producer sleep
    stats_path: str = ""           # consumer: one JSON line per read appended here (request,
    #                                 start, tokens, spans, bytes, seconds, steps (engine steps
    #                                 while it was in flight), ok, error; the read's
    #                                 path, pieces NIXL posted, staged_bytes; the seconds of each
    #                                 stage: peer_s, acquire_s, plan_s (plan_cpu_s: its CPU
    #                                 time), read_s); producer: one line per acquire it
    #                                 refused ("refused": why, in a word; "request_id"; "why")

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> "ConnectorConfig":
        extra = dict(extra or {})
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(extra) - set(known))
        if unknown:
            raise ValueError(f"kv_connector_extra_config has keys KvcacheExtConnector does not "
                             f"know: {unknown} (known: {sorted(known)})")
        values = {}
        for name, value in extra.items():
            default = known[name].default
            try:
                values[name] = type(default)(value)
            except (TypeError, ValueError):
                raise ValueError(f"kv_connector_extra_config[{name!r}] must be a "
                                 f"{type(default).__name__}, got {value!r}") from None
        cfg = cls(**values)
        if not cfg.pack_buffer_mb >= 0:
            raise ValueError(f"kv_connector_extra_config['pack_buffer_mb'] must be >= 0, got "
                             f"{cfg.pack_buffer_mb!r}")
        if not 0 <= cfg.idle_wait_ms <= 1000:
            raise ValueError(f"kv_connector_extra_config['idle_wait_ms'] must be in [0, 1000], "
                             f"got {cfg.idle_wait_ms!r}")
        if not 1 <= cfg.side_channel_max_connections <= 4096:
            raise ValueError(f"kv_connector_extra_config['side_channel_max_connections'] must "
                             f"be in [1, 4096], got {cfg.side_channel_max_connections!r}")
        if not 0 <= cfg.acquire_wait_s <= 60:
            raise ValueError(f"kv_connector_extra_config['acquire_wait_s'] must be in [0, 60], "
                             f"got {cfg.acquire_wait_s!r}")
        for name in ("hold_timeout_s", "read_timeout_s", "side_channel_timeout_s"):
            if not getattr(cfg, name) > 0:
                raise ValueError(f"kv_connector_extra_config[{name!r}] must be > 0, got "
                                 f"{getattr(cfg, name)!r}")
        return cfg

    def host(self) -> str:
        return self.side_channel_host or os.environ.get("VLLM_NIXL_SIDE_CHANNEL_HOST") or "127.0.0.1"

    def port(self, dp_index: int) -> int:
        """The side channel's port: 0 asks the OS for a free one."""
        if self.side_channel_port >= 0:
            return self.side_channel_port
        env = os.environ.get("VLLM_NIXL_SIDE_CHANNEL_PORT")
        return int(env) + dp_index if env else 0


def check_supported(vllm_config, kv_cache_config):
    """Refuse, naming the field, what the connector does not move yet. -> the VllmGroupPlan it
    checked a hybrid cache's layers with (the worker keeps it), else None."""
    groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
    vplan = None
    cache_dtype = getattr(vllm_config.cache_config, "cache_dtype", "auto")
    if len(groups) > 1:
        # a hybrid cache: every layer's record must be one the plan knows. The scheduler's
        # copy keeps one spec per group (vLLM's generate_scheduler_kv_cache_config): the
        # worker's, with every layer's spec, is checked.
        if all(hasattr(getattr(g, "kv_cache_spec", None), "kv_cache_specs") for g in groups):
            from .group_plan import group_plan_of
            vplan = group_plan_of(kv_cache_config)
    elif cache_dtype not in ("auto", None):
        raise ValueError(f"KvcacheExtConnector: cache_config.cache_dtype = {cache_dtype!r} is not "
                         f"supported in a one-group cache (fp8 K/V caches are not moved yet); "
                         f"use 'auto'")
    from .cache_plan import check_mla_spec, is_mla
    spec = getattr(groups[0], "kv_cache_spec", None) if groups else None
    if is_mla(spec):
        check_mla_spec(spec)
    par = vllm_config.parallel_config
    for field in ("tensor_parallel_size", "pipeline_parallel_size"):
        if getattr(par, field, 1) != 1:
            raise ValueError(f"KvcacheExtConnector: parallel_config.{field} = "
                             f"{getattr(par, field)} is not supported; 1 is")
    return vplan
