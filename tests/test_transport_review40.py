"""Review 40 of swarm.transport and swarm.wire: what a send-only DEALER takes in, a key
check whose thread cannot start, error texts that quote a sender's values, ports written
in digits other than 0-9, and an epoch or seq out of 64 bits."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import time

import msgpack
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message
from swarmtest import ROOT

from swarm import transport, wire
from swarm.errors import TransportError, WireError


# --- dealer(send_only=True): a link's DEALER holds nothing a neighbour sends back


def _monitor_events(mon: zmq.Socket) -> list[int]:
    events = []
    while mon.poll(0):
        events.append(recv_monitor_message(mon)["event"])
    return events


def test_a_send_only_dealer_holds_nothing_a_hostile_router_sends_back():
    # A link's DEALER only sends and nothing reads it, yet it took messages of up to
    # 512 MiB, 1000 of them, from the member at the other end and kept them for the
    # link's life: 100 messages of 8 MiB took a peer from 44 MB to 845 MB.
    ctx = zmq.Context()
    hostile = ctx.socket(zmq.ROUTER)
    hostile.linger = 0
    hostile.router_mandatory = 1
    mon = hostile.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    d = None
    try:
        d = transport.dealer(ctx, send_only=True)
        transport.connect(d, transport.bind(hostile, "tcp://127.0.0.1:*"))
        d.send(b"hello")
        assert hostile.poll(10_000), "the DEALER's message never arrived"
        route = hostile.recv_multipart()[0]
        junk = bytes(1 << 20)
        held = sent = 0
        disconnected = False
        deadline = time.monotonic() + 20
        # until libzmq drops the connection for the oversized message, or the DEALER
        # has taken in more than one message could be
        while time.monotonic() < deadline and not disconnected and held <= len(junk):
            for _ in range(10):
                try:
                    hostile.send_multipart([route, junk], zmq.NOBLOCK)
                    sent += 1
                except zmq.ZMQError:   # full, or the route already gone
                    break
            while d.poll(0):   # what the DEALER holds (a peer never reads it: it stays)
                held += sum(len(f) for f in d.recv_multipart())
            disconnected = zmq.EVENT_DISCONNECTED in _monitor_events(mon)
            if not disconnected:
                mon.poll(20)
        assert sent and held == 0, f"the DEALER took in {held} bytes of {sent} MiB sent back"
        assert disconnected, "no oversized message reached the DEALER before the deadline"
    finally:
        if d is not None:
            d.close(0)
        hostile.disable_monitor()
        mon.close(0)
        hostile.close(0)
        ctx.term()


def test_a_send_only_dealer_keeps_its_connection_through_curve_and_heartbeats():
    # Its small message limit must still take the CURVE handshake and ZMTP pings (libzmq
    # applies MAXMSGSIZE to commands too): a connection it refused would be dialled
    # again under a new routing id, over and over, and lose what was written to it.
    ctx = zmq.Context()
    server_public, server_secret = zmq.curve_keypair()
    public, secret = zmq.curve_keypair()
    r = transport.router(ctx)
    r.curve_publickey, r.curve_secretkey, r.curve_server = server_public, server_secret, True
    d = None
    try:
        d = transport.dealer(ctx, send_only=True, heartbeat_s=0.02, heartbeat_timeout_s=0.2)
        d.curve_publickey, d.curve_secretkey, d.curve_serverkey = public, secret, server_public
        transport.connect(d, transport.bind(r, "tcp://127.0.0.1:*"))
        routes = []
        for i in range(3):
            d.send(b"%d" % i)
            assert r.poll(10_000), f"message {i} never arrived"
            route, body = r.recv_multipart()
            assert body == b"%d" % i
            routes.append(route)
            time.sleep(0.5)   # 25 heartbeat intervals, each a PING and a PONG under CURVE
        assert len(set(routes)) == 1, "the connection was dropped and made again"
    finally:
        if d is not None:
            d.close(0)
        r.close(0)
        ctx.term()


def test_a_dealer_that_is_not_send_only_still_takes_large_replies():
    # the coordinator's DEALER of a peer reads its replies: those keep the full limit
    ctx = zmq.Context()
    r = transport.router(ctx)
    d = transport.dealer(ctx)
    try:
        transport.connect(d, transport.bind(r, "tcp://127.0.0.1:*"))
        d.send(b"ask")
        assert r.poll(10_000)
        route = r.recv_multipart()[0]
        r.send_multipart([route, bytes(1 << 20)])
        assert d.poll(10_000) and len(d.recv()) == 1 << 20
    finally:
        d.close(0)
        r.close(0)
        ctx.term()


# --- Curve.start: a key-check thread that cannot start leaves no socket open

_CURVE_THREAD_FAILS = textwrap.dedent("""
    import faulthandler, sys
    faulthandler.dump_traceback_later(30, exit=True)   # a hung term() is reported, not waited on
    import zmq, zmq.auth.thread
    from swarm import transport

    def cannot_start(self):
        raise RuntimeError("can't start new thread")

    zmq.auth.thread.AuthenticationThread.start = cannot_start
    transport.generate_keys(sys.argv[1], ["coordinator", "peer"])
    curve = transport.Curve(sys.argv[1], "peer")
    ctx = zmq.Context()
    try:
        curve.start(ctx)
    except Exception as e:   # as a peer's start does, which then closes what it made
        print(f"{type(e).__name__}: {e}", flush=True)
    ctx.term()
    print("terminated", flush=True)
""")


def test_a_key_check_thread_that_cannot_start_is_a_transport_error_and_the_context_ends(tmp_path):
    # pyzmq's ThreadAuthenticator.start() raises RuntimeError ("can't start new thread")
    # after binding its ZAP socket and making its pipe: Curve.start caught only ZMQError,
    # so the RuntimeError escaped, the sockets stayed open and the owner's ctx.term()
    # (a peer's close after its failed start) waited for ever.
    p = subprocess.Popen([sys.executable, "-c", _CURVE_THREAD_FAILS, str(tmp_path / "keys")], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert "TransportError: keys: cannot start the key check" in out and "can't start new thread" in out, out
    assert "terminated" in out and p.returncode == 0, out


# --- error texts quote what a sender chose at a bounded length


def _refusal(frames: list[bytes]) -> str:
    with pytest.raises(WireError) as e:
        wire.decode(frames)
    return str(e.value)


_HUGE = [list(range(1000)) for _ in range(100)]   # 100,000 ints, ~200 KB on the wire


@pytest.mark.parametrize("key, says", [("v", "protocol version"), ("t", "unknown message type"),
                                       ("src", "bad src")])
def test_a_refused_header_value_is_quoted_short(key, says):
    # decode quoted v, t and src with a whole repr: a 4 MB header of a 4M-int list made a
    # 12 MB error text, built and logged at 7x the cost of accepting a message
    head = {"v": wire.VERSION, "t": "ping", "src": "a", "epoch": 0, "seq": 0, "body": {}, "arrays": []}
    head[key] = _HUGE
    text = _refusal([msgpack.packb(head)])
    assert len(text) < 300, f"{len(text)} characters: {text[:300]}"
    assert text.startswith(says)


@pytest.mark.parametrize("desc, says", [
    (["x" * 60_000, [1]], "dtype"),
    (["float32", list(range(100_000))], "bad shape"),
    (["float32", [1, 2, _HUGE]], "bad shape"),
])
def test_a_refused_array_descriptor_is_quoted_short(desc, says):
    head = {"v": wire.VERSION, "t": "ping", "src": "a", "arrays": [desc]}
    text = _refusal([msgpack.packb(head), b""])
    assert len(text) < 300, f"{len(text)} characters: {text[:300]}"
    assert says in text


def test_a_short_refused_value_is_still_quoted_whole():
    head = {"v": wire.VERSION + 1, "t": "nosuchtype", "src": "a"}
    assert _refusal([msgpack.packb(head)]) == (f"protocol version {wire.VERSION + 1}, expected {wire.VERSION} "
                                               "(another swarm release: every host must run the same one)")
    head["v"] = wire.VERSION
    assert _refusal([msgpack.packb(head)]) == "unknown message type 'nosuchtype'"


def test_bad_input_logs_a_long_reason_cut_short(caplog):
    # BadInput logged a refusal's text whole: 12 MB a record, one per new source
    bad = transport.BadInput("peer x")
    with caplog.at_level(logging.WARNING, logger="swarm.transport"):
        bad(b"route", WireError("header says " + "x" * 100_000))
    logged = caplog.records[0].getMessage()
    assert len(logged) < 1000, f"{len(logged)} characters logged"
    assert bad.count == 1 and "dropped malformed message from b'route': header says xxx" in logged


# --- ports: only 0-9 are digits to libzmq


@pytest.mark.parametrize("port", ["²", "¹²", "٣"])
@pytest.mark.parametrize("verb", ["bind", "connect"])
def test_a_port_in_other_digits_is_a_transport_error(verb, port):
    # str.isdigit() is true for "²" and "٣", and int("²") raised a plain ValueError out
    # of bind and connect (Coordinator(bind="tcp://127.0.0.1:²").start(), Peer's too)
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.linger = 0
    try:
        with pytest.raises(TransportError, match=f"tcp://127.0.0.1:{port}"):
            getattr(transport, verb)(s, f"tcp://127.0.0.1:{port}")
    finally:
        s.close(0)
        ctx.term()


def test_a_port_over_65535_is_still_refused():
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.linger = 0
    try:
        with pytest.raises(TransportError, match="port 99999 is out of range"):
            transport.bind(s, "tcp://127.0.0.1:99999")
    finally:
        s.close(0)
        ctx.term()


# --- encode: an epoch or seq out of 64 bits is named


@pytest.mark.parametrize("field, value", [("epoch", 2**64), ("seq", 2**64), ("epoch", -2**63 - 1),
                                          ("seq", -2**100),
                                          pytest.param("epoch", 2**20_000, id="epoch-2**20000")])
def test_an_epoch_or_seq_out_of_64_bits_is_named(field, value):
    # encode said "body cannot go on the wire: Integer value out of range", blaming an
    # empty body for what msgpack refused in the header's epoch or seq
    with pytest.raises(WireError, match=f"^{field} must be an int of 64 bits") as e:
        wire.encode("ping", "a", **{field: value})
    assert "body" not in str(e.value)


@pytest.mark.parametrize("value", [2**64 - 1, -2**63])
def test_an_epoch_or_seq_at_the_ends_of_64_bits_goes_and_comes_back(value):
    m = wire.decode(wire.encode("ping", "a", epoch=value, seq=value))
    assert (m.epoch, m.seq) == (value, value)
