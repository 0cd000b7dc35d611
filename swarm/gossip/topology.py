"""Gossip topologies: who averages with whom, and with what weights.

Everything here works on *positions* ``0..n-1`` in a membership view (members
sorted by rank), so when a peer dies the survivors simply recompute with the
new ``n`` and the hole closes at the next round. numpy only: the peer imports
this module to pick its neighbours.

Names (:data:`TOPOLOGIES`):

``ring``
    ``i ± 1 (mod n)``. n = 2 gives one neighbour, n = 1 none; never a self-loop.
``grid``
    A 2-D grid without wrap-around, ``cols = ceil(sqrt(n))`` columns, filled row
    by row. The last row is partial unless ``cols`` divides n (n = 6 and 12 are
    full 2×3 and 3×4 rectangles): its last peer has no "right" neighbour, and a
    peer of the row above with nobody below it has no "down" one. Degrees are at
    most 4, 2 at a corner, and 1 where a partial row leaves a peer a single
    neighbour: the top-right peer of a two-row grid with nobody below it (n = 3:
    peer 1; n = 5: peer 2) and a peer alone on the last row (the last peer of
    n = 3, 7, 13, 21, ...). n = 2 is one pair. Metropolis–Hastings weights keep
    the matrix symmetric and doubly stochastic for any shape.
``torus``
    A ``rows × cols`` grid with wrap-around, ``rows`` the largest divisor of n
    not above ``sqrt(n)``; a prime n therefore degenerates to a ring. A side of
    length 2 gives one neighbour on that axis (not the same one twice).
``hypercube``
    ``i XOR 2^k``; n must be a power of two.
``exponential``
    Static exponential graph, undirected: ``i ± 2^k (mod n)`` for
    ``2^k < n``.
``one_peer_exponential``
    Time-varying and *directed* (Ying et al., 2021): in round t, with
    ``τ = ceil(log2 n)`` and ``s = 2^(t mod τ)``, peer i sends to ``i + s``
    and receives from ``i − s``, mixing half-and-half. Over τ consecutive rounds
    this is exact averaging when n is a power of two.
``random_pairing``
    A random perfect matching each round (AD-PSGD style), the same on every peer
    because it is drawn from ``(seed, t)``; with odd n one peer sits out.
``full``
    Everyone with everyone, weights ``1/n``.
``custom``
    An undirected edge list ``edges=[(a, b), ...]`` over positions.

Weights are Metropolis–Hastings, ``w_ij = 1/(1 + max(d_i, d_j))`` and
``w_ii = 1 − Σ_j w_ij``, for every undirected topology: symmetric, doubly
stochastic, and equal to the textbook 1/(d+1) on regular graphs of degree d:
1/3 on a ring of n >= 3 (1/2 at n = 2), 1/(d+1) on a hypercube, and on a torus
1/5 only when both sides are at least 3 (n = 9, 12, 15, 16, ...): a side of 2
gives degree 3 and 1/4 (n = 6, 8, 10, 14), and a ring-like torus 1/3 (a prime
n > 2, and n = 4, which is 2×2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from ..checks import is_int, is_real, rng_seed
from ..errors import ConfigError

__all__ = [
    "TOPOLOGIES",
    "Spectrum",
    "neighbours",
    "senders",
    "receivers",
    "all_receivers",
    "weights",
    "mixing_matrix",
    "spectrum",
    "period",
    "eccentricity",
    "rounds_to_epsilon",
    "within",
]

TOPOLOGIES: tuple[str, ...] = (
    "ring", "grid", "torus", "hypercube", "exponential", "one_peer_exponential",
    "random_pairing", "full", "custom",
)

#: Topologies whose graph depends on the round number t.
TIME_VARYING: frozenset[str] = frozenset({"one_peer_exponential", "random_pairing"})

Edges = Iterable[Sequence[int]]


# ----------------------------------------------------------------- validation

def _check(topology: str, n: int, i: int | None = None, t: int = 0) -> tuple[int, int | None, int]:
    """The arguments, checked, as Python ints (numpy's have no ``bit_length``, and
    positions computed from them would come back as numpy scalars)."""
    if not isinstance(topology, str) or topology not in TOPOLOGIES:
        raise ConfigError(f"unknown topology {topology!r}; choose one of {', '.join(TOPOLOGIES)}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ConfigError(f"topology {topology!r}: n must be an integer >= 1, got {n!r}")
    if i is not None and (isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < n):
        raise ConfigError(f"topology {topology!r}: position i must be an integer in [0, {n}), got {i!r}")
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
        raise ConfigError(f"topology {topology!r}: round t must be an integer >= 0, got {t!r}")
    if topology == "hypercube" and n & (n - 1):
        raise ConfigError(f"topology 'hypercube' needs n to be a power of two, got n={n}")
    return int(n), None if i is None else int(i), int(t)


def _edge_list(edges: Edges | None, n: int) -> list[tuple[int, int]]:
    if edges is None or isinstance(edges, (str, bytes)) or not hasattr(edges, "__iter__"):
        raise ConfigError(f"topology 'custom' needs edges=[(a, b), ...] over positions 0..n-1, got {edges!r}")
    out = []
    for e in edges:
        try:
            a, b = e
        except (TypeError, ValueError):
            a = b = None
        # int() would take 1.9 as 1, True as 1 and "2" as 2: a graph nobody wrote
        if not (is_int(a) and is_int(b)):
            raise ConfigError(f"topology 'custom': edge {e!r} is not a pair of integer positions")
        a, b = int(a), int(b)
        if not (0 <= a < n and 0 <= b < n):
            raise ConfigError(f"topology 'custom': edge {e!r} has a position outside [0, {n})")
        if a == b:
            raise ConfigError(f"topology 'custom': edge {e!r} is a self-loop")
        out.append((a, b))
    return out


def within(edges: Edges | None, n: int) -> list[tuple[int, int]]:
    """The edges of a custom graph between the positions a view of ``n`` members has.

    A custom graph names positions up to the swarm's full size; while peers are
    still joining, or after one has left, the members there link what they can
    instead of refusing the view.

    >>> within([(0, 1), (1, 2), (2, 0)], 2)
    [(0, 1)]
    """
    return [e for e in _edge_list(edges, 1 << 31) if max(e) < n]


# ------------------------------------------------------------------ structure

def _grid_shape(n: int) -> tuple[int, int]:
    cols = math.isqrt(n)
    if cols * cols < n:
        cols += 1
    return -(-n // cols), cols


def _torus_shape(n: int) -> tuple[int, int]:
    rows = max(r for r in range(1, math.isqrt(n) + 1) if n % r == 0)
    return rows, n // rows


def _tau(n: int) -> int:
    return max(1, (n - 1).bit_length())


def _custom_edges(topology: str, edges: Edges | None, n: int) -> list[tuple[int, int]] | None:
    """A custom graph's edges as a checked list, read once: a generator is spent after
    one pass, and the calls for later positions would see no edges."""
    return _edge_list(edges, n) if topology == "custom" else None


def _pairing(n: int, t: int, seed: int) -> np.ndarray:
    """partner[i] for the round-t matching (partner == i means: sits out)."""
    seed = rng_seed(seed)   # not masked to 32 bits: seeds 0 and 2**32 would draw alike
    perm = np.random.default_rng([seed, int(t)]).permutation(n)
    partner = np.arange(n)
    for k in range(0, n - 1, 2):
        a, b = perm[k], perm[k + 1]
        partner[a], partner[b] = b, a
    return partner


def _undirected(topology: str, n: int, i: int, t: int, edges: Edges | None, seed: int) -> set[int]:
    if n == 1:
        return set()
    if topology == "ring":
        s = {(i - 1) % n, (i + 1) % n}
    elif topology == "grid":
        rows, cols = _grid_shape(n)
        r, c = divmod(i, cols)
        s = set()
        if c > 0:
            s.add(i - 1)
        if c + 1 < cols and i + 1 < n:
            s.add(i + 1)
        if r > 0:
            s.add(i - cols)
        if i + cols < n:
            s.add(i + cols)
    elif topology == "torus":
        rows, cols = _torus_shape(n)
        r, c = divmod(i, cols)
        s = {r * cols + (c - 1) % cols, r * cols + (c + 1) % cols,
             ((r - 1) % rows) * cols + c, ((r + 1) % rows) * cols + c}
    elif topology == "hypercube":
        s = {i ^ (1 << k) for k in range(_tau(n))}
    elif topology == "exponential":
        s = set()
        k = 1
        while k < n:
            s.add((i + k) % n)
            s.add((i - k) % n)
            k <<= 1
    elif topology == "random_pairing":
        s = {int(_pairing(n, t, seed)[i])}
    elif topology == "full":
        s = set(range(n))
    elif topology == "custom":
        s = set()
        for a, b in _edge_list(edges, n):
            if a == i:
                s.add(b)
            elif b == i:
                s.add(a)
    else:  # pragma: no cover - _check guards the names
        raise ConfigError(f"unknown topology {topology!r}")
    s.discard(i)
    return s


# --------------------------------------------------------------------- public

def receivers(topology: str, n: int, i: int, t: int = 0, *, edges: Edges | None = None,
              seed: int = 0) -> list[int]:
    """Positions peer ``i`` sends its delta to in round ``t`` (out-neighbours)."""
    n, i, t = _check(topology, n, i, t)
    if topology == "one_peer_exponential":
        j = (i + (1 << (t % _tau(n)))) % n
        return [] if j == i else [j]
    return sorted(_undirected(topology, n, i, t, edges, seed))


def all_receivers(topology: str, n: int, t: int = 0, *, edges: Edges | None = None,
                  seed: int = 0) -> list[list[int]]:
    """:func:`receivers` of every position in round ``t`` at once (random pairing draws its
    matching once, not once per peer)."""
    n, _, t = _check(topology, n, None, t)
    if topology == "random_pairing" and n > 1:
        partner = _pairing(n, t, seed)
        return [[] if partner[i] == i else [int(partner[i])] for i in range(n)]
    edges = _custom_edges(topology, edges, n)
    return [receivers(topology, n, i, t, edges=edges, seed=seed) for i in range(n)]


def senders(topology: str, n: int, i: int, t: int = 0, *, edges: Edges | None = None,
            seed: int = 0) -> list[int]:
    """Positions peer ``i`` mixes in round ``t`` (in-neighbours: ``w_ij > 0``, j ≠ i)."""
    n, i, t = _check(topology, n, i, t)
    if topology == "one_peer_exponential":
        j = (i - (1 << (t % _tau(n)))) % n
        return [] if j == i else [j]
    return sorted(_undirected(topology, n, i, t, edges, seed))


def neighbours(topology: str, n: int, i: int, t: int = 0, *, edges: Edges | None = None,
               seed: int = 0) -> list[int]:
    """Positions peer ``i`` exchanges with in round ``t`` (senders ∪ receivers), sorted.

    Never contains ``i`` and never repeats a position.

    >>> neighbours("ring", 5, 0)
    [1, 4]
    >>> neighbours("ring", 2, 0), neighbours("ring", 1, 0)
    ([1], [])
    """
    n, i, t = _check(topology, n, i, t)
    edges = _custom_edges(topology, edges, n)
    return sorted(set(senders(topology, n, i, t, edges=edges, seed=seed))
                  | set(receivers(topology, n, i, t, edges=edges, seed=seed)))


def weights(topology: str, n: int, i: int, t: int = 0, *, edges: Edges | None = None,
            seed: int = 0) -> dict[int, float]:
    """Row ``i`` of the round-``t`` mixing matrix: ``{j: w_ij}`` over senders plus ``i``.

    The values sum to 1; ``x_i ← Σ_j w_ij x_j`` is one step of exact gossip.
    """
    n, i, t = _check(topology, n, i, t)
    if topology == "one_peer_exponential":
        src = senders(topology, n, i, t)
        return {i: 0.5, src[0]: 0.5} if src else {i: 1.0}
    if topology == "full":
        return {j: 1.0 / n for j in range(n)}
    edge_list = _custom_edges(topology, edges, n)
    mine = _undirected(topology, n, i, t, edge_list, seed)
    d_i = len(mine)
    row: dict[int, float] = {}
    for j in sorted(mine):
        d_j = len(_undirected(topology, n, j, t, edge_list, seed))
        row[j] = 1.0 / (1 + max(d_i, d_j))
    row[i] = 1.0 - math.fsum(row.values())
    return row


def mixing_matrix(topology: str, n: int, t: int = 0, *, edges: Edges | None = None,
                  seed: int = 0) -> np.ndarray:
    """The n×n matrix ``W`` of round ``t`` (float64), rows from :func:`weights`.

    Doubly stochastic for every topology; symmetric for all but
    ``one_peer_exponential``.
    """
    n, _, t = _check(topology, n, None, t)
    edge_list = _custom_edges(topology, edges, n)
    w = np.zeros((n, n))
    for i in range(n):
        for j, v in weights(topology, n, i, t, edges=edge_list, seed=seed).items():
            w[i, j] = v
    return w


def period(topology: str, n: int) -> int | None:
    """Rounds after which the graph repeats: 1 for static graphs, ``ceil(log2 n)``
    for the one-peer exponential graph, ``None`` for random pairing."""
    n, _, _ = _check(topology, n)
    if topology == "one_peer_exponential":
        return _tau(n)
    if topology == "random_pairing":
        return None
    return 1


def eccentricity(topology: str, n: int, i: int, *, edges: Edges | None = None, seed: int = 0) -> int:
    """Hops from peer ``i`` to the farthest peer it can reach on the round-0 graph.

    A message that ``i`` sends to its neighbours and that each peer passes on to
    its own, one hop less each time, reaches everyone when it starts with this
    many hops (:class:`swarm.gossip.GradientRelay`).

    >>> eccentricity("ring", 5, 0), eccentricity("ring", 4, 0), eccentricity("full", 8, 3)
    (2, 2, 1)
    """
    n, i, _ = _check(topology, n, i)
    edge_list = _custom_edges(topology, edges, n)
    dist = {i: 0}
    frontier = [i]
    while frontier:
        nxt = []
        for u in frontier:
            for v in neighbours(topology, n, u, 0, edges=edge_list, seed=seed):
                if v not in dist:
                    dist[v] = dist[u] + 1
                    nxt.append(v)
        frontier = nxt
    return max(dist.values())


@dataclass(frozen=True)
class Spectrum:
    """Spectral figures of a mixing matrix.

    ``lambda2``: second largest eigenvalue (real part); ``lambda_min``: smallest;
    ``rho``: ``‖W − J/n‖₂``, the per-round contraction of the consensus error
    (for symmetric W, ``max(|λ2|, |λ_min|)``); ``gap = 1 − rho``.
    """

    lambda2: float
    lambda_min: float
    rho: float
    gap: float


def spectrum(w: np.ndarray) -> Spectrum:
    """Spectral figures of a (doubly stochastic) mixing matrix ``w``."""
    try:
        w = np.asarray(w, dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(f"mixing matrix must be numbers, got {w!r}") from None
    if w.ndim != 2 or w.shape[0] != w.shape[1] or w.shape[0] < 1:
        raise ConfigError(f"mixing matrix must be square and non-empty, got shape {w.shape}")
    if not np.isfinite(w).all():   # numpy's eigensolvers raise LinAlgError on these
        raise ConfigError("mixing matrix must be finite, got a NaN or an infinity")
    n = w.shape[0]
    if np.allclose(w, w.T, atol=1e-12):
        ev = np.sort(np.linalg.eigvalsh(w))[::-1]
    else:
        ev = np.sort(np.linalg.eigvals(w).real)[::-1]
    lam2 = float(ev[1]) if n > 1 else 0.0
    rho = float(np.linalg.norm(w - np.full((n, n), 1.0 / n), 2)) if n > 1 else 0.0
    return Spectrum(lambda2=lam2, lambda_min=float(ev[-1]), rho=rho, gap=1.0 - rho)


def rounds_to_epsilon(rho: float, eps: float = 1e-3) -> int:
    """The bound ``⌈ln(1/ε) / ln(1/ρ)⌉`` on exact-gossip rounds to reach relative
    consensus error ε, for contraction ``rho`` (0 means one round); at least 1."""
    # the float() checks: an exact Fraction inside the range may round onto its end
    if not (is_real(eps) and 0 < eps < 1 and float(eps) > 0):
        raise ConfigError(f"eps must be a number in (0, 1), got {eps!r}")
    if not (is_real(rho) and 0 <= rho < 1 and float(rho) < 1):
        raise ConfigError(f"rho must be a number in [0, 1) for gossip to converge, got {rho!r}")
    rho, eps = float(rho), float(eps)
    if rho == 0:
        return 1
    # log(rho), not -log(1/rho): 1/rho overflows to inf below ~5.6e-309 and made the bound 0
    return max(1, math.ceil(math.log(eps) / math.log(rho)))
