"""`swarm status` against a real coordinator: whatever a member puts in its stats,
and rates in `--watch` that agree with the status page's.

A raw DEALER plays the members, so each heartbeat carries exactly the figures
under test.
"""

from __future__ import annotations

import json
import re
import signal
import time
import urllib.request

import msgpack
import zmq
from swarmtest import free_port, wait_for

from swarm import wire


def _member(addr: str, ids: list[str]) -> zmq.Socket:
    """A DEALER that has joined ``ids`` (incarnation 7) at the coordinator at ``addr``."""
    d = zmq.Context.instance().socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(addr)
    for pid in ids:
        d.send_multipart(wire.encode("join", pid, body={"addr": "tcp://127.0.0.1:9", "rank": -1, "inc": 7,
                                                        "last_epoch": 0}))
        deadline = time.monotonic() + 10
        while wire.decode(d.recv_multipart()).t != "welcome":   # views may come first
            assert time.monotonic() < deadline, f"{pid} was not welcomed"
    return d


def _beat(src: str, stats: dict | None = None) -> list[bytes]:
    """A heartbeat packed by hand: wire.encode would refuse the junk some tests send."""
    body = {"inc": 7, "linked": 1, **({"stats": stats} if stats is not None else {})}
    return [msgpack.packb({"v": wire.VERSION, "t": "heartbeat", "src": src, "epoch": 1, "seq": 0, "body": body,
                           "arrays": []})]


def _page_url(procs, coord) -> str:
    return wait_for(lambda: re.search(r"status page (http://\S+)", procs.log(coord)), 15,
                    what="the coordinator's status URL").group(1)


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read()


def _strict_json(text: str):
    def no_constant(c):
        raise ValueError(f"{c} is not JSON")
    return json.loads(text, parse_constant=no_constant)


def test_junk_stats_never_break_status(procs):
    addr = f"tcp://127.0.0.1:{free_port()}"
    coord = procs.start("coordinator", "--bind", addr, "--set", "coordinator.rejoin_grace_s=0", name="coord")
    url = _page_url(procs, coord)
    junk = {
        "j-nbrs-int": {"nbrs": 5},                      # not a list: a status request crashed the coordinator
        "j-nbrs-mixed": {"nbrs": [1, ["x"], "ok"]},     # not ids: `swarm status` died in its table
        "j-bytes": {"blob": b"\x00\xff", "nested": {"deep": [b"x"]}},   # `--json` could not print bytes
        "j-bytes-key": {b"k": 1, "env_steps": 5},       # ... nor a bytes key
        "j-nan": {"env_steps": float("nan"), "codec_ratio": float("inf")},   # NaN is not JSON
    }
    d = _member(addr, list(junk))
    try:
        for pid, stats in junk.items():
            d.send_multipart(_beat(pid, stats))
        time.sleep(0.5)   # the beats are in

        plain = procs.start("status", "--coordinator", addr, name="status")
        as_json = procs.start("status", "--coordinator", addr, "--json", name="status-json")
        assert plain.wait(20) == 0, procs.log(plain)
        assert as_json.wait(20) == 0, procs.log(as_json)
        out = procs.log(plain)
        assert all(pid in out for pid in junk) and "Traceback" not in out
        st = _strict_json(procs.log(as_json))
        rows = {r["id"]: r for r in st["members"]}
        assert set(rows) == set(junk) and all(r["state"] == "alive" for r in rows.values())
        assert rows["j-nbrs-int"]["neighbours"] == [] and rows["j-nbrs-mixed"]["neighbours"] == ["ok"]
        assert rows["j-bytes"]["stats"] == {"blob": None, "nested": {"deep": [None]}}
        assert rows["j-bytes-key"]["stats"] == {"env_steps": 5}
        assert rows["j-nan"]["stats"] == {"env_steps": None, "codec_ratio": None}

        # the coordinator lives on, and its page and metrics still serve every member
        assert coord.poll() is None, procs.log(coord)
        doc = _strict_json(_fetch(url + "status.json").decode())
        assert {p["id"] for p in doc["peers"]} == set(junk)
        assert b'peer="j-nbrs-int"' in _fetch(url + "metrics")
        assert "Traceback" not in procs.log(coord)
    finally:
        d.close(0)


def _si(cell: str) -> float:
    scale = {"k": 1e3, "M": 1e6, "G": 1e9}
    return float(cell[:-1]) * scale[cell[-1]] if cell[-1] in scale else float(cell)


def test_watch_rates_are_stamped_when_the_figures_arrived(procs):
    """Figures ride on one heartbeat a second; the bare beats between must not bend
    the rates `swarm status --watch` derives (they did: 0 steps/s right after a
    figure, 20% low a second later)."""
    addr = f"tcp://127.0.0.1:{free_port()}"
    coord = procs.start("coordinator", "--bind", addr, "--set", "coordinator.rejoin_grace_s=0", name="coord")
    url = _page_url(procs, coord)
    d = _member(addr, ["steady"])
    try:
        watch = procs.start("status", "--coordinator", addr, "--watch", "--interval", "0.1", name="watch")
        # 1,000 env steps a second: figures on every 4th beat, bare beats between, as a peer sends them
        t0 = time.monotonic()
        for beat in range(4 * 6):
            now = time.monotonic()
            d.send_multipart(_beat("steady", {"env_steps": int(1000 * (now - t0))} if beat % 4 == 0 else None))
            time.sleep(max(0.0, t0 + 0.25 * (beat + 1) - time.monotonic()))
        page = {p["id"]: p for p in _strict_json(_fetch(url + "status.json").decode())["peers"]}["steady"]
        watch.send_signal(signal.SIGINT)
        assert watch.wait(5) == 0
    finally:
        d.close(0)

    rates = []
    for frame in re.split(r"^--- .*\n", procs.log(watch), flags=re.MULTILINE)[1:]:
        row = next((ln.split() for ln in frame.splitlines() if ln.startswith("steady ")), None)
        if row is not None and row[2] == "alive" and row[4] != "-":
            rates.append(_si(row[4]))
    assert len(rates) >= 10, procs.log(watch)[-2000:]
    assert all(800 <= r <= 1200 for r in rates), rates
    # and the page, which stamps figures on arrival, says the same
    assert 800 <= page["env_steps_per_s"] <= 1200, page
