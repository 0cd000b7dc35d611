"""Review 45: a header whose version is 3.0 (a float: docs/wire.md says an int, MUST be
3) was taken for version 3."""

from __future__ import annotations

import msgpack
import pytest

from swarm import wire
from swarm.errors import WireError


def test_a_version_that_is_not_an_int_is_refused():
    frames = wire.encode("ping", "a")
    header = msgpack.unpackb(frames[0])
    assert wire.decode([msgpack.packb(header)]).t == "ping"
    header["v"] = float(wire.VERSION)
    with pytest.raises(WireError, match=f"protocol version {wire.VERSION}.0, expected {wire.VERSION}"):
        wire.decode([msgpack.packb(header)])
