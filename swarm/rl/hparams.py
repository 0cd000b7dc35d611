"""Hyperparameters of the reference agents, as typed config (no torch here).

Kept apart from :mod:`swarm.rl.dqn` so that experiment specs can be loaded and
checked without importing torch.
"""

from __future__ import annotations

import functools
import math
import numbers
import sys
import typing
from dataclasses import dataclass, fields

from ..checks import nonneg
from ..config import opt
from ..errors import ConfigError

__all__ = ["DQNConfig"]


def _pos(x: float) -> bool:
    return x > 0


def _unit(x: float) -> bool:
    return 0.0 <= x <= 1.0


#: The widest hidden layer. A typo guard, not a memory check: a 2**40 width passed and
#: then failed in every peer, allocating terabytes (two layers this wide are 17 GB).
MAX_HIDDEN = 65536

#: The largest learning rate, a typo guard too: the benchmarks use 1e-3 to 2.4e-2, and
#: lr = 1e39 (for 1e-3) made every parameter NaN or infinite in the first update.
MAX_LR = 1.0


def _has_type(value: object, tp: object) -> bool:
    """Whether ``value`` fits the field annotation ``tp`` (numpy scalars count as numbers)."""
    if tp is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):   # a bool is an int to Python, but never a count or a rate here
        return False
    if tp is int:
        return isinstance(value, numbers.Integral)
    if tp is float:
        if isinstance(value, numbers.Integral) and abs(value) > sys.float_info.max:
            return False   # no float holds it (math.isfinite would raise OverflowError)
        return isinstance(value, numbers.Real) and math.isfinite(value)
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        return isinstance(value, (list, tuple)) and all(_has_type(v, item) for v in value)
    return True


@dataclass
class DQNConfig:
    """DQN with double Q-learning, a target network and prioritized replay."""

    hidden: list[int] = opt([64, 64], f"hidden layer widths of the Q-network MLP, each at most {MAX_HIDDEN}",
                            lambda h: len(h) >= 1 and all(0 < w <= MAX_HIDDEN for w in h),
                            f"must be a non-empty list of positive widths, each at most {MAX_HIDDEN}")
    # The defaults favour a stable learner over a fast one. On CartPole-v1, lr 4e-3 with
    # tau 0.06 solved seeds 0-4 in 8k, 8k, 4k, 5k, 7k env steps (16k, 11k, 6k on seeds
    # 0-2 with these), but a 4-peer `swarm run` with them fell from 500 back to about 20
    # by 20k steps (scripts/bench_learning.py tunes each side for time to solve).
    lr: float = opt(1e-3, "Adam learning rate", lambda x: 0 < x <= MAX_LR,
                    f"must be > 0 and at most {MAX_LR:g} (a typo guard)")
    gamma: float = opt(0.99, "discount factor", lambda g: 0.0 <= g < 1.0, "must be in [0, 1)")
    batch_size: int = opt(64, "transitions per update", _pos, "must be > 0")
    learning_starts: int = opt(1000, "env steps before the first update. Acting is epsilon-greedy "
                                     "throughout: epsilon falls from step 0 (eps_steps), not from here, so "
                                     "some actions before the first update are the untrained net's greedy ones",
                               nonneg, "must be >= 0")
    train_every: int = opt(1, "env steps between updates (with gossip.exchange = gradients: between this "
                              "peer's turns at computing a gradient)", _pos, "must be > 0")
    updates_per_train: int = opt(1, "gradient steps each time an update is due (with gossip.exchange = "
                                    "gradients: in each of this peer's turns, each one relayed)", _pos,
                                 "must be > 0")
    double: bool = opt(True, "double DQN: the online net picks the next action, the target net values it")
    # Polyak averaging every update. A hard copy every 250 updates took 17k-22k env
    # steps on CartPole-v1 where tau 0.01 took 5k-16k; at this lr, 0.06 was faster
    # (14k, 11k, 8k, 8k, 12k) and 0.12 solved 1 seed of 5 (the protocol of
    # scripts/bench_learning.py: greedy 5-episode mean >= 475, every 1000 steps). At
    # lr 4e-3, 0.12 is the fastest of 0.06, 0.12 and 0.2 (the benchmark's setting).
    tau: float = opt(0.01, "target update rate: 1.0 copies (hard update), < 1 is Polyak averaging",
                     lambda t: 0.0 < t <= 1.0, "must be in (0, 1]")
    target_every: int = opt(1, "updates between target-network updates", _pos, "must be > 0")
    huber_delta: float = opt(1.0, "Huber loss threshold", _pos, "must be > 0")
    max_grad_norm: float = opt(10.0, "gradient clipping norm; 0 disables", nonneg, "must be >= 0")
    eps_start: float = opt(1.0, "initial exploration rate", _unit, "must be in [0, 1]")
    eps_end: float = opt(0.05, "final exploration rate", _unit, "must be in [0, 1]")
    eps_steps: int = opt(5_000, "env steps over which epsilon falls linearly to eps_end", _pos, "must be > 0")
    beta_start: float = opt(0.4, "initial importance-sampling exponent", _unit, "must be in [0, 1]")
    beta_steps: int = opt(50_000, "env steps over which beta rises linearly to 1", _pos, "must be > 0")

    def __post_init__(self) -> None:
        # A config built in Python (or by dataclasses.replace) gets the checks that
        # swarm.config.from_dict runs on a file's keys: a zero eps_steps or target_every
        # would otherwise surface as a ZeroDivisionError deep inside training.
        self._check_fields()

    def _check_fields(self, prefix: str = "") -> None:
        """Each field's type and its ``opt`` check; raises :class:`ConfigError` naming the field,
        and changes nothing. When all pass, numpy scalars and tuples are stored as the plain
        int, float and list that a config file gives (load_spec and to_toml take only those)."""
        hints = _hints()
        plain = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if not _has_type(value, hints[f.name]):
                raise ConfigError(f"{prefix}{f.name} = {value!r}: expected {_expected(hints[f.name])}")
            check = f.metadata.get("check")
            if check is not None and not check(value):
                raise ConfigError(f"{prefix}{f.name} = {value!r}: {f.metadata.get('why') or 'is not allowed'}")
            plain[f.name] = _plain(value, hints[f.name])
        for name, value in plain.items():
            setattr(self, name, value)

    def check(self, prefix: str = "") -> None:
        """Every field's check (again: a field may have been assigned since the config
        was built), then the cross-field checks that a single field's check cannot see.

        ``prefix`` (e.g. ``"dqn."``) makes the error name the full key when this
        config sits inside a larger one. (Not named ``validate``, which
        :func:`swarm.config.from_dict` would call without the prefix.)
        """
        self._check_fields(prefix)
        if self.eps_end > self.eps_start:
            raise ConfigError(f"{prefix}eps_end = {self.eps_end} is above {prefix}eps_start = "
                              f"{self.eps_start}; epsilon only falls")


@functools.cache
def _hints() -> dict[str, object]:
    # The annotations are strings (from __future__ import annotations): resolve them once.
    return typing.get_type_hints(DQNConfig)


def _plain(value: object, tp: object) -> object:
    """``value`` (already checked against ``tp``) as the plain Python type ``tp`` names."""
    if tp is int:
        return int(value)
    if tp is float:
        return float(value)
    if typing.get_origin(tp) is list:
        (item,) = typing.get_args(tp)
        return [_plain(v, item) for v in value]
    return value


def _expected(tp: object) -> str:
    names = {bool: "true or false", int: "an integer", float: "a finite number", list[int]: "a list of integers"}
    return names.get(tp, str(tp))
