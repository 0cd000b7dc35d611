"""Gossip averaging: topologies, mixing weights, the CHOCO-style engine, and the gradient relay.

>>> from swarm.gossip import Gossip, flat_parameters
>>> x = flat_parameters(model)            # one float32 vector over the model's tensors
>>> g = Gossip(peer, x, topology="ring", codec="ef+topk:0.01", gamma="auto")  # γ = 0.02
>>> result = await g.round()
>>> is_flat(model, x)                     # False once an operation moved the model out of x

torch is imported on first use only: by :func:`flat_parameters`, by the ``fp16``
codec (its float16 casts) and by ``identity``'s weighted adds; int8, qsgd, sign,
topk and randomk streams do without it.
"""

from ._codecs import suggested_gamma
from .engine import MODES, SYNC_MODES, Gossip, GossipStats, RoundResult
from .flat import flat_parameters, is_flat
from .relay import GradientRelay, RelayStats, Snapshot
from .topology import TOPOLOGIES, Spectrum, mixing_matrix, neighbours, spectrum, weights

__all__ = [
    "Gossip", "GossipStats", "RoundResult", "SYNC_MODES", "MODES", "flat_parameters", "is_flat", "suggested_gamma",
    "GradientRelay", "RelayStats", "Snapshot",
    "TOPOLOGIES", "Spectrum", "mixing_matrix", "neighbours", "spectrum", "weights",
]
