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

The gradients can be flat too (:func:`flatten_gradients`), and then one Adam
step is a handful of vector operations (:class:`FlatAdam`) instead of a loop over
tensors: for the small networks of RL agents, per-tensor overhead is most of the
cost of an update.
"""

from __future__ import annotations

import torch

from ..errors import SwarmError
from ..gossip.flat import flat_parameters

__all__ = ["FlatAdam", "flatten_gradients", "flatten_parameters", "is_flat"]


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


def flatten_gradients(module: torch.nn.Module) -> torch.Tensor:
    """Give every parameter of ``module`` a ``.grad`` that is a view into one zeroed
    float32 tensor, and return that tensor.

    Backward passes then accumulate into it in place (autograd adds into an
    existing ``.grad``), so clearing the gradients is ``grad.zero_()`` and their
    norm is ``grad.norm()``. Do not clear them with ``zero_grad(set_to_none=True)``,
    which drops the views.
    """
    params = list(module.parameters())
    grad = torch.zeros(sum(p.numel() for p in params), dtype=torch.float32)
    off = 0
    for p in params:
        p.grad = grad[off:off + p.numel()].view_as(p)
        off += p.numel()
    return grad


class FlatAdam:
    """Adam (Kingma & Ba, 2015) on one flat parameter vector and its flat gradient.

    The same arithmetic as ``torch.optim.Adam`` without weight decay or amsgrad, in
    seven vector operations per step rather than a Python loop over tensors.
    """

    def __init__(self, params: torch.Tensor, grad: torch.Tensor, lr: float,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        if params.shape != grad.shape or params.dim() != 1:
            raise SwarmError(f"FlatAdam needs one 1-D parameter vector and a gradient of its shape, got "
                             f"{tuple(params.shape)} and {tuple(grad.shape)}")
        self.params, self.grad = params, grad
        self.lr, self.betas, self.eps = float(lr), (float(betas[0]), float(betas[1])), float(eps)
        self.t = 0
        self.exp_avg = torch.zeros_like(params)
        self.exp_avg_sq = torch.zeros_like(params)

    @torch.no_grad()
    def step(self) -> None:
        b1, b2 = self.betas
        self.t += 1
        self.exp_avg.lerp_(self.grad, 1.0 - b1)
        self.exp_avg_sq.mul_(b2).addcmul_(self.grad, self.grad, value=1.0 - b2)
        denom = self.exp_avg_sq.sqrt().div_((1.0 - b2 ** self.t) ** 0.5).add_(self.eps)
        self.params.addcdiv_(self.exp_avg, denom, value=-self.lr / (1.0 - b1 ** self.t))

    def state_dict(self) -> dict:
        return {"t": self.t, "exp_avg": self.exp_avg.clone(), "exp_avg_sq": self.exp_avg_sq.clone()}

    def load_state_dict(self, state: dict) -> None:
        try:
            t, m, v = int(state["t"]), state["exp_avg"], state["exp_avg_sq"]
        except (KeyError, TypeError, ValueError):
            raise SwarmError("optimizer state is not FlatAdam's (a checkpoint from an older swarm?): "
                             f"keys {sorted(state) if isinstance(state, dict) else type(state).__name__}") from None
        for name, x in (("exp_avg", m), ("exp_avg_sq", v)):
            if not isinstance(x, torch.Tensor) or x.shape != self.params.shape:
                raise SwarmError(f"optimizer state {name} does not fit {self.params.numel()} parameters")
        self.t = t
        self.exp_avg.copy_(m)
        self.exp_avg_sq.copy_(v)
