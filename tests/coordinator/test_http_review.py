"""The status page's HTTP server against a stand-in coordinator: answers to HEAD that
carry no body whatever went wrong, the absolute-form request target, the page's JS
formatting numbers exactly as the server does, and how much of the loop document
rebuilds may take under a flood of requests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
import subprocess
import time
from types import SimpleNamespace
from typing import Any, AsyncIterator

import pytest

from swarmtest import http

from swarm.coordinator.http import _SCRIPT, StatusServer
from swarm.coordinator.report import fixed, si


class StandIn:
    """What StatusServer reads of a Coordinator (its member table and ``status()``),
    with a ``status()`` that holds the loop for ``build_s``, as a large swarm's does."""

    def __init__(self, build_s: float = 0.0) -> None:
        self.table = SimpleNamespace(members={})
        self.build_s = build_s
        self.builds: list[tuple[float, float]] = []   # (start, end) of each status() call

    def status(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        time.sleep(self.build_s)
        self.builds.append((t0, time.perf_counter()))
        return {"coordinator": "tcp://127.0.0.1:1", "mode": "active", "epoch": 1, "uptime_s": 1.0,
                "others": [], "view": {"members": []}, "members": [], "malformed": 0, "log": []}


@contextlib.asynccontextmanager
async def serving(coord: StandIn, **kw: Any) -> AsyncIterator[StatusServer]:
    srv = StatusServer(coord, "127.0.0.1:0", **kw)
    await srv.start()
    try:
        yield srv
    finally:
        await srv.close()


# ---------------------------------------------------------------- request line

def test_refused_head_requests_have_no_body():
    """A body after an answer to HEAD is read by the client as the start of the next
    response, so HEAD gets none whatever went wrong, not only for a missing page."""
    cases = [
        (b"HEAD * HTTP/1.1\r\n\r\n", 400),
        (b"HEAD ftp://h/ HTTP/1.1\r\n\r\n", 400),
        (b"HEAD / HTTP/2.0\r\n\r\n", 505),
        (b"HEAD /nope HTTP/1.1\r\n\r\n", 404),
        (b"HEAD / HTTP/1.1\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n", 431),
        (b"HEAD / HTTP/1.1\r\nX-Slow: ", 408),   # a head that never ends
    ]

    async def main():
        async with serving(StandIn(), header_timeout_s=0.3) as srv:
            for raw, want in cases:
                code, headers, body = await http(srv.port, raw)
                assert (code, body) == (want, b""), raw[:30]
                assert int(headers["content-length"]) > 0, raw[:30]
            # the same refusals to GET still say why
            code, _, body = await http(srv.port, b"GET * HTTP/1.1\r\n\r\n")
            assert code == 400 and body.startswith(b"request target must be a path")

    asyncio.run(asyncio.wait_for(main(), 30))


def test_absolute_form_targets_are_served():
    """RFC 9112 §3.2.2: a server MUST accept the absolute form (``GET http://host/path``,
    what a client sends a proxy); the page is named by its path."""
    async def main():
        async with serving(StandIn()) as srv:
            port = srv.port
            code, headers, body = await http(port, f"GET http://127.0.0.1:{port}/status.json HTTP/1.1\r\n\r\n".encode())
            assert code == 200 and headers["content-type"] == "application/json"
            assert json.loads(body)["epoch"] == 1
            code, headers, body = await http(port, b"HEAD http://h/ HTTP/1.1\r\n\r\n")
            assert code == 200 and body == b"" and headers["content-type"].startswith("text/html")
            assert (await http(port, b"GET HTTP://h/metrics?x=1 HTTP/1.1\r\n\r\n"))[0] == 200
            assert (await http(port, b"GET http://h HTTP/1.1\r\n\r\n"))[0] == 200    # empty path: "/"
            assert (await http(port, b"GET http://h/nope HTTP/1.1\r\n\r\n"))[0] == 404
            # other forms are still refused: authority, asterisk, other schemes
            for target in (b"h:80", b"*", b"https://h/", b"status.json"):
                assert (await http(port, b"GET " + target + b" HTTP/1.1\r\n\r\n"))[0] == 400, target

    asyncio.run(asyncio.wait_for(main(), 30))


# ---------------------------------------------------------------- numbers on the page

def test_ties_are_rounded_as_the_page_script_rounds_them():
    """The page is rendered by the server, then redrawn by its JS every second: a
    figure must not change on the first refresh. JS ``toFixed`` takes the larger
    (away from zero) of two equally near results; these are its answers."""
    assert si(1250, "B") == "1.3kB"
    assert si(2250) == "2.3k" and si(1_250_000) == "1.3M"
    assert si(10.5) == "11" and si(12.5) == "13" and si(0.25) == "0.3"
    assert si(-2.5) == "-2.5" and si(-10.5) == "-11" and si(-0.25) == "-0.3"
    assert fixed(0.0625, 3) == "0.063" and fixed(0.125, 2) == "0.13" and fixed(2.5, 0) == "3"
    assert fixed(1.005, 2) == "1.00"    # 1.005 is a little under it as a double: no tie
    assert fixed(-0.0, 1) == "0.0" and fixed(-0.04, 1) == "-0.0"
    assert fixed(1e21, 1) == "1e+21" and fixed(-1e25, 2) == "-1e+25"


def _values() -> list[float | int]:
    rnd = random.Random(7)
    ties = [k / 2 for k in range(-41, 41)] + [k / 16 for k in range(-50, 50)] + [k / 8 * 10**e for k in range(1, 80, 2)
                                                                                  for e in (3, 6, 9)]
    near = [rnd.uniform(-2000, 2000) for _ in range(300)] + [rnd.expovariate(1e-5) for _ in range(300)]
    edges = [0, -0.0, 1.005, 0.05, 9.95, 9.96, 999.95, 999.5, 2**53 + 1, 1e21, 9.99e20, 1.5e300, -1e25, 5e-324]
    return ties + near + edges + [round(v, 3) for v in near]


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_page_script_formats_numbers_like_the_server():
    """Run the page's own si() and fixed() in node on values as the page gets them (from
    JSON) and compare with what the server renders."""
    functions, sep, _ = _SCRIPT.partition("function cells(")
    assert sep, "the page's script no longer has cells(): update this test"
    values = _values()
    program = functions + ('for (const v of JSON.parse(require("fs").readFileSync(0, "utf8")))'
                           ' console.log(JSON.stringify([si(v), si(v, "B"), fixed(v, 1), fixed(v, 2), fixed(v, 3)]));')
    out = subprocess.run(["node", "-e", program], input=json.dumps(values), capture_output=True, text=True,
                         timeout=60, check=True).stdout
    js = [json.loads(line) for line in out.splitlines()]
    assert len(js) == len(values)
    for v, got in zip(values, js):
        assert [si(v), si(v, "B"), fixed(v, 1), fixed(v, 2), fixed(v, 3)] == got, v


# ---------------------------------------------------------------- flood

def test_a_flood_leaves_document_rebuilds_a_fifth_of_the_loop():
    """Clients asking in a loop: each document is kept for 5 times what it cost to build,
    so that building takes at most 1/5 of the coordinator's loop (4 times, from the
    build's start, was 1/4). Measured over whole rebuild cycles of a slow status()."""
    coord = StandIn(build_s=0.04)

    async def main():
        async with serving(coord, cache_s=0.001) as srv:
            done = asyncio.Event()

            async def client() -> None:
                # until told, not only until cancelled: Python 3.11's wait_for (in http())
                # returns the answer when it comes as the cancel does, swallowing the
                # cancel, and a `while True` client then ran on until the test's 30 s
                while not done.is_set():
                    code, _, _ = await http(srv.port, b"GET /status.json HTTP/1.1\r\n\r\n")
                    assert code == 200

            clients = [asyncio.create_task(client()) for _ in range(4)]
            try:
                await asyncio.sleep(1.5)
            finally:
                done.set()
                for c in clients:
                    c.cancel()
                await asyncio.gather(*clients, return_exceptions=True)

    asyncio.run(asyncio.wait_for(main(), 30))
    builds = coord.builds[1:]          # the first was built cold, at the first request
    assert len(builds) >= 4, builds
    busy = sum(end - start for start, end in builds[:-1])
    share = busy / (builds[-1][0] - builds[0][0])
    # 1/5 and a little for the requests' own latency; it was 1/4
    assert share < 0.225, f"rebuilds took {share:.0%} of the loop"
