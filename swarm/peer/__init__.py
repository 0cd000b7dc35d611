"""A swarm peer: sockets, membership client, links to neighbours."""

from .peer import Peer, PeerCounters, PeerState

__all__ = ["Peer", "PeerState", "PeerCounters"]
