"""An in-memory Link for federation tests: messages go through the real wire codec."""

from __future__ import annotations

import asyncio
import inspect

from swarm import wire
from swarm.link import Member, View


class Hub:
    """Routes messages between FakeLinks on one event loop; a killed peer is silent both ways."""

    def __init__(self) -> None:
        self.links: dict[str, "FakeLink"] = {}
        self.dead: set[str] = set()
        self.tasks: set[asyncio.Task] = set()

    def link(self, peer_id: str, neighbours: list[str]) -> "FakeLink":
        ln = FakeLink(self, peer_id, neighbours)
        self.links[peer_id] = ln
        return ln

    def kill(self, peer_id: str) -> None:
        self.dead.add(peer_id)

    async def settle(self, rounds: int = 20) -> None:
        """Let queued deliveries (and the replies they cause) run."""
        for _ in range(rounds):
            await asyncio.sleep(0)
            if self.tasks:
                await asyncio.gather(*list(self.tasks))

    async def close(self) -> None:
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*list(self.tasks), return_exceptions=True)


class FakeLink:
    def __init__(self, hub: Hub, peer_id: str, neighbours: list[str]) -> None:
        self._hub, self._id, self._nbrs = hub, peer_id, list(neighbours)
        self._handlers: dict[str, object] = {}
        self.sent = 0

    @property
    def id(self) -> str:
        return self._id

    @property
    def view(self) -> View:
        return View(1, tuple(Member(i, "inproc://" + i, r) for r, i in enumerate(sorted(self._hub.links))))

    def neighbours(self) -> list[str]:
        return [n for n in self._nbrs if n not in self._hub.dead]

    def set_neighbours(self, nbrs: list[str]) -> None:
        self._nbrs = list(nbrs)

    def on(self, t, handler) -> None:
        self._handlers[t] = handler

    def on_view(self, cb) -> None:
        pass

    async def send(self, dst, t, body=None, arrays=(), *, timeout=None) -> bool:
        hub = self._hub
        if self._id in hub.dead or dst in hub.dead or dst not in hub.links:
            return False
        frames = wire.encode(t, self._id, body=body, arrays=arrays)
        msg = wire.decode([bytes(f) for f in frames])   # copies, like a real socket
        handler = hub.links[dst]._handlers.get(t)
        if handler is None:
            return True
        self.sent += 1

        async def deliver():
            if dst in hub.dead:
                return
            r = handler(msg)
            if inspect.isawaitable(r):
                await r

        task = asyncio.get_running_loop().create_task(deliver())
        hub.tasks.add(task)
        task.add_done_callback(hub.tasks.discard)
        return True
