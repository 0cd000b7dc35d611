import contextlib
import threading
from unittest import mock

import numpy as np
import pytest
import torch

from swarm.errors import ConfigError, SwarmError
from swarm.rl.flat import FlatAdam, flatten_gradients, flatten_parameters, is_flat


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


def test_backward_accumulates_into_the_flat_gradient():
    net, ref = _net(), _net()
    flatten_parameters(net)
    grad = flatten_gradients(net)
    x = torch.randn(8, 3)
    for _ in range(2):  # twice: autograd adds into the views, as into any existing .grad
        net(x).pow(2).sum().backward()
        ref(x).pow(2).sum().backward()
    assert torch.allclose(grad, torch.cat([p.grad.reshape(-1) for p in ref.parameters()]))
    assert all(p.grad.data_ptr() >= grad.data_ptr() for p in net.parameters())
    grad.zero_()
    assert all(torch.count_nonzero(p.grad) == 0 for p in net.parameters())


def test_flat_adam_takes_torch_adams_steps():
    net, ref = _net(), _net()
    flat = flatten_parameters(net)
    opt = FlatAdam(flat, flatten_gradients(net), lr=0.01)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.01, foreach=False)
    g = torch.Generator().manual_seed(1)
    for _ in range(25):
        x = torch.randn(8, 3, generator=g)
        opt.grad.zero_()
        net(x).pow(2).sum().backward()
        opt.step()
        ref_opt.zero_grad()
        ref(x).pow(2).sum().backward()
        ref_opt.step()
    want = torch.cat([p.detach().reshape(-1) for p in ref.parameters()])
    assert not torch.allclose(want, torch.cat([p.detach().reshape(-1) for p in _net().parameters()]))
    assert torch.allclose(flat, want, atol=1e-6)
    assert is_flat(net, flat)


def test_flat_adam_state_round_trip_and_foreign_state():
    net = _net()
    flat = flatten_parameters(net)
    opt = FlatAdam(flat, flatten_gradients(net), lr=0.01)
    net(torch.randn(4, 3)).sum().backward()
    opt.step()
    other = FlatAdam(flat.clone(), torch.zeros_like(flat), lr=0.01)
    other.load_state_dict(opt.state_dict())
    assert other.t == 1 and torch.equal(other.exp_avg, opt.exp_avg) and torch.equal(other.exp_avg_sq, opt.exp_avg_sq)
    torch_state = torch.optim.Adam(_net().parameters()).state_dict()
    with pytest.raises(SwarmError, match="not FlatAdam"):
        other.load_state_dict(torch_state)
    with pytest.raises(SwarmError, match="does not fit"):
        other.load_state_dict({"t": 3, "exp_avg": torch.zeros(2), "exp_avg_sq": torch.zeros(2)})
    assert other.t == 1  # a rejected state changes nothing
    with pytest.raises(SwarmError, match="1-D"):
        FlatAdam(torch.zeros(3, 2), torch.zeros(3, 2), lr=0.1)


def test_flat_adam_refuses_a_gradient_that_does_not_fit_and_changes_nothing():
    net = _net()
    flat = flatten_parameters(net)
    opt = FlatAdam(flat, flatten_gradients(net), lr=0.01)
    before = flat.clone()
    for bad in (np.zeros(flat.numel() + 1, np.float32), np.zeros(flat.numel(), np.float64)):
        with pytest.raises(SwarmError, match="FlatAdam.step"):
            opt.step(bad)
    assert opt.t == 0 and torch.equal(flat, before) and not opt.exp_avg.any()
    opt.step(np.ones(flat.numel(), np.float32))   # a numpy gradient, not the flat tensor's
    assert opt.t == 1 and not torch.equal(flat, before)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_flat_adam_refuses_a_non_finite_gradient_and_changes_nothing(bad):
    net = _net()
    flat = flatten_parameters(net)
    grad = flatten_gradients(net)
    opt = FlatAdam(flat, grad, lr=0.01)
    opt.step(np.ones(flat.numel(), np.float32))
    before = [x.clone() for x in (flat, opt.exp_avg, opt.exp_avg_sq)]
    g = np.ones(flat.numel(), np.float32)
    g[3] = bad
    with pytest.raises(SwarmError, match="NaN or infinite"):
        opt.step(g)
    grad[0] = bad                                 # the default: the flat gradient tensor
    with pytest.raises(SwarmError, match="NaN or infinite"):
        opt.step()
    assert opt.t == 1
    assert all(torch.equal(x, b) for x, b in zip((flat, opt.exp_avg, opt.exp_avg_sq), before))


def test_flat_adam_checks_a_whole_state_before_loading_any_of_it():
    net = _net()
    flat = flatten_parameters(net)
    opt = FlatAdam(flat, flatten_gradients(net), lr=0.01)
    opt.step(np.ones(flat.numel(), np.float32))
    good = opt.state_dict()
    n = flat.numel()
    bads = [
        ({**good, "t": "3"}, "t = '3'"),
        ({**good, "t": -1}, "t = -1"),
        ({**good, "exp_avg": torch.full((n,), float("nan"))}, "exp_avg has NaN"),
        ({**good, "exp_avg_sq": -torch.ones(n)}, "negative"),
        ({**good, "exp_avg_sq": torch.zeros(n + 1)}, "does not fit"),
        ([1, 2, 3], "not FlatAdam"),
    ]
    other = FlatAdam(flat.clone(), torch.zeros_like(flat), lr=0.01)
    for state, match in bads:
        with pytest.raises(SwarmError, match=match):
            other.load_state_dict(state)
        assert other.t == 0 and not other.exp_avg.any() and not other.exp_avg_sq.any()


def _decay_first_moment(flush: bool) -> float:
    """On a thread of its own: one Adam step with a small gradient at entry 0, then
    2,000 with a zero gradient; returns the first moment left at entry 0."""
    out = {}

    def work():
        params, grad = torch.zeros(8), torch.zeros(8)
        opt = FlatAdam(params, grad, lr=0.01)
        g = np.zeros(8, np.float32)
        g[0] = 1e-3
        opt.step(g)
        g[0] = 0.0
        for _ in range(2000):
            opt.step(g)
        out["m0"] = float(opt.exp_avg[0])

    t = threading.Thread(target=work)
    # the control: every step without the flush (its block a no-op), as before the flush
    with contextlib.nullcontext() if flush else mock.patch("swarm.rl.flat.flush_denormals", contextlib.nullcontext):
        t.start()
        t.join(timeout=60)
    assert not t.is_alive()
    return out["m0"]


@pytest.mark.skipif(not torch.set_flush_denormal(False), reason="this CPU cannot flush denormals")
def test_flat_adam_moments_decay_to_zero_not_to_a_stuck_denormal():
    # 0.9 times the smallest float32 denormal rounds back to it: without the flush
    # the moment of a parameter whose gradient stays zero sticks there, and every
    # later step does slow denormal arithmetic on it.
    tiny = np.finfo(np.float32).tiny
    stuck = _decay_first_moment(flush=False)
    assert 0.0 < stuck < tiny
    assert _decay_first_moment(flush=True) == 0.0


def test_flat_adam_refuses_a_gradient_whose_square_overflows_and_changes_nothing():
    # Only NaN and inf were refused: an entry of 1e20 squared past float32's range, made
    # exp_avg_sq inf for good (that parameter never moved again), and the optimizer's own
    # state_dict no longer loaded ("exp_avg_sq has NaN or infinite entries").
    net = _net()
    flat = flatten_parameters(net)
    opt = FlatAdam(flat, flatten_gradients(net), lr=0.01)
    opt.step(np.ones(flat.numel(), np.float32))
    before = [x.clone() for x in (flat, opt.exp_avg, opt.exp_avg_sq)]
    g = np.ones(flat.numel(), np.float32)
    g[3] = -1e20
    with pytest.raises(SwarmError, match="too large"):
        opt.step(g)
    assert opt.t == 1
    assert all(torch.equal(x, b) for x, b in zip((flat, opt.exp_avg, opt.exp_avg_sq), before))
    g[3] = 1e19                                   # just under the bound: taken, and the moments stay finite
    opt.step(g)
    assert opt.t == 2 and torch.isfinite(opt.exp_avg_sq).all()
    FlatAdam(flat.clone(), torch.zeros_like(flat), lr=0.01).load_state_dict(opt.state_dict())


@pytest.mark.parametrize("kw, match", [
    ({"lr": float("nan")}, "lr = nan"),
    ({"lr": float("inf")}, "lr = inf"),
    ({"lr": -1.0}, "lr = -1.0"),
    ({"lr": "0.1"}, "lr = '0.1'"),
    ({"betas": (1.0, 0.999)}, r"betas = \(1.0, 0.999\)"),
    ({"betas": (0.9, 1.0)}, r"betas = \(0.9, 1.0\)"),
    ({"betas": (-0.1, 0.999)}, r"betas = \(-0.1, 0.999\)"),
    ({"betas": (0.9, float("nan"))}, r"betas = \(0.9, nan\)"),
    ({"betas": 0.9}, "betas = 0.9"),
    ({"eps": 0.0}, "eps = 0.0"),
    ({"eps": -1e-8}, "eps = -1e-08"),
    ({"eps": float("nan")}, "eps = nan"),
])
def test_flat_adam_refuses_hyperparameters_that_make_its_steps_nan(kw, match):
    # FlatAdam took any lr, betas and eps: lr=nan made every parameter NaN, lr=-1 climbed
    # the gradient, eps=0 made NaN where a gradient entry was 0, and a beta of 1 raised
    # ZeroDivisionError in step() after t and the moments had changed.
    with pytest.raises(ConfigError, match=match):
        FlatAdam(torch.zeros(3), torch.zeros(3), **{"lr": 1e-3, **kw})


def test_flat_adam_takes_edge_hyperparameters_that_are_well_defined():
    """The hyperparameter checks refuse only what makes steps NaN: lr 0, betas of 0 and a
    tiny eps are well defined."""
    params = torch.ones(3)
    opt = FlatAdam(params, torch.zeros(3), lr=0, betas=(0.0, 0.0), eps=1e-12)   # lr 0: a frozen optimizer
    opt.step(np.array([0.5, 0.0, -0.5], np.float32))
    assert torch.equal(params, torch.ones(3)) and opt.t == 1


def test_flat_adam_refuses_a_state_of_another_dtype():
    # Only shape and finiteness were checked: a float64 exp_avg of 1e300 is finite, passed,
    # and copy_ stored it as inf; the next step made the parameter NaN.
    net = _net()
    flat = flatten_parameters(net)
    opt = FlatAdam(flat, flatten_gradients(net), lr=0.01)
    n = flat.numel()
    big = torch.zeros(n, dtype=torch.float64)
    big[0] = 1e300
    for state in ({"t": 5, "exp_avg": big, "exp_avg_sq": torch.ones(n)},
                  {"t": 5, "exp_avg": torch.zeros(n), "exp_avg_sq": big},
                  {"t": 5, "exp_avg": torch.zeros(n, dtype=torch.float64), "exp_avg_sq": torch.ones(n)}):
        with pytest.raises(SwarmError, match="float64; needs float32"):
            opt.load_state_dict(state)
        assert opt.t == 0 and not opt.exp_avg.any() and not opt.exp_avg_sq.any()


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_flatten_gradients_refuses_parameters_that_are_not_float32(dtype):
    # A float64 or bfloat16 module raised torch's own RuntimeError ("attempting to assign a
    # gradient with dtype 'float' ..."), after the first parameters had been given views.
    net = _net().to(dtype)
    with pytest.raises(ConfigError, match=f"parameter '0.weight' is {dtype}"):
        flatten_gradients(net)
    assert all(p.grad is None for p in net.parameters())


def test_flat_adam_step_refuses_a_gradient_that_is_not_a_numpy_array():
    # A list raised AttributeError ('list' object has no attribute 'shape'); a float32
    # torch tensor was refused with "dtype torch.float32; needs float32".
    net = _net()
    flat = flatten_parameters(net)
    opt = FlatAdam(flat, flatten_gradients(net), lr=0.01)
    before = flat.clone()
    for bad, name in (([0.0] * flat.numel(), "list"), (torch.ones(flat.numel()), "Tensor")):
        with pytest.raises(SwarmError, match=f"FlatAdam.step: the gradient is a {name}; needs a numpy"):
            opt.step(bad)
    assert opt.t == 0 and torch.equal(flat, before)


@pytest.mark.parametrize("eps", [1e-8, 1e-3])
def test_flat_adam_matches_torch_adam_where_eps_and_bias_correction_matter(eps):
    """Gradients from 1e-8 to 1 (ReLU-dead units get the tiny ones): where sqrt(v_hat) is
    about eps, eps decides the step, and the first steps are mostly bias correction. O(1)
    gradients and atol=1e-6 hid both (eps x 10 moves the tiny-gradient parameters here up to
    0.3 away from torch's). A resume halfway (a fresh FlatAdam loading the state) must go on
    with the same steps."""
    torch.manual_seed(0)
    n = 64
    p0 = torch.randn(n)
    flat, grad = p0.clone(), torch.zeros(n)
    opt = FlatAdam(flat, grad, lr=0.1, eps=eps)
    ref = torch.nn.Parameter(p0.clone())
    ref_opt = torch.optim.Adam([ref], lr=0.1, eps=eps, foreach=False)
    g = torch.Generator().manual_seed(1)
    scale = torch.logspace(-8, 0, n)
    for step in range(20):
        gv = torch.randn(n, generator=g) * scale
        if step == 10:
            state = opt.state_dict()
            opt = FlatAdam(flat, grad, lr=0.1, eps=eps)
            opt.load_state_dict(state)
        grad.copy_(gv)
        opt.step()
        ref.grad = gv.clone()
        ref_opt.step()
    tiniest = (flat - p0)[:8].abs()        # gradients of 1e-8 to 1e-7
    if eps == 1e-8:
        assert tiniest.min() > 0.1            # sqrt(v_hat) ~ |g|: steps of about lr
    else:
        assert tiniest.max() < 1e-3           # eps >> sqrt(v_hat): steps damped to ~lr |g| / eps
    assert (flat - ref.detach()).abs().max() < 1e-6   # |p| < 4: a few float32 ulps
    st = ref_opt.state[ref]
    assert opt.t == int(st["step"]) == 20
    # m sums gradients of both signs (it may cancel to ~0): its error is measured against |g|'s scale
    assert ((opt.exp_avg - st["exp_avg"]).abs() / scale).max() < 1e-6
    assert torch.allclose(opt.exp_avg_sq, st["exp_avg_sq"], rtol=1e-6, atol=0)
