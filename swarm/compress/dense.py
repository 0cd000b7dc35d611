"""Dense codecs that keep every element: ``identity`` and ``fp16``."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _torch
from ._base import Codec, Encoded, Scratch

__all__ = ["Identity", "FP16"]

_F16_MAX = 65504.0
_CHUNK = 1 << 16


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
    ``<= 2**-25`` absolute below that (subnormals). Magnitudes above 65504 saturate
    to ±65504 instead of becoming Inf. NaN stays NaN; ±Inf saturates like any large value.
    Meta: ``{codec, n}``; frames: ``[values float16[n]]``.
    """

    name = "fp16"

    def __init__(self, spec: str | None = None) -> None:
        super().__init__(spec)
        self._scratch = Scratch()

    def _encode(self, x: np.ndarray) -> Encoded:
        h = np.empty(x.size, np.float16)
        _torch.cast_into(h, x)
        if h.size:
            torch = _torch.torch_or_none()
            # Saturate after the cast (on the 2-byte result, half the traffic of
            # clipping the input); NaN is left alone by clamp.
            if torch is not None:
                _torch.view(h).clamp_(-_F16_MAX, _F16_MAX)
            else:
                np.clip(h, -_F16_MAX, _F16_MAX, out=h)
        return Encoded({"codec": self.name, "n": int(x.size)}, [h])

    def _encode_device(self, t: Any) -> Encoded | None:
        import torch

        if not t.is_floating_point():
            return None  # the CPU path names the bad dtype
        h = t.detach().reshape(-1).to(torch.float16).clamp_(-_F16_MAX, _F16_MAX).cpu().numpy()
        return Encoded({"codec": self.name, "n": int(h.size)}, [h])

    def _frame_specs(self, meta, n):
        return [("values", ("float16",), n)]

    def _decode(self, meta, frames, n):
        out = np.empty(n, np.float32)
        return _torch.cast_into(out, frames[0])

    def _decode_into(self, meta, frames, out, alpha):
        # Cast cache-sized pieces into scratch and add from there: a mixed-dtype
        # in-place add runs at a fraction of memory speed in both numpy and torch.
        h, n = frames[0], out.size
        S = self._scratch.get("d", min(n, _CHUNK), np.float32)
        for a in range(0, n, _CHUNK):
            b = min(n, a + _CHUNK)
            T = _torch.cast_into(S[:b - a], h[a:b])
            if alpha != 1.0:
                T *= np.float32(alpha)
            out[a:b] += T
