"""Reference agents on Gymnasium environments.

``DQNAgent`` (double DQN, target network, Huber loss, gradient clipping,
prioritized replay) and the plain single-process loop ``run_agent`` that
trains any :class:`swarm.peer.agent.BaseAgent` on a Gymnasium env.
"""

from .dqn import DQNAgent, QNetwork, dqn_schema
from .flat import flatten_parameters, is_flat
from .hparams import DQNConfig

__all__ = ["DQNAgent", "DQNConfig", "QNetwork", "dqn_schema", "flatten_parameters", "is_flat"]
