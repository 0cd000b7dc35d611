"""Dense codecs that keep every element: ``identity`` and ``fp16``.

Also the float16 range handling that ``topk:…:values=fp16`` shares with ``fp16``:
:func:`fp16_scale` and :func:`to_fp16`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import _torch
from ._base import _F32_MAX, Codec, Encoded, Scratch, meta_scale

__all__ = ["Identity", "FP16", "fp16_scale", "to_fp16"]

_F16_MAX = 65504.0
#: the magnitudes whose float16 is finite: below 65520 (which rounds to 65504, to
#: nearest, ties to even)
_F16_HI = 65520.0
#: the bits of 65504 without the sign: float16 magnitudes order as integers
_F16_BITS_HI = 0x7BFF
_CHUNK = 1 << 16


def fp16_scale(amax: float) -> float:
    """The divisor float16 values are sent with, for a largest finite magnitude ``amax``.

    1 while ``amax`` is below 65520 (its float16 is finite: 65504 at most).
    Otherwise the power of two that brings ``amax`` into ``[2**14, 2**15)``: a
    value past 65504 would saturate (and error feedback would have to carry the
    excess for many rounds). A power of two makes the division and the receiver's
    multiplication exact, so the error stays float16's own, relative to the scaled
    value. At most 2**113, within float32's range.

    Small values are not scaled up (they are float16's subnormals below 2**-14, as
    before scales existed): a peer of an older version ignores ``scale`` and would
    read a scaled-up payload that many times too large, with nothing to refuse it;
    one that reads a scaled-down payload too small gets what saturation sent it.

    >>> fp16_scale(1e6), fp16_scale(1.0), fp16_scale(1e-6)
    (32.0, 1.0, 1.0)
    """
    if amax >= _F16_HI:
        _, e = math.frexp(amax)   # 2**(e-1) <= amax < 2**e
        return 2.0 ** min(e - 15, 113)
    return 1.0


def _fp16_limit(scale: float) -> float:
    """The largest float16 magnitude to send with ``scale``: 65504, or, when the
    receiver's ``65504 * scale`` would pass float32's largest value (inputs above
    2**127), the float16 below 2**15 (which times 2**113 stays finite)."""
    return 32752.0 if scale >= 2.0 ** 113 else _F16_MAX


def finite_amax(x: np.ndarray) -> float:
    """The largest finite ``|x|`` (0 when there is none), a cache-sized piece at a time."""
    amax = 0.0
    for a in range(0, x.size, _CHUNK):
        v = np.abs(x[a:a + _CHUNK])
        v = v[np.isfinite(v)]
        if v.size:
            amax = max(amax, float(v.max()))
    return amax


def to_fp16(v: np.ndarray) -> tuple[np.ndarray, float]:
    """``(float16 of v / scale, scale)`` with ``scale = fp16_scale(largest finite |v|)``;
    magnitudes past the float16 range (±Inf too) saturate, NaN stays NaN. For short
    vectors (top-k's kept values); :class:`FP16` does the same a piece at a time."""
    amax = float(np.maximum(v.max(), -v.min())) if v.size else 0.0   # NaN if v has one
    if amax < _F16_HI:
        return v.astype(np.float16), 1.0   # the usual case: nothing to scale or saturate
    scale = fp16_scale(finite_amax(v))
    if scale != 1.0:
        v = v * np.float32(1.0 / scale)
    lim = _fp16_limit(scale)
    return np.clip(v, -lim, lim).astype(np.float16), scale


class Identity(Codec):
    """No compression: the frame is the float32 vector itself (4 bytes/element).

    Zero-copy: the frame is a view of the input, so the caller must not change the
    input until the message is sent. Decoding is exact. NaN/Inf pass through.
    Meta: ``{codec, n}``; frames: ``[values float32[n]]``.
    """

    name = "identity"
    aliases_input = True

    def _encode(self, x: np.ndarray) -> Encoded:
        return Encoded({"codec": self.name, "n": int(x.size)}, [x])

    def _encode_device(self, t: Any) -> Encoded | None:
        return None  # moved to the CPU once by the caller; nothing to compute first

    def _frame_specs(self, meta, n):
        return [("values", ("float32",), n)]

    def _decode(self, meta, frames, n):
        return np.array(frames[0], dtype=np.float32, copy=True)

    def _decode_into(self, meta, frames, out, alpha):
        if alpha == 1.0:
            np.add(out, frames[0], out=out)
        else:
            _torch.add_into(out, frames[0], alpha)


class FP16(Codec):
    """IEEE half precision (2 bytes/element), round to nearest even.

    Error bound: ``|y - x| <= 2**-11 * |x|`` for ``2**-14 <= |x| <= 65504``, and
    ``<= 2**-25`` absolute below that (subnormals), while the largest finite ``|x|``
    is below 65520. Past that, the values are sent divided by the power of two
    ``meta["scale"]`` that brings it into ``[2**14, 2**15)`` (:func:`fp16_scale`),
    and the same bounds hold with every threshold times ``scale``: 1e6 travels as
    31250 with ``scale = 32``. NaN stays NaN; ±Inf saturates to the largest value
    sent (65504, times the scale).
    Meta: ``{codec, n}``, plus ``scale`` (a float, only when it is not 1);
    frames: ``[values float16[n]]``.
    """

    name = "fp16"

    def __init__(self, spec: str | None = None) -> None:
        super().__init__(spec)
        self._scratch = Scratch()

    def _encode(self, x: np.ndarray) -> Encoded:
        h = np.empty(x.size, np.float16)
        _torch.cast_into(h, x)
        meta = {"codec": self.name, "n": int(x.size)}
        if h.size and not self._in_range(h):
            # rare: a value overflowed (or there is a NaN or Inf): find the largest
            # finite magnitude and cast again, scaled
            scale = fp16_scale(finite_amax(x))
            if scale != 1.0:
                meta["scale"] = scale
                S = self._scratch.get("s", min(x.size, _CHUNK), np.float32)
                inv = np.float32(1.0 / scale)
                for a in range(0, x.size, _CHUNK):
                    b = min(x.size, a + _CHUNK)
                    _torch.cast_into(h[a:b], np.multiply(x[a:b], inv, out=S[:b - a]))
            lim = _fp16_limit(scale)
            if _torch.torch_or_none() is not None:
                _torch.view(h).clamp_(-lim, lim)   # NaN is left alone by clamp
            else:
                np.clip(h, -lim, lim, out=h)
        return Encoded(meta, [h])

    @staticmethod
    def _in_range(h: np.ndarray) -> bool:
        """Whether every ``|h|`` is a finite float16 (False for Inf and NaN).

        Read off the bits, magnitude in the low 15: the int16 maximum is the largest
        positive one, the uint16 maximum ``0x8000 +`` the largest negative one. Two
        integer reductions, cheaper than the clamp they spare (0.65 ms against 1.2
        at 10M, and 2.6 µs against 2.2 at 4,610) and than torch's aminmax."""
        m = max(int(h.view(np.int16).max()), int(h.view(np.uint16).max()) - 0x8000)
        return m <= _F16_BITS_HI

    def _encode_device(self, t: Any) -> Encoded | None:
        import torch

        if not t.is_floating_point():
            return None  # the CPU path names the bad dtype
        h = t.detach().reshape(-1).to(torch.float16)
        if h.numel():
            lo, hi = torch.stack(tuple(torch.aminmax(h))).tolist()   # one sync
            if not max(-lo, hi) <= _F16_MAX:
                return None  # out of range, or NaN (rare): the CPU path picks a scale
        h = h.cpu().numpy()
        return Encoded({"codec": self.name, "n": int(h.size)}, [h])

    def _check_meta(self, meta, n):
        if "scale" in meta:
            meta_scale(meta, "scale", self.name)

    def _frame_specs(self, meta, n):
        return [("values", ("float16",), n)]

    def _decode(self, meta, frames, n):
        out = np.empty(n, np.float32)
        _torch.cast_into(out, frames[0])
        if "scale" in meta:
            out *= np.float32(meta["scale"])
        return out

    def _decode_into(self, meta, frames, out, alpha):
        # Cast cache-sized pieces into scratch and add from there: a mixed-dtype
        # in-place add runs at a fraction of memory speed in both numpy and torch.
        h, n = frames[0], out.size
        scale = meta.get("scale", 1.0)
        # alpha folded into the scale can pass float32's range where alpha times a
        # value does not (a 0 would decode to 0 * Inf = NaN): then multiply twice
        if abs(alpha * scale) <= _F32_MAX:
            factors = [np.float32(alpha * scale)]
        else:
            factors = [np.float32(scale), np.float32(alpha)]
        S = self._scratch.get("d", min(n, _CHUNK), np.float32)
        for a in range(0, n, _CHUNK):
            b = min(n, a + _CHUNK)
            T = _torch.cast_into(S[:b - a], h[a:b])
            for f in factors:
                if f != 1.0:
                    T *= f
            out[a:b] += T
