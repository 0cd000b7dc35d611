"""Texts that quote a value a sender chose go through swarm.wire.shown() (review 41): a
member address from a join, a view or view delta from the coordinator, a codec's meta from
a delta or gradient, and a sender's id in the relay's log lines. shown() makes a bounded
repr without rendering the whole value and escapes line breaks, so a huge field neither
holds the receiver's loop while its text is built nor makes a huge text, and an id with a
line break cannot forge a log line. Sizes are checked (reprs made, text length), not times."""

import asyncio
import logging

import pytest

from swarm.compress import Encoded, get_codec
from swarm.errors import WireError
from swarm.gossip import GradientRelay
from swarm.gossip.relay import GRAD_LATE, GRAD_STATE
from swarm.gossip.sim import SimHub
from swarm.link import View
from swarm.transport import member_address_error
from swarm.wire import Message

from gossip.test_quoted_values import FORGED, MAX_TEXT, Counted, huge


def row() -> list[float]:
    """One list of 100,000 floats."""
    return huge()[0]


def bounded(text: str) -> None:
    assert Counted.made < 100, Counted.made
    assert len(text) < MAX_TEXT and "\n" not in text, (len(text), text[:500])


# ---------------------------------------------------------------- 1. transport

def test_a_member_address_from_a_join_is_quoted_without_rendering_it():
    """member_address_error made repr(addr) whole and then cut it to 60 characters: a join
    whose addr was 4 lists of 100k floats rendered 400,000 reprs (a 3 MB text) on the
    coordinator's loop for one refusal."""
    bounded(member_address_error(huge()))
    bounded(member_address_error("tcp://h:0\n" + "x" * 60_000))


# ---------------------------------------------------------------- 2. link

VIEWS = {
    "not a map": lambda: huge(),
    "epoch": lambda: {"epoch": huge(), "members": []},
    "members": lambda: {"epoch": 0, "members": {"m": huge()}},
    "member": lambda: {"epoch": 0, "members": [row()]},
    "member's fields": lambda: {"epoch": 0, "members": [[row(), "tcp://h:1", 0]]},
    "member's rank": lambda: {"epoch": 0, "members": [["a", "tcp://h:1", row()]]},
    "member's id": lambda: {"epoch": 0, "members": [["a" * 60_000 + "\n", "tcp://h:1", -1]]},
}


@pytest.mark.parametrize("case", list(VIEWS))
def test_a_bad_view_is_refused_with_a_short_text_on_one_line(case):
    """View.from_wire quoted the view as {d!r:.200}, {members!r:.200}, {m!r:.200},
    {epoch!r:.60}: each repr made whole, then cut; a view of 4 lists of 100k floats
    rendered them all on the peer's loop."""
    with pytest.raises(ValueError) as e:
        View.from_wire(VIEWS[case]())
    bounded(str(e.value))


DELTAS = {
    "not a map": lambda: huge(),
    "base": lambda: {"base": huge(), "epoch": 1, "add": [], "remove": []},
    "epoch": lambda: {"base": 0, "epoch": huge(), "add": [], "remove": []},
    "remove": lambda: {"base": 0, "epoch": 1, "add": [], "remove": row()},
    "add": lambda: {"base": 0, "epoch": 1, "add": [row()], "remove": []},
    "added member": lambda: {"base": 0, "epoch": 1, "add": huge(), "remove": []},
}


@pytest.mark.parametrize("case", list(DELTAS))
def test_a_bad_view_delta_is_refused_with_a_short_text_on_one_line(case):
    """View.apply quoted base and epoch ({base!r}, {epoch!r}), add and remove ({add!r},
    {remove!r}) whole, with no cut at all: a delta whose remove was 100k floats made a
    text of 1.8 million characters."""
    with pytest.raises(ValueError) as e:
        View(0, ()).apply(DELTAS[case]())
    bounded(str(e.value))


# ---------------------------------------------------------------- 3. compress

METAS = {
    "codec": ("topk:0.5", lambda: {"codec": huge(), "n": 4}),
    "n": ("topk:0.5", lambda: {"codec": "topk", "n": huge()}),
    "k": ("topk:0.5", lambda: {"codec": "topk", "n": 4, "k": huge()}),
    "float": ("sign", lambda: {"codec": "sign", "n": 8, "scale": huge()}),
    "scale": ("fp16", lambda: {"codec": "fp16", "n": 4, "scale": huge()}),
}


@pytest.mark.parametrize("case", list(METAS))
def test_a_bad_meta_is_refused_with_a_short_text_on_one_line(case):
    """The shared decode checks quoted a received meta's values whole ({v!r} in meta_int,
    meta_float and meta_scale, {meta.get('codec')!r} in _check): the engine's 'codec could
    not decode: {e}' and the relay's gradient errors passed those texts on."""
    spec, meta = METAS[case]
    with pytest.raises(WireError) as e:
        get_codec(spec).decode(Encoded(meta(), []))
    bounded(str(e.value))


def test_a_bad_meta_codec_name_is_quoted_short_where_n_is_read():
    """Encoded.n named the payload by str(meta['codec']), whole: a codec name of 4 lists of
    100k floats rendered them all."""
    with pytest.raises(WireError) as e:
        Encoded({"codec": huge(), "n": "x"}, []).n
    bounded(str(e.value))


# ---------------------------------------------------------------- 4. relay logs

def test_a_senders_id_with_a_line_break_forges_no_relay_log_line(caplog):
    """The relay's resync log lines printed a sender's id raw (%s, and {msg.src} in the why
    text of _tend): a grad_late or grad_state from 'Z\\n<a forged line>' wrote that line
    into the peer's log (the debug line of _on_side, and the info lines of _ask and
    _side_now that name the peer it asks, with _tend's why text)."""
    caplog.set_level(logging.DEBUG, logger="swarm.gossip.relay")

    async def main():
        hub = SimHub(topology="ring")
        a, b = (GradientRelay(link, 4, state=lambda: ({}, [])) for link in hub.add_many(2))
        try:
            a._on_side(Message(GRAD_STATE, FORGED, body={"r": 1, "no": "x"}))   # answers no request
            a._on_side(Message(GRAD_LATE, FORGED, body={"c": 5, "at": 5, "f": 1}))
            a._tend()   # wishes for FORGED's copy
            a._ask()    # FORGED has no link: not sent
        finally:
            await hub.close()
    asyncio.run(main())
    texts = [r.getMessage() for r in caplog.records if r.name == "swarm.gossip.relay"]
    assert len([t for t in texts if "Z" in t]) == 3, texts
    for text in texts:
        assert "\n" not in text, text
