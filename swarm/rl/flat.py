"""One contiguous float32 vector behind all of a module's parameters.

Gossip works on a flat vector per peer. Rather than copying parameters out and
back every round, the parameters are *re-pointed* into slices of one tensor, so
the vector and the model are the same memory:

    >>> net = torch.nn.Linear(3, 2)
    >>> flat = flatten_parameters(net)
    >>> vec = flat.numpy()          # shares memory with net.weight, net.bias
    >>> vec[:] = 0.0                # the module now outputs zeros

Optimizers must be built *after* flattening: they hold references to the
parameter objects, which stay the same, but their ``.data`` changes here.
"""

from __future__ import annotations

import torch

from ..errors import SwarmError

__all__ = ["flatten_parameters", "is_flat"]


def flatten_parameters(module: torch.nn.Module) -> torch.Tensor:
    """Move every parameter of ``module`` into one contiguous float32 tensor.

    Values are kept; afterwards each parameter's ``.data`` is a view into the
    returned 1-D tensor (in ``module.parameters()`` order), and
    ``returned.numpy()`` is a numpy view of the same memory. Buffers (e.g.
    batch-norm statistics) are not included: they are not gossiped.
    """
    params = [p for p in module.parameters()]
    if not params:
        raise SwarmError(f"{type(module).__name__} has no parameters to flatten")
    for name, p in module.named_parameters():
        if p.dtype != torch.float32:
            raise SwarmError(f"parameter {name} is {p.dtype}; only float32 parameters can be gossiped")
        if p.device.type != "cpu":
            raise SwarmError(f"parameter {name} is on {p.device}; the gossip vector must live on the CPU")
    total = sum(p.numel() for p in params)
    flat = torch.zeros(total, dtype=torch.float32)
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            flat[offset:offset + n].copy_(p.data.reshape(-1))
            p.data = flat[offset:offset + n].view_as(p)
            offset += n
    return flat


def is_flat(module: torch.nn.Module, flat: torch.Tensor) -> bool:
    """True when every parameter of ``module`` still lives inside ``flat``.

    Something that replaces a parameter's storage (``module.to(...)``, assigning
    ``p.data = ...``) silently breaks the sharing; callers check with this.
    """
    base = flat.untyped_storage().data_ptr()
    end = base + flat.numel() * flat.element_size()
    for p in module.parameters():
        ptr = p.data.data_ptr()
        if not (base <= ptr < end) or p.data.untyped_storage().data_ptr() != base:
            return False
    return True
