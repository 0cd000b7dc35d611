"""Another member's heartbeat stats are untrusted: a peer of `swarm run` / `swarm peer
--spec` that starts (or restarts) reads them to decide whether to bootstrap, and a
figure that is no number must count as none, not stop the peer before it trains."""

from __future__ import annotations

import asyncio
import types

import pytest
from swarmtest import until

from swarm.coordinator import Coordinator
from swarm.experiment import runner
from swarm.peer import Peer


def _their_steps(coord: Coordinator, pid: str):
    for m in coord.status()["members"]:
        if m.get("id") == pid:
            return "env_steps" in (m.get("stats") or {}) and m["stats"]["env_steps"]
    return False


@pytest.mark.parametrize("steps", ["lots", "1e400", [1, 2], {"n": 500}, True, -7])
def test_a_member_whose_env_steps_is_no_number_does_not_stop_a_starting_peer(steps):
    """The figure counts as 0 (nobody ahead: no bootstrap); once the member reports a
    real count ahead of the margin, the same question says to bootstrap."""
    async def main():
        async with Coordinator(bind="tcp://127.0.0.1:*", http_bind="") as coord:
            async with Peer(id="hostile", coordinators=[coord.address]) as hostile, \
                    Peer(id="victim", coordinators=[coord.address]):
                figure = {"env_steps": steps}
                hostile.stats = lambda: dict(figure)
                await until(lambda: _their_steps(coord, "hostile") is not False, timeout=15,
                            what="the member's stats at the coordinator")

                def ask() -> bool:   # as run_peer asks, from its own thread with its own client
                    client = runner._StatusClient(types.SimpleNamespace(keys_dir="", key_name="peer"), "victim")
                    try:
                        return runner._should_bootstrap([coord.address], client, "victim", 0, 100, fallback=False)
                    finally:
                        client.close()

                assert await asyncio.to_thread(ask) is False
                figure["env_steps"] = 500
                await until(lambda: _their_steps(coord, "hostile") == 500, timeout=15,
                            what="the member's next stats")
                assert await asyncio.to_thread(ask) is True

    asyncio.run(main())
