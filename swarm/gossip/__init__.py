"""Gossip averaging: topologies, mixing weights, and the CHOCO-style engine.

>>> from swarm.gossip import Gossip, flat_parameters
>>> x = flat_parameters(model)            # one float32 vector over the model's tensors
>>> g = Gossip(peer, x, topology="ring", codec="ef+topk:0.01", gamma=0.3)
>>> result = await g.round()

torch is imported only by :func:`flat_parameters`, on first use.
"""

from .engine import MODES, SYNC_MODES, Gossip, GossipStats, RoundResult
from .flat import flat_parameters
from .topology import TOPOLOGIES, Spectrum, mixing_matrix, neighbours, spectrum, weights

__all__ = [
    "Gossip", "GossipStats", "RoundResult", "SYNC_MODES", "MODES", "flat_parameters",
    "TOPOLOGIES", "Spectrum", "mixing_matrix", "neighbours", "spectrum", "weights",
]
