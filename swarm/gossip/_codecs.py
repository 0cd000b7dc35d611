"""Codec lookup for the engine: ``swarm.compress`` when present, else identity only.

The engine needs four things of a codec: ``encode(x) -> enc`` with ``enc.meta``
(a small msgpack-able dict) and ``enc.frames`` (numpy arrays), and
``decode(enc) -> float32 array``. A received delta is rebuilt as an
:class:`Received` with the same two fields, so any codec that decodes from
``meta`` and ``frames`` alone works.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import ConfigError


@dataclass
class Received:
    """An encoded delta rebuilt from a message: what a codec's ``decode`` reads."""

    meta: dict[str, Any]
    frames: list[np.ndarray] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(int(f.nbytes) for f in self.frames)


class _Identity:
    """Sends the float32 delta as it is; used only when swarm.compress is absent."""

    name = "identity"

    def encode(self, x: np.ndarray) -> Received:
        return Received({"codec": "identity", "n": int(x.size)}, [np.ascontiguousarray(x, np.float32)])

    def decode(self, enc: Any) -> np.ndarray:
        (f,) = enc.frames
        return np.asarray(f, dtype=np.float32).reshape(-1)


def make_codec(spec: str) -> Any:
    """A fresh codec instance for one stream (codecs may carry state, e.g. error feedback)."""
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"codec must be a non-empty string such as 'identity' or 'topk:0.01', got {spec!r}")
    try:
        from ..compress import get_codec  # noqa: PLC0415 - optional until swarm.compress lands
    except ImportError:
        if spec == "identity":
            return _Identity()
        raise ConfigError(f"codec {spec!r} needs swarm.compress, which is not installed") from None
    return get_codec(spec)
