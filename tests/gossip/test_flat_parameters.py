"""flat_parameters on modules it cannot flatten: lazy modules whose parameters do not
exist yet raised torch's raw ValueError (from numel) instead of a ConfigError."""

from __future__ import annotations

import numpy as np
import pytest

from swarm.errors import ConfigError
from swarm.gossip import flat_parameters

torch = pytest.importorskip("torch")


def test_lazy_module_before_its_first_forward_is_a_config_error():
    # Before the fix: ValueError "Attempted to use an uninitialized parameter".
    m = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.LazyLinear(3))
    w = m[0].weight.data.clone()
    with pytest.raises(ConfigError, match="uninitialized.*forward"):
        flat_parameters(m)
    assert m[0].weight.data_ptr() != 0 and torch.equal(m[0].weight.data, w)  # nothing moved


def test_lazy_module_after_its_first_forward_flattens():
    m = torch.nn.LazyLinear(3)
    m(torch.ones(1, 4))
    x = flat_parameters(m)
    assert x.shape == (15,) and x.dtype == np.float32
    x[:] = 2.0
    assert float(m.weight.data.sum()) == 24.0   # the parameters are views of x
