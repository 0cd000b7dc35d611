"""Codecs for parameter deltas: identity, fp16, int8, qsgd, top-k, random-k, sign; error feedback.

    from swarm.compress import get_codec, Encoded

    codec = get_codec("ef+topk:0.01")     # one instance per stream
    enc = codec.encode(delta)             # Encoded(meta, frames); enc.nbytes on the wire
    y = codec.decode(enc)                 # float32[n]
    codec.decode_into(enc, acc)           # acc += decoded, no temporary

``meta`` is a small msgpack-able dict (always ``codec`` and ``n``); ``frames`` are
numpy arrays meant to travel as zero-copy frames through :func:`swarm.wire.encode`.
Decoders check every payload and raise :class:`~swarm.errors.WireError` for a bad
one before writing anything. See docs/compress.md for formats and error bounds.
"""

from ._base import MAX_N, Codec, Encoded
from .dense import FP16, Identity
from .feedback import ErrorFeedback
from .quantize import QSGD, Int8, Sign
from .registry import CODECS, describe, get_codec, split_ef
from .sparse import RandomK, TopK

__all__ = [
    "CODECS",
    "MAX_N",
    "Codec",
    "Encoded",
    "ErrorFeedback",
    "FP16",
    "Identity",
    "Int8",
    "QSGD",
    "RandomK",
    "Sign",
    "TopK",
    "describe",
    "get_codec",
    "split_ef",
]
