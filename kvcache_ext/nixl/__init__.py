"""kvcache_ext.nixl (integration, needs NIXL): moving cache bytes between processes and machines.
See endpoint.py; `import kvcache_ext` alone never imports this package."""
from .endpoint import (DEFAULT_POLL_INTERVAL_S, Endpoint, NixlError, Peer, PeerGoneError,
                       TransferHandle)

__all__ = ["DEFAULT_POLL_INTERVAL_S", "Endpoint", "NixlError", "Peer", "PeerGoneError",
           "TransferHandle"]
