"""Gossip averaging: topologies, mixing weights, and the CHOCO-style engine."""

from .topology import TOPOLOGIES, Spectrum, mixing_matrix, neighbours, spectrum, weights

__all__ = ["TOPOLOGIES", "Spectrum", "mixing_matrix", "neighbours", "spectrum", "weights"]
