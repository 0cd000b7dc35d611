"""The one exception tree of swarm.

    SwarmError
    ├── ConfigError        a bad config key or value (names the key)
    ├── WireError          a message or payload that fails a check
    ├── TransportError     a socket could not be bound, connected or used
    ├── MembershipError    join refused, duplicate id, unknown peer
    ├── PeerTimeout        a wait ran past its deadline
    ├── GossipError        a gossip round could not be done (bad delta, bad size)
    └── ReplayError        a replay item, schema or request that fails a check

A raw ``zmq.ZMQError`` or ``KeyError`` never reaches a user: every message says
what was wrong and, where it can, what to do.
"""

from __future__ import annotations

__all__ = [
    "SwarmError",
    "ConfigError",
    "EncodedTooLarge",
    "WireError",
    "TransportError",
    "MembershipError",
    "PeerTimeout",
    "GossipError",
    "ReplayError",
]


class SwarmError(Exception):
    """Base class of every error swarm raises on purpose."""


class ConfigError(SwarmError, ValueError):
    """A config key or value is wrong; the message names the key and the value."""


class EncodedTooLarge(ConfigError):
    """A gradient the relay will not publish: what its codec would send decodes past
    ``MAX_GRAD`` (error feedback adds its residual, QSGD's levels can pass a block's
    largest entry). Nothing was sent; an agent passes that turn."""


class WireError(SwarmError, ValueError):
    """A message or encoded payload failed a check (size, dtype, shape, version, type)."""


class TransportError(SwarmError):
    """A socket could not be bound, connected or used."""


class MembershipError(SwarmError):
    """The coordinator refused a join, or a peer id is unknown or taken."""


class PeerTimeout(SwarmError, TimeoutError):
    """A wait ran past its deadline."""


class GossipError(SwarmError):
    """A gossip round or delta failed a check (NaN/Inf, wrong size)."""


class ReplayError(SwarmError, ValueError):
    """A replay item, schema or request failed a check; the message names the field."""
