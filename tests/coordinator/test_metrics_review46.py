"""Review 46: /metrics under real monitoring. A member that crashed (kill -9) or left (a
leave) stays listed for 5 minutes; its gauges stayed on /metrics with its last figures
(2 neighbours, its buffer, its return), so ``sum(swarm_peer_neighbours)`` or
``avg(swarm_peer_mean_return)`` counted it, while its rates, heartbeat age and unreachable
count were already dropped. Now a dead member has ``swarm_peer_up 0`` and its counters only.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import urllib.request

from swarmtest import ROOT, reap_all, status, wait_for

#: a peer process that reports a fixed set of figures on its heartbeats, and leaves on SIGTERM
PEER = textwrap.dedent("""
    import asyncio, signal, sys
    from swarm.peer import Peer

    async def main():
        p = Peer(coordinators=[sys.argv[1]], id=sys.argv[2], rank=int(sys.argv[3]), topology="ring")
        p.stats = lambda: {"env_steps": 100, "rounds": 10, "buffer_size": 500, "mean_return": 20.5,
                           "staleness": 1, "codec_ratio": 0.25, "under_replicated": 3, "unreachable": 0,
                           "relay_stale": 2}
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await p.start()
        await stop.wait()
        await p.close()

    asyncio.run(main())
""")

#: what a live peer's figures above put on /metrics besides its counters
GAUGES = {"swarm_peer_up", "swarm_peer_heartbeat_age_seconds", "swarm_peer_neighbours", "swarm_peer_codec_ratio",
          "swarm_peer_staleness_rounds", "swarm_peer_buffer_items", "swarm_peer_under_replicated_items",
          "swarm_peer_mean_return", "swarm_peer_unreachable_neighbours"}


def _series(url: str) -> dict[str, dict[str, float]]:
    """/metrics as {peer id: {metric name: value}} (the per-peer series only)."""
    text = urllib.request.urlopen(url + "metrics", timeout=5).read().decode()
    out: dict[str, dict[str, float]] = {}
    for m in re.finditer(r'^(swarm_peer_\w+)\{run="[^"]*",peer="([^"]*)",rank="\d+"\} (\S+)$', text, re.M):
        out.setdefault(m[2], {})[m[1]] = float(m[3])
    return out


def test_a_dead_or_departed_member_keeps_only_up_and_its_counters_on_metrics(procs):
    coord = procs.coordinator(None)
    url = status(coord.addr)["http"]
    peers = [subprocess.Popen([sys.executable, "-c", PEER, coord.addr, f"p{r}", str(r)], cwd=ROOT)
             for r in range(3)]
    try:
        wait_for(lambda: all(GAUGES <= _series(url).get(f"p{r}", {}).keys() for r in range(3)), 30,
                 what="the three peers' figures on /metrics")
        peers[1].kill()                       # crashed
        peers[2].send_signal(signal.SIGTERM)  # leaves
        assert peers[2].wait(20) == 0
        wait_for(lambda: [m["state"] for m in sorted(status(coord.addr)["members"], key=lambda m: m["id"])]
                 == ["alive", "dead", "dead"], 30, what="p1 and p2 dead in the coordinator's table")
        # past the page's document cache (0.25 s): the scrape shows the deaths
        m = wait_for(lambda: (s := _series(url))["p1"]["swarm_peer_up"] == 0 == s["p2"]["swarm_peer_up"] and s,
                     10, what="p1 and p2 down on /metrics")
        assert GAUGES <= m["p0"].keys(), m["p0"]
        for pid in ("p1", "p2"):
            gauges = {k for k in m[pid] if not k.endswith("_total")}
            assert gauges == {"swarm_peer_up"}, (pid, m[pid])
            # its counters stay: a rate() over them is right, and they do not go down
            assert m[pid]["swarm_peer_env_steps_total"] == 100 and m[pid]["swarm_peer_relay_stale_total"] == 2, m[pid]
    finally:
        reap_all(peers)
