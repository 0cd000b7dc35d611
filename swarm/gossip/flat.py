"""One contiguous float32 vector over a torch module's parameters (torch imported lazily)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ConfigError

__all__ = ["flat_parameters"]


def flat_parameters(module: Any) -> np.ndarray:
    """Move every parameter of ``module`` into one contiguous float32 CPU buffer and
    return a numpy view of it.

    Afterwards each ``p.data`` is a view into that buffer, so the gossip engine's
    in-place updates are the model's parameters, and optimizer steps on the model
    are seen by the engine, with no copies either way. Call it before creating the
    optimizer (the parameter objects stay the same, only their storage moves). A lazy
    module (``LazyLinear``) needs one forward pass first: until then its parameters
    have no shape, and this raises :class:`~swarm.errors.ConfigError`.

    >>> x = flat_parameters(torch.nn.Linear(4, 2))
    >>> x.shape
    (10,)
    """
    import torch  # noqa: PLC0415 - keep torch out of the import path of swarm.gossip

    if not isinstance(module, torch.nn.Module):
        raise ConfigError(f"flat_parameters needs a torch.nn.Module, got {type(module).__name__}")
    params = [p for p in module.parameters()]
    if not params:
        raise ConfigError(f"{type(module).__name__} has no parameters to gossip")
    for name, p in module.named_parameters():
        if isinstance(p, torch.nn.parameter.UninitializedParameter):
            raise ConfigError(f"parameter {name!r} is uninitialized (a lazy module such as LazyLinear); "
                              f"run one forward pass on a sample batch, then call flat_parameters")
        if p.dtype != torch.float32 or p.device.type != "cpu":
            raise ConfigError(f"parameter {name!r} is {p.dtype} on {p.device}; gossip needs float32 on cpu")
    total = sum(p.numel() for p in params)
    flat = torch.empty(total, dtype=torch.float32)
    off = 0
    with torch.no_grad():
        for p in params:
            k = p.numel()
            flat[off:off + k].copy_(p.reshape(-1))
            p.data = flat[off:off + k].view_as(p)
            off += k
    out = flat.numpy()
    # keep the storage alive as long as the numpy view is
    return out
