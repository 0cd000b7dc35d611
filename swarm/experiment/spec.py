"""The experiment spec: one typed file that says what a run trains and how.

A spec is TOML or JSON; every key has a default, so a file holds only what it
changes, and ``--set a.b=v`` overrides apply on top. Loading checks every key and
value, and every error names the full key (``gossip.codec``, ``dqn.lr``). The
resolved spec is saved beside the results as ``config.json``, which loads back
as a spec.

    name = "cartpole-grid"
    peers = 9
    [gossip]
    topology = "grid"
    codec = "ef+topk:0.05"

    >>> spec = load_spec("grid.toml", ["dqn.lr=5e-4"])  # doctest: +SKIP
    >>> save_resolved(spec, run_dir)     # run_dir/config.json  # doctest: +SKIP
"""

from __future__ import annotations

import difflib
import functools
import importlib
import json
import os
import re
import sys
from dataclasses import InitVar, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

from ..checks import SEED_LIMIT, is_int, is_real, nonneg
from ..config import (MAX_MESSAGE_MB, MAX_ZMTP_S, PeerConfig, apply_overrides, from_dict, opt, read_file, to_dict,
                      to_toml)
from ..errors import ConfigError
from ..rl.hparams import DQNConfig

__all__ = [
    "Spec", "GossipSpec", "BufferSpec", "BudgetSpec", "EvalSpec", "CheckpointSpec", "LinkSpec",
    "DEFAULT_SPEC", "ALGORITHMS", "SYNC_MODES", "load_spec", "show_spec", "save_resolved", "swarm_dqn",
]

ALGORITHMS: tuple[str, ...] = ("dqn",)
SYNC_MODES: tuple[str, ...] = ("lockstep", "bounded", "async")

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

#: The most peers a spec runs: `swarm run` starts every peer on this host, each a
#: process with its own torch, so this is far more than one host holds, and it keeps
#: a typo (peers = 100000) from reaching the topology code and the launcher.
MAX_PEERS = 1024
#: The longest run name: the run folder is NAME-YYYYmmdd-HHMMSS[-N] (`swarm peer`:
#: NAME-peerRANK), and a file name has at most 255 bytes.
MAX_NAME = 200
#: The longest gossip.round_timeout_s. A neighbour silent for an hour is lost, not slow;
#: and far above it (about 9.2e9 s, threading.TIMEOUT_MAX) every peer's first round
#: failed with an OverflowError from its wait for the round.
MAX_ROUND_TIMEOUT_S = 3600.0


def _pos(x: Any) -> bool:
    return x > 0


@dataclass
class GossipSpec:
    """How peers average their parameters."""

    topology: str = opt("ring", "neighbour graph: ring, grid, torus, hypercube, exponential, "
                                "one_peer_exponential, random_pairing, full, custom")
    edges: list[list[int]] = opt([], "edge list [[i, j], ...] when topology = custom")
    # Top-15% (fp16 values: 8x fewer bytes than float32 state) at step 0.3 every 10 env
    # steps keeps a 4-peer CartPole ring together: with the benchmark's swarm DQN
    # settings (swarm_dqn below) they solved in 1k-5k steps each (docs/rl.md). Top-5% at
    # step 0.1 every 50 steps held them only loosely (9k-25k); top-1% at step 0.3 or 1.0
    # diverged.
    codec: str = opt("ef+topk:0.15:values=fp16", "codec of the parameter deltas, e.g. identity, fp16, "
                                                 "int8, topk:0.01, ef+topk:0.01 (error feedback)")
    sync: str = opt("bounded", "lockstep (wait for every neighbour), bounded (wait only when one is "
                               "more than max_staleness rounds behind) or async (never wait)")
    max_staleness: int = opt(4, "rounds a neighbour may lag before a bounded peer waits", nonneg,
                             "must be >= 0")
    interval: int = opt(10, "env steps between gossip rounds (local steps H); above budget.env_steps no round "
                            "runs (swarm run warns: the isolated baseline)", _pos, "must be > 0")
    step_size: float = opt(0.3, "consensus step size gamma of CHOCO gossip; 1.0 is exact averaging with "
                                "codec = identity, sparse codecs need about 2x their kept fraction "
                                "(swarm.gossip suggested_gamma)",
                           lambda g: 0.0 < g <= 1.0, "must be in (0, 1]")
    round_timeout_s: float = opt(2.0, "deadline for a round's neighbours before it proceeds without them, "
                                      f"at most {MAX_ROUND_TIMEOUT_S:.0f} s",
                                 lambda t: 0 < t <= MAX_ROUND_TIMEOUT_S, f"must be in (0, {MAX_ROUND_TIMEOUT_S:.0f}]")
    bootstrap_timeout_s: float = opt(5.0, "deadline for a peer that joins late or restarts to fetch its "
                                          "parameters from its neighbours (a failed bootstrap trains on from "
                                          "its own); over a slow link allow for the whole vector (4 bytes a "
                                          f"parameter) at its rate; at most {MAX_ROUND_TIMEOUT_S:.0f} s",
                                     lambda t: 0 < t <= MAX_ROUND_TIMEOUT_S,
                                     f"must be in (0, {MAX_ROUND_TIMEOUT_S:.0f}]")
    exchange: str = opt("params", "params: each peer takes its own updates and gossip averages the "
                                  "parameters; gradients: every gradient a peer computes is relayed to "
                                  "every peer (compressed with codec) and applied by all, and parameter "
                                  "averaging only corrects drift (needs sync = async) or is off (average = false)",
                        lambda s: s in ("params", "gradients"), "must be 'params' or 'gradients'")
    average: bool = opt(True, "average the parameters in each round. With exchange = gradients the relay's "
                              "turns keep the peers' copies the same (one order of updates everywhere), and "
                              "averaging (whose estimates of the neighbours lag) only pulls them apart: "
                              "false leaves the rounds to the replay sharing")
    relay_staleness: int = opt(1, "with exchange = gradients: the peers take turns to compute gradients "
                                  "(dqn.train_every steps a round); a peer waits before its turn until it "
                                  "has the others' gradients up to this many rounds back. 1: every "
                                  "gradient sees all earlier ones, as one learner's would (waiting is wall "
                                  "time, though on a machine the peers share it costs CPU too)", _pos,
                                  "must be >= 1")


@dataclass
class BufferSpec:
    """Each peer's replay buffer and what it shares with its neighbours."""

    capacity: int = opt(50_000, "transitions each peer keeps", _pos, "must be > 0")
    prioritized: bool = opt(True, "prioritized sampling by TD error (else uniform)")
    alpha: float = opt(0.6, "priority exponent", lambda a: 0.0 <= a <= 1.0, "must be in [0, 1]")
    eps: float = opt(1e-6, "added to |TD| so that no item has zero priority", _pos, "must be > 0")
    decay: float = opt(0.0, "priority decay per second of age (lambda); 0 keeps priorities. Age is wall-clock "
                            "time, so with decay > 0 sampling depends on how fast the machine runs and the same "
                            "seed does not reproduce a run (a resume does not count its pause as age)",
                       nonneg, "must be >= 0")
    sharing: bool = opt(True, "push a share of new transitions to neighbours")
    share: float = opt(1.0, "fraction of new transitions pushed to each neighbour (with replicas, the "
                            "first `replicas` neighbours get every one as a replication push instead)",
                       lambda s: 0.0 <= s <= 1.0, "must be in [0, 1]")
    share_by: str = opt("newest", "which new transitions are shared: newest or priority",
                        lambda s: s in ("newest", "priority"), "must be 'newest' or 'priority'")
    replicas: int = opt(0, "neighbours that must acknowledge each local transition (0: no replication); "
                           "at most the fewest neighbours any peer has in gossip.topology; needs sharing "
                           "(without it swarm run warns)",
                        nonneg, "must be >= 0")
    ack_timeout_s: float = opt(2.0, "with replicas: seconds before a replication push that got no ack is "
                                    "sent again", _pos, "must be > 0")
    ack_timeout_max_s: float = opt(30.0, "with replicas: the longest wait between resends to a neighbour "
                                         "that acknowledges none (the wait doubles from ack_timeout_s)",
                                   _pos, "must be > 0")
    # The token bucket's burst is one second of rate and must hold a whole transition:
    # a rate below 1 stopped every peer at start.
    rate: float = opt(0.0, "transitions per second a peer sends for sharing and pulls, at least 1; 0 is "
                           "unbounded", lambda r: r == 0 or r >= 1,
                      "must be 0 (unbounded) or >= 1 transition per second (a peer sends whole transitions, "
                      "and its limiter holds one second of rate)")
    ride: bool = opt(True, "with gossip.exchange = gradients: the shared transitions go with each peer's "
                           "gradient messages (its new ones at each of its turns, every dqn.train_every "
                           "steps) instead of in pushes at the gossip rounds, which then cost nothing "
                           "unless gossip.average or replicas needs them")


@dataclass
class BudgetSpec:
    """When a run stops."""

    env_steps: int = opt(10_000, "env steps per peer", _pos, "must be > 0")
    max_seconds: float = opt(0.0, "wall-clock limit of the whole run; 0 means none", nonneg, "must be >= 0")
    stop_when_solved: bool = opt(False, "stop a peer once its greedy evaluation reaches eval.solve_return")


@dataclass
class EvalSpec:
    """Greedy evaluation during training."""

    every: int = opt(1_000, "env steps between evaluations; 0 disables; above budget.env_steps none runs "
                            "and there is no best.pt (swarm run warns)", nonneg, "must be >= 0")
    episodes: int = opt(5, "episodes per evaluation", _pos, "must be > 0")
    solve_return: float | None = opt(None, "mean greedy return that counts as solved; unset: the env's "
                                           "Gymnasium reward_threshold (CartPole-v1 475, CartPole-v0 195, "
                                           "Acrobot-v1 -100, MountainCar-v0 -110), which the resolved spec "
                                           "(config.json, --show) records; an env without one needs it set "
                                           "for budget.stop_when_solved")
    solver: int = opt(-1, "whose evaluation ends a run with budget.stop_when_solved: -1, any peer's "
                          "(the first to reach solve_return); a rank, only that peer's. With identical "
                          "copies (gossip.exchange = gradients) any peer's is a best of n evaluations of "
                          "one model; one rank's is one evaluation, as a single learner gets",
                      lambda r: r >= -1, "must be -1 (any peer) or a rank >= 0")


@dataclass
class CheckpointSpec:
    """When each peer writes checkpoints (see swarm.experiment.checkpoint).

    A full checkpoint holds parameters, optimizer state, counters, RNG states and
    the replay buffer; an incremental one holds only what changed since the last
    full one. A crash loses at most the env steps since the newest of either.
    """

    full_every_s: float = opt(300.0, "seconds between full checkpoints; 0: no timer", nonneg, "must be >= 0")
    full_every_steps: int = opt(0, "env steps between full checkpoints; 0: only the timer", nonneg,
                                "must be >= 0")
    incremental_every_steps: int = opt(0, "env steps between incremental checkpoints (changes since the "
                                          "last full one); 0: none", nonneg, "must be >= 0")


def _peer_opt(name: str, help: str) -> Any:
    """A spec field that sets :class:`~swarm.config.PeerConfig`'s field ``name``: its
    default, its check and the check's message are that field's."""
    f = next(f for f in fields(PeerConfig) if f.name == name)
    return opt(f.default, help, f.metadata["check"], f.metadata["why"])


@dataclass
class LinkSpec:
    """The peers' links: what `swarm peer` sets with peer.link_timeout_s and peer.max_message_mb."""

    timeout_s: float = _peer_opt("link_timeout_s", "ZMTP heartbeat timeout of each peer's links (to its neighbours "
                                                   "and its coordinator): a frozen neighbour is found after about "
                                                   "this long, and a message that takes longer to drain closes the "
                                                   "link and is lost; raise it to a few seconds for messages of tens "
                                                   "of MB (models of 10M parameters or more) or round trips above "
                                                   f"~50 ms (docs/wire.md); at most {MAX_ZMTP_S:g} s. A host's own "
                                                   "peer.link_timeout_s (swarm peer --set or --config) wins")
    max_message_mb: int = _peer_opt("max_message_mb", "largest message a peer sends or accepts, in MiB (a full "
                                                      "state takes 4 bytes a parameter); at most "
                                                      f"{MAX_MESSAGE_MB} (1 TiB). A host's own peer.max_message_mb "
                                                      "wins")

    def peer_settings(self) -> dict[str, Any]:
        """These settings as the :class:`~swarm.config.PeerConfig` fields they set."""
        return {"link_timeout_s": self.timeout_s, "max_message_mb": self.max_message_mb}


def swarm_dqn() -> DQNConfig:
    """The default spec's DQN settings (a new instance each call).

    ``DQNConfig``'s defaults are for one learner, slow and steady. Four peers that
    share every transition and average tightly take a larger rate, batch and target
    step, two updates per env step, and explore for less (docs/rl.md, "The swarm
    side's DQN settings"). On seeds 0-7 of the default spec (seventeenth session,
    evaluations every 1k env steps) the first peer of each run reached a greedy 500
    by 4k steps with these, every peer by 8k; with ``DQNConfig()`` on seeds 0-3 seed
    0 stayed at 100-320 for 20k steps, seeds 1 and 3 first reached 500 at 17k and
    14k, seed 2 only at one peer's last evaluation (20k).
    """
    return DQNConfig(lr=0.008, batch_size=128, updates_per_train=2, tau=0.12, learning_starts=250,
                     eps_steps=1250)


@dataclass
class Spec:
    """A decentralized RL experiment: N peers training one algorithm on one env."""

    name: str = opt("", "run name; the run folder is runs/<name>-<time>/; empty: ENV-TOPOLOGY "
                        f"(cartpole-ring for the default); at most {MAX_NAME} characters",
                    lambda s: s == "" or (len(s) <= MAX_NAME and bool(_NAME.match(s))),
                    f"must be letters, digits, '.', '_' or '-', at most {MAX_NAME} of them")
    env: str = opt("CartPole-v1", "Gymnasium environment id")
    algorithm: str = opt("dqn", "agent algorithm: " + ", ".join(ALGORITHMS))
    peers: int = opt(4, f"number of peer processes, at most {MAX_PEERS} (swarm run starts them all on this "
                        "host, each a process with its own torch)",
                     lambda n: 0 < n <= MAX_PEERS, f"must be in [1, {MAX_PEERS}]")
    seed: int = opt(0, "base seed, 0 to 2**32 - 1; peer of rank r uses seed + r",
                    lambda s: 0 <= s < SEED_LIMIT, f"must be in [0, {SEED_LIMIT - 1}]")
    gossip: GossipSpec = field(default_factory=GossipSpec)
    buffer: BufferSpec = field(default_factory=BufferSpec)
    dqn: DQNConfig = field(default_factory=swarm_dqn)
    budget: BudgetSpec = field(default_factory=BudgetSpec)
    eval: EvalSpec = field(default_factory=EvalSpec)
    checkpoint: CheckpointSpec = field(default_factory=CheckpointSpec)
    link: LinkSpec = field(default_factory=LinkSpec)
    restart_dead: bool = opt(False, "swarm run restarts a peer that crashed (once per crash; it takes its old "
                                    "rank, resumes from its checkpoint and bootstraps from its neighbours) "
                                    "and a coordinator that died, on the same address")
    #: The keys :func:`load_spec` derived while they were unset (``name`` from the env and
    #: topology, ``eval.solve_return`` from the env), each with the value it derived. Not a
    #: field (config.json and --show hold none of it); ``dataclasses.replace`` carries it
    #: over, so that a copy given another env or topology derives them again.
    _derived: InitVar[Mapping[str, Any]] = ()

    def __post_init__(self, _derived: Mapping[str, Any]) -> None:
        self._derived = dict(_derived)

    def peer_seed(self, rank: int) -> int:
        """The seed of the peer with this rank (distinct per peer, fixed per spec)."""
        return self.seed + rank

    def validate(self) -> None:
        """Check what single fields cannot: names against registries, cross-field ranges."""
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(f"algorithm = {self.algorithm!r}: unknown; choose one of {', '.join(ALGORITHMS)}")
        threshold = _check_env(self.env)
        if self.eval.solve_return is None:
            # Resolved here, so that config.json records the number each peer compares against.
            if threshold is None and self.budget.stop_when_solved:
                raise ConfigError(f"eval.solve_return is unset and env = {self.env!r} has no reward_threshold "
                                  "in its Gymnasium spec: budget.stop_when_solved = true needs one; set "
                                  "eval.solve_return to the mean greedy return that counts as solved")
            self.eval.solve_return = threshold
            self._derived["eval.solve_return"] = threshold
        g = self.gossip
        if g.sync not in SYNC_MODES:
            raise ConfigError(f"gossip.sync = {g.sync!r}: choose one of {', '.join(SYNC_MODES)}")
        _check_topology(g.topology, self.peers, g.edges)
        _check_codec(g.codec)
        if g.exchange == "gradients" and g.topology in ("one_peer_exponential", "random_pairing"):
            raise ConfigError(f"gossip.exchange = gradients with gossip.topology = {g.topology!r}: the gradient "
                              "relay needs a fixed neighbour graph (ring, grid, torus, ...)")
        if g.exchange == "gradients" and g.average and g.sync != "async":
            # Two waits on different clocks deadlock: a bounded round waits for a
            # neighbour whose round number lags, while that neighbour waits for this
            # peer's turn (a benchmark seed spent 178 s in 2 s round timeouts).
            raise ConfigError(f"gossip.sync = {g.sync!r} with gossip.exchange = gradients: the relay's turns "
                              "already pace the peers, and a parameter round that waits as well can deadlock "
                              "with them until its timeout; set gossip.sync = async")
        if self.buffer.ack_timeout_max_s < self.buffer.ack_timeout_s:
            raise ConfigError(f"buffer.ack_timeout_max_s = {self.buffer.ack_timeout_max_s:g} is below "
                              f"buffer.ack_timeout_s = {self.buffer.ack_timeout_s:g}: the longest wait "
                              "between resends cannot be shorter than the first")
        if g.exchange == "params" and not g.average:
            raise ConfigError("gossip.average = false with gossip.exchange = params: the peers would never "
                              "share what they learn; averaging can be off only with exchange = gradients")
        self.dqn.check("dqn.")
        if g.exchange == "gradients" and self.dqn.learning_starts < self.dqn.batch_size:
            # The others wait for each peer's gradient at each of its turns from
            # learning_starts on; a peer whose buffer cannot fill a batch has none.
            raise ConfigError(f"dqn.learning_starts = {self.dqn.learning_starts} with gossip.exchange = gradients: "
                              f"must be at least dqn.batch_size = {self.dqn.batch_size}, so that every peer has a "
                              "gradient to publish at each of its turns")
        if self.buffer.capacity < self.dqn.batch_size:
            raise ConfigError(f"buffer.capacity = {self.buffer.capacity} is below dqn.batch_size = "
                              f"{self.dqn.batch_size}; a batch could never be sampled")
        d, steps = self.dqn, self.budget.env_steps
        if d.learning_starts >= steps:
            raise ConfigError(f"dqn.learning_starts = {d.learning_starts} is not below "
                              f"budget.env_steps = {steps}; the agent would never learn")
        # Updates come at the env steps (counted from 0) >= learning_starts that are multiples
        # of train_every (DQNAgent.learns_at; rank 0's phase is 0, whatever the exchange).
        first = -(-d.learning_starts // d.train_every) * d.train_every
        if first >= steps:
            raise ConfigError(f"dqn.train_every = {d.train_every} with dqn.learning_starts = {d.learning_starts}: "
                              f"the first update would come at env step {first}, not below budget.env_steps = "
                              f"{steps}; the agent would never learn")
        if self.buffer.sharing and self.buffer.replicas:
            # A peer replicates to its own neighbours: one with fewer than `replicas` would
            # never see a transition acknowledged (they would wait for a neighbour for ever).
            rank, degree = _fewest_neighbours(g.topology, self.peers, g.edges)
            if degree < self.buffer.replicas:
                raise ConfigError(
                    f"buffer.replicas = {self.buffer.replicas}: with gossip.topology = {g.topology!r} and "
                    f"peers = {self.peers}, the peer of rank {rank} has {degree} neighbour{'s' * (degree != 1)} "
                    "to hold copies of its transitions, so they could never count as replicated; set "
                    f"buffer.replicas {f'<= {degree}' if degree else '= 0'} or choose a topology with more "
                    "neighbours")
        c = self.checkpoint
        if c.incremental_every_steps and c.full_every_steps and c.incremental_every_steps >= c.full_every_steps:
            raise ConfigError(f"checkpoint.incremental_every_steps = {c.incremental_every_steps} is not below "
                              f"checkpoint.full_every_steps = {c.full_every_steps}; every incremental one "
                              "would coincide with a full one")
        if self.eval.solver >= self.peers:
            raise ConfigError(f"eval.solver = {self.eval.solver}: there are only ranks 0-{self.peers - 1} "
                              f"with peers = {self.peers}")
        if self.budget.stop_when_solved and self.eval.every == 0:
            raise ConfigError("budget.stop_when_solved = true needs eval.every > 0 to know when it is solved")
        if self.budget.stop_when_solved and self.eval.every > steps:
            raise ConfigError(f"budget.stop_when_solved = true with eval.every = {self.eval.every} above "
                              f"budget.env_steps = {steps}: no evaluation would run to say it is solved; set "
                              f"eval.every <= {steps}")

    def warnings(self) -> list[str]:
        """Settings that load, and have their uses, but do nothing in this run (or undo what
        they are for): one line each, naming the key, its value and what follows. `swarm run` prints them (and
        keeps them in the run folder's ``warnings.txt``) before it starts anything.

        They stay allowed: ``gossip.interval`` above the budget makes the isolated
        baseline of scripts/compare_runs.py, and ``eval.every`` above it a smoke run
        that spends no time on evaluations.

            >>> for line in load_spec(None, ["budget.env_steps=500"]).warnings():
            ...     print(line)
            eval.every = 1000 is above budget.env_steps = 500: no greedy evaluation runs, ...
        """
        g, b, steps = self.gossip, self.buffer, self.budget.env_steps
        said: list[str] = []
        if g.interval > steps and self.peers > 1:
            # What a round does; relayed gradients (and the transitions riding on them)
            # go by without rounds.
            rounds_do = ["average their parameters"] if g.average else []
            if b.sharing and b.share > 0 and (g.exchange == "params" or not b.ride):
                rounds_do.append("share transitions")
            elif b.sharing and b.replicas:
                rounds_do.append("replicate transitions")
            if rounds_do:
                said.append(f"gossip.interval = {g.interval} is above budget.env_steps = {steps}: no gossip round "
                            f"runs, so the peers never {' or '.join(rounds_do)}"
                            + ("; each trains alone" if g.exchange == "params" else
                               " (their gradients are still relayed)"))
        if b.replicas and not b.sharing:
            said.append(f"buffer.replicas = {b.replicas} with buffer.sharing = false: nothing is replicated, as "
                        "no transition leaves its peer; set buffer.sharing = true to replicate")
        if g.exchange == "gradients" and self.peers > self.dqn.train_every:
            # phase = rank % train_every: peers that share a turn apply each other's gradients
            # after their own, in different orders, and Adam's result depends on the order.
            # Only runner's repair (average off, relay_staleness 1) takes copies; a copy taken
            # after the neighbour's turn went on moves the taker's turns past its env steps
            # (relay._serve's `n`), and its last turns then come after the others ended.
            if not g.average and g.relay_staleness == 1:
                then = ("each repaired by taking a whole copy from a neighbour, which mostly also skips the "
                        "repaired peer's turns up to the copy's and moves its step count (and epsilon and beta) "
                        "ahead of its env steps, so its last turns' gradients and transitions reach no peer and "
                        "the copies end apart")
            elif g.average:
                then = "only parameter averaging pulls them together"
            else:
                then = ("nothing brings them back together: a peer takes a neighbour's copy only with "
                        "gossip.relay_staleness = 1")
            said.append(f"dqn.train_every = {self.dqn.train_every} with gossip.exchange = gradients and peers = "
                        f"{self.peers}: peers share turns, so their copies part at each turn and differ at every "
                        f"digest check ({then}); set dqn.train_every = {self.peers} (a turn per peer) for copies "
                        "that stay the same")
        if self.peers > 1 and g.average and g.interval <= steps:
            # the engine's measure, which warns in each peer's log
            from ..gossip._codecs import DIVERGES_ABOVE, suggested_gamma  # noqa: PLC0415

            stable = suggested_gamma(g.codec)
            if g.step_size > DIVERGES_ABOVE * stable:
                said.append(f"gossip.step_size = {g.step_size:g} is far above the stable step for gossip.codec = "
                            f"{g.codec!r} (about {stable:g}): the peers' parameters are expected to diverge rather "
                            f"than average; set gossip.step_size = {stable:g}")
        if self.eval.every > steps:   # with budget.stop_when_solved, validate() refuses it
            said.append(f"eval.every = {self.eval.every} is above budget.env_steps = {steps}: no greedy "
                        "evaluation runs, so no peer writes best.pt (swarm eval has nothing to play) and the "
                        "summary's eval columns stay empty")
        return said


def _check_env(env_id: str) -> float | None:
    """Check that the peers can make ``env_id`` and train DQN on it; return its Gymnasium
    ``reward_threshold`` (None when it has none).

    ``module:EnvId`` imports ``module`` first (which registers ``EnvId``), as ``gymnasium.make``
    does in each peer process: an env registered only in the calling process is unknown there.
    """
    if not isinstance(env_id, str):   # a Spec changed in code is checked here before anything reads it
        raise ConfigError(f"env = {env_id!r:.80}: env must be a str, a Gymnasium id such as 'CartPole-v1'")
    import gymnasium  # noqa: PLC0415 - slow to import; only needed here

    module, sep, name = env_id.rpartition(":")
    if sep:
        if not module or not name:
            raise ConfigError(f"env = {env_id!r}: expected a Gymnasium id, or module:EnvId to import the "
                              "module that registers it first")
        try:
            importlib.import_module(module)
        except Exception as e:  # the module's own code runs: it can fail any way
            raise ConfigError(f"env = {env_id!r}: cannot import module {module!r}, which should register "
                              f"{name!r}: {type(e).__name__}: {e}") from None
        top = module.partition(".")[0]
        folder = _folder_of(top)
        if folder == Path.cwd().resolve() and not _found_by_peers(top):
            # `python -m swarm` (or a script run from its folder) has the working directory
            # first on its path; the peers start with `python -P`, which leaves it off
            raise ConfigError(f"env = {env_id!r}: module {module!r} is imported from the working directory "
                              f"{folder}, which the peers do not have on their path (they start with `python "
                              "-P`); put that folder on PYTHONPATH, or install the module")
    known = gymnasium.envs.registry
    if name not in known:
        close = difflib.get_close_matches(name, list(known), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        where = f" after importing {module!r}" if sep else ""
        how = "" if sep else (" (an env your own code registers is given as module:EnvId, naming the module "
                              "whose import registers it)")
        raise ConfigError(f"env = {env_id!r}: not a registered Gymnasium environment{where}{hint}{how}")
    # Made once here (milliseconds for CartPole), an env the peers cannot use fails
    # before `swarm run` makes a run folder, not inside every peer.
    try:
        env = gymnasium.make(env_id)
    except Exception as e:  # an env's constructor can fail any way: a missing Box2D, a deprecated version
        raise ConfigError(f"env = {env_id!r}: cannot be made: {e}") from None
    try:
        actions, observations = env.action_space, env.observation_space
        threshold = env.spec.reward_threshold if env.spec is not None else None
    finally:
        env.close()
    if not isinstance(actions, gymnasium.spaces.Discrete):
        raise ConfigError(f"env = {env_id!r}: its action space {actions} is not Discrete; "
                          "DQN needs discrete actions")
    if int(actions.start) != 0:
        # the agent's actions are the indices 0..n-1 of its Q-values, sent to the env as they are
        raise ConfigError(f"env = {env_id!r}: its action space {actions} starts at {int(actions.start)}; DQN "
                          "needs actions 0..n-1 (wrap the env to shift them)")
    if not isinstance(observations, gymnasium.spaces.Box) or not observations.shape or 0 in observations.shape:
        # DQN's network flattens each observation into its input layer.
        hint = "; one-hot encode a Discrete observation" if isinstance(observations, gymnasium.spaces.Discrete) else ""
        raise ConfigError(f"env = {env_id!r}: its observation space {observations} is not a Box of at least "
                          f"one dimension, none of them 0; DQN needs observations that are arrays of numbers{hint}")
    return None if threshold is None else float(threshold)


def _folder_of(top: str) -> Path | None:
    """The folder that this process imported the top-level module ``top`` from (the one on
    ``sys.path``), or None where it came from no folder (a built-in module)."""
    spec = sys.modules[top].__spec__
    if spec is None:
        return None
    if spec.submodule_search_locations:   # a package: the folder that holds its folder
        return Path(next(iter(spec.submodule_search_locations))).parent.resolve()
    return Path(spec.origin).parent.resolve() if spec.has_location else None


def check_env_for_peers(env_id: str) -> None:
    """Refuse ``env_id`` where this process knows it and the peers, fresh processes, would
    not: a plain id that a script or a notebook registered (``gymnasium.register``), which
    :func:`Spec.validate` finds in this process's registry. Asked by what starts peers
    (``run_experiment``, the Ray launch) before anything is made; a peer itself knows what
    its own registry holds. ``module:EnvId`` is the form the peers can make."""
    module, sep, name = env_id.rpartition(":")
    if not sep and name not in _gymnasium_ids() and not _registered_in_peers(name):
        raise ConfigError(f"env = {env_id!r} is registered in this process only, which the peers do not run; "
                          "register it in a module and give env = module:EnvId (the peers import the module "
                          "first)")


@functools.cache
def _gymnasium_ids() -> frozenset[str]:
    """The ids Gymnasium registers when it is imported, which every peer knows: those its
    registering module names (``register(id="CartPole-v1", ...)``), read from its source.
    Asked by id, not by entry point: a script's own ``register("MyCart-v0", entry_point=
    "gymnasium.envs...:CartPoleEnv")`` points into Gymnasium too, and the peers do not
    know it. Where that module names none (another layout), every id is asked of a
    process started as the peers are."""
    import gymnasium.envs  # noqa: PLC0415

    try:
        text = Path(gymnasium.envs.__file__).read_text(encoding="utf-8")
    except (OSError, TypeError, ValueError):
        return frozenset()
    return frozenset(re.findall(r"""\bid\s*=\s*["']([^"']+)["']""", text))


@functools.cache
def _registered_in_peers(env_id: str) -> bool:
    """Whether a process started as the peers are knows ``env_id`` once it imported
    Gymnasium and swarm's agent (asked only of an id not Gymnasium's own)."""
    return _peers_say("import sys, gymnasium, swarm.rl; sys.exit(sys.argv[1] not in gymnasium.envs.registry)",
                      env_id)


def _found_by_peers(top: str) -> bool:
    """Whether the peers find the top-level module ``top``: asked of a ``python -P`` started
    as :func:`~.forkserver.child_command` starts them (its PYTHONPATH, the site folders and
    their ``.pth`` files, as ``pip install -e .`` writes; not this process's ``sys.path``,
    which a script may have changed at run time)."""
    return _peers_say("import importlib.util, sys; sys.exit(importlib.util.find_spec(sys.argv[1]) is None)", top)


def _peers_say(code: str, arg: str) -> bool:
    """Whether ``code``, run with ``arg`` by a Python started as the peers are
    (:func:`~.forkserver.child_command`), exits 0; True where it does not answer within a
    minute (not known: the peers' own check says it)."""
    import subprocess  # noqa: PLC0415 - only for an env the peers may not know

    from .forkserver import child_command  # noqa: PLC0415

    command, env = child_command("swarm.cli", os.environ)
    try:
        said = subprocess.run([*command[:2], "-c", code, arg], env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, timeout=60)
    except subprocess.TimeoutExpired:
        return True
    return said.returncode == 0


def _check_topology(topology: str, peers: int, edges: list[list[int]]) -> None:
    from ..gossip.topology import TOPOLOGIES, weights  # noqa: PLC0415

    if topology not in TOPOLOGIES:
        raise ConfigError(f"gossip.topology = {topology!r}: unknown; choose one of {', '.join(TOPOLOGIES)}")
    if topology == "custom" and not edges:
        raise ConfigError("gossip.edges: topology = custom needs an edge list [[i, j], ...]")
    if edges and topology != "custom":
        raise ConfigError(f"gossip.edges is only used with topology = custom, not {topology!r}")
    try:  # the topology module knows which sizes each graph admits (hypercube: powers of two ...)
        # One row checks the same as the whole n×n matrix, in O(n) instead of O(n²) or worse.
        weights(topology, peers, 0, edges=edges or None)
    except ConfigError as e:   # with custom, what is wrong is an edge
        key = "gossip.edges" if topology == "custom" else f"gossip.topology = {topology!r}"
        raise ConfigError(f"{key} with peers = {peers}: {e}") from None
    if topology == "custom":
        # averaging never brings peers that no path joins to one model
        reached, frontier = {0}, [0]
        links: dict[int, list[int]] = {}
        for a, b in edges:
            links.setdefault(a, []).append(b)
            links.setdefault(b, []).append(a)
        while frontier:
            u = frontier.pop()
            for v in links.get(u, []):
                if v not in reached:
                    reached.add(v)
                    frontier.append(v)
        if len(reached) < peers:
            cut = sorted(set(range(peers)) - reached)
            raise ConfigError(f"gossip.edges: the graph is not connected: no path joins peer 0 to peers "
                              f"{', '.join(map(str, cut[:8]))}{' ...' if len(cut) > 8 else ''}, so their "
                              "models would never be averaged together")


def _fewest_neighbours(topology: str, peers: int, edges: list[list[int]]) -> tuple[int, int]:
    """The rank with the fewest neighbours in the graph peers pick them from (round 0, as
    :class:`swarm.peer.Peer` does), and how many it has. The topology is checked already."""
    if topology == "full":
        return 0, peers - 1
    if topology == "custom":   # from the edge list: neighbours() would read it once per peer
        links: list[set[int]] = [set() for _ in range(peers)]
        for a, b in edges:
            links[a].add(b)
            links[b].add(a)
        degrees = [len(s) for s in links]
    else:
        from ..gossip.topology import neighbours  # noqa: PLC0415
        degrees = [len(neighbours(topology, peers, i)) for i in range(peers)]
    rank = min(range(peers), key=degrees.__getitem__)
    return rank, degrees[rank]


def _check_codec(codec: str) -> None:
    try:
        from ..compress import get_codec  # noqa: PLC0415 - optional until swarm.compress lands
    except ImportError:
        # Without swarm.compress only the uncompressed codec exists; the gossip
        # engine makes the same choice.
        if codec != "identity":
            raise ConfigError(f"gossip.codec = {codec!r}: swarm.compress is not available, "
                              "only 'identity' can be used") from None
        return
    try:
        get_codec(codec)
    except ConfigError as e:
        raise ConfigError(f"gossip.codec = {codec!r}: {e}") from None


#: The built-in experiment: CartPole-v1, 4 peers on a ring, error-feedback top-k, sharing on.
#: One shared instance: change a copy (``load_spec()`` or ``dataclasses.replace``), not it.
#: Its name and eval.solve_return are what load_spec() derives for it, recorded as derived:
#: a copy given another env or topology gets that one's from load_spec().
DEFAULT_SPEC = Spec(name="cartpole-ring",   # the name load_spec() gives it (default_name)
                    eval=EvalSpec(solve_return=475.0),   # CartPole-v1's reward_threshold
                    _derived={"name": "cartpole-ring", "eval.solve_return": 475.0})


def load_spec(path: str | Path | Spec | None = None, overrides: list[str] | None = None) -> Spec:
    """Load a spec file (or the built-in default when ``path`` is None), apply overrides, check it.

    ``path`` may also be a :class:`Spec` made or changed in code: the result is a
    new, checked spec (the one given is left as it is), so a key set out of range
    with ``dataclasses.replace`` or an assignment fails here as it would in a file.
    Its ``name`` and ``eval.solve_return``, where load_spec() derived them (from the
    env and topology) and they still hold the derived value, are derived again, as for
    a file that leaves them unset: a copy given another env is named and judged
    solved after that env, not after the one it was derived for.

        >>> spec = load_spec(None, ["peers=2", "budget.env_steps=2000"])
        >>> spec = load_spec(dataclasses.replace(spec, seed=1))  # doctest: +SKIP
        >>> load_spec(dataclasses.replace(spec, env="Acrobot-v1")).name  # doctest: +SKIP
        'acrobot-ring'
    """
    # "" (an unset variable) is refused by read_file, not taken for the built-in default
    data = to_dict(path) if isinstance(path, Spec) else read_file(path) if path is not None else {}
    if isinstance(path, Spec):
        derived = dict(path._derived)
        if "name" in derived and data["name"] == derived["name"]:
            data["name"] = ""
        if "eval.solve_return" in derived and data["eval"]["solve_return"] == derived["eval.solve_return"]:
            data["eval"]["solve_return"] = None
    apply_overrides(data, [] if overrides is None else overrides)
    spec = from_dict(Spec, data)
    if not spec.name:   # named after what it runs, so `--set gossip.topology=grid` is not filed as a ring
        spec.name = default_name(spec)
        spec._derived["name"] = spec.name
    return spec


def show_spec(path: str | Path | Spec | None = None, overrides: list[str] | None = None) -> str:
    """`swarm run --show`'s TOML: the spec resolved, except that the keys derived from
    others while unset (``name`` from the env and topology, ``eval.solve_return`` from
    the env) and left unset by the file and the overrides are written as comments with
    their value: a file started from it and given another env or topology derives them
    again, instead of keeping "cartpole-ring" and CartPole's 475. ``path`` as for
    :func:`load_spec` (a spec it loaded: the file is not read again)."""
    spec = load_spec(path, overrides)
    notes = {"name": "derived from env and gossip.topology while unset",
             "eval.solve_return": "the env's reward_threshold while unset"}
    return to_toml(spec, {k: v for k, v in notes.items() if k in spec._derived})


def default_name(spec: Spec) -> str:
    """``ENV-TOPOLOGY`` in lower case, without the env's version: ``cartpole-ring``."""
    env = re.sub(r"-v\d+$", "", spec.env.rsplit("/", 1)[-1]).lower()
    env = re.sub(r"[^a-z0-9._-]+", "-", env).strip("-._") or "run"
    return f"{env}-{spec.gossip.topology}"


def _plain_number(v: Any) -> int | float:
    """``json.dumps``'s ``default``: a numpy number as Python's; anything else is refused."""
    if is_int(v):
        return int(v)
    if is_real(v):
        return float(v)
    raise TypeError(f"{type(v).__name__} {v!r:.80} cannot be written in config.json")


def save_resolved(spec: Spec, path: str | Path) -> Path:
    """Write the resolved spec as JSON and return the file written.

    ``path`` is a ``.json`` file, or a run folder (existing or not, any other
    path: ``runs/lr-1e-3.v2`` too), which gets ``config.json``. The file loads back
    with :func:`load_spec`. A ``.toml`` path is refused (ConfigError): the file
    would be JSON that :func:`load_spec` reads as TOML; :func:`show_spec` gives TOML.
    The file is replaced whole (a full disk leaves none, not an empty one that every
    resume then read as a damaged spec), and an OSError names it.
    """
    p = Path(path)
    if p.suffix.lower() == ".toml" and not p.is_dir():
        raise ConfigError(f"save_resolved writes JSON, and {str(p)!r} would load back as TOML; give a .json "
                          f"file or a run folder (show_spec gives the spec as TOML)")
    if p.is_dir() or p.suffix.lower() != ".json":
        p = p / "config.json"
    p.parent.mkdir(parents=True, exist_ok=True)
    from ..buffer.persist import write_synced  # noqa: PLC0415 - numpy: off `swarm run --show`'s path
    from .checkpoint import write_whole  # noqa: PLC0415

    # numpy's numbers (a Spec changed in code, a sweep's np.linspace) as Python's
    text = (json.dumps(to_dict(spec), indent=2, sort_keys=True, default=_plain_number) + "\n").encode()
    write_whole(p, lambda tmp: write_synced(tmp, text))
    return p
