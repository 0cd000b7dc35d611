"""What a peer bound to a wildcard address advertises (swarm.transport.advertised), and
the mechanism an endpoint's greeting names (swarm.transport.zmtp_mechanism)."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading

import pytest
import zmq
from swarmtest import free_port

from swarm import transport
from swarm.errors import WireError
from swarm.wire import DEFAULT_LIMITS


@pytest.mark.parametrize("resolved", ["127.0.1.1", "127.0.0.1"])
def test_a_loopback_guess_for_a_wildcard_bind_is_warned_about(monkeypatch, caplog, resolved):
    # Debian's /etc/hosts maps the host name to 127.0.1.1: other hosts cannot reach that
    monkeypatch.setattr(transport._socket, "gethostbyname", lambda name: resolved)
    with caplog.at_level(logging.WARNING, logger="swarm.transport"):
        assert transport.advertised("tcp://0.0.0.0:4321") == f"tcp://{resolved}:4321"
    assert "resolves to a loopback address" in caplog.text and '--bind "tcp://IP:*"' in caplog.text


def test_a_routable_guess_and_an_explicit_address_are_advertised_quietly(monkeypatch, caplog):
    monkeypatch.setattr(transport._socket, "gethostbyname", lambda name: "10.1.2.3")
    with caplog.at_level(logging.WARNING, logger="swarm.transport"):
        assert transport.advertised("tcp://0.0.0.0:4321") == "tcp://10.1.2.3:4321"
        assert transport.advertised("tcp://*:4321") == "tcp://10.1.2.3:4321"
        assert transport.advertised("tcp://127.0.0.1:4321") == "tcp://127.0.0.1:4321"
    assert caplog.text == ""


# --- zmtp_mechanism: the security mechanism an endpoint's ZMTP greeting names


def _router(ctx: zmq.Context, curve: bool) -> tuple[zmq.Socket, str]:
    s = ctx.socket(zmq.ROUTER)
    s.linger = 0
    if curve:
        public, secret = zmq.curve_keypair()
        s.curve_publickey, s.curve_secretkey, s.curve_server = public, secret, True
    return s, f"tcp://127.0.0.1:{s.bind_to_random_port('tcp://127.0.0.1')}"


@pytest.mark.parametrize("curve", [False, True])
def test_the_mechanism_of_a_zmq_endpoint_is_read_from_its_greeting(curve):
    ctx = zmq.Context()
    router, addr = _router(ctx, curve)
    client = ctx.socket(zmq.DEALER)
    client.linger = 0
    try:
        assert asyncio.run(transport.zmtp_mechanism(addr, 10.0)) == ("CURVE" if curve else "NULL")
        if not curve:   # the endpoint goes on serving after the greeting read and cut short
            client.connect(addr)
            client.send(b"hi")
            assert router.poll(10_000) and router.recv_multipart()[1] == b"hi"
    finally:
        client.close()
        router.close()
        ctx.term()


def test_no_mechanism_where_no_zmtp_greeting_comes():
    silent = socket.socket()   # accepts (the kernel does) and never says anything
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    talker = socket.socket()   # answers in another protocol
    talker.bind(("127.0.0.1", 0))
    talker.listen()
    talker.settimeout(10)

    def talk() -> None:
        try:
            conn, _ = talker.accept()
        except OSError:
            return
        with conn:
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n" * 3)

    t = threading.Thread(target=talk)
    t.start()
    try:
        for addr, timeout in [(f"tcp://127.0.0.1:{free_port()}", 10.0),       # nothing there
                              (f"tcp://127.0.0.1:{silent.getsockname()[1]}", 0.3),
                              (f"tcp://127.0.0.1:{talker.getsockname()[1]}", 10.0),
                              ("ipc:///tmp/swarm-nothing", 10.0), ("tcp://127.0.0.1", 10.0),
                              ("tcp://127.0.0.1:0", 10.0), ("tcp://127.0.0.1:99999", 10.0)]:
            assert asyncio.run(transport.zmtp_mechanism(addr, timeout)) == "", addr
    finally:
        talker.close()
        t.join(15)
        silent.close()


def test_a_message_of_very_many_frames_is_cut_short_and_the_next_one_comes_whole():
    # MAXMSGSIZE bounds each frame and the high-water mark counts messages, so libzmq
    # takes one message of any number of empty frames; drain made a Python Frame of
    # every one (~200 bytes each, for 2 on the wire: seconds and a GiB for a few
    # million) before decode refused it for its frame count
    ctx = zmq.Context()
    r = transport.router(ctx)
    d = ctx.socket(zmq.DEALER)
    try:
        d.connect(transport.bind(r, "tcp://127.0.0.1:*"))
        n = 50_000
        d.send_multipart([b""] * n)
        d.send_multipart([b"next", b"one"])
        assert r.poll(10_000)
        got: list[list[zmq.Frame]] = []
        for _ in range(100):
            got += transport.drain(r)
            if len(got) == 2:
                break
            r.poll(100)
        assert [len(m) for m in got] == [transport.KEEP_FRAMES + 1, 3]   # a ROUTER adds the routing id
        assert [f.bytes for f in got[1][1:]] == [b"next", b"one"]
        with pytest.raises(WireError, match="frames, more than the limit"):
            transport.decode_routed(got[0], DEFAULT_LIMITS)
    finally:
        d.close(0)
        r.close(0)
        ctx.term()
