"""ReplayBuffer.update_priorities(td) and add(times=...) take real numbers only: numeric
strings and complex numbers are refused naming the argument, and nothing changes."""

import warnings

import numpy as np
import pytest
from swarmtest import Clock

from swarm.buffer import ReplayBuffer
from swarm.errors import ReplayError

SCHEMA = {"obs": ("float32", (2,)), "action": ("int64", ())}


def items(n):
    return {"obs": np.zeros((n, 2), np.float32), "action": np.arange(n, dtype=np.int64)}


def state(buf):
    """What a refused call must leave as it was."""
    return (len(buf), buf.total_added, buf._next_seq, buf.max_priority, buf._base,
            buf._tree.leaves.tolist(), buf._data["action"].tolist(), buf._time.tolist())


NOT_REAL = [
    pytest.param(["3", "2"], id="numeric-str-list"),
    pytest.param(np.array(["3", "2"]), id="numeric-str-array"),
    pytest.param([3 + 0j, 2 + 1j], id="complex-list"),
    pytest.param(np.array([3, 2], np.complex64), id="complex64-array"),
]


@pytest.mark.parametrize("td", NOT_REAL)
def test_update_priorities_refuses_td_that_is_not_real_numbers(td):
    # before: ["3", "2"] was parsed as 3.0 and 2.0, and a complex td lost its imaginary
    # part with only a ComplexWarning; both set priorities
    buf = ReplayBuffer(SCHEMA, 8, decay=0.1, seed=0, clock=Clock(), first_seq=0)
    idx = buf.add(items(2))
    before = state(buf)
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # no ComplexWarning on the way to the refusal
        with pytest.raises(ReplayError, match=r"^td must be real numbers \(ints or floats\)"):
            buf.update_priorities(idx, td)
    assert state(buf) == before


@pytest.mark.parametrize("times", NOT_REAL + [pytest.param("999", id="numeric-str"),
                                              pytest.param(999 + 0j, id="complex")])
def test_add_refuses_times_that_are_not_real_numbers(times):
    # before: "999" or ["3", "2"] became origin times, and a complex time lost its
    # imaginary part with only a ComplexWarning; the items were stored
    buf = ReplayBuffer(SCHEMA, 8, decay=0.1, seed=0, clock=Clock(), first_seq=0)
    buf.add(items(1))
    before = state(buf)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ReplayError, match=r"^times must be real numbers \(ints or floats\)"):
            buf.add(items(2), times=times)
    assert state(buf) == before


def test_real_numbers_of_every_kind_still_go_through():
    # the checks above must not refuse what worked: ints, floats, bools, numpy scalars
    clock = Clock()
    buf = ReplayBuffer(SCHEMA, 8, alpha=1.0, eps=1e-6, seed=0, clock=clock, first_seq=0)
    idx = buf.add(items(2), times=np.float32(990))
    buf.add(items(2), times=[995, 996])
    assert buf._time[:4].tolist() == [990.0, 990.0, 995.0, 996.0]
    assert buf.update_priorities(idx, [3, 2]) == 2
    assert buf.update_priorities(idx, np.array([1.5, 0.5], np.float32)) == 2
    assert buf.update_priorities(idx, [True, False]) == 2
