"""A decode request's kv_transfer_params, checked field by field before anything is read: they come
from a request body, so each field is taken only in the type, range and size a producer's own
parameters have, and the producer they name only where the operator allows it
(kv_connector_extra_config['allowed_producers']). A bad field raises ParamError naming it; the
request then has nothing read and follows kv_load_failure_policy (scheduler.py)."""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Mapping

from .protocol import Remote

MAX_NAME_CHARS = 256        # ids, instances, host names (a DNS name is at most 253)
MAX_GROUPS = 64             # block lists: one per KV-cache group (DeepSeek-V4: 5)
MAX_BLOCK_ID = (1 << 31) - 1
MAX_SECONDS = 1e12          # time.time() values: far past any expiry, well within a float
LOOPBACK = ("127.0.0.0/8", "::1", "localhost")


class ParamError(ValueError):
    """A field of kv_transfer_params that is not what a producer's parameters hold."""

    def __init__(self, field: str, expected: str, got: object) -> None:
        try:
            shown = f"{got!r:.80}"
        except ValueError:  # an int past Python's digit limit for str()
            shown = f"a {type(got).__name__} too long to show"
        super().__init__(f"kv_transfer_params[{field!r}] must be {expected}, got {shown}")
        self.field = field


@dataclass(frozen=True)
class ParamLimits:
    """What this consumer accepts. max_tokens: its max_model_len (0: no bound known);
    num_groups: its KV-cache groups (0: not known); allowed: producer entries (allowed_of)."""

    max_tokens: int = 0
    num_groups: int = 0
    allowed: tuple[str, ...] = LOOPBACK


def allowed_of(setting: str, own_host: str) -> tuple[str, ...]:
    """kv_connector_extra_config['allowed_producers']: comma-separated entries, each a host
    name, an IP address, a network in CIDR form, any of those with ':port', or '*' (any
    producer). Empty (the default): this machine's producers only -- loopback and this engine's
    own side-channel host."""
    entries = tuple(e.strip() for e in setting.split(",") if e.strip())
    return entries or (*LOOPBACK, own_host)


def _split(entry: str) -> tuple[str, int | None]:
    if entry.startswith("["):  # [v6]:port
        host, _, port = entry[1:].partition("]:")
        return host, int(port) if port else None
    if entry.count(":") == 1:
        host, port = entry.split(":")
        return host, int(port)
    return entry, None


def producer_allowed(host: str, port: int, allowed: tuple[str, ...]) -> bool:
    """Whether host:port matches an entry (names by equality, addresses by network; no DNS
    lookup of a name a request chose)."""
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        addr = None
    for entry in allowed:
        if entry == "*":
            return True
        try:
            e_host, e_port = _split(entry)
        except ValueError:
            continue
        if e_port is not None and e_port != port:
            continue
        if e_host.lower() == host.lower():
            return True
        if addr is not None:
            try:
                if addr in ipaddress.ip_network(e_host, strict=False):
                    return True
            except ValueError:
                pass
    return False


def _int(p: Mapping, field: str, lo: int, hi: int) -> int:
    v = p.get(field)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ParamError(field, f"an integer in [{lo}, {hi}]", v)
    return v


def _name(p: Mapping, field: str) -> str:
    v = p.get(field)
    if not isinstance(v, str) or not 0 < len(v) <= MAX_NAME_CHARS or not v.isprintable():
        raise ParamError(field, f"a printable string of 1 to {MAX_NAME_CHARS} characters", v)
    return v


def remote_of(p: Mapping, limits: ParamLimits) -> Remote:
    """The producer's Remote from a request's parameters, each field checked (ParamError)."""
    max_tokens = limits.max_tokens or (1 << 31) - 1
    num_tokens = _int(p, "remote_num_tokens", 1, max_tokens)
    host, port = _name(p, "remote_host"), _int(p, "remote_port", 1, 65535)
    if any(c.isspace() for c in host):
        raise ParamError("remote_host", "a host name or address", host)
    if not producer_allowed(host, port, limits.allowed):
        raise ParamError("remote_host", f"a producer kv_connector_extra_config"
                                        f"['allowed_producers'] allows ({', '.join(limits.allowed)})",
                         f"{host}:{port}")
    groups = p.get("remote_block_ids")
    want = f"{limits.num_groups} list(s)" if limits.num_groups else f"1 to {MAX_GROUPS} lists"
    if (not isinstance(groups, list) or not 0 < len(groups) <= MAX_GROUPS
            or (limits.num_groups and len(groups) != limits.num_groups)
            or not all(isinstance(g, list) for g in groups)):
        raise ParamError("remote_block_ids", f"{want} of block ids, one per KV-cache group",
                         groups)
    for g in groups:
        # a block holds at least one token: never more blocks than the prompt's tokens
        if len(g) > num_tokens or not all(
                type(b) is int and 0 <= b <= MAX_BLOCK_ID for b in g):
            raise ParamError("remote_block_ids", f"lists of at most remote_num_tokens "
                                                 f"({num_tokens}) block ids in [0, {MAX_BLOCK_ID}]",
                             g)
    expiry = p.get("remote_blocks_expiry_time", 0.0)
    # compared, not converted: a 400-digit int raises no OverflowError, and NaN compares False
    if (isinstance(expiry, bool) or not isinstance(expiry, (int, float))
            or not -MAX_SECONDS <= expiry <= MAX_SECONDS):
        raise ParamError("remote_blocks_expiry_time",
                         f"a number of seconds (time.time()) within ±{MAX_SECONDS:g}", expiry)
    for field in ("tp_size", "dcp_size", "pp_size"):  # NixlConnector's keys: one rank each
        if field in p and (type(p[field]) is not int or p[field] != 1):
            raise ParamError(field, "1", p[field])
    if p.get("transfer_mode", "pull") != "pull":
        raise ParamError("transfer_mode", "'pull'", p["transfer_mode"])
    return Remote(host, port, _name(p, "remote_engine_id"), _name(p, "remote_instance"),
                  _name(p, "remote_request_id"),
                  _int(p, "remote_generation", 1, (1 << 63) - 1),
                  tuple(tuple(g) for g in groups), num_tokens, float(expiry))


def check_blocks(r: Remote, block_sizes: list[int], num_blocks: int) -> None:
    """Against the producer's plan (known once its metadata is loaded): a list per group of
    the producer's cache, each id below its block count, no more blocks than the prompt's
    tokens fill."""
    if len(r.block_ids) != len(block_sizes):
        raise ParamError("remote_block_ids", f"{len(block_sizes)} list(s), one per group of the "
                                             f"producer's cache", [len(g) for g in r.block_ids])
    for g, bs in zip(r.block_ids, block_sizes):
        need = -(-r.num_tokens // bs)
        if len(g) > need or any(b >= num_blocks for b in g):
            raise ParamError("remote_block_ids", f"at most {need} block id(s) (remote_num_tokens "
                                                 f"{r.num_tokens}, block {bs}) below the "
                                                 f"producer's {num_blocks} blocks", list(g)[:8])
