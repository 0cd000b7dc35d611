"""swarm: decentralized reinforcement learning over ZeroMQ gossip.

Symmetric peers train their own copy of a model, exchange compressed parameter
deltas with their neighbours and share replay samples; a lightweight
coordinator handles membership and failover and is never on the data path.
"""

from .config import CoordinatorConfig, PeerConfig, SwarmConfig, load_config
from .errors import (ConfigError, GossipError, MembershipError, PeerTimeout, ReplayError,
                     SwarmError, TransportError, WireError)

__version__ = "0.1.0"

__all__ = [
    "Peer", "SyncPeer", "Coordinator",
    "SwarmConfig", "PeerConfig", "CoordinatorConfig", "load_config",
    "SwarmError", "ConfigError", "WireError", "TransportError", "MembershipError",
    "PeerTimeout", "GossipError", "ReplayError",
]


def __getattr__(name: str):
    # Imported lazily so that `import swarm` (and the coordinator) start fast.
    if name in ("Peer", "SyncPeer"):
        from . import peer
        return getattr(peer, name)
    if name == "Coordinator":
        from .coordinator import Coordinator
        return Coordinator
    raise AttributeError(f"module 'swarm' has no attribute {name!r}")
