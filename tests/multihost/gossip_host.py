"""One gossiping host for tests/multihost/test_netns.py (run inside a network namespace).

    python gossip_host.py --coordinator tcp://10.213.0.1:5555 --bind tcp://10.213.0.10:* \
        --id h0 --rank 0 --n 4 --d 1000 --out DIR [--codec int8 --gamma 0.6 --sync async --pace 0.06]

Joins the swarm, waits for an ``n``-member view and for its links, writes
``DIR/ID.ready`` and waits for ``DIR/go``. Then it runs gossip rounds on a flat
float32 vector (seeded by its rank) until ``DIR/stop`` appears, sleeping
``--pace`` seconds between rounds in place of local training steps. After each
round it appends one JSON line to ``DIR/ID.rounds.jsonl``:

    {"t": wall clock, "r": round, "ok": bool, "p": participants, "st": {sender: staleness},
     "out": bytes sent, "drop": sends dropped, "err": consensus error}

where ``err`` is the RMS distance to the mean of all ``n`` initial vectors,
relative to their spread (meaningful while all ``n`` hosts take part). Every
tenth round it also prints a line of these figures. On stop it saves its
vector to ``DIR/ID.npy`` and leaves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import numpy as np


def initial(rank: int, d: int) -> np.ndarray:
    """The starting vector of ``rank``: noise around ``rank`` (so the hosts disagree)."""
    return np.random.default_rng(1000 + rank).standard_normal(d).astype(np.float32) + rank


async def wait_file(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        await asyncio.sleep(0.01)


async def main(a: argparse.Namespace) -> None:
    from swarm.gossip import Gossip
    from swarm.peer import Peer

    out = Path(a.out)
    x = initial(a.rank, a.d)
    target = np.mean([initial(r, a.d) for r in range(a.n)], axis=0)
    scale = float(np.sqrt(np.mean(np.square(x - target)))) or 1.0
    # Slow (shaped) links delay ZMTP heartbeats behind bulk data; the timeouts are
    # the test's to choose, as a user on a WAN link would.
    async with Peer(coordinators=[a.coordinator], id=a.id, rank=a.rank, topology="ring", bind=a.bind,
                    link_timeout_s=a.link_timeout, join_timeout_s=30.0) as peer:
        await peer.wait_view(lambda v: len(v.members) == a.n, timeout=60.0)
        await peer.wait_linked(30.0)
        g = Gossip(peer, x, topology="ring", codec=a.codec, gamma=a.gamma, sync=a.sync,
                   round_timeout=a.round_timeout)
        (out / f"{a.id}.ready").write_text(peer.address)
        await wait_file(out / "go", 120.0)
        deadline = time.monotonic() + a.max_seconds
        with open(out / f"{a.id}.rounds.jsonl", "w") as log:
            while not (out / "stop").exists() and time.monotonic() < deadline:
                res = await g.round()
                err = float(np.sqrt(np.mean(np.square(x - target)))) / scale
                log.write(json.dumps({"t": time.time(), "r": res.round, "ok": res.ok, "p": res.participants,
                                      "st": res.staleness, "out": res.bytes_out, "drop": res.dropped,
                                      "err": err, "epoch": peer.view.epoch}) + "\n")
                log.flush()
                if res.round % 10 == 0:
                    print(f"{a.id} round {res.round}: consensus error {err:.3g}, participants "
                          f"{res.participants}, {res.bytes_out} B out, waited {res.waited_s:.3f} s", flush=True)
                if a.pace:
                    await asyncio.sleep(a.pace)
        tmp = out / f"{a.id}.tmp.npy"
        np.save(tmp, x)
        tmp.rename(out / f"{a.id}.npy")
        print(f"{a.id} done after {g.t} rounds; dropped sends {g.stats.dropped_sends}", flush=True)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--coordinator", required=True)
    p.add_argument("--bind", required=True)
    p.add_argument("--id", required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--n", type=int, required=True, help="members to wait for")
    p.add_argument("--d", type=int, default=1000, help="vector length")
    p.add_argument("--codec", default="identity")
    p.add_argument("--gamma", type=float, default=1.0)
    p.add_argument("--sync", default="lockstep")
    p.add_argument("--pace", type=float, default=0.0, help="seconds of 'local training' between rounds")
    p.add_argument("--round-timeout", type=float, default=2.0)
    p.add_argument("--link-timeout", type=float, default=0.3, help="ZMTP heartbeat timeout on data links")
    p.add_argument("--max-seconds", type=float, default=60.0, help="stop by itself after this long")
    p.add_argument("--out", required=True)
    asyncio.run(main(p.parse_args()))
