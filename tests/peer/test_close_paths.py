"""Every way of closing a peer closes its sockets and its context, and a wait or a
start that another task's close() cuts short says so at once.

Closes cut short (a caller's deadline shorter than the leave's, Ctrl-C), and closes
of a peer whose loops had ended cancelled or with SystemExit, left the sockets and
the context open, the peer LEAVING or RUNNING: the next gc then hung the process
for ever (pyzmq's Context.__del__ terminates the context, which waits for every
socket). Those cases run in a fresh interpreter that reports and then collects,
so that a hang is a failed test (the child is killed by its pid at the deadline),
not a hung test run."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap

import pytest
from swarmtest import ROOT, free_port

from swarm.coordinator import Coordinator
from swarm.errors import MembershipError, SwarmError
from swarm.peer import Peer, PeerState

#: seconds a child has to close its peer, collect and exit (they take a few)
DEADLINE_S = 60

#: the children's common part: a coordinator on a thread of its own (for SyncPeer, and
#: to stop it while the peer runs), and the report: the peer's state, whether its
#: context is closed, then a gc of everything (what hung)
CHILD = """
import asyncio, gc, json, os, signal, sys, threading, time
from swarm.coordinator import Coordinator
from swarm.peer import Peer, SyncPeer


class CoordinatorThread:
    def __init__(self):
        self.ready = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)
        self.thread.start()
        assert self.ready.wait(20), "no coordinator"

    async def _serve(self):
        self.loop, self.stop = asyncio.get_running_loop(), asyncio.Event()
        async with Coordinator(bind="tcp://127.0.0.1:*") as c:
            self.address = c.address
            self.ready.set()
            await self.stop.wait()

    def close(self):
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(20)


def report(peer, **more):
    print(json.dumps({"state": peer.state.value, "ctx_closed": peer._ctx.closed, **more}), flush=True)


def collected():
    gc.collect()
    print("gc done", flush=True)
"""


def _child(script: str) -> tuple[dict, str]:
    """Run CHILD + ``script`` in a fresh interpreter: its report (the last JSON line)
    and its whole output. A child still running at the deadline is killed by its pid."""
    code = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n" + CHILD \
        + textwrap.dedent(script)
    # stderr apart: a log line from another thread (the coordinator's, at WARNING) landed
    # between a report's JSON and its newline, which print() writes separately
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=ROOT)
    try:
        out, err = p.communicate(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        out += "\n(hung: killed at the deadline)"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, (out + err)[-3000:]
    return json.loads(lines[-1]), out + "\n" + err


def _closed(report: dict, out: str) -> None:
    assert report["state"] == "closed" and report["ctx_closed"], out[-3000:]
    assert "gc done" in out and "hung" not in out, out[-3000:]


def test_a_close_that_its_callers_deadline_cuts_short_still_closes():
    # The coordinator is gone: the leave waits its second for a confirmation, and the
    # caller's wait_for gives the close 0.3 s. Was: LEAVING, context open, gc hung.
    got, out = _child("""
        async def main():
            coord = CoordinatorThread()
            p = Peer(coordinators=[coord.address], id="a", heartbeat_s=0.2)
            await p.start()
            coord.close()
            try:
                await asyncio.wait_for(p.close(), 0.3)
                outcome = "returned"
            except asyncio.TimeoutError:
                outcome = "timeout"
            return p, outcome

        p, outcome = asyncio.run(main())
        report(p, outcome=outcome)
        del p
        collected()
    """)
    assert got["outcome"] == "timeout"
    _closed(got, out)


def test_ctrl_c_during_close_closes_and_goes_on_up():
    # asyncio.run turns Ctrl-C into a cancellation of its main task, here in the close's
    # wait for the leave's confirmation; KeyboardInterrupt must still reach the caller.
    got, out = _child("""
        peers = []

        async def main():
            coord = CoordinatorThread()
            p = Peer(coordinators=[coord.address], id="a", heartbeat_s=0.2)
            peers.append(p)
            await p.start()
            coord.close()
            asyncio.get_running_loop().call_later(0.3, os.kill, os.getpid(), signal.SIGINT)
            await p.close(timeout=10)

        try:
            asyncio.run(main())
            outcome = "returned"
        except KeyboardInterrupt:
            outcome = "KeyboardInterrupt"
        report(peers[0], outcome=outcome)
        del peers[:]
        collected()
    """)
    assert got["outcome"] == "KeyboardInterrupt"
    _closed(got, out)


def test_syncpeer_close_with_a_short_timeout_after_the_coordinator_stopped_closes():
    # close(timeout=0.5) is shorter than the leave's wait (1 s): the close was cut short
    # and the loop thread's clean-up, closing again, met the runner it had cancelled.
    got, out = _child("""
        coord = CoordinatorThread()
        a = SyncPeer(coordinators=[coord.address], id="a", heartbeat_s=0.2).start()
        coord.close()
        try:
            a.close(timeout=0.5)
            outcome = "returned"
        except Exception as e:
            outcome = type(e).__name__
        report(a.peer, outcome=outcome)
        del a
        collected()
    """)
    assert got["outcome"] in ("returned", "PeerTimeout"), out[-3000:]
    _closed(got, out)


def test_sys_exit_in_the_stats_callback_closes_the_sockets():
    # SystemExit ended the peer's loops (and its loop thread); the close that followed
    # re-raised it from the runner before it reached the sockets.
    got, out = _child("""
        coord = CoordinatorThread()
        a = SyncPeer(coordinators=[coord.address], id="a", heartbeat_s=0.2).start()
        a.peer.stats = lambda: sys.exit(3)
        deadline = time.monotonic() + 20
        while a._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        try:
            a.close()
            outcome = "returned"
        except BaseException as e:
            outcome = type(e).__name__
        report(a.peer, outcome=outcome, thread_alive=a._thread.is_alive())
        del a
        collected()
        coord.close()
    """)
    assert not got["thread_alive"], out[-3000:]
    _closed(got, out)


def test_close_while_a_handler_blocks_the_loop_past_its_timeout_closes():
    # The close could not run before its timeout; the loop thread's clean-up cancelled
    # the runner and closed the peer, whose close then met the cancelled runner.
    got, out = _child("""
        coord = CoordinatorThread()
        b = SyncPeer(coordinators=[coord.address], id="b", heartbeat_s=0.2).start()
        a = SyncPeer(coordinators=[coord.address], id="a", heartbeat_s=0.2).start()
        a.wait_view(lambda v: len(v.members) == 2, timeout=10)
        a.on("slow", lambda m: time.sleep(3))   # a blocking step in a handler
        b.send("a", "slow", {}, timeout=5)
        time.sleep(0.3)
        try:
            a.close(timeout=1)
            outcome = "returned"
        except Exception as e:
            outcome = type(e).__name__
        deadline = time.monotonic() + 20
        while a._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        report(a.peer, outcome=outcome)
        b.close()
        coord.close()
        del a
        collected()
    """)
    _closed(got, out)


# ---------------------------------------------------------------- waits cut short


def test_waits_end_at_once_when_another_task_closes_the_peer():
    # wait_view(timeout=None) waited for ever after the close, and with a timeout ran it
    # out to raise a PeerTimeout about the view; wait_linked the same.
    async def main() -> None:
        async with Coordinator(bind="tcp://127.0.0.1:*") as coord:
            a = Peer(coordinators=[coord.address], id="a", heartbeat_s=0.2)
            await a.start()
            try:
                view_wait = asyncio.ensure_future(a.wait_view(lambda v: len(v.members) >= 2, timeout=None))
                a._linked.clear()   # as at a new view whose neighbours have not answered yet
                link_wait = asyncio.ensure_future(a.wait_linked(timeout=None))
                await asyncio.sleep(0.2)
                assert not view_wait.done() and not link_wait.done()
                await a.close()
                async with asyncio.timeout(10):
                    for w in (view_wait, link_wait):
                        with pytest.raises(SwarmError, match="peer a is closed"):
                            await w
                # on the closed peer, with a timeout: at once, not a PeerTimeout after it
                async with asyncio.timeout(10):
                    with pytest.raises(SwarmError, match="peer a is closed") as e:
                        await a.wait_view(lambda v: len(v.members) >= 2, timeout=30)
                assert "within" not in str(e.value)
            finally:
                await a.close()
            assert a.state is PeerState.CLOSED

    asyncio.run(main())


def test_a_close_during_start_ends_the_start_at_once_and_says_why():
    # Was: start() waited out join_timeout_s (30 s here) and then blamed the coordinator
    # ("no coordinator answered ...; is `swarm coordinator` running there?").
    async def main() -> None:
        p = Peer(coordinators=[f"tcp://127.0.0.1:{free_port()}"], id="c", join_timeout_s=30)
        start = asyncio.ensure_future(p.start())
        await asyncio.sleep(0.2)
        assert not start.done() and p.state is PeerState.JOINING
        await p.close()
        try:
            async with asyncio.timeout(10):
                with pytest.raises(SwarmError, match="peer c was closed while starting") as e:
                    await start
        finally:
            start.cancel()
        assert "coordinator" not in str(e.value)
        assert p.state is PeerState.CLOSED and p._ctx.closed

    asyncio.run(main())


def test_a_welcome_without_a_view_says_so():
    # the PeerTimeout ("welcomed but no view arrived") is a TimeoutError, and start()
    # turned it into "no coordinator answered ... is `swarm coordinator` running there?"
    async def main():
        coord = Coordinator(bind=f"tcp://127.0.0.1:{free_port()}", http_bind="")
        await coord.start()
        p = Peer(id="a", coordinators=[coord.address], join_timeout_s=1.0)
        p._install = lambda view: None   # welcomed, but no view is ever installed
        try:
            # a MembershipError, as wire.md's section 5 says, after one join_timeout_s in
            # all (it was a PeerTimeout after up to twice that: the view had a deadline of its own)
            with pytest.raises(MembershipError, match="welcomed, but no view that lists it arrived"):
                await p.start()
            assert p.state is PeerState.CLOSED
        finally:
            await p.close()
            await coord.close()

    asyncio.run(main())


def test_wait_linked_returns_on_a_link_that_a_new_view_clears_at_once():
    # polled every 5 ms, it missed a linked state that a view storm cleared within the
    # poll and waited on to its timeout; awaiting the event, as before, it returns
    async def main():
        p = Peer(id="a", coordinators=[f"tcp://127.0.0.1:{free_port()}"])

        async def blink():
            await asyncio.sleep(0.02)
            p._linked.set()
            p._linked.clear()

        task = asyncio.ensure_future(blink())
        await p.wait_linked(timeout=2.0)
        await task

    asyncio.run(main())
