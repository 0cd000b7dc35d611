"""Reference agents on Gymnasium environments.

``DQNAgent`` (double DQN, target network, Huber loss, gradient clipping,
prioritized replay) and the plain single-process loop ``run_agent`` that
trains any :class:`swarm.peer.agent.BaseAgent` on a Gymnasium env.

Names are imported on first use, so that ``swarm.rl.hparams`` (which experiment
specs read) does not pull in torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "DQNAgent": "dqn", "QNetwork": "dqn", "dqn_schema": "dqn",
    "flatten_parameters": "flat", "is_flat": "flat",
    "DQNConfig": "hparams",
    "run_agent": "train", "evaluate": "train", "make_env": "train", "RunResult": "train", "StepInfo": "train",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'swarm.rl' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
