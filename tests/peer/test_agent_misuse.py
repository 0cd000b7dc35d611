"""BaseAgent as a user's own agent misuses it: what reflect() is given is checked
before anything changes (check_outcome), and a checkpoint that is not a dict is
refused with a SwarmError, not a TypeError from deep inside."""

from __future__ import annotations

import math

import numpy as np
import pytest

from swarm.errors import SwarmError
from swarm.peer import BaseAgent
from swarm.peer.agent import check_outcome


class Counting(BaseAgent):
    """A hand-written agent that keeps a running return and the episodes it saw end."""

    def __init__(self) -> None:
        self.obs = None
        self.total = 0.0
        self.episodes = 0

    def perceive(self, observations):
        self.obs = observations

    def deliberate(self):
        return 0

    def reflect(self, reward, terminal, *, truncated=False, next_observations=None):
        reward = check_outcome(reward, terminal, truncated)   # before anything changes
        self.total += reward
        self.episodes += bool(terminal or truncated)


@pytest.mark.parametrize(("args", "message"), [
    ((math.nan, False), r"reflect\(reward=nan\): the reward must be finite"),
    ((-math.inf, False), r"reward=-inf\): the reward must be finite"),
    ((np.float32("inf"), False), r"the reward must be finite"),
    ((10 ** 400, False), r"the reward must be finite"),
    ((np.array([1.0]), False), r"the reward must be a real number \(got type ndarray\)"),
    (("1.0", False), r"reward='1.0'\): the reward must be a real number \(got type str\)"),
    ((None, False), r"the reward must be a real number \(got type NoneType\)"),
    ((True, False), r"the reward must be a real number \(got type bool\)"),
    # read as true or false without a word, they decided whether the agent bootstraps
    ((1.0, "False"), r"reflect\(terminal='False'\): terminal must be True or False \(got type str\)"),
    ((1.0, None), r"terminal must be True or False \(got type NoneType\)"),
    ((1.0, 1), r"terminal must be True or False \(got type int\)"),
    ((1.0, np.array([True])), r"terminal must be True or False \(got type ndarray\)"),
    ((1.0, False, "yes"), r"reflect\(truncated='yes'\): truncated must be True or False"),
])
def test_check_outcome_refuses_what_reflect_cannot_learn_from(args, message):
    with pytest.raises(SwarmError, match=message):
        check_outcome(*args)


def test_check_outcome_takes_python_and_numpy_values():
    assert check_outcome(1, True) == 1.0 and type(check_outcome(1, True)) is float
    assert check_outcome(np.float32(-0.5), np.bool_(False), np.bool_(True)) == -0.5
    assert check_outcome(np.int64(3), False, truncated=True) == 3.0


def test_a_refused_reflect_changes_nothing_and_the_agent_goes_on():
    agent = Counting()
    agent.perceive(np.zeros(3))
    agent.deliberate()
    agent.reflect(1.0, False)
    for bad in [(math.nan, False), (1.0, "True"), (2.0, None)]:
        with pytest.raises(SwarmError):
            agent.reflect(*bad)
        assert (agent.total, agent.episodes) == (1.0, 0)
    agent.reflect(2.0, True)
    assert (agent.total, agent.episodes) == (3.0, 1)


def test_load_state_dict_refuses_what_is_not_a_dict():
    # a list or a number gave "TypeError: 'int' object is not iterable" (or, for a
    # string, "keeps no state but got keys ['a', 'b']")
    agent = Counting()
    for bad in [5, "ab", [("q", 1)], None]:
        with pytest.raises(SwarmError, match=r"Counting.load_state_dict: got a \w+, not the dict"):
            agent.load_state_dict(bad)
    agent.load_state_dict({})                      # what state_dict() returns
    with pytest.raises(SwarmError, match=r"keeps no state but got keys \['q'\]"):
        agent.load_state_dict({"q": 1})
