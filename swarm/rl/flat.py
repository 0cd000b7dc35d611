"""The Q-network's parameters as one contiguous float32 vector, in torch terms.

Gossip works on one flat vector per peer. :func:`swarm.gossip.flat.flat_parameters`
re-points a module's parameters into slices of one buffer (no copies either way);
this module gives agents the same buffer as a torch tensor and a check that the
sharing still holds.

    >>> net = torch.nn.Linear(3, 2)
    >>> flat = flatten_parameters(net)
    >>> vec = flat.numpy()          # shares memory with net.weight, net.bias
    >>> vec[:] = 0.0                # the module now outputs zeros

Optimizers must be built *after* flattening: they hold references to the
parameter objects, which stay the same, but their ``.data`` moves.
"""

from __future__ import annotations

import torch

from ..gossip.flat import flat_parameters

__all__ = ["flatten_parameters", "is_flat"]


def flatten_parameters(module: torch.nn.Module) -> torch.Tensor:
    """Move every parameter of ``module`` into one float32 tensor and return it.

    Values are kept; afterwards each parameter's ``.data`` is a view into the
    returned 1-D tensor (in ``module.parameters()`` order), and
    ``returned.numpy()`` is a numpy view of the same memory. Buffers (e.g.
    batch-norm statistics) are not included: they are not gossiped. Raises
    :class:`swarm.errors.ConfigError` for a module without float32 CPU parameters.
    """
    return torch.from_numpy(flat_parameters(module))


def is_flat(module: torch.nn.Module, flat: torch.Tensor) -> bool:
    """True when every parameter of ``module`` still lives inside ``flat``.

    Something that replaces a parameter's storage (``module.to(...)``, assigning
    ``p.data = ...``) silently breaks the sharing; callers check with this.
    """
    base = flat.data_ptr()
    end = base + flat.numel() * flat.element_size()
    for p in module.parameters():
        start = p.data.data_ptr()
        if not (base <= start and start + p.numel() * p.element_size() <= end):
            return False
    return True
