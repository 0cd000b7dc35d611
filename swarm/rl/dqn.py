"""DQN with double Q-learning, a target network and prioritized replay.

The update rule is :meth:`DQNAgent.gradient` and reads top to bottom on one
screen, in the manner of CleanRL's ``dqn.py``; :meth:`DQNAgent.apply_gradient`
takes the optimizer step and the target update (split so that peers can apply
each other's gradients). Everything else here is plumbing (epsilon-greedy acting,
assembling transitions, checkpoints).

The Q-network's parameters live in one flat float32 tensor
(:func:`swarm.rl.flat.flatten_parameters`), exposed by :meth:`parameters` as a
numpy view that the gossip engine averages in place. Transitions go into the
replay buffer given to the constructor, which a peer may federate with its
neighbours; the agent only adds, samples and updates priorities.

    >>> from swarm.buffer import ReplayBuffer
    >>> buf = ReplayBuffer(schema=dqn_schema((4,)), capacity=50_000, alpha=0.6,
    ...                    eps=1e-6, decay=0.0, prioritized=True, seed=0)
    >>> agent = DQNAgent((4,), 2, buf, DQNConfig(), seed=0)
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Mapping
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..checks import MAX_GRAD, is_int, largest_abs
from ..errors import ConfigError, EncodedTooLarge, ReplayError, SwarmError
from ..peer.agent import BaseAgent, check_outcome
from .flat import FlatAdam, clip_norm_, flatten_gradients, flatten_parameters, flush_denormals, is_flat
from .hparams import DQNConfig

__all__ = ["DQNAgent", "QNetwork", "dqn_schema"]

log = logging.getLogger(__name__)

_F32_MAX = float(np.finfo(np.float32).max)


def dqn_schema(obs_shape: tuple[int, ...]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The replay schema DQN needs, for a buffer built outside the agent."""
    shape = tuple(int(d) for d in obs_shape)
    return {
        "obs": ("float32", shape),
        "action": ("int64", ()),
        "reward": ("float32", ()),
        "next_obs": ("float32", shape),
        "done": ("float32", ()),
    }


class QNetwork(nn.Module):
    """A small MLP from a flat observation to one Q-value per action."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: list[int]):
        super().__init__()
        if not (is_int(obs_dim) and obs_dim >= 1 and is_int(n_actions) and n_actions >= 1):
            raise ConfigError(f"obs_dim and n_actions must be ints >= 1, got {obs_dim!r:.40} and {n_actions!r:.40}")
        if not (isinstance(hidden, (list, tuple)) and all(is_int(h) and h >= 1 for h in hidden)):
            raise ConfigError(f"hidden must be a list of layer widths, ints >= 1, got {hidden!r:.80}")
        layers: list[nn.Module] = []
        width = int(obs_dim)
        for h in hidden:
            layers += [nn.Linear(width, int(h)), nn.ReLU()]
            width = int(h)
        layers.append(nn.Linear(width, int(n_actions)))
        self.net = nn.Sequential(*layers)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.flatten(1))


class DQNAgent(BaseAgent):
    """Epsilon-greedy DQN agent over a discrete action space.

    Args:
        obs_shape: shape of one observation (flattened for the MLP).
        n_actions: number of discrete actions.
        buffer: a replay buffer with the :func:`dqn_schema` fields
            (``add``, ``sample(n, beta)``, ``update_priorities``, ``len``).
        config: hyperparameters; defaults to :class:`DQNConfig`.
        seed: seeds exploration (and the network initialisation unless ``init_seed`` is given).
        init_seed: seeds the network initialisation. Peers of one swarm should pass the
            same value: averaging the parameters of independently initialised networks
            mixes unrelated hidden units (any permutation of a layer's units is the same
            function), so gossip would pull every peer towards a network that is none of
            them. From one initial network, averaging starts from agreement.
    """

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int, buffer: Any,
                 config: DQNConfig | None = None, seed: int = 0, init_seed: int | None = None):
        cfg = DQNConfig() if config is None else config
        if not isinstance(cfg, DQNConfig):
            raise ConfigError(f"config: expected a DQNConfig, got {type(cfg).__name__}; "
                              "build one with DQNConfig(...) or swarm.config.from_dict(DQNConfig, ...)")
        cfg.check()
        try:
            shape = tuple(obs_shape)
        except TypeError:
            raise ConfigError(f"obs_shape = {obs_shape!r}: expected a tuple of dimensions, e.g. (4,)") from None
        if not shape:   # what a Discrete observation space has
            raise ConfigError("obs_shape = (): the Q-network needs a vector; one-hot encode a Discrete observation")
        if not all(is_int(d) and d > 0 for d in shape):
            raise ConfigError(f"obs_shape = {obs_shape!r}: dimensions must be positive integers")
        if not (is_int(n_actions) and n_actions >= 1):
            raise ConfigError(f"n_actions = {n_actions!r}: need a whole number of actions, at least one")
        for name, value in (("seed", seed), ("init_seed", init_seed)):
            if value is not None and not (is_int(value) and 0 <= value < 2**64):   # torch.manual_seed's range
                raise ConfigError(f"{name} = {value!r}: must be an integer in [0, 2**64)")
        for name in ("add", "sample", "update_priorities", "__len__"):
            if not hasattr(buffer, name):
                raise ConfigError(f"buffer: {type(buffer).__name__} has no {name}(); "
                                  "pass a swarm.buffer.ReplayBuffer")
        self.cfg = cfg
        self.obs_shape = tuple(int(d) for d in shape)
        self._schema = dqn_schema(self.obs_shape)   # what gradient() checks each batch against
        self.n_actions = int(n_actions)
        self._check_schema(buffer)
        self.buffer = buffer
        self.rng = np.random.default_rng(seed)
        # Seed the initialisation without touching the caller's global torch RNG:
        # many agents may share one process in simulations.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed if init_seed is None else init_seed)
            self.q = QNetwork(int(np.prod(self.obs_shape)), self.n_actions, cfg.hidden)
        self.flat = flatten_parameters(self.q)
        self._vec = self.flat.numpy()
        self.target = copy.deepcopy(self.q)
        self.target.requires_grad_(False)
        # Flat too, so that a target update is one vector operation.
        self.target_flat = flatten_parameters(self.target)
        # Gradients in one vector too: clearing, clipping and the Adam step are a
        # few vector operations, not loops over the network's six tensors: for
        # networks this small, per-tensor overhead dominates (scripts/bench_dqn.py:
        # 0.86 ms per update at batch 128 against 1.16 with torch.optim.Adam and
        # clip_grad_norm_).
        self.grad = flatten_gradients(self.q)
        self._grad_vec = self.grad.numpy()
        self.optimizer = FlatAdam(self.flat, self.grad, cfg.lr)
        # Greedy acting in numpy, on views of the same parameters: one forward of a
        # small MLP on one observation costs ~10 us in numpy against ~65 in torch.
        self._layers = [(m.weight.detach().numpy(), m.bias.detach().numpy())
                        for m in self.q.net if isinstance(m, nn.Linear)]

        self.steps = 0      # env steps taken (calls to deliberate)
        self.updates = 0    # gradient steps taken (own and, with publish, other peers')
        #: Set by a peer that shares gradients (swarm.gossip.GradientRelay.publish): called
        #: with each gradient this agent computes; returns the vector to apply, which is
        #: what the other peers apply when they receive it. They feed theirs to
        #: apply_gradient(). Called with None when this agent takes no update at a step
        #: where it learns (too little data, a rate limiter, a non-finite gradient): the
        #: others then do not wait for one. A gradient it refuses with EncodedTooLarge
        #: (nothing sent) is passed so too, and counted in skipped and refused.
        self.publish: Callable[[np.ndarray | None], np.ndarray | None] | None = None
        #: Trains at the steps where steps % train_every == phase; peers that share
        #: gradients take turns by rank.
        self.phase = 0
        self.skipped = 0    # updates not taken for a non-finite loss or gradient (with publish: passed)
        self.refused = 0    # of them, gradients publish refused (EncodedTooLarge; first one logged)
        self.unusable = 0   # sampled items no update could learn from (see _unusable), left out
        self._obs: np.ndarray | None = None
        self._action: int | None = None
        self._pending: tuple[np.ndarray, int, float] | None = None  # (obs, action, reward) awaiting next obs
        self._loss_sum = 0.0
        self._td_sum = 0.0
        self._q_sum = 0.0
        self._n_logged = 0

    @classmethod
    def for_env(cls, env: Any, buffer: Any, config: DQNConfig | None = None, seed: int = 0,
                init_seed: int | None = None) -> "DQNAgent":
        """Build an agent sized for a Gymnasium env with a Discrete action space and a Box
        observation space of at least one dimension."""
        n = getattr(env.action_space, "n", None)
        if n is None:
            raise ConfigError(f"env action space {env.action_space} is not Discrete; DQN needs discrete actions")
        if int(getattr(env.action_space, "start", 0)) != 0:
            # its actions are the indices 0..n-1 of its Q-values, sent to the env as they are
            raise ConfigError(f"env action space {env.action_space} does not start at 0; DQN needs actions "
                              "0..n-1 (wrap the env to shift them)")
        space = env.observation_space
        shape = getattr(space, "shape", None)
        if not shape or 0 in shape:   # None: a Tuple or Dict space; (): a Discrete one
            hint = "; one-hot encode a Discrete observation" if shape == () else ""
            raise ConfigError(f"env observation space {space} is not a Box of at least one dimension, none of "
                              f"them 0; DQN needs observations that are arrays of numbers{hint}")
        return cls(shape, int(n), buffer, config, seed, init_seed)

    # ------------------------------------------------------------ the update rule

    def update(self, batch: dict[str, torch.Tensor], weights: torch.Tensor) -> tuple[float, torch.Tensor]:
        """One gradient step on a batch; returns (loss, per-item TD errors)."""
        with flush_denormals():   # the update's arithmetic, not the caller's after it (as learn)
            loss, td_error = self.gradient(batch, weights)
            self.apply_gradient()
        return loss, td_error

    def gradient(self, batch: dict[str, torch.Tensor], weights: torch.Tensor) -> tuple[float, torch.Tensor]:
        """The clipped gradient of the loss on a batch, left in :attr:`grad`; returns (loss, TD errors).

        ``batch`` holds N >= 1 items as tensors of the :func:`dqn_schema` dtypes and shapes
        (``action`` any integer dtype, in ``[0, n_actions)``); ``weights`` is float32 of
        shape ``(N,)``. Anything else raises :class:`ReplayError`, naming the field, and
        changes nothing. NaN and infinite values pass: a finite loss is :meth:`learn`'s check.
        """
        self._check_batch(batch, weights)
        cfg = self.cfg
        obs, actions, rewards = batch["obs"], batch["action"].long(), batch["reward"]
        next_obs, dones = batch["next_obs"], batch["done"]
        with torch.no_grad():
            if cfg.double:  # online net picks the action, target net values it
                next_actions = self.q(next_obs).argmax(dim=1, keepdim=True)
                next_q = self.target(next_obs).gather(1, next_actions).squeeze(1)
            else:
                next_q = self.target(next_obs).max(dim=1).values
            td_target = rewards + cfg.gamma * (1.0 - dones) * next_q
        q_taken = self.q(obs).gather(1, actions.unsqueeze(1)).squeeze(1)
        td_error = td_target - q_taken
        # Importance weights undo the bias of prioritized sampling.
        elementwise = F.huber_loss(q_taken, td_target, reduction="none", delta=cfg.huber_delta)
        loss = (weights * elementwise).mean()

        self.grad.zero_()
        loss.backward()
        if cfg.max_grad_norm > 0:  # scale the whole gradient down to the norm, never up
            clip_norm_(self.grad, cfg.max_grad_norm)
        loss_value = loss.item()
        self._log(loss_value, td_error, q_taken)
        return loss_value, td_error.detach()

    def apply_gradient(self, grad: torch.Tensor | np.ndarray | None = None) -> None:
        """One optimizer step with ``grad`` (default: what :meth:`gradient` left), then the target update.

        Raises :class:`SwarmError`, and changes nothing, for a gradient that is not a
        vector of this network's size or that has a NaN or infinite entry.
        """
        if grad is not None:   # a float32 numpy vector goes in as it is; anything else is copied to one
            try:
                grad = grad.detach().cpu().numpy() if isinstance(grad, torch.Tensor) else grad
                grad = np.asarray(grad)
            except (TypeError, ValueError, RuntimeError):
                raise SwarmError(f"apply_gradient: a {type(grad).__name__} is not a gradient vector") from None
            if grad.dtype.kind not in "fiu":
                raise SwarmError(f"apply_gradient: gradient of dtype {grad.dtype}; needs real numbers")
            if grad.size != self._vec.size:
                raise SwarmError(f"apply_gradient: gradient of {grad.size} values; this network has "
                                 f"{self._vec.size} parameters")
            grad = grad.astype(np.float32, copy=False).reshape(-1)
        self.optimizer.step(grad)   # refuses NaN and Inf before it changes anything
        self.updates += 1
        if self.updates % self.cfg.target_every == 0:
            self._update_target()

    def learn(self) -> float | None:
        """Sample the buffer, take one update, feed TD errors back as priorities.

        The update flushes denormals to zero (:class:`swarm.rl.flat.flush_denormals`:
        Adam's moments of dead units slow every step otherwise); the calling thread
        has its own floating-point mode back when it returns.
        """
        with flush_denormals():
            return self._learn()

    def _learn(self) -> float | None:
        can_sample = getattr(self.buffer, "can_sample", None)  # a rate limiter may hold updates back
        if len(self.buffer) < self.cfg.batch_size or (can_sample is not None
                                                       and not can_sample(self.cfg.batch_size)):
            self._pass()
            return None
        sample = self.buffer.sample(self.cfg.batch_size, beta=self.beta)
        items, weights = sample.batch, np.asarray(sample.weights, dtype=np.float32)
        a, d, bad = items["action"], items["done"], None
        # The usual batch costs four reductions here: the full check runs only when they or
        # the loss say something is wrong (~10 us against a learn's ~450). Every done is 0
        # or 1 when as many are non-zero (NaN included) as equal 1.
        if (0 <= np.minimum.reduce(a) and np.maximum.reduce(a) < self.n_actions
                and np.count_nonzero(d) == np.count_nonzero(d == 1)):
            loss, td = self._gradient_of(items, weights)
        else:
            loss = math.nan   # gather would raise for an action outside the Q-values
        ok = self._finite(loss)
        if not ok:
            bad = self._unusable(items)
            if bad is not None:
                # A neighbour's items pass the buffer's schema (dtypes, shapes) only: one
                # with an action outside this agent's range failed every update that drew
                # it, a NaN reward made each such update a skipped one, and a done of 0.5
                # scaled the bootstrap term. They take no part in this one (the loss, its
                # gradient and the logged means are the usable items') and are not drawn again.
                self.unusable += int(bad.sum())
                self._forget(np.asarray(sample.indices)[bad])
                if bad.all():
                    self._pass()
                    return None
                loss, td = self._gradient_of({k: v[~bad] for k, v in items.items()}, weights[~bad])
                ok = self._finite(loss)
        if not ok:
            # Finite items whose loss is not (values past what the network's float32 can
            # hold): stepping would make every parameter NaN, and the peers that share
            # gradients would refuse it. Skip it and count it.
            self.skipped += 1
            self._pass()
            return loss
        if self.publish is None:
            self.apply_gradient()
        else:  # the swarm shares this gradient; apply what the others will apply
            try:
                shared = self.publish(self._grad_vec)
            except EncodedTooLarge as e:
                # The relay sent nothing: what its codec would send decodes past MAX_GRAD
                # (error feedback adds its residual, QSGD rounds up). Passed, as a skipped
                # update; any other refusal (a relay of another size, a bad clock) goes up.
                if not self.refused:
                    log.warning("a gradient the relay refused is passed (counted as skipped): %s", e)
                self.refused += 1
                self.skipped += 1
                self._pass()
                return loss
            self.apply_gradient(shared)
        keep = slice(None) if bad is None else ~bad   # td has the usable items' errors only
        self.buffer.update_priorities(np.asarray(sample.indices)[keep], td.abs().numpy())
        return loss

    def _check_batch(self, batch: Any, weights: Any) -> None:
        # O(1) but for one min/max of the actions: this runs at every update. Torch would
        # raise its own errors for most misfits, after the forward; weights of shape (N, 1)
        # it would broadcast against the N losses into an N x N loss, and step on it.
        schema = self._schema
        if not isinstance(batch, Mapping):
            raise ReplayError(f"batch is a {type(batch).__name__}; expected a dict of tensors (dqn_schema's fields)")
        missing = [k for k in schema if not isinstance(batch.get(k), torch.Tensor)]
        if missing:
            raise ReplayError(f"batch {missing}: absent or not tensors; it needs every field of dqn_schema")
        n = len(batch["obs"]) if batch["obs"].dim() else 0
        if n == 0:
            raise ReplayError("batch has no items")
        for key, (dtype, shape) in schema.items():
            t = batch[key]
            if t.shape != (n, *shape):
                raise ReplayError(f"batch {key} has shape {tuple(t.shape)}; expected {(n, *shape)}")
            if dtype == "float32" and t.dtype != torch.float32:
                raise ReplayError(f"batch {key} is {t.dtype}; expected float32")
            if dtype == "int64" and (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool):
                raise ReplayError(f"batch {key} is {t.dtype}; expected integers")
        low, high = map(int, torch.aminmax(batch["action"]))   # ints: a tensor compare costs ~1.5 us
        if low < 0 or high >= self.n_actions:
            raise ReplayError(f"batch action {low if low < 0 else high} is outside this agent's "
                              f"[0, {self.n_actions})")
        if not (isinstance(weights, torch.Tensor) and weights.dtype == torch.float32 and weights.shape == (n,)):
            have = ((weights.dtype, tuple(weights.shape)) if isinstance(weights, torch.Tensor)
                    else type(weights).__name__)
            raise ReplayError(f"weights are {have}; expected a float32 tensor of shape ({n},), one per item")

    def _finite(self, loss: float) -> bool:
        """Whether the gradient :meth:`gradient` left, and its loss, may be stepped: finite,
        and no entry above :data:`swarm.checks.MAX_GRAD` (FlatAdam refuses those)."""
        return math.isfinite(loss) and largest_abs(self._grad_vec) <= MAX_GRAD

    def _gradient_of(self, items: dict[str, np.ndarray], weights: np.ndarray) -> tuple[float, torch.Tensor]:
        return self.gradient({k: torch.as_tensor(v) for k, v in items.items()}, torch.as_tensor(weights))

    def _forget(self, indices: np.ndarray) -> None:
        """Take ``indices`` out of sampling: :meth:`ReplayBuffer.forget`, or for a buffer
        without it (a test double) the lowest priority."""
        forget = getattr(self.buffer, "forget", None)
        if forget is not None:
            forget(indices)
        else:
            self.buffer.update_priorities(indices, np.zeros(indices.size))

    def _unusable(self, batch: dict[str, np.ndarray]) -> np.ndarray | None:
        """The items of a sampled batch that no update can learn from (an action outside
        ``[0, n_actions)``, a NaN or infinite reward or observation, a done other than 0
        or 1), as a mask; None when there is none (the usual case)."""
        a, d = batch["action"], batch["done"]
        bad = (a < 0) | (a >= self.n_actions) | ~np.isfinite(batch["reward"]) | ((d != 0) & (d != 1))
        for k in ("obs", "next_obs"):
            bad |= ~np.isfinite(batch[k].reshape(a.size, -1)).all(axis=1)
        return bad if bad.any() else None

    def _pass(self) -> None:
        """No update at this turn: tell the peers that share gradients (see publish)."""
        if self.publish is not None:
            self.publish(None)

    def _update_target(self) -> None:
        # tau = 1 copies (hard update); tau < 1 is Polyak averaging.
        self.target_flat.lerp_(self.flat, self.cfg.tau)

    # ------------------------------------------------------------ schedules

    def learns_at(self, step: int) -> bool:
        """Whether :meth:`deliberate` trains at env step ``step`` (from learning_starts,
        every train_every steps, at this agent's :attr:`phase`)."""
        c = self.cfg
        return step >= c.learning_starts and step % c.train_every == self.phase % c.train_every

    @property
    def epsilon(self) -> float:
        """Exploration rate now: linear from eps_start to eps_end over eps_steps."""
        c = self.cfg
        frac = min(1.0, self.steps / c.eps_steps)
        return c.eps_start + frac * (c.eps_end - c.eps_start)

    @property
    def beta(self) -> float:
        """Importance-sampling exponent now: linear from beta_start to 1."""
        c = self.cfg
        frac = min(1.0, self.steps / c.beta_steps)
        return c.beta_start + frac * (1.0 - c.beta_start)

    # ------------------------------------------------------------ BaseAgent

    def perceive(self, observations: Any) -> None:
        obs = self._check_obs(observations)
        if self._pending is not None:
            self._store(*self._pending, obs, done=0.0)
            self._pending = None
        self._obs = obs
        # An action not reflected on is dropped: its outcome would be learnt from this
        # observation, not the one it was taken on (acting-only loops skip reflect()).
        self._action = None

    def deliberate(self) -> int:
        if self._obs is None:
            raise SwarmError("deliberate() before perceive(): the agent has no observation yet")
        # Acting again would take an env step whose transition overwrites the waiting one.
        if self._pending is not None:
            raise SwarmError("deliberate() before perceive(): the last transition waits for the next "
                             "observation; call perceive(obs) after each step (or pass next_observations "
                             "to reflect())")
        if self._action is not None:
            raise SwarmError("deliberate() before reflect(): the last action's outcome is not in; "
                             "call reflect(reward, terminal) after each step")
        cfg = self.cfg
        if self.learns_at(self.steps):
            for _ in range(cfg.updates_per_train):
                self.learn()
        if self.rng.random() < self.epsilon:
            action = int(self.rng.integers(self.n_actions))
        else:
            action = self._greedy(self._obs)   # checked by perceive()
        self.steps += 1
        self._action = action
        return action

    def reflect(self, reward: float, terminal: bool, *, truncated: bool = False,
                next_observations: Any = None) -> None:
        if self._obs is None or self._action is None:
            raise SwarmError("reflect() before deliberate(): there is no action to learn from")
        reward = check_outcome(reward, terminal, truncated)   # a finite real; bool flags
        if abs(reward) > _F32_MAX:   # stored as float32: inf, and every update that drew it skipped
            raise SwarmError(f"reflect(reward={reward!r}): past float32's largest value {_F32_MAX:.8g}, "
                             "which the replay buffer stores rewards in")
        # Everything is checked before anything changes: a refused call can be retried.
        nxt = None if next_observations is None else self._check_obs(next_observations)
        if truncated and not terminal and nxt is None:
            raise SwarmError("reflect(truncated=True) needs next_observations: the value of the state "
                             "where the episode was cut off still counts")
        obs, action = self._obs, self._action
        if terminal:
            # Next state is masked out by done=1, so any placeholder does.
            self._store(obs, action, reward, obs if nxt is None else nxt, done=1.0)
            self._obs = None
        elif nxt is not None:
            self._store(obs, action, reward, nxt, done=0.0)
            # After a cut-off the next perceive() starts a new episode.
            self._obs = None if truncated else nxt
        else:
            self._pending = (obs, action, reward)
        self._action = None

    def act(self, observations: Any) -> int:
        return self._greedy(self._check_obs(observations))

    def _greedy(self, obs: np.ndarray) -> int:
        x = obs.reshape(-1)
        for i, (w, b) in enumerate(self._layers):   # QNetwork's forward: Linear, ReLU, ..., Linear
            x = w @ x + b
            if i < len(self._layers) - 1:
                np.maximum(x, 0.0, out=x)
        return int(x.argmax())

    def parameters(self) -> np.ndarray:
        return self._vec

    def on_parameters_changed(self) -> None:
        if not is_flat(self.q, self.flat):
            raise SwarmError("the Q-network's parameters no longer live in the gossip vector "
                             "(was the module moved or its parameters replaced?)")

    def sync_target(self) -> None:
        """Make the target network a copy of the online one (a hard update).

        For a driver that replaced the online network wholesale from outside, as
        :meth:`Gossip.bootstrap <swarm.gossip.Gossip.bootstrap>` does for a late
        joiner: the target would otherwise stay the network this agent had before
        (for a fresh peer, the untrained one), and the first updates would pull Q
        back towards ``r + γ·Q_old``. Not after ordinary gossip rounds: averaging
        moves the online network a little at a time, and the target is meant to
        follow it slowly (``tau``, ``target_every``).
        """
        self.on_parameters_changed()   # the online network must still be the gossip vector
        with torch.no_grad():
            self.target_flat.copy_(self.flat)

    def state_dict(self) -> dict[str, Any]:
        return {
            "q": self.q.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "steps": self.steps,
            "updates": self.updates,
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load a :meth:`state_dict`. Every entry is checked before any is loaded, so a
        checkpoint that does not fit (another network, a NaN, a torn entry) changes nothing
        and raises :class:`ConfigError`: every start that loads it would fail the same way."""
        if not isinstance(state, Mapping):
            raise ConfigError(f"DQN checkpoint is a {type(state).__name__}, not a dict from state_dict()")
        missing = {"q", "target", "optimizer", "steps", "updates", "rng"} - set(state)
        if missing:
            raise ConfigError(f"DQN checkpoint lacks {sorted(missing)}")
        for name, net in (("q", self.q), ("target", self.target)):
            _check_module_state(name, net, state[name])
        try:
            self.optimizer.check_state_dict(state["optimizer"])
        except SwarmError as e:
            raise ConfigError(f"DQN checkpoint: {e}") from None
        for name in ("steps", "updates"):
            if not (is_int(state[name]) and state[name] >= 0):
                raise ConfigError(f"DQN checkpoint {name} = {state[name]!r}: must be a count >= 0")
        rng_kind = type(self.rng.bit_generator).__name__
        # numpy takes a float word (and truncates it): only integers pass
        if isinstance(state["rng"], Mapping) and not _rng_words(state["rng"]):
            raise ConfigError(f"DQN checkpoint rng is not a {rng_kind} state: its words must be integers")
        try:   # on a spare generator of the same kind: the agent's stays as it is
            type(self.rng.bit_generator)().state = state["rng"]
        except (TypeError, ValueError, KeyError, OverflowError):   # Overflow: a word out of its range
            raise ConfigError(f"DQN checkpoint rng is not a {rng_kind} state") from None
        # Module.load_state_dict copies into the existing tensors, so the parameters
        # stay inside the flat gossip vector.
        self.q.load_state_dict(state["q"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])
        self.updates = int(state["updates"])
        self.rng.bit_generator.state = state["rng"]

    def replica(self) -> tuple[dict[str, Any], list[np.ndarray]]:
        """What makes another agent's network take the same updates as this one from here:
        ``({"updates", "adam_t"}, [parameters, Adam's two moments, target parameters])``,
        copies (a :class:`~swarm.gossip.GradientRelay`'s ``state``). Parameters alone
        are not enough: the next Adam step depends on the moments, and the target
        network on what it followed."""
        opt = self.optimizer
        return ({"updates": self.updates, "adam_t": opt.t},
                [self._vec.copy(), opt.exp_avg.numpy().copy(), opt.exp_avg_sq.numpy().copy(),
                 self.target_flat.numpy().copy()])

    def load_replica(self, body: Any, arrays: Any) -> None:
        """Load what another agent's :meth:`replica` returned. Everything is checked
        first: a copy that does not fit raises :class:`SwarmError` and changes nothing."""
        if not (isinstance(body, Mapping) and isinstance(arrays, (list, tuple))):
            raise SwarmError(f"replica: expected a map and a list of arrays, got {type(body).__name__} "
                             f"and {type(arrays).__name__}")
        updates, t = body.get("updates"), body.get("adam_t")
        if not (is_int(updates) and updates >= 0 and is_int(t) and t >= 0):
            raise SwarmError(f"replica: updates = {updates!r} and adam_t = {t!r} must be counts >= 0")
        names = ("parameters", "exp_avg", "exp_avg_sq", "target")
        if len(arrays) != len(names):
            raise SwarmError(f"replica: {len(arrays)} arrays; expected {len(names)} ({', '.join(names)})")
        for name, a in zip(names, arrays):
            if not (isinstance(a, np.ndarray) and a.dtype == np.float32 and a.shape == self._vec.shape):
                shape = (a.dtype, a.shape) if isinstance(a, np.ndarray) else type(a).__name__
                raise SwarmError(f"replica: {name} is {shape}; this network needs float32 {self._vec.shape}")
            if not np.isfinite(a).all():
                raise SwarmError(f"replica: {name} has NaN or infinite entries")
        if (arrays[2] < 0).any():
            raise SwarmError("replica: exp_avg_sq has negative entries (it is a mean of squares)")
        p, m, v, target = arrays
        np.copyto(self._vec, p)   # in place: the parameters stay inside the flat vector
        np.copyto(self.optimizer.exp_avg.numpy(), m)
        np.copyto(self.optimizer.exp_avg_sq.numpy(), v)
        np.copyto(self.target_flat.numpy(), target)
        self.optimizer.t = int(t)
        self.updates = int(updates)

    def metrics(self) -> dict[str, float]:
        """Means since the last call (loss, |TD|, Q, over the batches whose loss was finite)
        plus epsilon and counters."""
        out = {"epsilon": self.epsilon, "updates": float(self.updates), "steps": float(self.steps),
               "skipped": float(self.skipped), "unusable": float(self.unusable)}
        if self._n_logged:
            n = self._n_logged
            out.update(loss=self._loss_sum / n, td_abs=self._td_sum / n, q_mean=self._q_sum / n)
            self._loss_sum = self._td_sum = self._q_sum = 0.0
            self._n_logged = 0
        return out

    # ------------------------------------------------------------ plumbing

    def _check_obs(self, observations: Any) -> np.ndarray:
        if np.iscomplexobj(observations):   # cast to float32, only the real part would be kept
            raise SwarmError(f"observation {observations!r:.80}: complex numbers; this agent takes real ones")
        try:
            obs = np.asarray(observations, dtype=np.float32)
        except (TypeError, ValueError):
            raise SwarmError(f"observation {observations!r:.80}: not an array of numbers") from None
        if obs.shape != self.obs_shape:
            raise SwarmError(f"observation has shape {obs.shape}; this agent was built for {self.obs_shape}")
        # One NaN stored in the replay would reach a batch and make every parameter NaN.
        if not np.isfinite(obs).all():
            raise SwarmError(f"observation has {np.count_nonzero(~np.isfinite(obs))} NaN or infinite "
                             "entries; nothing was stored")
        return obs

    def _check_schema(self, buffer: Any) -> None:
        """Refuse a buffer whose schema cannot hold this agent's transitions now, not at
        its first add (a buffer without a ``schema``, like a test double, is not checked)."""
        check = getattr(getattr(buffer, "schema", None), "check", None)
        if check is None:
            return
        zeros = np.zeros(self.obs_shape, np.float32)
        try:
            check(self._item(zeros, 0, 0.0, zeros, 0.0))
        except ReplayError as e:
            raise ConfigError(f"buffer: its schema does not fit this agent's transitions ({e}); "
                              f"build it with dqn_schema({self.obs_shape})") from None

    def _item(self, obs: np.ndarray, action: int, reward: float, next_obs: np.ndarray,
              done: float) -> dict[str, np.ndarray]:
        return {
            "obs": obs[None],
            "action": np.array([action], dtype=np.int64),
            "reward": np.array([reward], dtype=np.float32),
            "next_obs": next_obs[None],
            "done": np.array([done], dtype=np.float32),
        }

    def _store(self, obs: np.ndarray, action: int, reward: float, next_obs: np.ndarray, done: float) -> None:
        self.buffer.add(self._item(obs, action, reward, next_obs, done))

    def _log(self, loss: float, td: torch.Tensor, q: torch.Tensor) -> None:
        if not math.isfinite(loss):   # a batch learn() skips (or takes again without its bad items)
            return
        self._loss_sum += loss
        self._td_sum += float(td.detach().abs().mean())
        self._q_sum += float(q.detach().mean())
        self._n_logged += 1


def _rng_words(state: Any) -> bool:
    """Whether every word of a bit generator's ``state`` (nested maps, but for the
    ``bit_generator`` name) is an integer or an array of them; not a bool or a float."""
    if isinstance(state, Mapping):
        return all(k == "bit_generator" or _rng_words(v) for k, v in state.items())
    return is_int(state) or (isinstance(state, np.ndarray) and state.dtype.kind in "iu")


def _check_module_state(name: str, net: nn.Module, state: Any) -> None:
    """Raise :class:`ConfigError` unless ``state`` fits ``net`` (its keys, shapes and dtype)
    and is finite (a checkpoint of another network, or one holding NaN: every start would
    meet it again). Checked before loading: torch's own load copies tensor by tensor and
    stops at the first misfit, half loaded."""
    own = net.state_dict()
    if not isinstance(state, Mapping) or set(state) != set(own):
        keys = sorted(map(str, state)) if isinstance(state, Mapping) else type(state).__name__
        raise ConfigError(f"DQN checkpoint does not fit this network: {name} has {keys}, "
                          f"the network {sorted(own)}")
    for key, want in own.items():
        have = state[key]
        if not isinstance(have, torch.Tensor) or have.shape != want.shape:
            shape = tuple(have.shape) if isinstance(have, torch.Tensor) else type(have).__name__
            raise ConfigError(f"DQN checkpoint does not fit this network: {name}.{key} is {shape}, "
                              f"the network's {tuple(want.shape)}")
        if have.dtype != want.dtype:   # a float64 1e300 is finite, and loads as inf
            raise ConfigError(f"DQN checkpoint does not fit this network: {name}.{key} is {have.dtype}, "
                              f"the network's {want.dtype}")
        if not bool(torch.isfinite(have).all()):
            raise ConfigError(f"DQN checkpoint {name}.{key} has NaN or infinite entries")
