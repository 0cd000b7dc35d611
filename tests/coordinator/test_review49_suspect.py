"""A suspect that arrives while a coordinator's stall holds (the forty-ninth session's review:
Ctrl-Z on `swarm run` stops the coordinator and the peers together, and at `fg` the peers'
links had timed out): its probe found the old connection closed and declared a live member
dead (1 stop in 8 under load). No probe while the hold lasts, as for every other cause."""

from __future__ import annotations

import asyncio
import time

from swarm.coordinator.server import Coordinator
from swarm.peer.peer import Peer


def test_a_suspect_during_a_stall_hold_is_not_probed_and_one_after_it_is():
    async def main() -> list[tuple[str, str]]:
        # a long probe_timeout_s: the hold (at least that long) outlasts the test's first part;
        # long zmtp_timeout_s and takeover_s: a stall of this loaded loop is not taken as one
        # (its hold would drop the second suspect too), only the test's own hold counts
        coord = Coordinator(bind="tcp://127.0.0.1:0", http_bind="", probe_timeout_s=60.0,
                            zmtp_timeout_s=30.0, takeover_s=30.0)
        await coord.start()
        peers = [Peer(coordinators=[coord.address], id=f"p{i}") for i in range(2)]
        probed: list[tuple[str, str]] = []
        try:
            await asyncio.gather(*(p.start() for p in peers))
            await asyncio.gather(*(p.wait_linked(timeout=30) for p in peers))
            coord._probe = lambda pid, cause: probed.append((pid, cause))
            suspects: list[str] = []
            handle = coord._handle

            def counted(route, msg, frame, now):
                handle(route, msg, frame, now)
                if msg.t == "suspect":
                    suspects.append(msg.src)

            coord._handle = counted
            coord._stalled_at = time.monotonic()     # as _check_stall marks a stall's thaw
            peers[0]._send_coord("suspect", {"id": "p1"})
            for _ in range(400):   # until the coordinator has handled it (20 s at most)
                if suspects:
                    break
                await asyncio.sleep(0.05)
            assert suspects == ["p0"]
            held = list(probed)
            coord._stalled_at = 0.0                  # the hold over
            peers[0]._send_coord("suspect", {"id": "p1"})
            for _ in range(400):   # 20 s at most
                if len(probed) > len(held):
                    break
                await asyncio.sleep(0.05)
            return held, list(probed)
        finally:
            for p in peers:
                await p.close()
            await coord.close()

    held, probed = asyncio.run(main())
    assert held == []
    assert probed == [("p1", "suspected by p0")]
