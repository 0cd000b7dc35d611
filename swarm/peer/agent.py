"""The agent interface: what a peer drives, and what it gossips.

A peer does not know which algorithm runs on it. Whatever drives the agent
(``swarm peer`` and ``swarm run``, or your own loop beside a
:class:`~swarm.peer.SyncPeer`, as in ``examples/custom_simulator.py``) makes three
calls per environment step and, between steps, lets the gossip engine average the
agent's parameters in place, as one flat float32 vector; ``state_dict`` saves and
restores the agent.

    agent.perceive(obs)              # what the agent sees now
    action = agent.deliberate()      # what it does (explores, may learn)
    obs, reward, terminal = sim.step(action)
    agent.reflect(reward, terminal)  # what came of it (a time limit's cut: truncated=True)
    # every few steps, between agent calls:
    peer.call(gossip.round()); agent.on_parameters_changed()

This module stays free of torch so that a peer, a coordinator or a custom
simulator can import it cheaply; agents built on torch live in :mod:`swarm.rl`.
"""

from __future__ import annotations

import abc
import math
from typing import Any

import numpy as np

from ..checks import is_real
from ..errors import SwarmError

__all__ = ["BaseAgent", "check_outcome"]


class BaseAgent(abc.ABC):
    """Base class of every agent a peer can run.

    Subclasses implement :meth:`perceive`, :meth:`deliberate` and
    :meth:`reflect`. Agents that learn also override :meth:`parameters` (the
    vector the peer gossips), :meth:`state_dict`/:meth:`load_state_dict`
    (checkpoints) and usually :meth:`act` (greedy evaluation) and
    :meth:`metrics` (what the peer logs).

    Threading: gossip writes into :meth:`parameters` only inside
    :meth:`swarm.gossip.Gossip.round`, which the driver runs *between* agent calls
    (``SyncPeer.call`` blocks until the round is done), never while
    :meth:`deliberate` or :meth:`reflect` runs, so agents need no lock of their own.

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

        Implementations call :func:`check_outcome` before they change anything, so
        that a reward of NaN or a ``terminal`` of ``"False"`` is refused, not learnt.
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
        with nothing to learn returns an empty vector (the default): there is
        nothing to gossip, and :class:`~swarm.gossip.Gossip` refuses it
        (:class:`ConfigError`), so build no engine for it.
        """
        return _EMPTY

    def on_parameters_changed(self) -> None:
        """Called by the driver after gossip wrote into :meth:`parameters`.

        The default does nothing; an agent that caches anything derived from its
        parameters (a compiled policy, a target copy it wants in step) refreshes
        it here. It is called after every gossip round, so a copy meant to follow
        the parameters slowly (DQN's Polyak target) is not one of those; after a
        bootstrap replaced them wholesale the runner also calls
        :meth:`DQNAgent.sync_target <swarm.rl.DQNAgent.sync_target>`.
        """

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume this agent (for checkpoints)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        if not isinstance(state, dict):
            raise SwarmError(f"{type(self).__name__}.load_state_dict: got a {type(state).__name__}, "
                             f"not the dict that state_dict() returns")
        if state:
            raise SwarmError(f"{type(self).__name__} keeps no state but got keys {sorted(state)}")

    def metrics(self) -> dict[str, float]:
        """Scalars worth logging now (loss, epsilon, ...); empty by default."""
        return {}


def check_outcome(reward: Any, terminal: Any, truncated: Any = False) -> float:
    """Check the arguments of :meth:`BaseAgent.reflect`; returns ``reward`` as a float.

    ``reward`` must be a finite real number: one NaN in a replay batch makes every
    parameter NaN, and gossip spreads it to the neighbours. ``terminal`` and
    ``truncated`` must be bools (numpy's too): a ``"False"`` or a ``None`` would
    otherwise be read as true or false without a word, and decide whether the
    agent bootstraps. Raises :class:`SwarmError` naming the argument.

    >>> check_outcome(np.float32(-1.5), False)
    -1.5
    """
    if not is_real(reward):
        raise SwarmError(f"reflect(reward={reward!r:.80}): the reward must be a real number "
                         f"(got type {type(reward).__name__})")
    try:
        value = float(reward)
    except OverflowError:   # an int too large for a float
        value = math.inf
    if not math.isfinite(value):
        raise SwarmError(f"reflect(reward={reward!r:.80}): the reward must be finite")
    for name, flag in (("terminal", terminal), ("truncated", truncated)):
        if not isinstance(flag, (bool, np.bool_)):
            raise SwarmError(f"reflect({name}={flag!r:.80}): {name} must be True or False "
                             f"(got type {type(flag).__name__})")
    return value


_EMPTY = np.zeros(0, dtype=np.float32)
_EMPTY.flags.writeable = False
