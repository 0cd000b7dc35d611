"""The envelope: round trips without copies, and every check refuses bad input."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from swarm import wire
from swarm.errors import WireError


def test_round_trip_arrays_zero_copy():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.array([1, -2, 3], dtype=np.int8)
    frames = wire.encode("ping", "p1", epoch=7, seq=3, body={"k": "v"}, arrays=[a, b, np.zeros(0, np.float64)])
    msg = wire.decode([bytes(f) if not isinstance(f, bytes) else f for f in frames])
    assert (msg.t, msg.src, msg.epoch, msg.seq, msg.body) == ("ping", "p1", 7, 3, {"k": "v"})
    np.testing.assert_array_equal(msg.arrays[0], a)
    np.testing.assert_array_equal(msg.arrays[1], b)
    assert msg.arrays[2].shape == (0,)
    # decoding views the received buffer, it does not copy it
    buf = bytearray(bytes(frames[1]))
    msg2 = wire.decode([frames[0], buf, bytes(frames[2]), b""])
    buf[:4] = np.float32(42).tobytes()
    assert msg2.arrays[0][0, 0] == 42


def test_encode_refuses_unlisted_dtype():
    with pytest.raises(WireError, match="cannot go on the wire"):
        wire.encode("ping", "p", arrays=[np.array(["a"], dtype=object)])
    with pytest.raises(WireError):
        wire.encode("ping", "p", arrays=[np.zeros(2, dtype=">f4")])


def test_non_contiguous_is_sent_contiguous():
    a = np.arange(20, dtype=np.float32).reshape(4, 5)[:, ::2]
    msg = wire.decode([bytes(f) if not isinstance(f, bytes) else f for f in wire.encode("ping", "p", arrays=[a])])
    np.testing.assert_array_equal(msg.arrays[0], a)


@pytest.mark.parametrize("frames,match", [
    ([], "empty"),
    ([b"\xc1"], "not valid msgpack"),
    ([msgpack.packb({"v": 2, "t": "ping", "src": "x"})], "version"),
    ([msgpack.packb({"v": 1, "t": "nope", "src": "x"})], "unknown message type"),
    ([msgpack.packb({"v": 1, "t": "ping", "src": 5})], "bad src"),
    ([msgpack.packb({"v": 1, "t": "ping", "src": "x", "arrays": [["float32", [3]]]}), b"1234"], "needs 12 bytes"),
    ([msgpack.packb({"v": 1, "t": "ping", "src": "x", "arrays": [["complex64", [1]]]}), b"12345678"], "not allowed"),
    ([msgpack.packb({"v": 1, "t": "ping", "src": "x", "arrays": []}), b"x"], "describes 0 arrays"),
    ([msgpack.packb({"v": 1, "t": "ping", "src": "x", "arrays": [["uint8", [1, True]]]}), b"x"], "bad shape"),
])
def test_decode_rejects(frames, match):
    with pytest.raises(WireError, match=match):
        wire.decode(frames)


def test_limits_enforced():
    lim = wire.Limits(max_message_bytes=100, max_frames=2)
    with pytest.raises(WireError, match="exceeds the limit"):
        wire.decode(wire.encode("ping", "x", arrays=[np.zeros(200, np.uint8)]), lim)
    with pytest.raises(WireError, match="frames"):
        wire.decode([bytes(f) for f in wire.encode("ping", "x", arrays=[np.zeros(1, np.uint8)] * 4)], lim)
    big_str = msgpack.packb({"v": 1, "t": "ping", "src": "x", "body": {"s": "a" * 100_000}})
    with pytest.raises(WireError, match="msgpack"):
        wire.decode([big_str])


def test_register_type():
    with pytest.raises(ValueError):
        wire.register_type("")
    wire.register_type("test.custom")
    assert wire.decode(wire.encode("test.custom", "x")).t == "test.custom"


def test_view_delta_round_trip():
    from swarm.link import Member, View
    a = View(3, (Member("a", "x", 0), Member("b", "y", 1), Member("c", "z", 2)))
    b = View(4, (Member("a", "x", 0), Member("c", "z2", 2), Member("d", "w", 3)))
    d = b.delta(a)
    assert d["remove"] == ["b"] and [m[0] for m in d["add"]] == ["c", "d"]
    assert a.apply(d) == b
    with pytest.raises(ValueError, match="against epoch 3"):
        View(2).apply(d)
