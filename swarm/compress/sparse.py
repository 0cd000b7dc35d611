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

from ..errors import GossipError, WireError
from ._base import Codec, Encoded, Scratch, meta_float, meta_int, meta_scale, ratio_length
from .dense import to_fp16

__all__ = ["TopK", "RandomK", "strata_indices", "pack_gaps", "unpack_gaps"]

_CHUNK = 1 << 16
_SAMPLE = 1 << 16
_MIN_SAMPLED = 1 << 17


def pack_gaps(idx: np.ndarray) -> np.ndarray:
    """Strictly increasing non-negative indices as uint8 gap codes.

    Each index is sent as its gap to the previous one (the first to -1) minus
    one, ``g >= 0``, written as ``g // 255`` bytes of 255 and then ``g % 255``.
    For top-1% the mean gap is ~100, so an index costs ~1.1 bytes instead of 4
    (a gap of 255 or more costs one byte more per 255). Example::

        >>> pack_gaps(np.array([0, 3, 300])).tolist()
        [0, 2, 255, 41]
    """
    idx = np.asarray(idx, np.int64)
    if idx.size == 0:
        return np.empty(0, np.uint8)
    g = np.empty_like(idx)
    g[0] = idx[0]
    np.subtract(idx[1:], idx[:-1], out=g[1:])
    g[1:] -= 1
    if g.max() < 255:   # every gap fits one byte (the usual case above top-0.4%)
        return g.astype(np.uint8)
    reps = g // 255 + 1
    out = np.full(int(reps.sum()), 255, np.uint8)
    out[np.cumsum(reps) - 1] = g % 255
    return out


def unpack_gaps(codes: np.ndarray, k: int, n: int, codec: str = "topk") -> np.ndarray:
    """The k int64 indices that :func:`pack_gaps` wrote, checked to lie in ``[0, n)``;
    :class:`WireError` for codes that do not hold exactly k indices."""
    if k == 0:
        if codes.size:
            raise WireError(f"{codec}: {codes.size} index bytes for k=0")
        return np.empty(0, np.int64)
    if codes[-1] == 255:
        raise WireError(f"{codec}: index codes end inside a gap (last byte 255)")
    # index_j = sum of all codes up to the end of gap j, plus one per earlier gap
    idx = np.cumsum(codes, dtype=np.int64)
    if codes.size != k or codes.max() == 255:   # some gap is 255 or longer (rare at k/n above 1/255)
        ends = np.flatnonzero(codes != 255)
        if ends.size != k:
            raise WireError(f"{codec}: index codes hold {ends.size} indices, expected k={k}")
        idx = idx[ends]
    idx += np.arange(k, dtype=np.int64)
    if int(idx[-1]) >= n:
        raise WireError(f"{codec}: indices outside [0, {n})")
    return idx


def _k(ratio: float, n: int) -> int:
    return 0 if n == 0 else min(n, max(1, int(round(ratio * n))))


class _Sparse(Codec):
    def __init__(self, spec: str | None = None, *, ratio: float, seed: int | None = None) -> None:
        super().__init__(spec)
        if not (isinstance(ratio, (int, float)) and 0.0 < ratio <= 1.0):
            # get_codec checks first with the spec in the message; this guards direct use
            from ..errors import ConfigError

            raise ConfigError(f"{self.name}: ratio must be in (0, 1], got {ratio!r}")
        #: the fraction of elements kept (the spec's RATIO); :meth:`ratio` is the
        #: compression ratio, as for every codec
        self.fraction = float(ratio)
        self._rng = np.random.default_rng(seed)
        self._scratch = Scratch()

    def k_for(self, n: int) -> int:
        """How many elements a vector of length n keeps: ``round(fraction * n)``, at least 1."""
        return _k(self.fraction, n)


class TopK(_Sparse):
    """Keep the k = round(ratio * n) largest magnitudes; send their indices and values.

    Exactly k elements; among equal magnitudes at the cut, lower indices win (on an
    accelerator too, where :func:`torch.topk` selects and the ties are then settled).
    Error: ``||y - x||^2 <= (1 - k/n) ||x||^2`` (a contraction; use ``ef+topk`` to
    keep what was cut). NaN ranks below every number (kept only if fewer than k numbers exist);
    ±Inf is selected first.
    Meta: ``{codec, n, k, ib}``; frames: ``[index codes uint8[ib], values float32[k]]``,
    the sorted indices as gap codes (:func:`pack_gaps`): ~1.1 bytes per index
    at 1%, so about 5.1 bytes per kept element instead of 8 with uint32 indices.

    ``values="fp16"`` sends the kept values as float16: ~3.1 bytes per kept
    element. The rounding (relative 2⁻¹¹) is one more error that CHOCO's x − x̂
    or ``ef+`` carries into the next round; the decoder takes either value dtype.
    When the largest kept magnitude is past 65504, the values are sent divided by
    a power of two, ``scale`` in the meta (as :class:`FP16` does,
    :func:`~swarm.compress.dense.fp16_scale`), so nothing saturates short of Inf.

    ``values="fp8"`` sends each kept value in one byte: float8 e5m2 (the upper byte
    of a float16: sign, 5 exponent and 2 mantissa bits, round to nearest even) of
    the value divided by ``scale`` (in the meta), which maps the largest magnitude
    to 2¹⁵. Relative error ≤ 2⁻³ down to 2⁻¹⁴ of the largest (coarser below, zero
    under 2⁻³²; a kept NaN raises :class:`~swarm.errors.GossipError`, as no code
    stands for it): ~2.1 bytes per kept element. Meant for gradients applied by Adam,
    whose step depends on which coordinates arrive more than on their exact size;
    error feedback (``ef+``) carries the rounding into the next message.
    """

    name = "topk"
    #: the largest kept magnitude is scaled to this float16 value (well inside e5m2's 57344)
    FP8_TOP = 32768.0

    def __init__(self, spec: str | None = None, *, ratio: float, seed: int | None = None,
                 values: str = "fp32") -> None:
        super().__init__(spec, ratio=ratio, seed=seed)
        if values not in ("fp32", "fp16", "fp8"):
            from ..errors import ConfigError

            raise ConfigError(f"{self.name}: values must be 'fp32', 'fp16' or 'fp8', got {values!r}")
        self.values = values

    def _encode(self, x: np.ndarray) -> Encoded:
        n = x.size
        k = self.k_for(n)
        idx = self.select(x, k)
        return self._payload(n, idx, x[idx])

    def ratio(self, n: int) -> float:
        """The compression ratio when the kept elements fall at random places, as the
        largest magnitudes of unstructured data do (standard normal data: within
        0.5% at n ≥ 10⁵, k ≥ 20).

        The index codes depend on where the kept elements are, from k bytes (every
        gap under 255) to ``k + (n − 1) // 255``: each gap g costs ``1 + g // 255``.
        For k places drawn at random each gap has the law of the first index,
        ``P(g ≥ m) = C(n − m, k) / C(n, k)``, so the codes take
        ``k (1 + Σ_j P(g ≥ 255 j))`` bytes on average: 1.08 per index at 1%, but
        4.4 at 0.1% (a ratio of 474 where k bytes would say 800)."""
        n = ratio_length(self.name, n)
        k = self.k_for(n)
        if k == 0:
            return 4.0 * n
        # P(g ≥ m) < e^(−km/n): terms past km/n = 50 add nothing
        m = 255.0 * np.arange(1, min((n - k) // 255, 50 * n // (255 * k) + 1) + 1)
        # Π_{i<k} (1 − m/(n − i)), to within a part in 10⁶ for the k and m that matter
        extra = k * float(np.exp(k * np.log1p(-m / (n - (k - 1) / 2))).sum())
        codes = k + min(round(extra), (n - 1) // 255)
        return 4.0 * n / (codes + {"fp32": 4, "fp16": 2, "fp8": 1}[self.values] * k)

    def _encode_sparse(self, x: np.ndarray) -> tuple[Encoded, np.ndarray, np.ndarray]:
        n = x.size
        idx = self.select(x, self.k_for(n))
        enc = self._payload(n, idx, x[idx])
        vals = enc.frames[1]   # as _check_frames and _decode turn them into float32
        if self.values == "fp16":
            vals = vals.astype(np.float32)
            if "scale" in enc.meta:
                vals *= np.float32(enc.meta["scale"])
        elif self.values == "fp8":
            vals = from_fp8(vals, float(enc.meta["scale"]), self.name)
        return enc, idx, vals

    def _payload(self, n: int, idx: np.ndarray, vals: np.ndarray) -> Encoded:
        meta = {"codec": self.name, "n": int(n), "k": int(idx.size)}
        if self.values == "fp16":
            vals, scale = to_fp16(vals)
            if scale != 1.0:
                meta["scale"] = scale
        elif self.values == "fp8":
            vals, meta["scale"] = to_fp8(vals, self.FP8_TOP, self.name)
        codes = pack_gaps(idx)
        meta["ib"] = int(codes.size)
        return Encoded(meta, [codes, vals])

    def _encode_device(self, t: Any) -> Encoded | None:
        import torch

        if not t.is_floating_point():
            return None  # the CPU path names the bad dtype
        v = t.detach().reshape(-1).float()
        if t.element_size() > 4 and bool(torch.isinf(v).sum() > torch.isinf(t).sum()):
            return None   # finite float64 past float32's range: the CPU path refuses it
        n = v.numel()
        k = self.k_for(n)
        if k == 0:
            return None
        # torch.topk is fast on accelerators; bring back only 2k numbers. It ranks NaN
        # above everything and breaks ties in no set order, so NaN gets the key -1
        # (below every magnitude) and ties at the cut are settled as on the CPU.
        key = v.abs().masked_fill_(torch.isnan(v), -1.0)
        top = torch.topk(key, k, sorted=False)
        kth = top.values.min()
        tied, kept = torch.stack(((key == kth).sum(), (top.values == kth).sum())).tolist()
        if tied == kept:   # every element at the cut is kept: no choice was made
            idx = top.indices.sort().values
        else:              # all above the cut, then the lowest-indexed ties
            above = torch.nonzero(key > kth).reshape(-1)
            ties = torch.nonzero(key == kth).reshape(-1)[:k - above.numel()]
            idx = torch.cat((above, ties)).sort().values
        vals = v[idx].cpu().numpy()
        return self._payload(n, idx.cpu().numpy(), vals)

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
        keep = v >= kth
        if np.count_nonzero(keep) == k:   # no tie at the cut (the usual case)
            return cand[keep]
        keep = v > kth
        short = k - int(np.count_nonzero(keep))
        keep[np.flatnonzero(v == kth)[:short]] = True
        return cand[keep]

    def _exact(self, x: np.ndarray, k: int) -> np.ndarray:
        v = np.abs(x)
        pos = np.flatnonzero(v > 0)
        if pos.size >= k:
            # Only nonzero magnitudes can be kept. Partitioning without the zeros is
            # also faster: numpy's partition slows down several times over many equal
            # values (106 µs against 8 for a 4,610-vector two thirds zeros, as ReLU
            # networks' gradients are).
            return self._repair_values(pos, v[pos], k)
        nan = np.isnan(v)
        if nan.any():
            # NaN ranks below every number, so it is only kept when fewer than k numbers exist
            v[nan] = -1.0
        return self._repair_values(np.arange(x.size, dtype=np.int64), v, k)

    # ---- decode -----------------------------------------------------------------------

    def _frame_specs(self, meta, n):
        k = meta_int(meta, "k", self.name, lo=0, hi=n)
        # k gaps summing to at most n - 1 take at most k + (n - 1) // 255 bytes
        ib = meta_int(meta, "ib", self.name, lo=k, hi=k + max(0, n - 1) // 255)
        return [("index codes", ("uint8",), ib), ("values", ("float32", "float16", "uint8"), k)]

    def _check_frames(self, meta, frames, n):
        # decoding the gaps is the check (count, range; increasing by construction),
        # so the decoded indices replace the codes for _decode_into
        frames[0] = unpack_gaps(frames[0], meta["k"], n, self.name)
        if frames[1].dtype == np.uint8:   # fp8 values: the decoded floats replace the codes
            frames[1] = from_fp8(frames[1], meta_float(meta, "scale", self.name), self.name)
        elif frames[1].dtype == np.float16 and "scale" in meta:   # scaled fp16 values
            frames[1] = frames[1].astype(np.float32) * np.float32(meta_scale(meta, "scale", self.name))

    def _decode(self, meta, frames, n):
        idx, vals = frames
        out = np.zeros(n, np.float32)
        out[idx] = vals   # the indices are distinct: a plain scatter, no gather-add
        return out

    def _decode_into(self, meta, frames, out, alpha):
        idx, vals = frames
        if alpha == 1.0:
            out[idx] += vals
        else:
            # dtype=float32: under numpy 1.x a float32 scalar times float16 values
            # stays float16 (Inf for 2 * 60000, 0 for 1e-8 * 1)
            out[idx] += np.multiply(vals, alpha, dtype=np.float32)


#: the smallest positive float32 (a subnormal): the least scale that is not 0 in float32
_F32_LEAST = float(np.finfo(np.float32).smallest_subnormal)


def to_fp8(vals: np.ndarray, top: float, codec: str = "topk") -> tuple[np.ndarray, float]:
    """(e5m2 codes of ``vals / scale``, scale), with the largest magnitude scaled to ``top``;
    :class:`GossipError` for a NaN, which no code that :func:`from_fp8` accepts stands for."""
    v = np.clip(vals, -3e38, 3e38)   # Inf would make the scale Inf
    amax = float(np.max(np.abs(v))) if v.size else 0.0
    if math.isnan(amax):   # top-k keeps NaN only when fewer than k numbers exist
        raise GossipError(f"{codec}: a kept value is NaN, which values=fp8 cannot send")
    # The float32 the receiver multiplies by, at least the least float32: below
    # amax = 2**-135 the quotient rounds to 0 and the codes would be Inf. It may round
    # down by up to a third, so the largest code is at most 1.5 * top, still finite.
    scale = np.float32(max(amax / top, _F32_LEAST)) if amax > 0 else np.float32(1.0)
    h = (v / scale).astype(np.float16).view(np.uint16).astype(np.uint32)
    return ((h + 0x7F + ((h >> 8) & 1)) >> 8).astype(np.uint8), float(scale)


def from_fp8(codes: np.ndarray, scale: float, codec: str) -> np.ndarray:
    """float32 values of e5m2 ``codes`` times ``scale``; WireError for an Inf or NaN code."""
    if ((codes & 0x7C) == 0x7C).any():
        raise WireError(f"{codec}: an fp8 value code is Inf or NaN")
    return (codes.astype(np.uint16) << 8).view(np.float16).astype(np.float32) * np.float32(scale)


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
