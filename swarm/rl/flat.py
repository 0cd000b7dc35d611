"""The Q-network's parameters as one contiguous float32 vector, in torch terms.

Gossip works on one flat vector per peer. :func:`swarm.gossip.flat.flat_parameters`
re-points a module's parameters into slices of one buffer (no copies either way);
this module gives agents the same buffer as a torch tensor, and re-exports
:func:`swarm.gossip.flat.is_flat`, the check that the sharing still holds (it takes
the tensor too).

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

import math
import numbers
import sys

import numpy as np
import torch

from ..checks import MAX_GRAD, is_real, largest_abs
from ..errors import ConfigError, SwarmError
from ..gossip.flat import flat_parameters, is_flat

__all__ = ["FlatAdam", "clip_norm_", "flatten_gradients", "flatten_parameters", "flush_denormals", "is_flat"]

#: the smallest normal float64: half of it is a denormal, or 0 on a thread that flushes
_TINY = sys.float_info.min


class flush_denormals:
    """Flush denormal floats to zero on the calling thread inside a ``with`` block, and
    give it back its own mode on exit.

        >>> with flush_denormals():
        ...     sys.float_info.min / 4 == 0.0
        True

    Adam's moments of a parameter whose gradient stays zero (about two thirds of
    a DQN gradient's entries here, most likely ReLU units no sample activates) decay
    geometrically into the denormal range and stick there (0.9 times the smallest
    denormal rounds back to it), and arithmetic on denormals is several times
    slower on x86: an Adam step on 4,610 parameters took 70 us instead of 16, and
    the isolated CartPole learner 1.1-1.2 ms per env step instead of 1.0. Inside the
    block denormals count as zero in this thread's arithmetic (numpy's, torch's and
    Python's own): float32 values under 1.2e-38, float64 ones under 2.2e-308. No
    quantity of an update notices. :meth:`FlatAdam.step` and
    :class:`~swarm.rl.dqn.DQNAgent`'s updates run in one. Before, the first step
    flushed the thread for good, and the threads it started later (they copy the
    mode): ``5.6e-309 > 0.0`` was False in the caller's own code after training.

    A thread that flushes already (an enclosing block, or the caller's own
    ``torch.set_flush_denormal(True)``) is left as it is: nested use costs a
    comparison. On a CPU that cannot flush, the block changes nothing.
    """

    __slots__ = ("_turned_on",)

    def __enter__(self) -> None:
        # The mode has no getter: a denormal result that comes out 0 says the thread flushes.
        # set_flush_denormal(True) is False where the CPU cannot flush: nothing to undo then.
        self._turned_on = _TINY * 0.5 != 0.0 and torch.set_flush_denormal(True)

    def __exit__(self, *exc: object) -> None:
        if self._turned_on:
            torch.set_flush_denormal(False)


def flatten_parameters(module: torch.nn.Module) -> torch.Tensor:
    """Move every parameter of ``module`` into one float32 tensor and return it.

    Values are kept; afterwards each parameter's ``.data`` is a view into the
    returned 1-D tensor (in ``module.parameters()`` order), and
    ``returned.numpy()`` is a numpy view of the same memory. Buffers (e.g.
    batch-norm statistics) are not included: they are not gossiped. Raises
    :class:`swarm.errors.ConfigError` for a module without float32 CPU parameters.
    """
    return torch.from_numpy(flat_parameters(module))


def flatten_gradients(module: torch.nn.Module) -> torch.Tensor:
    """Give every parameter of ``module`` a ``.grad`` that is a view into one zeroed
    float32 tensor, and return that tensor.

    Backward passes then accumulate into it in place (autograd adds into an
    existing ``.grad``), so clearing the gradients is ``grad.zero_()`` and clipping
    them :func:`clip_norm_`. Do not clear them with ``zero_grad(set_to_none=True)``,
    which drops the views. Raises :class:`swarm.errors.ConfigError`, and changes
    nothing, for a module whose parameters are not float32 on the CPU.
    """
    for name, p in module.named_parameters():
        if p.dtype != torch.float32 or p.device.type != "cpu":
            raise ConfigError(f"parameter {name!r} is {p.dtype} on {p.device}; flat gradients need float32 "
                              "on cpu (flatten_parameters the module first: it says the same)")
    params = list(module.parameters())
    grad = torch.zeros(sum(p.numel() for p in params), dtype=torch.float32)
    off = 0
    for p in params:
        p.grad = grad[off:off + p.numel()].view_as(p)
        off += p.numel()
    return grad


def clip_norm_(grad: torch.Tensor, max_norm: float) -> float:
    """Scale the flat float32 ``grad`` in place down to a norm of ``max_norm`` if it is
    larger (never up); return its norm before.

    The sum of squares can overflow float32 though every entry is finite (4,610 entries
    of 3e17 do): ``max_norm / grad.norm()`` was then 0, and the gradient zeros. Such a
    norm is computed again from the gradient divided by its largest entry, and the
    gradient scaled in two steps, so that it keeps its direction at a norm of
    ``max_norm``. A gradient with a NaN or infinite entry is left as it is (its norm,
    NaN or inf, is returned): :meth:`FlatAdam.step` refuses it whole.

        >>> g = torch.full((4610,), 1e18)
        >>> round(clip_norm_(g, 10.0) / 1e18, 2), round(float(g.double().norm()), 4)
        (67.9, 10.0)
    """
    norm = float(grad.norm())
    if norm == math.inf:
        big = largest_abs(grad.numpy())
        if not math.isfinite(big):
            return big
        unit = float((grad / big).norm())   # at most sqrt(n); a copy, in this rare case only
        if max_norm < big * unit:
            # Not one factor: max_norm / norm can be under float32's smallest normal, which
            # is 0 inside an agent's update (flush_denormals) and a denormal outside one.
            grad.div_(big).mul_(max_norm / unit)
        return big * unit
    if max_norm < norm + 1e-6:   # 1e-6 as before (and torch's clip_grad_norm_): no division by 0
        grad.mul_(max_norm / (norm + 1e-6))
    return norm


class FlatAdam:
    """Adam (Kingma & Ba, 2015) on one flat parameter vector and its flat gradient.

    The same arithmetic as ``torch.optim.Adam`` without weight decay or amsgrad, up
    to float rounding, in numpy on views of the same memory: a dozen in-place
    ufuncs into one scratch vector. For a few thousand parameters that is about
    16 us a step, against 85 with seven torch operations (a torch call costs
    microseconds before it does any arithmetic), and a swarm peer that applies
    every peer's gradients takes one such step per gradient. The step's arithmetic
    flushes denormals (:class:`flush_denormals`), and the thread's own mode is back
    when it returns: without the flush, the moments of parameters with zero
    gradients make it 70 us.

    Raises :class:`swarm.errors.ConfigError` for an ``lr`` that is not a finite number
    >= 0, a beta outside [0, 1) or an ``eps`` that is not > 0: each makes steps NaN
    (or, for a beta of 1, a division by zero).
    """

    def __init__(self, params: torch.Tensor, grad: torch.Tensor, lr: float,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        if params.shape != grad.shape or params.dim() != 1:
            raise SwarmError(f"FlatAdam needs one 1-D parameter vector and a gradient of its shape, got "
                             f"{tuple(params.shape)} and {tuple(grad.shape)}")
        if params.dtype != torch.float32 or grad.dtype != torch.float32 or params.device.type != "cpu":
            raise SwarmError(f"FlatAdam needs float32 CPU tensors, got {params.dtype} on {params.device}")
        if not (is_real(lr) and 0 <= lr < math.inf):
            raise ConfigError(f"FlatAdam lr = {lr!r}: must be a finite number >= 0")
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2
                and all(is_real(b) and 0 <= b < 1 for b in betas)):
            raise ConfigError(f"FlatAdam betas = {betas!r}: must be two numbers in [0, 1)")
        if not (is_real(eps) and 0 < eps < math.inf):
            raise ConfigError(f"FlatAdam eps = {eps!r}: must be a finite number > 0")
        self.params, self.grad = params, grad
        self.lr, self.betas, self.eps = float(lr), (float(betas[0]), float(betas[1])), float(eps)
        self.t = 0
        self.exp_avg = torch.zeros_like(params)
        self.exp_avg_sq = torch.zeros_like(params)
        # numpy views of the same memory: the step works on these
        self._p, self._g = params.detach().numpy(), grad.numpy()
        self._m, self._v = self.exp_avg.numpy(), self.exp_avg_sq.numpy()
        self._tmp = np.empty_like(self._p)

    def step(self, grad: np.ndarray | None = None) -> None:
        """One Adam step with ``grad`` (a float32 vector of the parameters' length;
        default: the flat gradient tensor given to the constructor).

        Raises :class:`SwarmError`, and changes nothing, for a gradient that is not a
        numpy array, of another shape or dtype, or with a NaN, infinite or too large
        (above :data:`MAX_GRAD`) entry: one such entry would make its moment, and then
        its parameter, NaN or infinite for good.
        """
        g = self._g if grad is None else grad
        if not isinstance(g, np.ndarray):
            raise SwarmError(f"FlatAdam.step: the gradient is a {type(g).__name__}; needs a numpy "
                             f"float32 array of shape {self._p.shape}")
        if g.shape != self._p.shape or g.dtype != np.float32:
            raise SwarmError(f"FlatAdam.step: gradient of shape {g.shape} and dtype {g.dtype}; "
                             f"needs float32 of shape {self._p.shape}")
        m, v, tmp = self._m, self._v, self._tmp
        largest = largest_abs(g)   # NaN if an entry is, inf if one is
        if not math.isfinite(largest):
            raise SwarmError("FlatAdam.step: the gradient has NaN or infinite entries; not applied "
                             "(parameters and moments unchanged)")
        if largest > MAX_GRAD:
            raise SwarmError(f"FlatAdam.step: a gradient entry of {largest:.3g} is too large (its square "
                             f"overflows float32 above {MAX_GRAD:.3g}); not applied (parameters and "
                             "moments unchanged)")
        b1, b2 = self.betas
        self.t += 1
        with flush_denormals():   # inside an agent's update, which flushes already: one comparison
            # m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
            np.multiply(m, b1, out=m)
            np.multiply(g, 1.0 - b1, out=tmp)
            np.add(m, tmp, out=m)
            np.multiply(v, b2, out=v)
            np.multiply(g, g, out=tmp)
            np.multiply(tmp, 1.0 - b2, out=tmp)
            np.add(v, tmp, out=v)
            # p -= lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^t)) + eps)
            np.sqrt(v, out=tmp)
            np.multiply(tmp, 1.0 / (1.0 - b2 ** self.t) ** 0.5, out=tmp)
            np.add(tmp, self.eps, out=tmp)
            np.divide(m, tmp, out=tmp)
            np.multiply(tmp, -self.lr / (1.0 - b1 ** self.t), out=tmp)
            np.add(self._p, tmp, out=self._p)

    def state_dict(self) -> dict:
        return {"t": self.t, "exp_avg": self.exp_avg.clone(), "exp_avg_sq": self.exp_avg_sq.clone()}

    def check_state_dict(self, state: dict) -> tuple[int, torch.Tensor, torch.Tensor]:
        """Check a :meth:`state_dict` against these parameters without loading it; returns
        (t, exp_avg, exp_avg_sq). Raises :class:`SwarmError` saying what does not fit."""
        try:
            t, m, v = state["t"], state["exp_avg"], state["exp_avg_sq"]
        except (KeyError, TypeError, IndexError):
            raise SwarmError("optimizer state is not FlatAdam's (a checkpoint from an older swarm?): "
                             f"keys {sorted(state) if isinstance(state, dict) else type(state).__name__}") from None
        if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0:
            raise SwarmError(f"optimizer state t = {t!r}: must be a step count >= 0")
        for name, x in (("exp_avg", m), ("exp_avg_sq", v)):
            if not isinstance(x, torch.Tensor) or x.shape != self.params.shape:
                raise SwarmError(f"optimizer state {name} does not fit {self.params.numel()} parameters")
            if x.dtype != torch.float32:   # a float64 1e300 is finite, and copies in as inf
                raise SwarmError(f"optimizer state {name} is {x.dtype}; needs float32 (the parameters' dtype)")
            if not bool(torch.isfinite(x).all()):
                raise SwarmError(f"optimizer state {name} has NaN or infinite entries")
        if bool((v < 0).any()):
            raise SwarmError("optimizer state exp_avg_sq has negative entries (it is a mean of squares)")
        return int(t), m, v

    def load_state_dict(self, state: dict) -> None:
        """Load a :meth:`state_dict`; checks all of it first, so a failed load changes nothing."""
        t, m, v = self.check_state_dict(state)
        self.t = t
        self.exp_avg.copy_(m)
        self.exp_avg_sq.copy_(v)
