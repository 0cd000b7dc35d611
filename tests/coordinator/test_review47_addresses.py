"""Review 47 (rC): addresses a coordinator is given or handed. An other coordinator
whose name does not resolve held a standby back for ever, in silence; a member that
advertised 0.0.0.0 was handed to every neighbour; a bind that failed printed its
address twice and called a name that does not resolve "No such device"."""

from __future__ import annotations

import socket

import pytest
import zmq
from swarmtest import free_port, status, wait_for

from swarm import transport as tp
from swarm import wire
from swarm.config import load_config
from swarm.errors import ConfigError, TransportError


# ------------------------------------------------------------ an other that does not resolve

def test_a_coordinator_whose_other_does_not_resolve_takes_over_and_names_it(procs):
    # libzmq reports no event for a name it cannot resolve: the first dial never ended,
    # and the coordinator stood by for ever, refusing every peer, with nothing in its log
    addr, other = f"tcp://127.0.0.1:{free_port()}", f"tcp://standby-b.invalid:{free_port()}"
    p = procs.start("coordinator", "--bind", addr, "--others", other, name="coord")
    wait_for(lambda: status(addr, 0.5)["mode"] == "active", 20, what="the coordinator active")
    st = status(addr)
    (o,) = st["others"]
    assert o["address"] == other and o["state"] == "no answer"
    assert "does not resolve" in o["error"], o
    line = wait_for(lambda: next((ln for ln in procs.log(p).splitlines() if "does not resolve" in ln), None), 10,
                    what="the warning")
    assert other in line and "--others" in line, line
    # once, though libzmq had tried the name again several times before the takeover
    assert procs.log(p).count("does not resolve") == 1


# ------------------------------------------------------------ an address to listen on, advertised

@pytest.mark.parametrize("addr", ["tcp://0.0.0.0:5555", "tcp://0:5555", "tcp://0.0:5555"])
def test_an_address_to_listen_on_is_no_address_to_dial(addr):
    assert tp.dial_address_error(addr) == f"{addr!r} is an address to listen on (every interface), not one to dial"


@pytest.mark.parametrize("addr", ["tcp://127.0.0.1:5555", "tcp://localhost:1", "tcp://10.0.0.1:5555"])
def test_an_address_to_dial_is_one(addr):
    assert tp.dial_address_error(addr) == ""


def test_a_join_advertising_every_interface_is_refused(procs):
    # the coordinator handed tcp://0.0.0.0:PORT to every neighbour, which dialled its own host
    c = procs.coordinator(None)
    d = zmq.Context.instance().socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.setsockopt(zmq.RCVTIMEO, 10_000)
    d.connect(c.addr)
    try:
        for i, junk in enumerate(["tcp://0.0.0.0:5555", "tcp://0:5556"]):
            d.send_multipart(wire.encode("join", f"p{i}", body={"rank": -1, "inc": 1, "addr": junk}))
            msg = wire.decode(d.recv_multipart())
            assert msg.t == "refuse", (junk, msg)
            assert f"{junk!r} is an address to listen on (every interface), not one to dial" in msg.body["reason"]
            assert "peer.advertise" in msg.body["reason"]
        assert status(c.addr)["view"]["members"] == []
    finally:
        d.close(0)


def test_a_peer_advertising_every_interface_is_told_why(procs):
    c = procs.coordinator(None)
    port = free_port()
    p = procs.start("peer", "--coordinator", c.addr, "--id", "p0", "--bind", f"tcp://0.0.0.0:{port}",
                    "--set", f"peer.advertise=tcp://0.0.0.0:{port}", name="peer")
    assert p.wait(30) != 0
    log = procs.log(p)
    # refused by its own config check, before it joins (the coordinator's check is above)
    assert f"peer.advertise = 'tcp://0.0.0.0:{port}': must be tcp://HOST:PORT" in log and "not 0.0.0.0" in log, log


# ------------------------------------------------------------ bind failures

def test_a_bind_on_a_port_in_use_names_the_key_and_the_address_once(procs):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", free_port()))
        busy.listen()
        addr = f"tcp://127.0.0.1:{busy.getsockname()[1]}"
        p = procs.start("coordinator", "--bind", addr, name="coord")
        assert p.wait(30) != 0
    log = procs.log(p)
    assert f"coordinator.bind: cannot bind {addr}: Address already in use" in log, log
    assert log.count(addr) == 1, log


def test_a_bind_on_a_name_that_does_not_resolve_says_so(procs):
    addr = f"tcp://coord-host.invalid:{free_port()}"
    p = procs.start("coordinator", "--bind", addr, name="coord")
    assert p.wait(30) != 0
    log = procs.log(p)
    assert f"coordinator.bind: cannot bind {addr}: coord-host.invalid does not resolve to an IPv4 address" in log, log
    assert "No such device" not in log and log.count(addr) == 1, log


@pytest.mark.parametrize("host", ["my-host.invalid", "localhost."])
def test_the_transport_bind_says_a_name_does_not_resolve(host):
    s = zmq.Context.instance().socket(zmq.ROUTER)
    try:
        with pytest.raises(TransportError) as e:
            tp.bind(s, f"tcp://{host}:*", what="peer.bind")
        assert str(e.value).startswith(f"peer.bind: cannot bind tcp://{host}:*: {host} does not resolve to an "
                                       "IPv4 address"), e.value
        assert "addr=" not in str(e.value)
    finally:
        s.close(0)


@pytest.mark.parametrize("addr", ["tcp://0.0.0.0:5555", "tcp://0:5555"])
def test_the_config_refuses_advertising_every_interface(addr):
    with pytest.raises(ConfigError, match=rf"^peer\.advertise = '{addr}': must be tcp://HOST:PORT .*not 0\.0\.0\.0"):
        load_config(None, ["peer.bind=tcp://0.0.0.0:5555", f"peer.advertise={addr}"])
