"""Real torch models through flat_parameters and the gossip engine (review 46).

flat_parameters returned a numpy view of a torch-allocated buffer: ``model.share_memory()``
(or handing the model to a torch.multiprocessing child) moved that storage into shared
memory and freed the block under the vector, which gossip then wrote into. Operations
that replace a parameter's storage unlinked the model silently, with no check in
swarm.gossip, and a second flat_parameters call moved the parameters away from the first
vector. New outbound streams began from an all-zero public copy, so peers that start from
one checkpoint were pushed apart by compressed first deltas. A neighbour with a model of
another size was refused every round with nothing above DEBUG in the log.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from multiprocessing import resource_tracker

import numpy as np
import pytest

from gossip.test_live import LiveSwarm
from swarm.errors import ConfigError
from swarm.gossip import Gossip, flat_parameters, is_flat

torch = pytest.importorskip("torch")
mp = pytest.importorskip("torch.multiprocessing")

pytestmark = pytest.mark.timeout(120)


def _mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


# ---------------------------------------------------------------- 1. shared memory


def test_share_memory_after_flat_parameters_leaves_x_valid_and_says_the_model_left_it():
    # Before: the block under x was freed and handed out again (x read back 7.0s), and
    # gossip's writes into x corrupted the heap.
    m = _mlp()
    x = flat_parameters(m)
    want = x.copy()
    m.share_memory()
    junk = [torch.full((x.size,), 7.0) for _ in range(20)] + [np.full(x.size, 7.0, np.float32) for _ in range(20)]
    np.testing.assert_array_equal(x, want)
    assert not is_flat(m, x)          # the model now reads shared memory, not x
    x[:] = 1.0                        # x is still its own memory to write
    assert all(bool((p != 1.0).any()) for p in m.parameters())
    del junk


def _child_writes(model: torch.nn.Module, seen: torch.Tensor) -> None:
    seen.copy_(model[2].bias.detach())
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(3.0)


def test_a_model_shared_before_flat_parameters_stays_in_x_across_processes():
    # torch's Hogwild order: share_memory(), then the vector, then the workers.
    m = _mlp()
    m.share_memory()
    x = flat_parameters(m)
    assert is_flat(m, x)
    x[:] = 2.0                        # a gossip round's write, seen by the child
    seen = torch.zeros(4).share_memory_()
    p = mp.get_context("spawn").Process(target=_child_writes, args=(m, seen))
    p.start()
    try:
        p.join(60)
        assert p.exitcode == 0
    finally:
        if p.is_alive():
            p.kill()
            p.join(10)
        # spawning started multiprocessing's resource tracker, a child of this process that
        # would outlive the test (test_api counts this worker's children after its runs)
        resource_tracker._resource_tracker._stop()
    assert torch.equal(seen, torch.full((4,), 2.0))
    assert is_flat(m, x)
    np.testing.assert_array_equal(x, np.full(x.size, 3.0, np.float32))   # the child's step is in x
    m.share_memory()                  # again: a no-op on shared storage
    assert is_flat(m, x)


# ---------------------------------------------------------------- 2. is_flat, a second call


@pytest.mark.parametrize("op", [
    lambda m: m.half(),
    lambda m: m.double(),
    lambda m: m.load_state_dict(_mlp(1).state_dict(), assign=True),
    lambda m: torch.nn.utils.vector_to_parameters(torch.zeros(sum(p.numel() for p in m.parameters())),
                                                  m.parameters()),
    lambda m: m.share_memory(),
], ids=["half", "double", "load_state_dict_assign", "vector_to_parameters", "share_memory"])
def test_is_flat_says_when_an_operation_unlinked_the_model(op):
    m = _mlp()
    x = flat_parameters(m)
    assert is_flat(m, x) and is_flat(m, torch.from_numpy(x))
    op(m)
    assert not is_flat(m, x) and not is_flat(m, torch.from_numpy(x))


@pytest.mark.parametrize("op", [
    lambda m: m.float(),
    lambda m: m.to("cpu"),
    lambda m: m.load_state_dict(_mlp(1).state_dict()),
    lambda m: m[0].reset_parameters(),
], ids=["float", "to_cpu", "load_state_dict", "reset_parameters"])
def test_is_flat_holds_after_operations_that_write_in_place(op):
    m = _mlp()
    x = flat_parameters(m)
    op(m)
    assert is_flat(m, x)


def test_is_flat_refuses_what_is_not_a_module_and_a_vector():
    m = _mlp()
    x = flat_parameters(m)
    with pytest.raises(ConfigError, match="is_flat: module"):
        is_flat(x, x)
    with pytest.raises(ConfigError, match="is_flat: x .*list"):
        is_flat(m, [0.0] * x.size)
    assert is_flat(m, x)


def test_flat_parameters_twice_returns_the_same_vector():
    # Before: the second call moved the parameters into a new buffer, and the first
    # vector, which a Gossip engine may hold, went stale.
    m = _mlp()
    x = flat_parameters(m)
    assert flat_parameters(m) is x
    assert is_flat(m, x)
    x[:] = 0.5
    assert all(bool((p == 0.5).all()) for p in m.parameters())
    # once unlinked, a call flattens again, into a new vector
    m.load_state_dict(_mlp(1).state_dict(), assign=True)
    y = flat_parameters(m)
    assert y is not x and is_flat(m, y) and not is_flat(m, x)
    np.testing.assert_array_equal(y, torch.cat([p.detach().reshape(-1) for p in _mlp(1).parameters()]).numpy())


# ---------------------------------------------------------------- 4. new streams start full


@pytest.mark.parametrize("codec", ["qsgd:4", "randomk:0.1", "ef+topk:0.1"])
def test_peers_starting_from_one_checkpoint_stay_there(codec):
    # Before: a new stream's first delta was C(x − 0), so each peer's copy of its
    # neighbours was a compressed x: randomk:0.1 moved the peers 42% of ||x|| away
    # from a checkpoint they all started from.
    base = _mlp()
    ckpt = flat_parameters(copy.deepcopy(base)).copy()

    async def main():
        async with LiveSwarm(3, "ring") as sw:
            models = [copy.deepcopy(base) for _ in sw.peers]
            xs = [flat_parameters(m) for m in models]
            engines = [Gossip(p, x, topology="ring", codec=codec, gamma="auto", round_timeout=10.0)
                       for p, x in zip(sw.peers, xs)]
            try:
                first = await asyncio.gather(*(g.round() for g in engines))
                rest = [await asyncio.gather(*(g.round() for g in engines)) for _ in range(9)]
            finally:
                for g in engines:
                    g.close()
            return xs, first, rest
    xs, first, rest = asyncio.run(main())
    for x in xs:
        np.testing.assert_allclose(x, ckpt, rtol=0, atol=1e-6)
    # one full state to each new receiver, then deltas only
    assert all(r.ok and r.full_sent == r.sent == 2 for r in first), first
    assert all(r.ok and r.full_sent == 0 for rs in rest for r in rs), rest


# ---------------------------------------------------------------- 5. models of different sizes


@pytest.mark.parametrize("codec", ["identity", "ef+topk:0.5"])
def test_a_neighbour_with_another_model_size_is_warned_of_once(codec, caplog):
    sizes = {"p00": 10, "p01": 12}

    async def main():
        async with LiveSwarm(2, "ring") as sw:
            xs = [np.ones(sizes[p.id], np.float32) for p in sw.peers]
            engines = [Gossip(p, x, topology="ring", codec=codec, round_timeout=0.5)
                       for p, x in zip(sw.peers, xs)]
            try:
                with caplog.at_level(logging.WARNING, logger="swarm.gossip.engine"):
                    res = [await asyncio.gather(*(g.round() for g in engines)) for _ in range(3)]
            finally:
                for g in engines:
                    g.close()
            return engines, res
    engines, res = asyncio.run(main())
    assert not any(r.ok for rs in res for r in rs)
    # counted; after the first refusal's nack (review 47) no more states come, so 1, or 2
    # where a second state left before the nack arrived
    assert all(1 <= g.stats.rejected_size <= 2 for g in engines)
    warned = [r.getMessage() for r in caplog.records
              if r.levelno == logging.WARNING and "values" in r.getMessage()]
    assert len(warned) == 2, warned
    assert any("'p01'" in w and "12 values" in w and "10" in w for w in warned), warned
    assert any("'p00'" in w and "10 values" in w and "12" in w for w in warned), warned
