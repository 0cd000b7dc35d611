"""The status surfaces against members whose stats are hostile: too big to send whole,
figures whose rate is infinite, and control characters meant for the operator's
terminal. Whatever one member sends, `swarm status`, `/status.json` and
`swarm status --watch` keep working for everyone.

A raw DEALER plays the members (as in test_status.py), so each
heartbeat carries exactly the stats under test.
"""

from __future__ import annotations

import asyncio
import json
import time

import zmq
import zmq.asyncio
# the hand-packed heartbeat and the page helpers of test_status.py (tests/ is on the path)
from coordinator.test_status import _beat, _fetch, _member, _page_url, _strict_json
from swarmtest import free_port, wait_for

from swarm import cli, wire
from swarm.coordinator import Coordinator
from swarm.coordinator.report import (MAX_STAT_ITEMS, MAX_STAT_TEXT, MAX_STATS_SIZE, PeerRates, bound_stats,
                                      format_table, status_document)


def _strings(v):
    """Every string in ``v``, keys included."""
    if isinstance(v, str):
        yield v
    elif isinstance(v, list):
        for x in v:
            yield from _strings(x)
    elif isinstance(v, dict):
        for k, x in v.items():
            yield k
            yield from _strings(x)


# ---------------------------------------------------------------- stats too big to send

def test_members_with_huge_stats_cannot_stop_status(procs):
    """5 members each sent one heartbeat of 15 strings of 60,000 characters (within the
    message limits): the coordinator kept them whole, its status reply grew to 4.5 MB
    and could not be encoded, so `swarm status` said no coordinator answered (with a
    hint about --keys) and the coordinator counted the asker's request as malformed.
    A member's stats are now kept bounded."""
    addr = f"tcp://127.0.0.1:{free_port()}"
    coord = procs.start("coordinator", "--bind", addr, "--set", "coordinator.rejoin_grace_s=0", name="coord")
    url = _page_url(procs, coord)
    big = [f"big{k}" for k in range(5)]
    d = _member(addr, ["calm", *big])
    try:
        d.send_multipart(_beat("calm", {"env_steps": 5, "last_error": "", "nbrs": ["big0"]}))
        for k, pid in enumerate(big):
            stats = {f"k{j}": "s" * 60_000 for j in range(15)}
            if k == 0:   # and neighbours as long and many as the message allows
                stats = {"nbrs": [f"n{j}-" + "x" * 60_000 for j in range(15)]}
            d.send_multipart(_beat(pid, stats))
        wait_for(lambda: len(_strict_json(_fetch(url + "status.json").decode())["peers"]) == 6, 10,
                 what="the six members on the page")
        time.sleep(0.3)   # the heartbeats, sent before the page showed the members, are in

        as_json = procs.start("status", "--coordinator", addr, "--json", name="status-json")
        plain = procs.start("status", "--coordinator", addr, name="status")
        assert as_json.wait(20) == 0, procs.log(as_json)
        assert plain.wait(20) == 0, procs.log(plain)
        st = _strict_json(procs.log(as_json))
        rows = {r["id"]: r for r in st["members"]}
        assert set(rows) == {"calm", *big} and all(pid in procs.log(plain) for pid in rows)
        assert rows["calm"]["stats"] == {"env_steps": 5, "last_error": "", "nbrs": ["big0"]}   # kept as sent
        for pid in big:
            s = rows[pid]["stats"]
            assert s, pid   # cut, not dropped
            assert len(json.dumps(s)) <= 2 * MAX_STATS_SIZE, (pid, len(json.dumps(s)))
            assert all(len(x) <= MAX_STAT_TEXT for x in _strings(s)), pid
            assert all(len(n) <= MAX_STAT_TEXT for n in rows[pid]["neighbours"]), pid
        assert rows["big0"]["neighbours"] and rows["big0"]["neighbours"][0].startswith("n0-x")
        # the asker did nothing wrong
        assert st["malformed"] == 0 and "malformed" not in procs.log(coord), procs.log(coord)[-2000:]
    finally:
        d.close(0)


def test_a_status_reply_too_big_to_send_says_so(capsys):
    """When the table still does not fit in one message (a huge swarm), the asker gets
    an error reply that says why, and `swarm status` prints it; it was silence (`no
    coordinator answered ... --keys`), and the asker was logged and counted as the
    sender of a malformed message."""
    async def main():
        async with Coordinator(bind="tcp://127.0.0.1:*") as coord:
            real = coord.status

            def huge() -> dict:
                # 600 members whose stats fill their bound: about 5 MB, over the 4 MiB a message holds
                st = real()
                full = bound_stats({f"k{j:02}": "s" * 1000 for j in range(64)})
                st["members"] = [{"id": f"p{i}", "stats": full} for i in range(600)]
                return st

            coord.status = huge
            d = zmq.asyncio.Context.instance().socket(zmq.DEALER)
            d.setsockopt(zmq.LINGER, 0)
            d.connect(coord.address)
            try:
                await d.send_multipart(wire.encode("status", "asker"))
                assert await d.poll(10_000), "no reply to a status request whose reply is too big"
                msg = wire.decode(await d.recv_multipart(), wire.Limits(max_header_bytes=64 << 20))
            finally:
                d.close(0)
            assert msg.t == "status_reply" and "does not fit in a message" in msg.body["error"], msg.body
            assert coord.http_url and coord.http_url in msg.body["error"]   # where to look instead
            rc = await asyncio.to_thread(cli.main, ["status", "--coordinator", coord.address, "--timeout", "10"])
            assert coord.malformed == 0
            return rc

    rc = asyncio.run(asyncio.wait_for(main(), 60))
    err = capsys.readouterr().err
    assert rc == 2 and "answered but cannot send its status" in err and "does not fit" in err, err
    assert "no coordinator answered" not in err and "--keys" not in err, err


def test_bound_stats_keeps_a_peers_figures_and_bounds_the_rest():
    figures = {"msgs_in": 10, "bytes_out": 2**63, "dropped_out": 0, "nbrs": ["p1", "p2"], "env_steps": 1000,
               "mean_return": -3.5, "codec_ratio": None, "done": False, "last_error": "round timed out",
               "spec": "cartpole-dqn@3f2a"}
    assert bound_stats(figures) == figures
    assert bound_stats({"blob": b"\x00", "nan": float("nan"), "nested": {"deep": [b"x"]}, 7: 1}) == \
        {"blob": None, "nan": None, "nested": {"deep": [None]}}
    # deep, wide and long: each bound holds, and the walk ends early
    wide = {f"k{i}": [["x" * 10_000] * 1000] * 1000 for i in range(64)}
    out = bound_stats(wide)
    assert len(json.dumps(out)) <= 2 * MAX_STATS_SIZE
    assert all(len(x) <= MAX_STAT_TEXT for x in _strings(out))
    assert len(bound_stats({"nbrs": [f"p{i}" for i in range(1000)]})["nbrs"]) == MAX_STAT_ITEMS
    assert "k" * 1000 not in bound_stats({"k" * 1000: 1, "ok": 2}) and bound_stats({"k" * 1000: 1, "ok": 2})["ok"] == 2


# ---------------------------------------------------------------- infinite rates

def test_an_infinite_rate_does_not_drop_status_json(procs):
    """env_steps 0.0 then 1.7e308 0.3 s later: both finite, but the rate is infinite,
    which json.dumps(allow_nan=False) refused, so every /status.json request was
    dropped without an answer (and a traceback logged) while the figures stood."""
    addr = f"tcp://127.0.0.1:{free_port()}"
    coord = procs.start("coordinator", "--bind", addr, "--set", "coordinator.rejoin_grace_s=0", name="coord")
    url = _page_url(procs, coord)
    d = _member(addr, ["fast"])

    def row():
        return {p["id"]: p for p in _strict_json(_fetch(url + "status.json").decode())["peers"]}["fast"]

    try:
        d.send_multipart(_beat("fast", {"env_steps": 0.0, "bytes_in": 0}))
        wait_for(lambda: row()["env_steps"] == 0.0, 10, what="the first figure on the page")
        time.sleep(0.3)   # more than the rates' shortest span (0.2 s)
        d.send_multipart(_beat("fast", {"env_steps": 1.7e308, "bytes_in": 3000}))
        p = wait_for(lambda: (r := row())["env_steps"] == 1.7e308 and r, 10, what="the second figure on the page")
        # while the member is alive (a dead one has no rates: the old page came back then),
        # its finite rate is shown and the infinite one is unknown
        assert p["state"] == "alive" and p["bytes_in_per_s"] > 0 and p["env_steps_per_s"] is None, p
        assert b'peer="fast"' in _fetch(url + "metrics")
        assert "Traceback" not in procs.log(coord), procs.log(coord)[-2000:]
    finally:
        d.close(0)


def test_infinite_rates_are_unknown():
    rates = PeerRates()
    rates.observe("p", 1, 0.0, {"env_steps": 0.0, "rounds": -1.7e308, "bytes_in": 1})
    rates.observe("p", 1, 0.5, {"env_steps": 1.7e308, "rounds": 1.7e308, "bytes_in": 3})
    assert rates.rates("p") == {"env_steps": None, "rounds": None, "bytes_in": 4.0, "bytes_out": None}


def test_status_json_serves_a_value_json_cannot_hold_as_null(monkeypatch):
    """A figure that gets past the checks and JSON cannot hold (NaN, inf, a bytes key)
    costs that value, not every request for the page."""
    from swarm.coordinator import http as status_http

    def with_junk(*args, **kwargs):
        doc = status_document(*args, **kwargs)
        doc["new_figure"] = float("inf")
        doc[b"odd"] = 1
        return doc

    monkeypatch.setattr(status_http, "status_document", with_junk)

    async def main():
        async with Coordinator(bind="tcp://127.0.0.1:*") as coord:
            port = coord._http.port
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(b"GET /status.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                await writer.drain()
                data = await asyncio.wait_for(reader.read(), 10)
            finally:
                writer.close()
            return data, coord._http.json_fallbacks

    data, fallbacks = asyncio.run(asyncio.wait_for(main(), 60))
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), data[:300]
    doc = _strict_json(body.decode())
    assert doc["new_figure"] is None and "odd" not in doc and doc["peers"] == []
    assert fallbacks == 1


# ---------------------------------------------------------------- the operator's terminal

def test_the_terminal_tables_show_control_characters_escaped():
    """Peer ids, neighbours, the event log and last_error (from stats) reached the
    terminal of `swarm status` and `swarm status --watch` as they were sent: an ESC
    sequence from a peer could clear the screen, recolour it or hide rows."""
    evil = "p\x1b[2J\x1b]0;owned\x07\u202e\r\n"
    st = {"coordinator": "tcp://127.0.0.1:5555", "epoch": 3, "uptime_s": 1.0, "view": {"members": [[evil]]},
          "members": [{"id": evil, "rank": 0, "addr": "tcp://127.0.0.1:7000", "state": "alive", "incarnation": 1,
                       "heartbeat_age_s": 0.1, "stats_age_s": 0.1, "linked_epoch": 3, "neighbours": [evil],
                       "cause": "", "stats": {"last_error": evil}}],
          "log": [[time.time(), "join", evil]]}
    watch = format_table(status_document(st, PeerRates(), run="r"), width=1000)
    once = cli.format_status(st)
    for text in (watch, once):
        assert not any(c in text for c in "\x1b\x07\r\u202e"), repr(text)
        assert "p\\x1b[2J" in text
        assert len(text.splitlines()) == len([ln for ln in text.split("\n")])   # no line break from a peer
    assert watch.count("p\\x1b[2J") == 4   # id, neighbours, last_error, the log
    assert len([ln for ln in once.splitlines() if "p\\x1b[2J" in ln]) == 1   # one row, one line
