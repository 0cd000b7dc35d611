"""Review 45: what a member may advertise. Hosts that libzmq's connect() refuses (one
that begins with '-', '_' or '.') and digits-and-dots hosts that are no IPv4 address
were admitted into views (tests/coordinator/test_membership.py joins with them); the
names and addresses that neighbours can dial stay accepted."""

from __future__ import annotations

import pytest
import zmq

from swarm.transport import member_address_error


@pytest.mark.parametrize("addr", ["tcp://my_host:5555", "tcp://host.example.com:5555", "tcp://10.0.0.1:5555",
                                  "tcp://x-:5555", "tcp://a_:5555", "tcp://0.0.0.0:5555", "tcp://localhost:1"])
def test_hosts_a_neighbour_can_dial_are_accepted(addr):
    assert member_address_error(addr) == ""
    s = zmq.Context.instance().socket(zmq.DEALER)
    try:
        s.connect(addr)   # libzmq takes it too
    finally:
        s.close(0)


@pytest.mark.parametrize("addr", ["tcp://-x:5555", "tcp://_a:5555", "tcp://..:5555", "tcp://999.1.1.1:5555",
                                  "tcp://1.2.3.4.5:5555", "tcp://1.256.1.1:5555"])
def test_hosts_no_neighbour_can_dial_are_named(addr):
    assert member_address_error(addr) == f"{addr!r} is not tcp://HOST:PORT with a port in 1..65535"
