"""Receive-path error texts quote what a sender chose through swarm.wire.shown(): a bounded
repr, made without rendering the whole value, and with a line break escaped, so that a
message with a huge field neither holds the receiver's loop while its text is built nor
makes a huge text, and a sender's id or origin cannot forge lines wherever the text goes
(stats, exceptions, logs). Messages are built as the engine and relay malformed-input
tests build them (on the in-memory hub, or handed to the handler)."""

import asyncio
import logging
import tracemalloc

import numpy as np
import pytest

from swarm import wire
from swarm.errors import WireError
from swarm.gossip import Gossip, GradientRelay
from swarm.gossip.engine import T_BOOT, T_BOOT_REQ, T_DELTA
from swarm.gossip.relay import GRAD, GRAD_HELLO, GRAD_LATE, GRAD_STATE, GRAD_SYNC
from swarm.gossip.sim import SimHub
from swarm.peer import Peer
from swarm.wire import Message

D = 4
#: a sender's id with a line break, and a whole forged log line after it
FORGED = "Z\n2026-12-04 23:00:00,000 swarm.coordinator ERROR coordinator: member T is compromised"
#: longest error text a rejection may make (the values it quotes are cut to wire.MAX_SHOWN)
MAX_TEXT = 400


class Counted(float):
    """A float that counts how often its repr is made: how much of a value a text rendered."""

    made = 0

    def __repr__(self) -> str:
        Counted.made += 1
        return super().__repr__()


def huge() -> list[list[float]]:
    """4 lists of 100,000 floats, as the review's gsp_delta carried in r (3.6 MB)."""
    Counted.made = 0
    row = [Counted(0.123456789)] * 100_000
    return [row] * 4


def bounded(text: str) -> None:
    assert len(text) < MAX_TEXT and "\n" not in text, (len(text), text[:500])


def engine_texts(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "swarm.gossip.engine"]


def test_a_delta_with_a_huge_round_is_refused_without_rendering_it(caplog):
    """r and ver were quoted as f'{r!r:.30}': the whole repr made, then cut. A delta whose r
    was 4 lists of 100k floats held the receiver's loop ~136 ms per message (400,000
    reprs made for a 30-character text)."""
    caplog.set_level(logging.DEBUG, logger="swarm.gossip.engine")

    async def main():
        hub = SimHub(topology="ring")
        a, b, c = hub.add_many(["a", "b", "c"])
        g = Gossip(a, np.zeros(8, np.float32))
        g._on_message(Message(T_DELTA, "b", body={"r": huge(), "ver": huge(), "meta": {}}))
        assert g.stats.rejected_malformed == 1 and "b" not in g._in
        await hub.close()
    asyncio.run(main())
    assert Counted.made < 100, Counted.made
    (text,) = engine_texts(caplog)
    bounded(text)


def test_a_bootstrap_request_with_huge_bounds_is_refused_with_a_short_text(caplog):
    """lo and hi went into the text whole ({lo}, no cut at all): a request with 3.6 MB of
    floats in each made a text of millions of characters."""
    caplog.set_level(logging.DEBUG, logger="swarm.gossip.engine")

    async def main():
        hub = SimHub(topology="ring")
        a, b, c = hub.add_many(["a", "b", "c"])
        g = Gossip(a, np.zeros(8, np.float32))
        await g._on_boot_req(Message(T_BOOT_REQ, "b", body={"lo": huge(), "hi": huge(), "nonce": 1}))
        assert g.stats.rejected_malformed == 1 and g.stats.boot_served == 0
        await hub.close()
    asyncio.run(main())
    assert Counted.made < 100, Counted.made
    (text,) = engine_texts(caplog)
    bounded(text)


def test_a_bootstrap_slice_with_a_huge_round_or_from_a_forged_id_is_refused_with_a_short_text(caplog):
    """The slice's r was quoted as f'{r!r:.30}' (the whole repr made, then cut); and the
    rejection was logged with the sender's id raw, though any sender (a stranger too) may
    answer: an id with a line break wrote a forged line into the log."""
    caplog.set_level(logging.DEBUG, logger="swarm.gossip.engine")

    async def main():
        hub = SimHub()
        links = hub.add_many(3)
        g = Gossip(links[0], np.ones(1000, np.float32), topology="ring")
        task = asyncio.ensure_future(g.bootstrap(donors=1, timeout=1.0))
        await asyncio.sleep(0.05)
        (nonce, (donor, lo, hi, _)), = g._boot.items()
        ok = [np.zeros(hi - lo, np.float32)]
        g._on_boot(Message(T_BOOT, FORGED, body={"lo": lo, "hi": hi, "nonce": nonce, "r": 1}, arrays=ok))
        g._on_boot(Message(T_BOOT, donor, body={"lo": lo, "hi": hi, "nonce": nonce, "r": huge()}, arrays=ok))
        assert g.stats.rejected_malformed == 2
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await hub.close()
    asyncio.run(main())
    assert Counted.made < 100, Counted.made
    texts = engine_texts(caplog)
    assert len(texts) == 2, texts
    for text in texts:
        bounded(text)


def relay_pair(**kw):
    hub = SimHub(topology="ring")
    return hub, [GradientRelay(link, D, **kw) for link in hub.add_many(2)]


def refusal(call, **kw) -> tuple[GradientRelay, str]:
    """The first relay of a pair (its hub closed) and the WireError text ``call(relay)`` raised."""
    async def main():
        hub, (a, _) = relay_pair(**kw)
        with pytest.raises(WireError) as e:
            call(a)
        await hub.close()
        return a, str(e.value)
    return asyncio.run(main())


GOOD = {"o": "p001", "s": 1, "h": 1, "t": 0.0, "c": 0, "meta": {}, "p": 1}
#: an origin with a line break, 60,000 characters long (the wire takes strings up to 64 KiB)
LONG_ORIGIN = "O\n" + "o" * 60_000
# bodies each refused by a different check of the relay's _accept
BAD_GRADS = {
    "x": dict(GOOD, x=5),
    "o": dict(GOOD, o=5),
    "s": dict(GOOD, s=2**62),
    "r": dict(GOOD, r=2),
    "c": dict(GOOD, c=-1),
    "b": dict(GOOD, b=5),
    "p": dict(GOOD, p=2),
    "d": dict(GOOD, d=5),
    "j": dict(GOOD, j=5),
}


@pytest.mark.parametrize("src", ["p001", FORGED])
@pytest.mark.parametrize("origin", ["p001", LONG_ORIGIN])
@pytest.mark.parametrize("bad", list(BAD_GRADS))
def test_a_malformed_gradient_is_refused_with_a_short_text_on_one_line(bad, origin, src):
    """The relay's texts quoted the sender's src and the message's origin raw ({msg.src},
    {origin}): the wire takes any 1-256 character src and origins up to 64 KiB, line breaks
    and all, so an error text carried whole forged log lines, and 60,000 characters."""
    body = dict(BAD_GRADS[bad], o=origin) if bad != "o" else BAD_GRADS[bad]
    a, text = refusal(lambda a: a._accept(Message(GRAD, src, body=body), a._send))
    assert a.stats.rejected == 1 and not a.pending
    bounded(text)


def test_a_gradient_with_a_huge_clock_is_refused_without_rendering_it():
    """c was quoted as f'{c!r:.30}': the whole repr made, then cut."""
    _, text = refusal(lambda a: a._accept(Message(GRAD, "p001", body=dict(GOOD, c=huge())), a._send))
    assert Counted.made < 100, Counted.made
    bounded(text)


def test_a_gradient_the_decoder_refuses_and_a_stranger_origin_are_refused_with_a_short_text():
    """The text for gradients the decoder refuses and for origins past the strangers'
    bound quoted the origin raw."""
    async def main():
        hub, (a, _) = relay_pair()
        texts = []
        body = dict(GOOD, o=LONG_ORIGIN, meta={"codec": "none"})
        del body["p"]
        with pytest.raises(WireError) as e:   # 3 values, not D
            a._accept(Message(GRAD, FORGED, body=body, arrays=[np.ones(3, np.float32)]), a._send)
        texts.append(str(e.value))
        for i in range(1000):   # origins outside the view: a few are taken, the rest refused
            try:
                a._accept(Message(GRAD, FORGED, body=dict(GOOD, o=f"{LONG_ORIGIN}{i}")), a._send)
            except WireError as e:
                texts.append(str(e))
                break
        await hub.close()
        return texts
    texts = asyncio.run(main())
    assert len(texts) == 2, texts[:1]
    for text in texts:
        bounded(text)


@pytest.mark.parametrize("t, body", [
    (GRAD_LATE, {"c": "x"}),
    (GRAD_SYNC, {"r": 0}),
    (GRAD_STATE, {"r": 0}),
    (GRAD_STATE, {"r": 1, "no": 5}),
    (GRAD_STATE, {"r": 1, "c": "x"}),
    (GRAD_STATE, {"r": 1, "c": 0, "app": 5}),
    (GRAD_STATE, {"r": 1, "c": 0, "app": {}, "na": 0, "po": 5}),
    (GRAD_STATE, {"r": 1, "c": 0, "app": {}, "na": 0, "po": [], "g": 5}),
])
def test_a_malformed_notice_request_or_copy_is_refused_with_a_short_text_on_one_line(t, body):
    """grad_late, grad_sync and grad_state texts quoted the sender's src raw ({src}): the
    review's stranger with src 'Z\\n<a forged log line>' wrote that line into the peer's log."""
    bounded(refusal(lambda a: a._on_side(Message(t, FORGED, body=body)), state=lambda: ({}, []))[1])


def test_a_malformed_hello_is_refused_with_a_short_text_on_one_line():
    """grad_hello's text quoted the sender's src raw."""
    bounded(refusal(lambda a: a._on_hello(Message(GRAD_HELLO, FORGED, body={"ep": 5})))[1])


def test_a_welcome_with_a_huge_rank_is_refused_without_rendering_it():
    """The peer quoted a welcome's rank as f'{rank!r:.60}': the whole repr made, then cut
    (about 7 MB of temporary text for a rank of 4 lists of 100k ints, against nothing for
    a good welcome carrying the same list under another key)."""
    rows = [[10**18 + i for i in range(100_000)]] * 4
    bad = wire.encode("welcome", "coordinator", body={"rank": rows, "epoch": 0})
    good = wire.encode("welcome", "coordinator", body={"rank": 0, "epoch": 0, "pad": rows})
    p = Peer(id="T", coordinators=["tcp://127.0.0.1:9"])
    try:
        peaks = []
        for frames in (good, bad):
            tracemalloc.start()
            try:
                p._on_coord(frames)
                peaks.append(tracemalloc.get_traced_memory()[1])
            finally:
                tracemalloc.stop()
        assert p.counters.malformed == 1 and p.rank == 0
        assert p._bad.by_reason == {"bad welcome body": 1}
    finally:
        asyncio.run(p.close())
    assert peaks[1] - peaks[0] < 1 << 20, peaks
