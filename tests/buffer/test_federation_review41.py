"""Review 41 of the federation's error texts: what a sender chose is quoted bounded, a
wrong array count is named as one, and a sender's id cannot put a line break in them."""

import asyncio

import numpy as np

from fakelink import Hub
from swarm.buffer import Federation, ReplayBuffer

SCHEMA = {"obs": ("float32", (3,)), "action": ("int64", ())}
NAMES = ["obs", "action"]


def fed(hub, name="b"):
    buf = ReplayBuffer(SCHEMA, 100, first_seq=0, peer_id=name)
    return buf, Federation(buf, hub.link(name, []), seed=1)


def arrays(n_fields=2):
    """A valid layout of one item: the fields (the first ``n_fields`` of them), then the meta."""
    fields = [np.zeros((1, 3), np.float32), np.zeros(1, np.int64)][:n_fields]
    return fields + [np.zeros(1, np.int32), np.zeros(1, np.int64), np.zeros(1), np.ones(1)]


def deliver(sends):
    """Run ``sends(hub)`` against a fresh receiver 'b'; its buffer and federation."""
    async def main():
        hub = Hub()
        buf, fb = fed(hub)
        try:
            await sends(hub)
            await hub.settle()
        finally:
            fb.close()
            await hub.close()
        return buf, fb
    return asyncio.run(main())


def test_a_push_with_a_huge_fields_list_is_dropped_with_a_bounded_reason():
    # A push whose 'fields' was a long list put its whole repr in the drop text, and
    # stats.errors kept it: 20 pushes of a 3.6 MB header pinned 135 M characters.
    big = [float(i) + 0.5 for i in range(20_000)]

    async def sends(hub):
        x = hub.link("x", ["b"])
        for rid in range(3):
            await x.send("b", "buf.push", {"rid": rid, "fields": [big] * 4, "peers": []}, arrays())

    buf, fb = deliver(sends)
    assert len(buf) == 0 and fb.stats.dropped_messages == 3
    assert len(fb.stats.errors) == 3
    for e in fb.stats.errors:
        assert len(e) <= 300, f"{len(e)} characters kept"
        assert "fields [[0.5, 1.5," in e and "do not match schema" in e


def test_bad_acks_pulls_and_rids_quote_the_sender_s_value_bounded():
    # f"{v!r:.200}" made the whole repr of a sender's value and kept its first 200
    # characters: a plain prefix, made at the cost of the whole. wire.shown abbreviates
    # each list itself ("...") and is what every such text now uses.
    big = list(range(50_000))

    async def sends(hub):
        x = hub.link("x", ["b"])
        await x.send("b", "buf.ack", {"rid": big, "n": 1})
        await x.send("b", "buf.pull", {"rid": big, "n": 1})
        await x.send("b", "buf.items", {"rid": big, "fields": NAMES, "peers": []}, arrays())

    _, fb = deliver(sends)
    assert fb.stats.dropped_messages == 3
    for e in fb.stats.errors:
        assert "[0, 1, 2, 3, 4, 5, ...]" in e and len(e) <= 300, e


def test_a_wrong_number_of_arrays_is_named_as_such():
    # The fields and the array count were checked as one: a push with the right fields
    # and too few arrays read "fields ['obs', 'action'] do not match schema ['obs', 'action']".
    async def sends(hub):
        await hub.link("x", ["b"]).send("b", "buf.push", {"rid": 1, "fields": NAMES, "peers": ["x"]},
                                        arrays(n_fields=1))

    buf, fb = deliver(sends)
    assert len(buf) == 0 and fb.stats.dropped_messages == 1
    (e,) = fb.stats.errors
    assert "5 arrays, expected 6" in e, e
    assert "do not match" not in e


def test_a_sender_id_with_a_line_break_is_stored_escaped():
    # stats.errors held the sender's id raw: one with a line break (the wire takes any
    # 1-256 characters) wrote a forged line into whatever printed the errors.
    src = "z\n2026-12-04 23:00:00,000 swarm.coordinator ERROR forged"

    async def sends(hub):
        await hub.link(src, ["b"]).send("b", "buf.ack", {"rid": "x", "n": 1})

    _, fb = deliver(sends)
    (e,) = fb.stats.errors
    assert "\n" not in e and "z\\n2026" in e, e
