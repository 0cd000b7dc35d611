"""A swarm peer inside a hand-written simulator loop (no Gymnasium, no asyncio).

Each process heats a simulated room: the agent switches a heater (off, low,
high) to hold 21 °C while the outside temperature drifts. Several processes
learn together: every few steps they average their Q-networks with their ring
neighbours through the gossip engine and send a share of their new transitions
to the neighbours' replay buffers, on the peer's own background thread.

    swarm coordinator --bind tcp://127.0.0.1:5555 &
    python examples/custom_simulator.py --rank 0 &
    python examples/custom_simulator.py --rank 1

The part that touches swarm is the dozen lines in ``main`` between
``SyncPeer(...)`` and the end of the loop.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch

from swarm.buffer import Federation, ReplayBuffer
from swarm.gossip import Gossip
from swarm.peer import SyncPeer
from swarm.rl import DQNAgent, DQNConfig, dqn_schema


class Room:
    """A first-order thermal model: T' = k_out (T_out - T) + heat(action) + noise."""

    HEAT = (0.0, 0.4, 0.9)   # degrees per step for off, low, high

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.t = 0

    def reset(self) -> np.ndarray:
        self.t = 0
        self.temp = 21.0 + self.rng.normal(0, 3)
        self.outside = 5.0 + self.rng.normal(0, 5)
        return self.observe()

    def observe(self) -> np.ndarray:
        return np.array([(self.temp - 21.0) / 5, (self.outside - 10.0) / 10, math.sin(self.t / 20)], np.float32)

    def advance(self, action: int) -> tuple[np.ndarray, float, bool]:
        """One step; the bool says the episode's time is up (a cut-off, not a terminal state)."""
        self.t += 1
        self.outside += 0.3 * math.sin(self.t / 20) + self.rng.normal(0, 0.1)
        self.temp += 0.05 * (self.outside - self.temp) + self.HEAT[action] + self.rng.normal(0, 0.05)
        reward = -abs(self.temp - 21.0) - 0.05 * action   # comfort, and a little energy cost
        return self.observe(), reward, self.t >= 100


def learner(rank: int) -> tuple[ReplayBuffer, DQNAgent]:
    """Rank ``rank``'s replay buffer and agent."""
    buffer = ReplayBuffer(dqn_schema((3,)), capacity=20_000, seed=rank, peer_id=f"room{rank}")
    # Every rank starts from one network (init_seed): averaging independently initialised
    # networks mixes unrelated hidden units. Exploration still differs by rank (seed).
    agent = DQNAgent((3,), 3, buffer, DQNConfig(learning_starts=200, eps_steps=2_000),
                     seed=rank, init_seed=0)
    return buffer, agent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--coordinator", default="tcp://127.0.0.1:5555")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--peers", type=int, default=2, help="wait until this many peers have joined")
    ap.add_argument("--steps", type=int, default=5_000)
    ap.add_argument("--gossip-every", type=int, default=50, help="simulator steps between gossip rounds")
    args = ap.parse_args()
    for name in ("peers", "steps", "gossip_every"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")

    torch.set_num_threads(1)   # peers usually share cores; one thread each avoids oversubscription
    room = Room(seed=args.rank)
    buffer, agent = learner(args.rank)

    with SyncPeer(coordinators=[args.coordinator], id=f"room{args.rank}", rank=args.rank) as peer:
        peer.wait_view(lambda view: len(view.members) >= args.peers, timeout=60)

        async def build() -> tuple[Gossip, Federation]:
            # Built on the peer's thread, where its message handlers run. The engine
            # averages agent.parameters() in place: that array IS the Q-network. The
            # federation puts a quarter of the new transitions in the neighbours' buffers.
            return (Gossip(peer.peer, agent.parameters(), topology="ring", codec="ef+topk:0.05",
                           gamma="auto", sync="bounded", max_staleness=2, round_timeout=2.0),
                    Federation(buffer, peer.peer, share=0.25))

        gossip, federation = peer.call(build())
        rounds = joined = 0
        rewards: list[float] = []
        obs, episode_reward = room.reset(), 0.0
        for step in range(1, args.steps + 1):
            agent.perceive(obs)
            obs, reward, time_up = room.advance(agent.deliberate())
            agent.reflect(reward, False, truncated=time_up, next_observations=obs if time_up else None)
            episode_reward += reward
            if time_up:
                rewards.append(episode_reward)
                obs, episode_reward = room.reset(), 0.0
            if step % args.gossip_every == 0:
                result = peer.call(gossip.round(), timeout=30)   # on the peer's thread
                agent.on_parameters_changed()
                peer.call(federation.flush(), timeout=30)
                rounds += 1
                joined += bool(result.participants)
        mean = lambda xs: f"{np.mean(xs):.1f}" if xs else "-"   # noqa: E731 - no episode ended in a short run
        print(f"room{args.rank}: {args.steps} steps, {len(rewards)} episodes, "
              f"mean reward of the last 5 {mean(rewards[-5:])} (first 5 {mean(rewards[:5])}), "
              f"{rounds} gossip rounds, {joined} with neighbours, "
              f"{gossip.stats.bytes_out} bytes sent, "
              f"{federation.stats.stored} transitions from neighbours", flush=True)


if __name__ == "__main__":
    main()
