"""Sparsifying codecs: ``topk`` (largest magnitudes) and ``randomk`` (seeded strata).

Top-k never sorts the vector. It estimates the k-th largest magnitude from a
random sample, keeps the candidates at or above that threshold in one chunked
pass (``abs``, compare, ``flatnonzero`` on cache-sized pieces), and repairs the
candidate set to exactly k with a partition over the few candidates. If the
estimate was too high (fewer than k candidates), it lowers the threshold and
tries again; the answer does not depend on the sample, only the time does.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import WireError
from ._base import Codec, Encoded, Scratch, meta_int

__all__ = ["TopK", "RandomK", "strata_indices"]

_CHUNK = 1 << 16
_SAMPLE = 1 << 16
_MIN_SAMPLED = 1 << 17
_U32_MAX = (1 << 32) - 1


def _k(ratio: float, n: int) -> int:
    return 0 if n == 0 else min(n, max(1, int(round(ratio * n))))


class _Sparse(Codec):
    def __init__(self, spec: str | None = None, *, ratio: float, seed: int | None = None) -> None:
        super().__init__(spec)
        if not (isinstance(ratio, (int, float)) and 0.0 < ratio <= 1.0):
            # get_codec checks first with the spec in the message; this guards direct use
            from ..errors import ConfigError

            raise ConfigError(f"{self.name}: ratio must be in (0, 1], got {ratio!r}")
        self.ratio = float(ratio)
        self._rng = np.random.default_rng(seed)
        self._scratch = Scratch()

    def k_for(self, n: int) -> int:
        """How many elements a vector of length n keeps: ``round(ratio * n)``, at least 1."""
        return _k(self.ratio, n)


class TopK(_Sparse):
    """Keep the k = round(ratio * n) largest magnitudes; send their indices and values.

    Exactly k elements; among equal magnitudes at the cut, lower indices win.
    Error: ``||y - x||^2 <= (1 - k/n) ||x||^2`` (a contraction; use ``ef+topk`` to
    keep what was cut). NaN ranks below every number (kept only if fewer than k numbers exist);
    ±Inf is selected first.
    Meta: ``{codec, n, k}``; frames: ``[indices uint32[k] (int64 if n >= 2**32),
    values float32[k]]``, indices strictly increasing.
    """

    name = "topk"

    def _encode(self, x: np.ndarray) -> Encoded:
        n = x.size
        k = self.k_for(n)
        idx = self.select(x, k)
        itype = np.uint32 if n <= _U32_MAX else np.int64
        return Encoded({"codec": self.name, "n": int(n), "k": int(k)},
                       [idx.astype(itype, copy=False), x[idx]])

    def _encode_device(self, t: Any) -> Encoded | None:
        import torch

        if not t.is_floating_point():
            return None  # the CPU path names the bad dtype
        v = t.detach().reshape(-1).float()
        n = v.numel()
        k = self.k_for(n)
        if k == 0:
            return None
        # torch.topk is fast on accelerators; bring back only 2k numbers.
        idx = torch.topk(v.abs(), k, sorted=False).indices.sort().values
        vals = v[idx].cpu().numpy()
        itype = np.uint32 if n <= _U32_MAX else np.int64
        return Encoded({"codec": self.name, "n": int(n), "k": int(k)},
                       [idx.cpu().numpy().astype(itype), vals])

    # ---- selection ------------------------------------------------------------------------

    def select(self, x: np.ndarray, k: int) -> np.ndarray:
        """Sorted int64 indices of the k largest ``|x|`` (see the class doc for ties)."""
        n = x.size
        if k <= 0:
            return np.empty(0, np.int64)
        if k >= n:
            return np.arange(n, dtype=np.int64)
        if n < _MIN_SAMPLED or k > n // 16:
            return self._exact(x, k)
        # ~1.5% of the vector, so that drawing and partitioning the sample stays
        # small next to the pass over x
        m = min(_SAMPLE, max(_SAMPLE // 8, n // 64))
        sample = np.abs(x[self._rng.integers(0, n, m)])
        expect = m * k / n
        # Aim a few standard deviations above the expected count so that one pass
        # almost always yields >= k candidates, yet only ~k(1 + 4/sqrt(expect)) of them.
        r = int(math.ceil(expect + 4.0 * math.sqrt(expect) + 8))
        while r < m:
            thr = np.partition(sample, m - r)[m - r]
            if not thr > 0:  # zeros or NaN at the cut: no cheap threshold exists
                break
            cand = self._candidates(x, thr)
            if cand.size >= k:
                return self._repair(x, cand, k)
            r *= 4
        return self._exact(x, k)

    def _candidates(self, x: np.ndarray, thr: np.floating) -> np.ndarray:
        n = x.size
        A = self._scratch.get("a", min(n, _CHUNK), np.float32)
        M = self._scratch.get("m", min(n, _CHUNK), np.bool_)
        parts = []
        for a in range(0, n, _CHUNK):
            m = min(n, a + _CHUNK) - a
            np.abs(x[a:a + m], out=A[:m])
            np.greater_equal(A[:m], thr, out=M[:m])
            nz = np.flatnonzero(M[:m])
            if nz.size:
                parts.append(nz + a if a else nz)
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    @classmethod
    def _repair(cls, x: np.ndarray, cand: np.ndarray, k: int) -> np.ndarray:
        """The k largest of the (sorted, NaN-free) candidates, lowest index first on ties."""
        if cand.size == k:
            return cand
        return cls._repair_values(cand, np.abs(x[cand]), k)

    @staticmethod
    def _repair_values(cand: np.ndarray, v: np.ndarray, k: int) -> np.ndarray:
        c = cand.size
        kth = np.partition(v, c - k)[c - k]
        keep = v > kth
        short = k - int(np.count_nonzero(keep))
        keep[np.flatnonzero(v == kth)[:short]] = True
        return cand[keep]

    def _exact(self, x: np.ndarray, k: int) -> np.ndarray:
        v = np.abs(x)
        nan = np.isnan(v)
        if nan.any():
            # NaN ranks below every number, so it is only kept when fewer than k numbers exist
            v[nan] = -1.0
        return self._repair_values(np.arange(x.size, dtype=np.int64), v, k)

    # ---- decode -----------------------------------------------------------------------

    def _frame_specs(self, meta, n):
        k = meta_int(meta, "k", self.name, lo=0, hi=n)
        return [("indices", ("uint32", "int64"), k), ("values", ("float32",), k)]

    def _check_frames(self, meta, frames, n):
        idx = frames[0]
        if idx.size:
            if int(idx[0]) < 0 or int(idx[-1]) >= n:
                raise WireError(f"{self.name}: indices outside [0, {n})")
            if idx.size > 1 and not (idx[1:] > idx[:-1]).all():
                raise WireError(f"{self.name}: indices are not strictly increasing")

    def _decode_into(self, meta, frames, out, alpha):
        idx, vals = frames
        if alpha == 1.0:
            out[idx] += vals
        else:
            out[idx] += np.float32(alpha) * vals


def strata_indices(n: int, k: int, seed: int) -> np.ndarray:
    """k sorted, distinct indices in [0, n): one uniform pick in each of k equal strata.

    Built from PCG64's raw output with integer arithmetic only, so a sender and a
    receiver on any platform and numpy version derive the same indices from ``seed``.
    """
    if k == 0:
        return np.empty(0, np.int64)
    bounds = (np.arange(k + 1, dtype=np.int64) * n) // k
    width = np.diff(bounds).astype(np.uint64)
    raw = np.random.PCG64(seed).random_raw(k)
    # Lemire's multiply-shift: (r32 * w) >> 32 is uniform enough in [0, w) for w << 2**32
    off = ((raw >> np.uint64(32)) * width) >> np.uint64(32)
    return bounds[:-1] + off.astype(np.int64)


class RandomK(_Sparse):
    """Keep k = round(ratio * n) elements at seeded positions; send values and a seed.

    The vector is cut into k near-equal strata and one element of each is kept,
    so every element is kept with probability ~k/n and no index travels: the
    receiver regenerates them from ``meta["seed"]`` (see :func:`strata_indices`).
    Unscaled, hence a contraction (``E||y - x||^2 <= (1 - k/n)||x||^2``) rather than
    unbiased; use it with ``ef+`` or CHOCO. Meta: ``{codec, n, k, seed}``;
    frames: ``[values float32[k]]``.
    """

    name = "randomk"

    def _encode(self, x: np.ndarray) -> Encoded:
        n = x.size
        k = self.k_for(n)
        seed = int(self._rng.integers(0, 1 << 63))
        idx = strata_indices(n, k, seed)
        return Encoded({"codec": self.name, "n": int(n), "k": int(k), "seed": seed}, [x[idx]])

    def _frame_specs(self, meta, n):
        k = meta_int(meta, "k", self.name, lo=0, hi=n)
        meta_int(meta, "seed", self.name, lo=0, hi=(1 << 64) - 1)
        return [("values", ("float32",), k)]

    def _decode_into(self, meta, frames, out, alpha):
        idx = strata_indices(out.size, meta["k"], meta["seed"])
        if alpha == 1.0:
            out[idx] += frames[0]
        else:
            out[idx] += np.float32(alpha) * frames[0]
