import numpy as np
import pytest
import torch

from swarm.errors import SwarmError
from swarm.rl.flat import flatten_parameters, is_flat


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.ReLU(), torch.nn.Linear(5, 2))


def test_flatten_keeps_values_and_order():
    net = _net()
    before = [p.detach().clone() for p in net.parameters()]
    x = torch.randn(7, 3)
    out_before = net(x).detach()
    flat = flatten_parameters(net)
    assert flat.numel() == sum(p.numel() for p in before) == 3 * 5 + 5 + 5 * 2 + 2
    assert torch.equal(flat, torch.cat([b.reshape(-1) for b in before]))
    assert torch.equal(net(x), out_before)
    assert is_flat(net, flat)


def test_numpy_view_writes_reach_the_module():
    net = _net()
    vec = flatten_parameters(net).numpy()
    assert vec.dtype == np.float32 and vec.flags.c_contiguous
    vec[:] = 0.0
    assert torch.count_nonzero(net(torch.randn(4, 3))) == 0
    # The last 2 entries are the output bias: writing them sets the output.
    vec[-2:] = [1.5, -2.0]
    assert torch.allclose(net(torch.randn(4, 3)), torch.tensor([[1.5, -2.0]] * 4))


def test_optimizer_steps_move_the_flat_vector():
    net = _net()
    flat = flatten_parameters(net)
    before = flat.clone()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    net(torch.randn(8, 3)).pow(2).sum().backward()
    opt.step()
    assert not torch.equal(flat, before)
    assert is_flat(net, flat)


def test_load_state_dict_stays_flat_but_reassignment_is_detected():
    net, other = _net(), _net()
    flat = flatten_parameters(net)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    net.load_state_dict(other.state_dict())
    assert is_flat(net, flat)
    assert torch.equal(flat, torch.cat([p.detach().reshape(-1) for p in other.parameters()]))
    net[0].weight.data = torch.zeros(5, 3)
    assert not is_flat(net, flat)


def test_rejects_modules_it_cannot_flatten():
    with pytest.raises(SwarmError, match="no parameters"):
        flatten_parameters(torch.nn.ReLU())
    with pytest.raises(SwarmError, match="float64"):
        flatten_parameters(torch.nn.Linear(2, 2).double())
