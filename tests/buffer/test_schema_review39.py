"""Schema defects found by review 39: dtype specs numpy refuses with a ValueError."""

import pytest

from swarm.buffer import ReplayBuffer
from swarm.buffer.schema import Schema
from swarm.errors import ReplayError


@pytest.mark.parametrize("dtype", [{"names": ["a"]}, [("a", "f4", -1)], [("a", "f4"), ("a", "f4")],
                                   ("f4", -1)], ids=repr)
def test_a_dtype_numpy_refuses_with_a_value_error_is_a_replay_error(dtype):
    """Before: only np.dtype's TypeError was caught; these raised a raw ValueError, from
    ReplayBuffer(...) too."""
    with pytest.raises(ReplayError, match="schema field 'x': unknown dtype"):
        Schema({"x": (dtype, ())})
    with pytest.raises(ReplayError, match="schema field 'x': unknown dtype"):
        ReplayBuffer({"x": (dtype, ())}, 4)
