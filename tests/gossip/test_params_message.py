"""A float32 vector the engine cannot gossip in place is refused naming the property
that fails (C-contiguous, writeable) and what to pass instead, and is left as it was."""

import numpy as np
import pytest

from swarm.errors import ConfigError
from swarm.gossip import Gossip
from swarm.gossip.sim import SimHub

PREFIX = r"^params must be a writeable 1-D contiguous float32 numpy array, got ndarray float32 shape \(10,\)"


def test_a_non_contiguous_params_is_told_to_pass_a_contiguous_copy():
    # it read "got ndarray float32 shape (10,)" alone, the same as for a read-only one,
    # so nothing said that the stride (not the dtype or shape) was wrong
    link = SimHub(topology="ring").add_many(1)[0]
    base = np.arange(20, dtype=np.float32)
    params = base[::2]
    with pytest.raises(ConfigError, match=PREFIX + r": it is not C-contiguous \(a strided view\); pass "
                                                   r"np.ascontiguousarray\(params\) and keep that array, "
                                                   r"which the engine updates in place$"):
        Gossip(link, params)
    assert np.array_equal(base, np.arange(20, dtype=np.float32))


def test_a_read_only_params_is_told_it_must_be_writeable():
    # it read "got ndarray float32 shape (10,)" alone, the same as for a strided one,
    # so nothing said that the engine needs to write into it
    link = SimHub(topology="ring").add_many(1)[0]
    params = np.arange(10, dtype=np.float32)
    params.flags.writeable = False
    with pytest.raises(ConfigError, match=PREFIX + r": it is read-only, and the engine writes the average into "
                                                   r"it in place; pass a writeable array \(params.copy\(\)\)$"):
        Gossip(link, params)
    assert np.array_equal(params, np.arange(10, dtype=np.float32)) and not params.flags.writeable
