"""Quantizing codecs: ``int8`` (per-block scales), ``qsgd`` (s levels, unbiased), ``sign``.

int8 and qsgd share one kernel: split the vector into blocks of ``B`` elements,
give each block a multiplier ``m``, and send ``q = round(x / m)`` as small integers
in ``[-L, L]``. They differ in ``m``: int8 uses the block's max-abs over 127, QSGD
the block's L2 norm over ``s``. Stochastic rounding (``floor(v + u)`` with ``u``
uniform on [0, 1)) makes the result unbiased. Work runs over chunks of rows so the
float temporaries stay in cache and no full-size scratch is needed.

float32 holds ``v + u`` exactly only while ``|v| < 256`` (24 bits, 16 of them for
``u``). From 256 levels up, ``v + u`` would round, up to ``L + 1`` when ``v = L``
(an int16 of 32768 wraps to -32768), so those levels round as ``floor(v) +
(u < frac(v))``, with ``frac(v)`` exact, and ``v`` is ``x / m``, one division
against the multiplier sent (:meth:`_BlockQuantizer._fine_levels`); the multiplier
is rounded down where ``L * mult`` would pass float32's largest value, so decoded
values stay finite.

Below 256 levels ``v`` is ``x * inv``, with ``inv`` rounded down so that no ``|v|``
passes ``L``: an element at its block's ``amax`` (int8's largest, a qsgd bucket's
only nonzero) can sit an ulp (at most 2**-16) under ``L``, and then gets ``L - 1``
when ``u`` is 0, once in 2**16. That is the 16-bit dither's bias of at most 2**-16
of a level, as for any other element; setting those elements to ``L`` (as
:meth:`_BlockQuantizer._fine_levels` does from 256 up) cost ~14% of ``qsgd:16``'s
encode time and ~29% of ``int8:stochastic``'s, so it is not done.

Non-finite input: these codecs compute a scale per block, which turns NaN/Inf
into a non-finite scale at no extra cost; encode then raises
:class:`~swarm.errors.GossipError` instead of sending garbage.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import ConfigError, GossipError, WireError
from ._base import Codec, Encoded, Scratch, meta_float, meta_int

__all__ = ["Int8", "QSGD", "Sign"]

# Elements per chunk in the chunked kernels: 256 KiB of float32, cache-sized.
_CHUNK = 1 << 16
_U16 = np.float32(2.0 ** -16)
_TINY = np.float32(2.0 ** -100)


def _rng(seed: int | None) -> np.random.Generator:
    return np.random.default_rng(seed)


def _check_int(codec: str, key: str, v: Any, lo: int, hi: int) -> None:
    """:class:`ConfigError` unless ``v`` is an int in ``[lo, hi]``."""
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ConfigError(f"{codec}: {key} must be an integer in [{lo}, {hi}], got {v!r}")


class _BlockQuantizer(Codec):
    """Shared kernel of int8 and qsgd. Meta: ``{codec, n, block, levels}``;
    frames: ``[q int8|int16 [n], mult float32 [ceil(n/block)]]``, ``y = q * mult[block]``.
    """

    levels: int
    block: int
    stochastic: bool

    def __init__(self, spec: str | None, levels: int, block: int, stochastic: bool,
                 seed: int | None) -> None:
        super().__init__(spec)
        self.levels, self.block, self.stochastic = levels, block, stochastic
        self.qdtype = np.int8 if levels <= 127 else np.int16
        self._rng = _rng(seed)
        self._scratch = Scratch()

    def _block_scale(self, X: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        """The per-row quantity that maps to ``levels`` (max-abs or L2 norm)."""
        raise NotImplementedError

    def _encode(self, x: np.ndarray) -> Encoded:
        n, B, L = x.size, self.block, self.levels
        nb = -(-n // B)
        q = np.empty(n, self.qdtype)
        mult = np.empty(nb, np.float32)
        rows = max(1, _CHUNK // B)
        step = rows * B
        for a in range(0, n, step):
            b = min(n, a + step)
            full = (b - a) // B * B
            if full:
                self._quantize(x[a:a + full].reshape(-1, B), q[a:a + full].reshape(-1, B),
                               mult[a // B:(a + full) // B])
            if a + full < b:  # the short last block
                self._quantize(x[a + full:b].reshape(1, -1), q[a + full:b].reshape(1, -1),
                               mult[nb - 1:nb])
        if not np.isfinite(mult).all():
            bad = int(np.flatnonzero(~np.isfinite(mult))[0])
            lo, hi = bad * B, min(n, (bad + 1) * B)
            if np.isfinite(x[lo:hi]).all():   # finite values whose L2 norm passes float32
                norm = float(np.linalg.norm(x[lo:hi].astype(np.float64)))
                raise GossipError(
                    f"{self.name}: the L2 norm of elements [{lo}, {hi}) is {norm:.4g}, past "
                    f"float32's largest value (3.4028e+38), so no block multiplier can "
                    f"represent it; scale the input down")
            raise GossipError(f"{self.name}: input has NaN or Inf in elements [{lo}, {hi})")
        meta = {"codec": self.name, "n": int(n), "block": int(B), "levels": int(L)}
        return Encoded(meta, [q, mult])

    def _quantize(self, X: np.ndarray, Q: np.ndarray, mult: np.ndarray) -> None:
        L = np.float32(self.levels)
        amax = self._block_scale(X)
        # Blocks below 2**-100 flush to zero: their multiplier would be subnormal and
        # lose the precision the error bound needs (NaN compares False and survives).
        amax[amax < _TINY] = 0
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            np.divide(amax, L, out=mult)
            # Rounded to nearest, L * mult can pass float32's largest value when amax is
            # within an ulp of it: decoded values would be Inf. Round those down.
            over = ~np.isfinite(mult * L) & np.isfinite(mult)
            while over.any():
                mult[over] = np.nextafter(mult[over], np.float32(0))
                over = ~np.isfinite(mult * L) & np.isfinite(mult)
            S = self._scratch.get("s", X.size, np.float32).reshape(X.shape)
            if self.levels < 256:
                inv = np.where(amax > 0, L / amax, np.float32(0)).astype(np.float32)
                # Round inv down until amax * inv <= L in float32, so that no element
                # can land outside [-L, L] (and an int8 never wraps to -128).
                over = amax * inv > L
                while over.any():
                    inv[over] = np.nextafter(inv[over], np.float32(0))
                    over = amax * inv > L
                np.multiply(X, inv[:, None], out=S)
            else:
                self._fine_levels(X, amax, mult, S)
        if not self.stochastic:
            np.rint(S, out=S)
        else:
            U = self._scratch.get("u", X.size, np.float32).reshape(X.shape)
            raw = self._rng.bit_generator.random_raw(-(-X.size // 4)).view(np.uint16)[:X.size]
            np.multiply(raw.reshape(X.shape), _U16, out=U, dtype=np.float32)
            if self.levels < 256:   # |S| + U < 256: the float32 sum is exact
                S += U
                np.floor(S, out=S)
            else:                   # floor(S) + (U < frac(S)): S - floor(S) is exact
                F = self._scratch.get("f", X.size, np.float32).reshape(X.shape)
                M = self._scratch.get("m", X.size, np.bool_).reshape(X.shape)
                np.floor(S, out=F)
                np.subtract(S, F, out=S)
                np.less(U, S, out=M)
                np.add(F, M, out=S)
                # |S| <= L up to an ulp (x / mult <= amax / mult); the clip keeps an int16
                # from wrapping
                np.clip(S, -L, L, out=S)
        with np.errstate(invalid="ignore"):
            np.copyto(Q, S, casting="unsafe")

    def _fine_levels(self, X: np.ndarray, amax: np.ndarray, mult: np.ndarray, S: np.ndarray) -> None:
        """``S = X / mult`` per row, rounded once, and exactly ``±L`` where ``|x|`` is the
        row's ``amax``: the levels from 256 up.

        ``X * inv`` rounds twice, and ``inv`` is not ``1 / mult``: up to ``L * 2**-23``
        of a level off (0.004 at 32767), enough now and then to round an element to a
        level beyond the two around ``x / mult``, ``|q * mult - x| > mult``. Rounded once,
        ``S`` stays between those two, so ``|q * mult - x| < mult``.
        """
        L = np.float32(self.levels)
        # inf for a zero multiplier (a flushed block): levels 0, not 0 / 0
        div = np.where(mult > 0, mult, np.float32(np.inf))
        np.divide(X, div[:, None], out=S)
        # An element that carries its bucket's whole norm gets amax / mult, within an ulp
        # of L either side; below L it would now and then go to L - 1. Only rows where
        # that quotient is below L can hold one to set (NaN compares False). mult stays
        # as rounded: one step down would cost a whole element its exact decode.
        low = np.flatnonzero((amax / div < L) & (amax > 0))
        if low.size:
            hit = np.abs(np.take(X, low, axis=0)) >= amax[low, None]
            if hit.any():
                r, c = np.nonzero(hit)
                r = low[r]
                S[r, c] = np.copysign(L, X[r, c])

    # ---- decode -------------------------------------------------------------------------

    def _frame_specs(self, meta, n):
        B = meta_int(meta, "block", self.name, lo=1, hi=1 << 24)
        L = meta_int(meta, "levels", self.name, lo=1, hi=32767)
        qd = "int8" if L <= 127 else "int16"
        return [("q", (qd,), n), ("mult", ("float32",), -(-n // B))]

    def _check_frames(self, meta, frames, n):
        q, mult = frames
        L = meta["levels"]
        if mult.size and not (np.isfinite(mult).all() and mult.min() >= 0):
            raise WireError(f"{self.name}: block multipliers must be finite and >= 0")
        if q.size and (int(q.min()) < -L or int(q.max()) > L):
            raise WireError(f"{self.name}: quantized values outside [-{L}, {L}]")

    def _decode(self, meta, frames, n):
        out = np.empty(n, np.float32)
        q, mult = frames
        # numpy casts integers to float32 at memory speed (torch only helps float16),
        # and importing torch for it would cost ~0.8 s and ~180 MB
        np.copyto(out, q, casting="unsafe")
        B = meta["block"]
        full = n // B * B
        if full:
            out[:full].reshape(-1, B).__imul__(mult[:full // B, None])
        if full < n:
            out[full:] *= mult[-1]
        return out

    def _decode_into(self, meta, frames, out, alpha):
        q, mult = frames
        B = meta["block"]
        a32 = np.float32(alpha)
        with np.errstate(over="ignore"):
            m = mult * a32
        # alpha folded into a multiplier can pass float32's range where q * mult * alpha
        # does not (q = 0 would give 0 * Inf = NaN): then apply the two apart
        post = None
        if not np.isfinite(m).all():
            m, post = mult, a32
        n = out.size
        step = max(1, _CHUNK // B) * B
        for a in range(0, n, step):
            b = min(n, a + step)
            full = (b - a) // B * B
            S = self._scratch.get("d", b - a, np.float32)
            if full:
                np.multiply(q[a:a + full].reshape(-1, B), m[a // B:(a + full) // B, None],
                            out=S[:full].reshape(-1, B), dtype=np.float32)
            if a + full < b:
                np.multiply(q[a + full:b], m[-1], out=S[full:], dtype=np.float32)
            if post is not None:
                S *= post
            out[a:b] += S


class Int8(_BlockQuantizer):
    """8-bit integers with one float32 scale per block of ``block`` elements.

    ``q = round(x * 127 / max|x_block|)``; deterministic rounding bounds the error
    by ``max|x_block| / 254`` per element, stochastic rounding (unbiased, to
    2**-16 of a level) by ``max|x_block| / 127``. A block whose max-abs is below
    2**-100 decodes to zeros (absolute error < 2**-100). Bytes: ``n + 4 * ceil(n / block)``.
    """

    name = "int8"

    def __init__(self, spec: str | None = None, *, block: int = 256, stochastic: bool = False,
                 seed: int | None = None) -> None:
        # get_codec checks first with the spec in the message; this guards direct use
        _check_int("int8", "block", block, 1, 1 << 24)
        super().__init__(spec, 127, block, stochastic, seed)

    def _block_scale(self, X):
        # max and min per row read X twice but write nothing; cheaper than abs().max()
        return np.maximum(X.max(axis=1), -X.min(axis=1))


class QSGD(_BlockQuantizer):
    """QSGD (Alistarh et al. 2017): ``s`` levels of each bucket's L2 norm, unbiased.

    ``y = norm * sign(x) * xi / s`` with ``xi`` the stochastic rounding of
    ``|x| * s / norm``; ``E[y] = x`` (to 2**-16 of a level: the dither has 16 bits),
    ``|y - x| < norm_bucket / s`` per element and
    ``E||y - x||^2 <= omega * ||x||^2`` per bucket of ``B`` (:meth:`omega`).
    An element that carries its bucket's whole norm gets exactly ``s`` from 256
    levels up; below, where float32 puts it an ulp under ``s`` (10-28% of such
    buckets, by ``s``), it gets ``s - 1`` once in 2**16 (see the module's docstring).
    Levels travel as int8 for ``s <= 127``, int16 above. A bucket whose norm is
    below 2**-100 decodes to zeros; one of finite values whose norm passes float32's
    largest value (~3.4e38) raises :class:`~swarm.errors.GossipError` saying so.

    Under error feedback (``ef+qsgd``) a QSGD with ``omega >= 1`` (``qsgd:11`` and
    coarser with buckets of 512) sends ``y / (1 + omega)`` instead, scaled in its
    multipliers, so receivers need nothing to decode it (:meth:`_encode_contracting`).
    """

    name = "qsgd"

    def __init__(self, spec: str | None = None, *, s: int = 16, bucket: int = 512,
                 seed: int | None = None) -> None:
        # levels travel as int16 and decoders refuse blocks past 2**24 (as get_codec checks)
        _check_int("qsgd", "s", s, 1, 32767)
        _check_int("qsgd", "bucket", bucket, 1, 1 << 24)
        super().__init__(spec, s, bucket, True, seed)

    def omega(self, n: int) -> float:
        """The variance factor for a vector of length n: ``E||y - x||^2 <= omega ||x||^2``,
        ``omega = min(B / (4 s^2), sqrt(B) / s)`` with ``B = min(bucket, n)``: rounding an
        element that sits ``v`` levels up has variance at most ``min(1/4, v)`` levels
        squared, and the ``v`` of a bucket sum to at most ``sqrt(B) s``.

        >>> QSGD(s=8).omega(10_000)
        2.0
        """
        B, s = min(self.block, n), self.levels
        return min(B / (4.0 * s * s), math.sqrt(B) / s)

    def _encode_contracting(self, x: np.ndarray) -> Encoded:
        """``encode(x)``, scaled by ``1 / (1 + omega)`` when ``omega >= 1``.

        Unbiased with ``omega >= 1`` is no contraction, and error feedback's residual
        grows without bound with it (``ef+qsgd:8`` on standard-normal inputs of 10^4:
        ||e|| / ||x|| of 6.7 after 10 calls, 2e5 after 300). Scaled, ``E||y / (1 + omega)
        - x||^2 <= omega / (1 + omega) ||x||^2``: a contraction (Koloskova et al. 2019;
        the same rescaling as gossip's ``copy_scale``). The scale goes into the
        multipliers, so the payload is an ordinary qsgd one that decodes to the scaled y.
        """
        enc = self.encode(x)
        w = self.omega(x.size)
        if w >= 1.0:
            enc.frames[1] *= np.float32(1.0 / (1.0 + w))   # a new array each encode
        return enc

    def _block_scale(self, X):
        norm = np.sqrt(np.einsum("ij,ij->i", X, X))
        # x*x under- or overflows float32 for |x| < ~1e-19 or > ~1e19; redo those
        # rows in float64 (rare; NaN/Inf input stays non-finite and is rejected). A
        # norm past float32's range stays Inf too: _encode names that cause.
        redo = ~((norm > 1e-18) & (norm < 1e18))
        if redo.any():
            with np.errstate(over="ignore"):
                norm[redo] = np.linalg.norm(X[redo].astype(np.float64), axis=1)
        return norm


class Sign(Codec):
    """Scaled sign with one scale per block: ``y = (‖x_blk‖₁ / |blk|) · sign(x)``.

    One bit per element plus one float32 scale per ``block`` elements (default
    256: 1/8 + 1/64 bytes per element). A scale per block rather than one per
    vector matters under CHOCO gossip: with a single scale over 10⁵ elements the
    consensus error of a 16-ring stalls near 2·10⁻³ (reproduced with a float64
    numpy reference, so it is the dynamics, not rounding), while blocks of 256
    converge linearly at the exact-gossip rate (docs/gossip.md). ``block=0``
    keeps the single-scale form: ``y = (‖x‖₁/n) · sign(x)``.

    Zero and +0.0 map to +scale, -0.0 to -scale. Meta: ``{codec, n, block}`` with
    frames ``[bits uint8[ceil(n/8)], scales float32[ceil(n/block)]]``, or, for
    ``block=0``, ``{codec, n, scale}`` with frames ``[bits]`` (bit i of byte j,
    little bit order, is element ``8j + i``, set for negative). ``block`` is a
    multiple of 8, so every block starts on a byte. Not unbiased; a contraction,
    meant for CHOCO or ErrorFeedback (``ef+sign``). NaN/Inf input raises GossipError.
    """

    name = "sign"

    def __init__(self, spec: str | None = None, *, block: int = 256) -> None:
        super().__init__(spec)
        if isinstance(block, bool) or not isinstance(block, int) or block < 0 or block % 8 \
                or block > 1 << 24:
            from ..errors import ConfigError

            raise ConfigError(f"sign: block must be 0 or a multiple of 8 up to 2**24, got {block!r}")
        self.block = block
        self._scratch = Scratch()
        # byte value -> its 8 signs (+1 / -1)
        bits = (np.arange(256)[:, None] >> np.arange(8)) & 1
        self._table = (1.0 - 2.0 * bits).astype(np.float32)

    def _encode(self, x: np.ndarray) -> Encoded:
        n, B = x.size, self.block
        bits = np.empty(-(-n // 8), np.uint8)
        # chunks of whole blocks, a multiple of 8 elements, cache-sized
        step = max(1, _CHUNK // B) * B if B else _CHUNK
        A = self._scratch.get("a", min(n, step), np.float32)
        M = self._scratch.get("m", min(n, step), np.bool_)
        scales = np.empty(-(-n // B) if B else 0, np.float32)
        l1 = 0.0
        for a in range(0, n, step):
            b = min(n, a + step)
            xa = x[a:b]
            with np.errstate(over="ignore", invalid="ignore"):
                ab = np.abs(xa, out=A[:b - a])
                if B:
                    full = (b - a) // B * B
                    s = scales[a // B:-(-b // B)]
                    if full:
                        ab[:full].reshape(-1, B).mean(axis=1, dtype=np.float32, out=s[:full // B])
                    if full < b - a:
                        s[-1] = ab[full:].mean(dtype=np.float32)
                    if not np.isfinite(s).all():  # float32 overflow near 3e38: redo in float64
                        s[...] = _block_l1_f64(xa, B)
                else:
                    part = float(ab.sum(dtype=np.float32))
                    if not math.isfinite(part):
                        part = float(np.abs(xa.astype(np.float64)).sum())
                    l1 += part
            np.signbit(xa, out=M[:b - a])
            bits[a // 8:-(-b // 8)] = np.packbits(M[:b - a], bitorder="little")
        if B:
            if not np.isfinite(scales).all():
                bad = int(np.flatnonzero(~np.isfinite(scales))[0])
                raise GossipError(f"sign: input has NaN or Inf in elements [{bad * B}, {min(n, (bad + 1) * B)})")
            return Encoded({"codec": self.name, "n": int(n), "block": int(B)}, [bits, scales])
        scale = l1 / n if n else 0.0
        if not math.isfinite(scale):
            raise GossipError("sign: input has NaN or Inf (its L1 norm is not finite)")
        return Encoded({"codec": self.name, "n": int(n), "scale": scale}, [bits])

    def _frame_specs(self, meta, n):
        if "block" in meta:
            B = meta_int(meta, "block", self.name, lo=8, hi=1 << 24)
            if B % 8:
                raise WireError(f"{self.name}: meta block={B} is not a multiple of 8")
            return [("bits", ("uint8",), -(-n // 8)), ("scales", ("float32",), -(-n // B))]
        meta_float(meta, "scale", self.name)
        return [("bits", ("uint8",), -(-n // 8))]

    def _check_frames(self, meta, frames, n):
        if len(frames) == 2 and frames[1].size:
            s = frames[1]
            if not (np.isfinite(s).all() and s.min() >= 0):
                raise WireError(f"{self.name}: block scales must be finite and >= 0")

    def _decode(self, meta, frames, n):
        out = np.empty(n, np.float32)
        self._expand(meta, frames, out, 1.0, add=False)
        return out

    def _decode_into(self, meta, frames, out, alpha):
        self._expand(meta, frames, out, alpha, add=True)

    def _expand(self, meta: dict[str, Any], frames: list[np.ndarray], out: np.ndarray, alpha: float,
                add: bool) -> None:
        n = out.size
        bits = frames[0]
        B = meta.get("block", 0)
        if B:
            table = self._table
            m = frames[1] * np.float32(alpha)
            step = max(1, _CHUNK // B) * B // 8  # bytes per chunk: whole blocks
        else:
            table = self._table * np.float32(meta["scale"] * alpha)
            step = _CHUNK // 8
        S = self._scratch.get("d", min(n, step * 8) + 8, np.float32) if add or n % 8 else None
        for a in range(0, bits.size, step):
            b = min(bits.size, a + step)
            lo, hi = a * 8, min(n, b * 8)
            direct = not add and hi - lo == (b - a) * 8  # expand straight into out
            T = out[lo:hi] if direct else S[:(b - a) * 8]
            np.take(table, bits[a:b], axis=0, out=T.reshape(-1, 8))
            T = T[:hi - lo]
            if B:
                full = (hi - lo) // B * B
                if full:
                    T[:full].reshape(-1, B).__imul__(m[lo // B:(lo + full) // B, None])
                if full < hi - lo:
                    T[full:] *= m[-1]
            if add:
                out[lo:hi] += T
            elif not direct:
                out[lo:hi] = T


def _block_l1_f64(x: np.ndarray, B: int) -> np.ndarray:
    """Mean |x| per block of B (the last may be short), in float64 so that huge
    finite values do not overflow, cast back to float32 (NaN/Inf stay non-finite)."""
    a = np.abs(x.astype(np.float64))
    full = a.size // B * B
    parts = [a[:full].reshape(-1, B).mean(axis=1)] if full else []
    if full < a.size:
        parts.append(a[full:].mean(keepdims=True))
    return np.concatenate(parts).astype(np.float32)
