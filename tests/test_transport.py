"""What a peer bound to a wildcard address advertises (swarm.transport.advertised)."""

from __future__ import annotations

import logging

import pytest

from swarm import transport


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
