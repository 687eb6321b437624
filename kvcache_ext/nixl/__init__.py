"""kvcache_ext.nixl (integration, needs NIXL): moving cache bytes between processes and machines.
See endpoint.py (the Endpoint), paths.py (the ways a transfer reaches NIXL) and handle.py (a
transfer's handle and stats); `import kvcache_ext` alone never imports this package."""
from .endpoint import (DEFAULT_POLL_INTERVAL_S, Endpoint, NixlError, Peer, PeerGoneError,
                       TransferHandle, TransferStats)
from .paths import PATHS

__all__ = ["DEFAULT_POLL_INTERVAL_S", "Endpoint", "NixlError", "PATHS", "Peer", "PeerGoneError",
           "TransferHandle", "TransferStats"]
