"""Review 41: a flood of ``status`` requests, the terminal table's number cells and mode
line, the Coordinator's docstring example, and a ``swarm status`` client's closed
connection whose fd a joining member's takes.

Raw DEALERs speak the wire protocol to an in-process coordinator (as in
test_review40.py), each on a context of its own that the test closes.
"""

from __future__ import annotations

import asyncio
import doctest
import subprocess
import sys
import time
from typing import Any

import zmq
from swarmtest import ROOT, reap_all, until

from swarm import Coordinator, wire
from swarm import transport as tp
from swarm.coordinator import server
from swarm.coordinator.report import PeerRates, format_table, status_document
from swarm.coordinator.table import ALIVE, DEAD

from coordinator.test_review40 import ADDR, _coordinator, _dealer


async def _recv(s: zmq.Socket, what: str) -> wire.Message:
    await until(lambda: s.poll(0), 5, what=what)
    return wire.decode(s.recv_multipart())


async def _status(s: zmq.Socket) -> dict[str, Any]:
    """Ask for the status and return the reply's body; whatever came before it is skipped."""
    s.send_multipart(wire.encode("status", "asker"))
    while True:
        m = await _recv(s, "a status reply")
        if m.t == "status_reply":
            return m.body


def _states(body: dict[str, Any]) -> dict[str, str]:
    return {r["id"]: r["state"] for r in body["members"]}


# ---------------------------------------------------------------- status replies

def test_a_flood_of_status_requests_builds_one_reply_and_a_change_shows_at_once(monkeypatch):
    # Every status request built its reply anew (~60 ms each at 256 members), so N requests
    # cost N builds. The window is made long here so that the count cannot depend on timing.
    built, status = [], Coordinator.status

    def counted(self):
        built.append(1)
        return status(self)
    monkeypatch.setattr(Coordinator, "status", counted)
    monkeypatch.setattr(server, "STATUS_CACHE_S", 60.0, raising=False)

    async def main() -> None:
        async with _coordinator() as coord:
            with _dealer(coord) as asker, _dealer(coord) as member:
                for _ in range(30):
                    asker.send_multipart(wire.encode("status", "asker"))
                replies = [await _recv(asker, "a status reply") for _ in range(30)]
                assert {m.t for m in replies} == {"status_reply"}
                assert len(built) == 1, len(built)
                assert replies[0].body == replies[-1].body
                # a join and a leave show in the very next reply, window or not
                member.send_multipart(wire.encode("join", "a", body={"addr": ADDR, "rank": -1, "inc": 1}))
                assert (await _recv(member, "a welcome")).t == "welcome"
                assert _states(await _status(asker)) == {"a": ALIVE}
                member.send_multipart(wire.encode("leave", "a", body={"inc": 1}))
                await until(lambda: coord.table.get("a").state == DEAD, 5, what="a left")
                assert _states(await _status(asker)) == {"a": DEAD}
                assert len(built) <= 4, len(built)   # one per change (the join, its view, the leave ...)

    asyncio.run(main())


def test_watch_rates_are_not_bent_by_a_status_reply_sent_again():
    # A reply sent again from the cache carries the ages of when it was built, so a client
    # stamped the same figures later each time it got it, and its rates came out low
    # (1,000 steps/s shown as 909, then 826)
    rates = PeerRates()

    def reply(steps: int, age: float) -> list[dict[str, Any]]:
        return [{"id": "p", "incarnation": 1, "stats_age_s": age, "stats": {"env_steps": steps}}]
    rates.observe_rows(reply(0, 0.0), now=100.0)
    rates.observe_rows(reply(1000, 0.0), now=101.0)
    for late in (0.1, 0.2):     # the same reply, built at 101.0, sent again
        rates.observe_rows(reply(1000, 0.0), now=101.0 + late)
    assert rates.rates("p", now=101.2)["env_steps"] == 1000.0


# ---------------------------------------------------------------- the terminal table

def _doc(rows: list[dict[str, Any]], others: list[dict[str, Any]] | None = None) -> dict:
    members = [{"id": f"p{i}", "addr": ADDR, "state": "alive", "incarnation": 1, "linked_epoch": 1,
                "neighbours": ["n"], "cause": "", "heartbeat_age_s": 0.1, **r} for i, r in enumerate(rows)]
    st = {"coordinator": "tcp://127.0.0.1:5555", "epoch": 1, "uptime_s": 1.0, "view": {"members": []},
          "mode": "standby", "others": others or [], "members": members, "log": []}
    return status_document(st, PeerRates())


def test_the_watch_tables_number_cells_keep_to_their_columns():
    # A number wider than its column ("12.3k" in the 4 of rank, "123.5k" in the 5 of stale,
    # "12.500" in the 5 of ratio, "100000000000.0G" in the 7 of buffer) pushed every column
    # after it out of line
    big = [{"rank": 12345, "heartbeat_age_s": 1234.5,
            "stats": {"staleness": 123456, "buffer_size": 1e20, "codec_ratio": 12.5}},
           {"rank": 2**31 - 1, "stats": {"staleness": -123456, "buffer_size": 99_999_999, "codec_ratio": -0.5}}]
    text = format_table(_doc([{"rank": 1, "stats": {"staleness": 3, "buffer_size": 10, "codec_ratio": 0.1}}] + big),
                        width=1000)
    lines = text.splitlines()
    head = next(line for line in lines if line.startswith("id "))
    rows = lines[lines.index(head) + 2:]
    assert len(rows) == 3, text
    for row in rows:
        # every row ends its figures where the header does, and its neighbours start there
        assert row.index("  n ") == head.index("  neighbours"), "\n" + "\n".join([head, *rows])
        for word in ("rank", "hb age", "ratio", "stale", "buffer"):
            end = head.index(word) + len(word)
            assert row[end] == " " and row[end - 1] != " ", (word, row)   # right-aligned in its column


def test_the_watch_tables_mode_line_is_cut_to_the_terminal_at_whole_escapes():
    # The line was cut by characters, only its part after "mode standby  ", and before
    # its control characters were escaped: it ran past the terminal, cut inside an escape
    error = "closed\x1b" * 60
    text = format_table(_doc([], others=[{"address": "tcp://10.0.0.2:5555", "state": "no answer",
                                          "error": error}]), width=80)
    line = text.splitlines()[1]
    assert line.startswith("mode standby  tcp://10.0.0.2:5555: no answer (closed\\x1b"), line
    assert 74 <= len(line) <= 80, len(line)     # as much as fits, no more
    assert line.endswith(("closed\\x1b", "c", "cl", "clo", "clos", "close", "closed")), line


# ---------------------------------------------------------------- docs

def test_the_coordinators_docstring_examples_are_valid_python_at_the_prompt():
    # The class docstring showed `>>> async with Coordinator(...)`: a doctest run (pytest
    # --doctest-modules) failed with SyntaxError, 'async with' outside async function
    for test in doctest.DocTestFinder().find(server):
        for example in test.examples:
            compile(example.source, f"{test.name} line {example.lineno}", "single")


# ---------------------------------------------------------------- closed connections

# Both clients run in processes of their own: a client in this process would take the
# freed fd for its own end of the member's connection.
_CLIENT = """
import sys, zmq
from swarm import wire
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.connect(sys.argv[1])
s.send_multipart(wire.encode("status", "client"))
assert s.poll(10_000), "no status reply"
print(wire.decode(s.recv_multipart()).t, flush=True)
sys.stdin.readline()        # closes when told: once the coordinator's loop is held
s.close(0)
ctx.term()
"""
_MEMBER = """
import sys, zmq
from swarm import wire
ctx = zmq.Context()
s = ctx.socket(zmq.DEALER)
s.connect(sys.argv[1])
s.send_multipart(wire.encode("join", "m", body={"addr": "tcp://127.0.0.1:9", "rank": -1, "inc": 1}))
seen = []
while s.poll(10_000):
    t = wire.decode(s.recv_multipart()).t
    seen.append(t)
    if t == "welcome":      # a probe, sent after the join's batch, comes before this reply
        s.send_multipart(wire.encode("status", "m"))
    if t == "status_reply":
        break
print(" ".join(seen), flush=True)
s.close(0)
ctx.term()
"""


def _python(script: str, addr: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script, addr], cwd=ROOT, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _hold_until(pred, what: str) -> None:
    """Hold the coordinator's loop (a blocking wait on its thread) until ``pred()``."""
    deadline = time.monotonic() + 10
    while not pred():
        assert time.monotonic() < deadline, f"timed out after 10 s waiting for {what}"
        time.sleep(0.01)


def test_a_member_on_the_fd_of_a_closed_status_client_is_not_probed(monkeypatch):
    # A connection that had sent only status requests closed, and a joining member's new
    # connection took its fd, both read in one wake-up: the close had no ids, so the join
    # on that fd was taken as one from the closed connection and the member was probed
    # (and, had it not answered, declared dead after probe_timeout_s)
    closed_fds: list[int] = []
    mapped: dict[str, int] = {}
    parse, map_fd = server.parse_monitor_message, Coordinator._map_fd

    def spy_parse(frames):
        ev = parse(frames)
        if ev["event"] == zmq.EVENT_DISCONNECTED:
            closed_fds.append(int(ev["value"]))
        return ev

    def spy_map(self, pid, route, frame):
        mapped[pid] = tp.srcfd(frame)
        map_fd(self, pid, route, frame)
    monkeypatch.setattr(server, "parse_monitor_message", spy_parse)
    monkeypatch.setattr(Coordinator, "_map_fd", spy_map)

    async def main() -> None:
        procs: list[subprocess.Popen] = []
        try:
            async with _coordinator() as coord:
                procs.append(_python(_CLIENT, coord.address))
                client = procs[0]
                got = asyncio.get_running_loop().run_in_executor(None, client.stdout.readline)
                assert (await asyncio.wait_for(got, 10)).strip() == "status_reply"
                # from here until the join is queued the loop is held, so one wake-up reads
                # the client's close and the member's join
                client.stdin.write("\n")
                client.stdin.flush()
                client.wait(10)
                _hold_until(lambda: coord._events.getsockopt(zmq.EVENTS) & zmq.POLLIN, "the client's close")
                time.sleep(0.1)     # libzmq closes the fd just after it reports the close
                procs.append(_python(_MEMBER, coord.address))
                member = procs[1]
                _hold_until(lambda: coord._plain.getsockopt(zmq.EVENTS) & zmq.POLLIN, "the member's join")
                out = await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(None, member.communicate), 15)
                assert mapped.get("m") in closed_fds, ("the member's connection did not take the closed fd",
                                                       mapped, closed_fds)
                seen = out[0].split()
                assert seen[0] == "welcome" and seen[-1] == "status_reply", seen
                assert "probe" not in seen, seen
        finally:
            reap_all(procs)

    asyncio.run(main())


def test_a_status_request_read_after_its_close_leaves_no_entry_that_spares_a_later_probe(monkeypatch):
    # A status request read after its own connection's close (a `swarm status` client that
    # gave up while its request was queued) was recorded in _askers all the same; no later
    # close popped it, and a new connection on that fd that joined and closed in one batch
    # was then taken for the status client's and not probed. Unit level: a fake monitor
    # hands out the disconnects, and the fd of every message is 7.
    events: list[int] = []

    class Monitor:
        def getsockopt(self, opt: int) -> int:
            return zmq.POLLIN if events else 0

    class Frame:
        def __init__(self, fd: int) -> None:
            self.bytes = fd

    monkeypatch.setattr(tp, "srcfd", lambda frame: 7)
    monkeypatch.setattr(tp, "try_send", lambda sock, frames: True)
    monkeypatch.setattr(tp, "drain", lambda mon: [[Frame(events.pop(0))]])
    monkeypatch.setattr(server, "parse_monitor_message",
                        lambda frames: {"event": zmq.EVENT_DISCONNECTED, "value": frames[0]})

    def probed(after_a_late_status: bool) -> bool:
        c = Coordinator(bind="tcp://127.0.0.1:0", http_bind="")
        c._events = Monitor()
        now = time.monotonic()
        if after_a_late_status:   # its close read first, then its request, in one batch
            events.append(7)
            c._read_closes()
            c._on_message(b"\0S", [zmq.Frame(f) for f in wire.encode("status", "client")], now)
            c._closed_fds.clear()   # the batch drained
        events.append(7)   # a new connection on fd 7 joined and closed: its close read first
        c._read_closes()
        join = wire.encode("join", "m", body={"addr": ADDR, "rank": -1, "inc": 1})
        c._on_message(b"\0C", [zmq.Frame(f) for f in join], now)
        return any(pid == "m" for pid, _ in c._closing)

    assert probed(False)
    assert probed(True)


def test_a_join_under_an_id_that_is_not_printable_is_refused():
    # The coordinator took any id in a join (the wire allows any 1-256 characters), so an
    # id with a line break went into every member's view, and every log line that names a
    # member could carry a forged line.
    async def main() -> None:
        async with _coordinator() as coord:
            with _dealer(coord) as s:
                forged = "m\n2026-12-04 23:00:00,000 swarm.peer ERROR peer p0: compromised"
                s.send_multipart(wire.encode("join", forged, body={"addr": ADDR, "rank": -1, "inc": 1}))
                m = await _recv(s, "an answer to the join")
                assert m.t == "refuse" and "not printable" in m.body["reason"], (m.t, m.body)
                body = await _status(s)
                assert forged not in _states(body) and body["malformed"] == 1, body
                s.send_multipart(wire.encode("join", "m", body={"addr": ADDR, "rank": -1, "inc": 1}))
                m = await _recv(s, "an answer to a good join")
                assert m.t == "welcome", (m.t, m.body)

    asyncio.run(main())
