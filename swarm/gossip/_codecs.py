"""Codec lookup for the engine (one instance per stream; see :mod:`swarm.compress`)."""

from __future__ import annotations

import math
from typing import Any

from ..checks import is_real
from ..compress import Encoded, get_codec, split_ef
from ..errors import ConfigError
from .topology import TIME_VARYING, TOPOLOGIES

__all__ = ["Encoded", "make_codec", "suggested_gamma", "outer_step_limit", "copy_scale"]


def make_codec(spec: str) -> Any:
    """A fresh codec instance for one stream (codecs may carry state, e.g. error feedback)."""
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"codec must be a non-empty string such as 'identity' or 'topk:0.01', got {spec!r}")
    # CHOCO's public copy already is error feedback: x − x̂ carries everything the
    # codec dropped into the next round. Wrapping the codec in ErrorFeedback as
    # well feeds the same residual back twice and diverges (8-ring, ef+topk:0.1,
    # γ = 0.1: consensus error ×345 after 40 rounds, while topk:0.1 shrinks it),
    # so "ef+X" means X here.
    ef, inner = split_ef(spec)
    if ef:
        get_codec(spec)  # still reject a bad spec by its full name
    return get_codec(inner)


def copy_scale(meta: Any) -> float:
    """The factor CHOCO applies to a decoded delta before adding it to a public copy.

    CHOCO needs a contraction, ``E‖C(v) − v‖² ≤ (1 − δ)‖v‖²`` with δ > 0. QSGD is
    unbiased with variance ``ω‖v‖²``, ``ω = min(B/(4s²), √B/s)`` per bucket of B
    (stochastic rounding moves an element by at most norm/s with variance at most
    a quarter of that squared); for ω ≥ 1 it is no contraction, and the copies
    x̂ += Q(x − x̂) grow without bound whatever γ is (qsgd:8 with buckets of 512,
    ω = 2: Inf within 100 rounds on an 8-ring). Scaled by 1/(1 + ω) it is one with
    δ = 1/(1 + ω) (Koloskova et al. 2019, the "rescaled" QSGD). Read from the
    payload's meta, so both ends of a stream scale alike; 1 for every other payload.

    B is ``min(block, n)`` (as :meth:`~swarm.compress.QSGD.omega` has it): the
    bound holds bucket by bucket and grows with the bucket's length, and no bucket
    is longer than the vector, so a vector shorter than ``block`` is one bucket of
    n with the smaller ω of n. Without ``n`` in the meta, ``block``: never smaller.

    >>> copy_scale({"codec": "qsgd", "levels": 8, "block": 512, "n": 10_000})
    0.3333333333333333
    >>> copy_scale({"codec": "qsgd", "levels": 8, "block": 512, "n": 200})   # ω = 0.78
    1.0
    """
    if meta.get("codec") != "qsgd":
        return 1.0
    s, b, n = meta.get("levels"), meta.get("block"), meta.get("n")
    if not (isinstance(s, int) and isinstance(b, int) and s > 0 and b > 0):
        return 1.0   # the codec's own checks refuse such a payload
    if isinstance(n, int) and not isinstance(n, bool) and 0 < n < b:
        b = n
    omega = min(b / (4.0 * s * s), math.sqrt(b) / s)
    return 1.0 / (1.0 + omega) if omega >= 1.0 else 1.0


#: a step this many times :func:`suggested_gamma` is where CHOCO gossip is expected to
#: diverge rather than average (the engine warns; `swarm run` warns before it starts)
DIVERGES_ABOVE = 2.0


def suggested_gamma(spec: str, outer_lr: float = 1.0, outer_momentum: float = 0.0,
                    topology: str | None = None) -> float:
    """A consensus step γ that is stable for codec ``spec`` under CHOCO gossip.

    Measured on rings of 6–16 peers (scripts/bench_gossip.py sweeps it): a
    sparsifier keeping a fraction r is stable up to about γ ≈ 2.5 r and diverges
    above (top-1%: 0.02 converges, 0.03 diverges; top-10%: 0.2 converges, 0.3
    diverges), so it gets 2 r; random-k, whose picks ignore magnitude, r; scaled
    sign (one scale per 256) does best at 1 (0.8 converges slower and levels off
    near 1e-3 at d = 1e5); quantizers 0.6, less for a QSGD so coarse that CHOCO
    rescales it (:func:`copy_scale`): 1.5 times its contraction; dense codecs are
    exact at 1.

    In the engine's ``pseudo_gradient`` mode (``outer_lr``, ``outer_momentum``), the
    outer Nesterov step carries x about lr/(1 − μ) times as far as the mix moved it (7×
    at 0.7 and 0.9), so a lossy codec's step is that much smaller: at the suggested γ
    itself an 8-ring's consensus error grew 1e4× in 600 rounds with top-10% and 1e18×
    with qsgd:4, and falls steadily at the smaller one. Sign diverged there even so
    (0.14), and levels off near 4e-3 at 0.02. Every codec, dense ones too, also gets at
    most half the step where the outer step itself diverges (:func:`outer_step_limit`).
    On the time-varying graphs (``topology``: one-peer exponential, random pairing) a
    dense codec's step is (1 − μ)/lr as well, and a sparsifier's or sign's a third of
    the lossy one: each per-edge stream moves only every few rounds, and top-10% at
    0.0286 drove 4 and 8 peers apart (×3.4 per 200 rounds), while a third converged on
    4–32 peers.

    >>> suggested_gamma("ef+topk:0.01")
    0.02
    >>> round(suggested_gamma("ef+topk:0.1", outer_lr=0.7, outer_momentum=0.9), 4)
    0.0286
    >>> round(suggested_gamma("identity", outer_lr=0.7, outer_momentum=0.9, topology="ring"), 3)
    0.727
    """
    codec = make_codec(spec)  # a bad spec fails here, by its full name
    # checked as Gossip checks them: 0 divided by zero, NaN came out as γ = 1 (min(1, nan))
    if not (is_real(outer_lr) and math.isfinite(outer_lr) and outer_lr > 0):
        raise ConfigError(f"outer_lr must be a finite number > 0, got {outer_lr!r}")
    if not (is_real(outer_momentum) and 0 <= outer_momentum < 1):
        raise ConfigError(f"outer_momentum must be a number in [0, 1), got {outer_momentum!r}")
    outer_lr, outer_momentum = float(outer_lr), float(outer_momentum)
    if topology is not None and topology not in TOPOLOGIES:   # a misspelt time-varying graph got ~3x the step
        raise ConfigError(f"unknown topology {topology!r}; choose one of {', '.join(TOPOLOGIES)}")
    base = _codec_gamma(codec)
    if (outer_lr, outer_momentum) == (1.0, 0.0):
        return base
    dense = codec.name in ("identity", "fp16")
    if codec.name == "sign":
        base = 0.15
    if topology in TIME_VARYING:
        # the outer step's stable range shrinks with the swarm there (identity, μ = 0.9:
        # lr·γ < 0.83 for 8 peers, 0.23 for 64), so dense codecs take the lossy rule too
        gamma = base * (1.0 - outer_momentum) / outer_lr
        if codec.name in ("topk", "randomk", "sign"):
            gamma /= 3.0
    else:
        gamma = math.inf if dense else base * (1.0 - outer_momentum) / outer_lr
    return min(1.0, gamma, outer_step_limit(outer_lr, outer_momentum, topology) / DIVERGES_ABOVE)


#: the largest eigenvalue of I − W (its modulus, per round, on the time-varying graphs),
#: at most, by topology. Gershgorin: a peer of degree D gives its neighbours D/(1 + D) at
#: most, so 2D/(1 + D): 4/3 on a ring, 8/5 on a torus or grid; 2 bounds the others.
_LAMBDA_MAX = {"full": 1.0, "ring": 4.0 / 3.0, "torus": 1.6, "grid": 1.6,
               "one_peer_exponential": 1.0, "random_pairing": 1.0}


def outer_step_limit(outer_lr: float, outer_momentum: float, topology: str | None = None) -> float:
    """The γ above which ``pseudo_gradient`` mode's outer step diverges with exact gossip.

    With identity, the outer step is Nesterov on the quadratic ``γ aᵀ(I − W)a`` of the
    anchor a, with step lr and momentum μ: stable iff ``lr·γ·λ < 2(1 + μ)/(1 + 2μ)`` for
    each eigenvalue λ of I − W (4/3 at most on a ring, 1 on a full graph, 8/5 on a torus
    or grid, 2 on any other; per round on the time-varying graphs, whose products are tighter still: see
    :func:`suggested_gamma`). A 4-ring at lr 1.1 and μ 0.9 with γ = 1 reached 1e37.

    >>> round(outer_step_limit(1.1, 0.9, "ring"), 3)
    0.925
    """
    lam = _LAMBDA_MAX.get(topology, 2.0) if topology is not None else 2.0
    return 2.0 * (1.0 + outer_momentum) / ((1.0 + 2.0 * outer_momentum) * outer_lr * lam)


def _codec_gamma(codec: Any) -> float:
    """:func:`suggested_gamma` of plain averaging (no outer step)."""
    name = codec.name
    if name == "topk":
        return min(1.0, 2.0 * codec.fraction)
    if name == "randomk":
        return min(1.0, codec.fraction)
    if name == "qsgd":
        # a rescaled QSGD (copy_scale) contracts by δ = its scale; 1.5 δ converged on
        # 8- and 16-rings and a 4×4 torus for 1, 2 and 4 levels (2 δ diverged at 2)
        delta = copy_scale({"codec": name, "levels": codec.levels, "block": codec.block})
        return min(0.6, 1.5 * delta)
    if name == "int8":
        return 0.6
    if name == "sign":
        return 1.0
    return 1.0
