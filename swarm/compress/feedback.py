"""Error feedback: carry what a codec dropped into the next round.

``encode(x)`` compresses ``p = x + e`` and keeps ``e' = p - decode(encode(p))``, so
over any number of rounds ``sum(decoded) + e == sum(inputs)`` (up to float32
rounding). This turns biased contractions (top-k, random-k, sign) into codecs
whose error does not accumulate (Stich et al. 2018; Karimireddy et al. 2019).
The residual stays bounded only when the codec is a contraction,
``E||C(p) - p||^2 < ||p||^2``; a coarse QSGD is not one, so it is sent scaled
(:meth:`Codec._encode_contracting`, :meth:`QSGD._encode_contracting`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import GossipError
from ._base import Codec, Encoded, as_vector, scatter

__all__ = ["ErrorFeedback"]


class ErrorFeedback(Codec):
    """Wrap ``inner`` and carry its residual between calls (one instance per stream).

    The wire format is the inner codec's (``meta["codec"]`` names the inner family),
    so a receiver decodes with a plain ``get_codec(inner_spec)``. The residual's
    length is fixed by the first ``encode``; a vector of another length raises
    :class:`~swarm.errors.GossipError` and leaves the residual unchanged, as does
    any error the inner codec raises. Non-finite input that the inner codec does not
    reject (topk, randomk, fp16, identity) would stay in the residual: call
    :meth:`reset` after such a round, or check deltas first, as gossip does.

    The residual stays bounded for every inner codec: a QSGD with ``omega >= 1``
    sends its output scaled by ``1 / (1 + omega)``, inside its payload, so the
    receiver's plain decoder applies the scale and nothing is scaled twice. It stays
    finite for finite input too: where ``x + residual`` passes float32's largest
    value, that sum saturates to ``±3.4028235e38`` (the excess, which float32 cannot
    hold, is dropped) instead of becoming Inf for ever.

    Example::

        ef = ErrorFeedback(get_codec("topk:0.01"))
        enc = ef.encode(delta)      # send enc; ef.residual keeps the rest
    """

    def __init__(self, inner: Codec, spec: str | None = None) -> None:
        if not isinstance(inner, Codec) or isinstance(inner, ErrorFeedback):
            raise GossipError(f"ErrorFeedback wraps a plain codec, got {inner!r}")
        super().__init__(spec or f"ef+{inner.spec}")
        self.inner = inner
        self.name = inner.name  # decodes the inner family's payloads
        self._e: np.ndarray | None = None
        self._spare: np.ndarray | None = None

    @property
    def residual(self) -> np.ndarray | None:
        """A copy of the carried residual (None before the first encode).

        A copy because encode alternates between two buffers: a view kept across
        calls would silently show an older residual. It costs one pass over the
        vector, so read it for checks and logs, not once per element.
        """
        return None if self._e is None else self._e.copy()

    def reset(self) -> None:
        """Forget the residual (e.g. after the model was reloaded or resized)."""
        self._e = None
        self._spare = None

    def encode(self, x: Any) -> Encoded:
        """Compress ``x + residual`` with the inner codec; keep what it dropped."""
        p, e, enc, _ = self._start(x)
        self.inner.decode_into(enc, p, -1.0)
        self._e, self._spare = p, e
        return enc

    def encode_decoded(self, x: Any) -> tuple[Encoded, np.ndarray]:
        """:meth:`encode`, and the decoded vector: decoded once, for both the caller and
        the residual (``p - decoded``: the same floats as :meth:`encode` keeps)."""
        p, e, enc, sparse = self._start(x, sparse=True)
        if sparse is None:
            dec = self.inner.decode(enc, p.size)
            np.subtract(p, dec, out=p)
        else:   # p - decoded differs from p only at the kept coordinates
            idx, vals = sparse
            dec = scatter(p.size, idx, vals)
            p[idx] -= vals
        self._e, self._spare = p, e
        return enc, dec

    def _start(self, x: Any, sparse: bool = False
               ) -> tuple[np.ndarray, np.ndarray, Encoded, tuple[np.ndarray, np.ndarray] | None]:
        """``p = x + e`` (in the spare buffer), the residual ``e`` itself, and the inner
        codec's encoding of ``p``; with ``sparse``, also its kept indices and decoded
        values where the inner codec gives them (:meth:`Codec._encode_sparse`), else None.
        The caller keeps ``p`` (less what was sent) as the residual and ``e`` as the spare."""
        v = as_vector(x)
        n = v.size
        # p goes into the spare buffer so that an error in the inner codec leaves e intact;
        # on the first call both are new, and become state only when the caller keeps them
        if self._e is None:
            e, p = np.zeros(n, np.float32), np.empty(n, np.float32)
        elif self._e.size != n:
            raise GossipError(f"ErrorFeedback({self.inner.spec}): vector of length {n}, but the "
                              f"residual has length {self._e.size}; call reset() after resizing")
        else:
            e, p = self._e, self._spare
        try:
            with np.errstate(over="raise"):   # the flag is set anyway: no extra pass
                np.add(v, e, out=p)
        except FloatingPointError:
            _add_saturating(v, e, p)
        q = p.copy() if self.inner.aliases_input else p
        if sparse:
            got = self.inner._encode_sparse(q)
            if got is not None:
                return p, e, got[0], (got[1], got[2])
        return p, e, self.inner._encode_contracting(q), None

    def decode(self, enc: Encoded, n: int | None = None) -> np.ndarray:
        """Decode with the inner codec (the residual is a sender-side matter)."""
        return self.inner.decode(enc, n)

    def decode_into(self, enc: Encoded, out: np.ndarray, alpha: float = 1.0) -> np.ndarray:
        """Add ``alpha * decode(enc)`` to ``out`` with the inner codec."""
        return self.inner.decode_into(enc, out, alpha)

    def ratio(self, n: int) -> float:
        """The inner codec's compression ratio (without touching the residual)."""
        return self.inner.ratio(n)


def _add_saturating(v: np.ndarray, e: np.ndarray, out: np.ndarray) -> None:
    """``out = v + e``, with sums of finite values that pass float32's range set to
    ``±max`` rather than ±Inf (Inf or NaN in ``v`` or ``e`` itself stays)."""
    with np.errstate(over="ignore"):
        np.add(v, e, out=out)
    over = np.isinf(out) & np.isfinite(v) & np.isfinite(e)
    out[over] = np.copysign(np.finfo(np.float32).max, out[over])
