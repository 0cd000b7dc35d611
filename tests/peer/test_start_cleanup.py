"""A start() that fails, whatever the error, closes every socket it made: close()
then returns at once. A socket left open made the context's term() wait for ever,
in close() or at exit, on the caller's event loop (a synchronous hang).

Each failing case runs in a fresh interpreter, so that a hang is a failed test
(the child is killed by its pid at the deadline), not a hung test run."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest
# a coordinator process for in-process peers (tests/ is on the path)
from peer.test_syncpeer import coordinator  # noqa: F401 - a fixture
from swarmtest import ROOT

from swarm.config import MAX_HWM, MAX_MESSAGE_MB, MAX_ZMTP_S, load_config
from swarm.coordinator import Coordinator
from swarm.peer import Peer, PeerState

#: seconds a child has to fail its start, close and exit (it takes about one)
DEADLINE_S = 60


def _run(script: str, *args: str) -> str:
    """Run ``script`` in a fresh interpreter; its output, with its exit code last."""
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    try:
        out = p.communicate(timeout=DEADLINE_S)[0]
    except subprocess.TimeoutExpired:
        p.kill()
        out = p.communicate()[0]
        return out + "\n(hung: killed at the deadline)"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return f"{out}\nexit {p.returncode}"


# Peer.start() fails at its first socket (a value libzmq refuses), at a coordinator's
# DEALER (an error while keys are set on it, before it was kept), or at that DEALER's
# monitor (made after it was kept, and closed only with a monitor, once).
PEER_FAILS = {
    "limits": ("", "Peer(coordinators=[addr], limits=Limits(max_message_bytes=2**64))",
               "ConfigError: socket option MAXMSGSIZE = 18446744073709551616 is out of libzmq's range"),
    "curve client": ("tp.Curve.client = boom; tp.generate_keys(keys, ['coordinator', 'peer'])",
                     "Peer(coordinators=[addr], keys_dir=keys)", "RuntimeError: injected"),
    "monitor": ("zmq.asyncio.Socket.get_monitor_socket = boom",
                "Peer(coordinators=[addr])", "RuntimeError: injected"),
}


@pytest.mark.parametrize("case", sorted(PEER_FAILS))
def test_a_failed_start_closes_what_it_made(coordinator, tmp_path, case):
    setup, make, error = PEER_FAILS[case]
    out = _run(f"""
        import asyncio, sys
        import zmq.asyncio
        from swarm import transport as tp
        from swarm.peer import Peer
        from swarm.wire import Limits
        addr, keys = sys.argv[1], sys.argv[2]
        def boom(*args, **kwargs):
            raise RuntimeError("injected")
        {setup}
        async def main():
            p = {make}
            error = None
            try:
                await p.start()
            except Exception as e:
                # kept, as a caller that logs or re-raises it does: its traceback holds
                # what start() made, so a socket it left open is not collected either
                error = e
            print(f"start: {{type(error).__name__}}: {{error}}", flush=True)
            print("state", p.state.value, flush=True)
            await p.close()
            print("closed", flush=True)
        asyncio.run(main())
    """, coordinator, str(tmp_path / "keys"))
    assert f"start: {error}" in out, out
    assert "state closed\nclosed\n" in out and out.endswith("exit 0"), out


def test_a_failed_sync_start_ends_its_thread(coordinator):
    out = _run("""
        import sys, threading
        from swarm.peer import SyncPeer
        from swarm.wire import Limits
        error = None
        try:
            SyncPeer(coordinators=[sys.argv[1]], limits=Limits(max_message_bytes=2**64)).start()
        except Exception as e:
            error = e
        print(f"start: {type(error).__name__}: {error}", flush=True)
        print("threads", [t.name for t in threading.enumerate() if t.name == "swarm-peer"], flush=True)
    """, coordinator)
    assert "start: ConfigError: socket option MAXMSGSIZE" in out, out
    assert "threads []" in out and out.endswith("exit 0"), out


def test_a_coordinator_whose_socket_option_is_refused_closes():
    # its settings are checked (ConfigError), but a Limits given directly is not: the
    # socket libzmq refuses it on is closed, and so is the coordinator
    out = _run("""
        import asyncio
        from swarm.coordinator import Coordinator
        from swarm.wire import Limits
        async def main():
            c = Coordinator(bind="tcp://127.0.0.1:*", http_bind="", limits=Limits(max_message_bytes=2**64))
            error = None
            try:
                await c.start()
            except Exception as e:
                error = e     # kept: see test_a_failed_start_closes_what_it_made
            print(f"start: {type(error).__name__}: {error}", flush=True)
            await c.close()
            print("closed", flush=True)
        asyncio.run(main())
    """)
    assert "start: ConfigError: socket option MAXMSGSIZE = 18446744073709551616 is out of libzmq's range" in out, out
    assert "closed\n" in out and out.endswith("exit 0"), out


def test_the_largest_allowed_settings_make_working_sockets():
    # the config's bounds are libzmq's own: at them, a coordinator and a peer start and join
    cfg = load_config(None, [f"peer.data_hwm={MAX_HWM}", f"peer.max_message_mb={MAX_MESSAGE_MB}",
                             f"peer.link_heartbeat_s={MAX_ZMTP_S}", f"peer.link_timeout_s={MAX_ZMTP_S}",
                             f"coordinator.zmtp_heartbeat_s={MAX_ZMTP_S}",
                             f"coordinator.zmtp_timeout_s={MAX_ZMTP_S}"])

    async def main() -> None:
        async with Coordinator(cfg.coordinator, bind="tcp://127.0.0.1:*", http_bind="") as coord:
            p = Peer(cfg.peer, id="big", coordinators=[coord.address])
            async with p:
                assert p.state is PeerState.RUNNING
                await p.wait_view(lambda v: v.ids == ["big"])
            assert p.state is PeerState.CLOSED

    asyncio.run(main())
