"""SimHub's link emulation under both event loops, and which modules pick uvloop (the
forty-ninth session's review of loops).

Under uvloop ``loop.time()`` goes by whole ms (floored) and a timer's delay is rounded to
whole ms (one under 0.5 ms is none): a hub that scheduled on them delivered messages up
to a ms before their ``latency_s`` or their turn on the link. The assertions are lower
bounds the hub promises (no message before its time), not speed targets."""

import ast
import asyncio
import re
import time
from pathlib import Path

import numpy as np
import pytest
import uvloop

from swarm.gossip.sim import SimHub

T = "review49.data"
RUNNERS = [pytest.param(asyncio.run, id="asyncio"), pytest.param(uvloop.run, id="uvloop")]
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("run", RUNNERS)
@pytest.mark.parametrize("latency", [0.0003, 0.002])
def test_no_message_is_delivered_before_its_latency(run, latency):
    async def main():
        hub = SimHub(latency_s=latency)
        a, b = hub.add_many(2)
        delays = {a.id: [], b.id: []}   # per receiver: delivery - send, in order
        sent = {}
        def on_data(m, me):
            delays[me].append((m.body["i"], time.monotonic() - sent[m.src, m.body["i"]]))
        for link in (a, b):
            link.on(T, lambda m, me=link.id: on_data(m, me))
        for i in range(30):
            await asyncio.sleep(0.003)
            for src, dst in ((a, b), (b, a)):
                sent[src.id, i] = time.monotonic()
                assert await src.send(dst.id, T, {"i": i})
            while min(len(d) for d in delays.values()) <= i:
                await asyncio.sleep(0)
        await hub.close()
        return hub, delays

    hub, delays = run(main())
    for dst, got in delays.items():
        assert [i for i, _ in got] == list(range(30)), dst
        early = [round(d * 1e3, 3) for _, d in got if d < latency - 1e-9]   # 1 ns: float rounding
        assert not early, f"to {dst}: {len(early)}/30 delivered before latency_s={latency}: {early} ms"
    assert not any(hub._in_flight.values()) and hub.undeliverable == 0


@pytest.mark.parametrize("run", RUNNERS)
def test_back_to_back_messages_wait_for_the_link_and_keep_their_order(run):
    bps, latency, bursts, n = 1e8, 0.0003, 6, 8
    x = np.zeros(4_000, np.uint8)   # about 0.33 ms on the link each: not whole ms

    async def main():
        hub = SimHub(bandwidth_bps=bps, latency_s=latency)
        a, b = hub.add_many(2)
        got = []
        b.on(T, lambda m: got.append((m.body["k"], time.monotonic())))
        starts = []
        for burst in range(bursts):   # each from another point in the loop's ms
            await asyncio.sleep(0.003)
            starts.append(time.monotonic())
            for k in range(1, n + 1):
                assert a.send_nowait(b.id, T, {"k": k}, [x])
            while len(got) < (burst + 1) * n:
                await asyncio.sleep(0.001)
        await hub.close()
        return hub, got, starts

    hub, got, starts = run(main())
    assert [k for k, _ in got] == list(range(1, n + 1)) * bursts
    size = hub.link_bytes[("p000", "p001")] / (bursts * n)
    for i, (k, at) in enumerate(got):
        due = k * 8.0 * size / bps + latency
        # 1 ns of slack for the sums' rounding, not for timing
        assert at - starts[i // n] >= due - 1e-9, \
            f"burst {i // n}, message {k}: arrived {(due - (at - starts[i // n])) * 1e3:.3f} ms early"
    assert hub._in_flight[("p000", "p001")] == 0


def _picks_uvloop(path: Path) -> bool:
    """Whether the code (not a docstring or message naming it) uses ``uvloop.new_event_loop``."""
    return any(isinstance(n, ast.Attribute) and n.attr == "new_event_loop"
               and isinstance(n.value, ast.Name) and n.value.id == "uvloop"
               for n in ast.walk(ast.parse(path.read_text())))


def test_the_modules_that_pick_uvloop_are_the_ones_the_docs_name():
    picks = {str(p.relative_to(ROOT)) for p in (ROOT / "swarm").rglob("*.py") if _picks_uvloop(p)}
    assert picks == {"swarm/cli.py", "swarm/experiment/ray_launch.py"}
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "only the `swarm` command and `launch_ray`'s peer actors use uvloop" in readme
    cli_doc = (ROOT / "swarm" / "cli.py").read_text().split('"""')[1]
    sentence = re.search(r"[^.]*uvloop[^.]*\.", cli_doc).group(0)
    assert "launch_ray" in sentence, f"swarm/cli.py's docstring: {sentence.strip()!r}"
