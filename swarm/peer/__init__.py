"""A swarm peer: sockets, membership client, links to neighbours."""

from .agent import BaseAgent
from .peer import Peer, PeerCounters, PeerState
from .sync import SyncPeer

__all__ = ["Peer", "PeerState", "PeerCounters", "SyncPeer", "BaseAgent"]
