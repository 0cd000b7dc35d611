"""Replay for swarm: a local prioritized buffer with age decay, shared with neighbours.

Public API::

    from swarm.buffer import ReplayBuffer, Schema, RateLimiter, Federation
"""

from .federation import Federation, FederationStats
from .limiter import RateLimiter, TokenBucket
from .persist import Snapshot
from .replay import Items, ReplayBuffer, Sample
from .schema import Schema
from .sumtree import SumTree

__all__ = ["ReplayBuffer", "Schema", "Sample", "Items", "RateLimiter", "TokenBucket", "SumTree", "Snapshot", "Federation", "FederationStats"]
