"""torch for the few kernels numpy does slowly (float16 casts), where the program has it.

numpy casts float32 <-> float16 in a scalar loop on CPUs without AVX-512
(~0.6 GB/s here); torch's cast into a preallocated tensor runs at memory speed.
The codecs never import torch themselves: they use it once the program has (a torch
model has), and numpy otherwise. Importing it on a codec's first use held the
caller, a peer's event loop in its first fp16 round, for 1.4-2.2 s.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import numpy as np


def torch_or_none() -> Any:
    """The torch module where the program has imported it, else None (also while another
    thread is still importing it: its functions may not exist yet)."""
    torch = sys.modules.get("torch")
    if torch is None or getattr(getattr(torch, "__spec__", None), "_initializing", False):
        return None
    return torch


def view(a: np.ndarray) -> Any:
    """A torch tensor over ``a``'s memory (read-only frames from the wire included).

    torch warns that it cannot protect a read-only buffer; the callers below only
    ever read through such views, so the warning is silenced here.
    """
    torch = torch_or_none()
    if a.flags.writeable:
        return torch.from_numpy(a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(a)


def _viewable(*arrays: np.ndarray) -> bool:
    """Whether torch is present and can view every array: torch.from_numpy refuses
    negative strides (``x[::-1]``, or a hand-built payload's frames) and strides that
    are not a multiple of the item size (a field of a structured array)."""
    return torch_or_none() is not None and all(s >= 0 and s % a.itemsize == 0
                                               for a in arrays for s in a.strides)


def cast_into(dst: np.ndarray, src: np.ndarray) -> np.ndarray:
    """``dst[:] = src`` with a dtype cast, at memory speed when torch is present."""
    if dst.size == 0 or not _viewable(dst, src):
        with np.errstate(over="ignore"):   # past float16's range: inf, as torch's cast (callers check)
            np.copyto(dst, src, casting="unsafe")
    else:
        view(dst).copy_(view(src))
    return dst


def add_into(dst: np.ndarray, src: np.ndarray, alpha: float) -> np.ndarray:
    """``dst += alpha * src`` for float32 ``dst`` and any float ``src``, without a temporary."""
    if dst.size == 0:
        return dst
    if not _viewable(dst, src):
        if alpha == 1.0:
            np.add(dst, src, out=dst, casting="unsafe")
        else:
            dst += np.float32(alpha) * src.astype(np.float32)
    else:
        view(dst).add_(view(src), alpha=alpha)
    return dst
