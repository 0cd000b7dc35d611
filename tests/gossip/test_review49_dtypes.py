"""Memory formats and `flat_parameters` (the forty-ninth session's review of model structures)."""

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from swarm.gossip import flat_parameters, is_flat


def test_a_channels_last_weight_is_laid_out_row_major_with_a_warning_naming_it():
    # flat_parameters put a channels_last weight back into the default format without a
    # word; the values were right, the memory format the user asked for was gone.
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 1)).to(memory_format=torch.channels_last)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.warns(UserWarning, match=r"'0\.weight'.*channels_last"):
        x = flat_parameters(m)
    assert is_flat(m, x)
    for k, v in m.state_dict().items():
        assert torch.equal(v, before[k])
    assert m[0].weight.is_contiguous()


def test_a_model_in_the_default_format_is_not_warned_of():
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Linear(4, 2))
    m.add_module("t", nn.Linear(3, 3))
    m.t.weight = nn.Parameter(m.t.weight.detach().t())   # non-contiguous, not channels_last
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        flat_parameters(m)


@pytest.mark.parametrize("move", ["channels_last", "to_empty"])
def test_the_documented_unlinking_operations_unlink(move):
    # The docs named ".to() another dtype or device" only: a channels_last conversion (same
    # dtype, same device) and to_empty() give new storage too, and gossip stops reaching
    # the model.
    m = nn.Conv2d(3, 8, 3)
    x = flat_parameters(m)
    if move == "channels_last":
        m.to(memory_format=torch.channels_last)
    else:
        m.to_empty(device="cpu")
        with torch.no_grad():
            m.weight.fill_(1.0)   # its new storage is uninitialised: it may hold zeros already
    assert not is_flat(m, x)
    x[:] = 0.0
    assert not bool((m.weight == 0).all())
    doc = is_flat.__doc__
    assert "memory format" in doc and "to_empty" in doc


def test_gossip_writes_reach_a_relaid_channels_last_model():
    m = nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        x = flat_parameters(m)
    x[:] = np.arange(x.size, dtype=np.float32)
    assert torch.equal(m.weight.reshape(-1), torch.arange(m.weight.numel(), dtype=torch.float32))
