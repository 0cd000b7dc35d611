"""The agent interface: what a peer drives, and what it gossips.

A peer does not know which algorithm runs on it. It drives an agent through
three calls per environment step and, between steps, reads and writes the
agent's parameters as one flat float32 vector (the gossip engine averages it in
place) and saves or restores the agent through ``state_dict``.

    agent.perceive(obs)              # what the agent sees now
    action = agent.deliberate()      # what it does (explores, may learn)
    obs, reward, done = sim.step(action)
    agent.reflect(reward, done)      # what came of it

This module stays free of torch so that a peer, a coordinator or a custom
simulator can import it cheaply; agents built on torch live in :mod:`swarm.rl`.
"""

from __future__ import annotations

import abc
from typing import Any

import numpy as np

from ..errors import SwarmError

__all__ = ["BaseAgent"]


class BaseAgent(abc.ABC):
    """Base class of every agent a peer can run.

    Subclasses implement :meth:`perceive`, :meth:`deliberate` and
    :meth:`reflect`. Agents that learn also override :meth:`parameters` (the
    vector the peer gossips), :meth:`state_dict`/:meth:`load_state_dict`
    (checkpoints) and usually :meth:`act` (greedy evaluation) and
    :meth:`metrics` (what the peer logs).

    Threading: the peer writes into :meth:`parameters` only *between* agent
    calls, never while :meth:`deliberate` or :meth:`reflect` runs, so agents
    need no lock of their own.

    Example, a hand-written agent with nothing to gossip::

        class Greedy(BaseAgent):
            def perceive(self, observations):
                self.obs = observations
            def deliberate(self):
                return int(self.obs[0] > 0)
            def reflect(self, reward, terminal, **kw):
                pass
    """

    @abc.abstractmethod
    def perceive(self, observations: Any) -> None:
        """Take in the current observation (after a reset or a step)."""

    @abc.abstractmethod
    def deliberate(self) -> Any:
        """Choose the action for the last perceived observation.

        May explore and may run learning updates; the peer counts one call as
        one environment step.
        """

    @abc.abstractmethod
    def reflect(self, reward: float, terminal: bool, *, truncated: bool = False,
                next_observations: Any = None) -> None:
        """Receive the outcome of the last action.

        ``terminal``: the episode ended in a terminal state (no bootstrapping).
        ``truncated``: it was cut off (time limit); the value of
        ``next_observations`` still counts, so pass the final observation then.
        Otherwise the next :meth:`perceive` supplies the next observation.
        """

    def act(self, observations: Any) -> Any:
        """The greedy action for ``observations``, without exploring or learning.

        Used for evaluation; agents that cannot evaluate need not override it.
        """
        raise NotImplementedError(f"{type(self).__name__} has no greedy policy (override act())")

    def parameters(self) -> np.ndarray:
        """The agent's learnable parameters as ONE contiguous float32 vector.

        The returned array must *share memory* with the model: the gossip engine
        writes averaged values into it in place and the model must see them at
        its next step. The same array object is returned on every call. An agent
        with nothing to learn returns an empty vector, and the peer skips gossip.
        """
        return _EMPTY

    def on_parameters_changed(self) -> None:
        """Called by the peer after gossip wrote into :meth:`parameters`.

        The default does nothing; an agent that caches anything derived from its
        parameters (a compiled policy, a target copy it wants in step) refreshes
        it here.
        """

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume this agent (for checkpoints)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        if state:
            raise SwarmError(f"{type(self).__name__} keeps no state but got keys {sorted(state)}")

    def metrics(self) -> dict[str, float]:
        """Scalars worth logging now (loss, epsilon, ...); empty by default."""
        return {}


_EMPTY = np.zeros(0, dtype=np.float32)
_EMPTY.flags.writeable = False
