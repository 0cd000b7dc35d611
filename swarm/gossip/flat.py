"""One contiguous float32 vector over a torch module's parameters (torch imported lazily)."""

from __future__ import annotations

import warnings
import weakref
from typing import Any

import numpy as np

from ..errors import ConfigError

__all__ = ["flat_parameters", "is_flat"]

# The vectors flat_parameters made, by the address of their first value: a second call on
# a module whose parameters still fill one of them in order returns it. Weak: an entry
# goes with its vector (the parameters' storage holds the vector while they live in it).
_vectors: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()


def flat_parameters(module: Any) -> np.ndarray:
    """Move every parameter of ``module`` into one contiguous float32 CPU buffer and
    return it as a numpy vector.

    Afterwards each ``p.data`` is a view into that vector (in ``module.parameters()``
    order), so the gossip engine's in-place updates are the model's parameters, and
    optimizer steps on the model are seen by the engine, with no copies either way.
    Call it before creating the optimizer (the parameter objects stay the same, only
    their storage moves). A lazy module (``LazyLinear``) needs one forward pass first:
    until then its parameters have no shape, and this raises
    :class:`~swarm.errors.ConfigError`. Called again on a module whose parameters still
    fill the vector in order, it returns that same vector and moves nothing.

    Only parameters are in the vector: buffers are not, so gossip never averages
    BatchNorm's running mean and variance (nor ``num_batches_tracked``), and each peer
    keeps the statistics of its own data. Peers whose data differ then give different
    outputs in ``eval()`` at the same parameters. Use GroupNorm or LayerNorm (they have
    no running statistics), or recompute the statistics on shared data before you
    evaluate (a few forward passes in ``train()`` mode).

    Shared memory: the vector is numpy's own memory, which torch only borrows, so
    nothing torch does to the parameters can free it under the vector. A module whose
    parameters are already shared (``model.share_memory()`` called first, as torch's
    Hogwild examples do) gets a vector in shared memory, which torch.multiprocessing
    children then share with this process. That is the order that works:
    ``model.share_memory()``, then ``flat_parameters(model)``, then the workers.
    ``share_memory()`` after this call, or handing the model to a child process before
    it was shared (which shares it), moves the parameters into new shared memory: the
    vector stays valid, but the model no longer reads it (:func:`is_flat` is then false).

    Each parameter lies in the vector in torch's default (row-major) layout: a weight in
    ``channels_last`` memory format comes back in the default format (its values
    unchanged; a warning names it), and ``.to(memory_format=torch.channels_last)``
    afterwards gives it new storage, outside the vector.

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
    x = next((_vectors.get(p.data_ptr()) for p in params if p.numel()), None)
    if x is not None and x.size == total and _in_order(params, x):
        return x
    if any(p.is_shared() for p in params):
        # torch's shared memory, which a later share_memory() or pickling leaves in place
        flat = torch.empty(total, dtype=torch.float32).share_memory_()
        x = flat.numpy()
    else:
        # numpy's memory: torch moving the storage (share_memory_) lets go of it, never frees it
        x = np.empty(total, np.float32)
        flat = torch.from_numpy(x)
    relaid = [name for name, p in module.named_parameters()
              if not p.is_contiguous() and p.dim() == 4 and p.is_contiguous(memory_format=torch.channels_last)]
    if relaid:
        warnings.warn(f"flat_parameters: {', '.join(map(repr, relaid))} in channels_last memory format "
                      f"now lie in the default format (values unchanged): the gossip vector holds "
                      f"each parameter row-major, and converting back would move it out of the vector",
                      stacklevel=2)
    off = 0
    with torch.no_grad():
        for p in params:
            k = p.numel()
            flat[off:off + k].copy_(p.reshape(-1))
            p.data = flat[off:off + k].view_as(p)
            off += k
    _vectors[x.ctypes.data] = x
    return x


def _in_order(params: list[Any], x: np.ndarray) -> bool:
    """Whether ``params`` fill ``x`` one after another, each contiguous, as
    :func:`flat_parameters` laid them out."""
    at = x.ctypes.data
    for p in params:
        if p.numel() == 0:   # no memory, and a data_ptr of 0
            continue
        if not p.is_contiguous() or p.data_ptr() != at:
            return False
        at += p.numel() * 4
    return at == x.ctypes.data + x.nbytes


def is_flat(module: Any, x: Any) -> bool:
    """True when every parameter of ``module`` still lives inside ``x``, the vector
    :func:`flat_parameters` returned (a numpy array, or a torch tensor of it).

    Gossip writes into ``x``; once a parameter has left it, the model no longer sees
    the averages, and the engine averages a vector the model does not read. Nothing
    raises when that happens. What moves parameters out: ``model.half()``,
    ``model.double()``, ``.to(...)`` another dtype, device or memory format
    (``memory_format=torch.channels_last``), ``model.to_empty(...)``,
    ``load_state_dict(..., assign=True)``, ``torch.nn.utils.vector_to_parameters``,
    assigning ``p.data = ...`` or a new ``Parameter``, and ``model.share_memory()``
    (or handing the model to a torch.multiprocessing child) on a model that was not
    shared before :func:`flat_parameters`. ``model.float()``, ``.to("cpu")``, plain
    ``load_state_dict``, ``reset_parameters()`` and optimizer steps write in place and
    keep it. Raises :class:`~swarm.errors.ConfigError` when ``module`` is not a torch
    module or ``x`` is neither a numpy array nor a tensor.

    >>> x = flat_parameters(model)
    >>> model.half()
    >>> is_flat(model, x)
    False
    """
    import torch  # noqa: PLC0415 - as in flat_parameters

    if not isinstance(module, torch.nn.Module):
        raise ConfigError(f"is_flat: module must be a torch.nn.Module, got {type(module).__name__}")
    if isinstance(x, np.ndarray):
        base, end = x.ctypes.data, x.ctypes.data + x.nbytes
    elif isinstance(x, torch.Tensor):
        base = x.data_ptr()
        end = base + x.numel() * x.element_size()
    else:
        raise ConfigError(f"is_flat: x must be the numpy vector flat_parameters returned (or a tensor "
                          f"of it), got {type(x).__name__}")
    for p in module.parameters():
        start = p.data_ptr()
        if p.numel() and not (base <= start and start + p.numel() * p.element_size() <= end):
            return False
    return True
