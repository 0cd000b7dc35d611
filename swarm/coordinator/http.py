"""The coordinator's status page: a small HTTP/1.1 server on asyncio streams (stdlib only).

Routes (GET or HEAD; every response closes its connection):

=================  ==========================================================
``/``              HTML status page: run, uptime, epoch, one row per peer and
                   the join/leave/failover log; a few lines of inline JS
                   re-fetch ``/status.json`` every second (no external assets)
``/status.json``   the same figures as JSON (:func:`report.status_document`)
``/metrics``       Prometheus text exposition format, one series per peer
=================  ==========================================================

It runs inside the coordinator's task group and shares its loop, so it must
never stall it or bring it down: a request head must arrive within
``header_timeout_s`` (slowloris), may not exceed ``max_header_bytes``
(huge headers get 431), at most ``max_connections`` are served at once (503
beyond), a response must drain within ``write_timeout_s``, and the document
and each of its renderings are built at most every ``cache_s`` (less often
when building them takes longer than a fifth of that) however many requests
come. Every failure of a connection ends that connection only.

>>> server = StatusServer(coordinator, "127.0.0.1:0")
>>> await server.start(); print(server.url)       # http://127.0.0.1:PORT/
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import html
import json
import logging
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..errors import ConfigError, TransportError
from .report import PeerRates, fixed, plain, prometheus, si, status_document
from .table import DEAD

if TYPE_CHECKING:
    from .server import Coordinator

log = logging.getLogger("swarm.coordinator.http")

__all__ = ["StatusServer", "parse_bind"]

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 431: "Request Header Fields Too Large", 500: "Internal Server Error",
            503: "Service Unavailable", 505: "HTTP Version Not Supported"}


_PAGES = {"/": "html", "/index.html": "html", "/status.json": "json", "/metrics": "metrics"}


class _Reject(Exception):
    def __init__(self, code: int, why: str) -> None:
        super().__init__(why)
        self.code = code


def parse_bind(bind: str) -> tuple[str, int]:
    """``"HOST:PORT"`` (``"[::1]:8080"`` for IPv6) → ``(host, port)``; port 0 picks a free one."""
    host, sep, port = bind.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"coordinator.http_bind = {bind!r}: expected HOST:PORT, e.g. 127.0.0.1:8555")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        p = int(port)
    except ValueError:
        raise ConfigError(f"coordinator.http_bind = {bind!r}: port {port!r} is not a number") from None
    if not 0 <= p <= 65535:
        raise ConfigError(f"coordinator.http_bind = {bind!r}: port must be 0..65535")
    return host, p


def _path(method: str, target: str, version: str) -> str:
    """The path a request line asks for (its query left out), or :class:`_Reject`."""
    if not version.startswith("HTTP/1."):
        raise _Reject(505, "only HTTP/1.x is served")
    if method not in ("GET", "HEAD"):
        raise _Reject(405, f"method {method[:20]} not allowed; use GET")
    if target[:7].lower() == "http://":
        # RFC 9112 §3.2.2: a server MUST accept the absolute form (what clients send a
        # proxy). Whatever host it names, this server has only its own pages to serve.
        try:
            target = urlsplit(target).path or "/"
        except ValueError:
            raise _Reject(400, "malformed request target") from None
    if not target.startswith("/"):
        raise _Reject(400, "request target must be a path")
    return target.split("?", 1)[0]


class StatusServer:
    """Serves a :class:`~swarm.coordinator.Coordinator`'s status over HTTP.

    ``start()`` binds (so the URL is known at once), ``run()`` samples the
    member table for rates until cancelled, ``close()`` stops listening and
    drops open connections.
    """

    def __init__(self, coordinator: "Coordinator", bind: str = "127.0.0.1:0", *, run: str = "",
                 sample_s: float = 1.0, cache_s: float = 0.25, header_timeout_s: float = 5.0,
                 write_timeout_s: float = 5.0, max_connections: int = 64,
                 max_header_bytes: int = 16 * 1024) -> None:
        self.coordinator = coordinator
        self.host, self.port = parse_bind(bind)
        self.run_name = run
        self.sample_s, self.cache_s = sample_s, cache_s
        self.header_timeout_s, self.write_timeout_s = header_timeout_s, write_timeout_s
        self.max_connections, self.max_header_bytes = max_connections, max_header_bytes
        self.linger_s = 0.5
        self.rates = PeerRates()
        self.url = ""
        self.served = 0
        self.rejected = 0
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.Task[Any]] = set()
        self._doc: tuple[float, dict[str, Any]] | None = None
        self._bodies: dict[str, tuple[str, bytes]] = {}   # the renderings of _doc, by page
        self._cost = 0.0    # seconds spent building _doc and its renderings
        self.json_fallbacks = 0   # documents /status.json served with values JSON cannot hold as null

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        try:
            # the stream limit bounds one header line; the whole head is bounded in _read_head
            self._server = await asyncio.start_server(self._client, self.host, self.port,
                                                      limit=self.max_header_bytes, reuse_address=True)
        except OSError as e:
            raise TransportError(f"status page: cannot listen on {self.host}:{self.port}: {e.strerror or e}; "
                                 f"set coordinator.http_bind to another HOST:PORT, or \"\" to disable it") from None
        host, port = self._server.sockets[0].getsockname()[:2]
        self.port = port
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}/"

    async def run(self) -> None:
        """Sample heartbeats for rates until cancelled; then close."""
        try:
            while True:
                try:
                    self.sample()
                except Exception:   # rates are a nicety; the coordinator must go on without them
                    log.exception("status page: sampling heartbeats failed")
                await asyncio.sleep(self.sample_s)
        finally:
            await self.close()

    def sample(self) -> None:
        """Feed the latest heartbeat of every live member to the rate tracker."""
        members = self.coordinator.table.members
        for m in members.values():
            if m.state != DEAD and m.stats:
                # stamped with when the figures arrived, not the last (bare) heartbeat
                self.rates.observe(m.id, m.incarnation, m.stats_at, m.stats)
        self.rates.forget_except(members.keys())

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._clients):
            task.cancel()
        if self._clients:
            await asyncio.wait(list(self._clients), timeout=1.0)

    # ------------------------------------------------------------ documents

    def document(self) -> dict[str, Any]:
        """The status document, rebuilt at most every ``cache_s``.

        At 1,000 members building it and rendering the page take tens of ms of
        the coordinator's loop, so a large swarm's document is kept longer: for
        5 times what it cost, counted from when its build began (so the build
        is part of that time), which leaves the loop 4/5 of its time however
        many clients ask.
        """
        now = time.monotonic()
        if self._doc is None or now - self._doc[0] >= max(self.cache_s, 5 * self._cost):
            t0 = time.perf_counter()
            self.sample()
            doc = status_document(self.coordinator.status(), self.rates, run=self.run_name, http=self.url)
            self._doc, self._bodies = (now, doc), {}
            self._cost = time.perf_counter() - t0
        return self._doc[1]

    def _route(self, path: str) -> tuple[str, bytes]:
        """(content type, body) of a page, rendered once per document."""
        page = _PAGES.get(path)
        if page is None:
            raise _Reject(404, f"no page at {path[:100]}")
        doc = self.document()
        if page not in self._bodies:
            t0 = time.perf_counter()
            if page == "html":
                # backslashreplace: one string UTF-8 cannot hold must not take the page down
                self._bodies[page] = ("text/html; charset=utf-8", render_page(doc).encode(errors="backslashreplace"))
            elif page == "json":
                self._bodies[page] = ("application/json", self._json(doc))
            else:
                self._bodies[page] = ("text/plain; version=0.0.4; charset=utf-8",
                                      prometheus(doc).encode(errors="backslashreplace"))
            self._cost += time.perf_counter() - t0
        return self._bodies[page]

    def _json(self, doc: dict[str, Any]) -> bytes:
        """``doc`` as strict JSON. A value JSON cannot hold (NaN, a bytes key) that got
        past the figures' checks is served as null (or left out, :func:`report.plain`):
        one bad figure must not cost every request for the page."""
        try:
            return json.dumps(doc, allow_nan=False).encode()
        except (TypeError, ValueError) as e:
            self.json_fallbacks += 1
            if self.json_fallbacks == 1:
                log.warning("status page: /status.json holds what JSON cannot (%s); served as null", e)
            return json.dumps(plain(doc), allow_nan=False).encode()

    # ------------------------------------------------------------ connections

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        busy = len(self._clients) >= self.max_connections
        self._clients.add(task)
        try:
            if busy:
                self.rejected += 1
                await self._respond(writer, 503, "text/plain", b"too many connections\n", head_only=False)
                await self._linger(reader, writer)
                return
            method = "GET"   # until the request line is read: a request refused before it gets a body
            try:
                # The request line first, on its own: an answer to HEAD has no body, also
                # when the rest of the head is too slow (408), too large (431) or wrong.
                async with asyncio.timeout(self.header_timeout_s):
                    method, target, version, size = await self._read_request_line(reader)
                    await self._read_headers(reader, size)
                ctype, body = self._route(_path(method, target, version))
                code = 200
            except TimeoutError:
                code, ctype, body = 408, "text/plain", b"request head too slow\n"
            except _Reject as e:
                code, ctype, body = e.code, "text/plain", f"{e}\n".encode()
            if code != 200:
                self.rejected += 1
            else:
                self.served += 1
            await self._respond(writer, code, ctype, body, head_only=method == "HEAD")
            await self._linger(reader, writer)
        except (OSError, asyncio.IncompleteReadError):
            # the client went away (a reset shows as ECONNRESET, EPIPE or, on
            # shutdown, ENOTCONN: any OSError); nothing to answer
            writer.transport.abort()
        except asyncio.CancelledError:
            # Only close() cancels a connection. Ending the task normally instead of
            # re-raising keeps Python 3.11's stream callback from logging the
            # cancellation as an error; there is no caller to tell.
            writer.transport.abort()
        except Exception:
            # a bug here must cost one request, never the coordinator
            log.exception("status page: request failed")
            writer.transport.abort()
        finally:
            self._clients.discard(task)

    async def _read_request_line(self, reader: asyncio.StreamReader) -> tuple[str, str, str, int]:
        """(method, target, version, bytes of the head read so far); checked by :func:`_path`."""
        size = 0
        while True:
            line = await self._read_line(reader)
            size += len(line)
            if size > self.max_header_bytes:
                raise _Reject(431, "request head too large")
            if line not in (b"\r\n", b"\n"):
                break   # RFC 9112: ignore empty lines before the request line
        try:
            method, target, version = line.decode("ascii").split()
        except (UnicodeDecodeError, ValueError):
            raise _Reject(400, "malformed request line") from None
        return method, target, version, size

    async def _read_headers(self, reader: asyncio.StreamReader, size: int) -> None:
        """Read past the header lines (none is used) to the empty line that ends the head."""
        for _ in range(100):
            line = await self._read_line(reader)
            size += len(line)
            if size > self.max_header_bytes:
                raise _Reject(431, "request head too large")
            if line in (b"\r\n", b"\n"):
                return
        raise _Reject(431, "request head too large")

    @staticmethod
    async def _read_line(reader: asyncio.StreamReader) -> bytes:
        try:
            line = await reader.readline()
        except (ValueError, asyncio.LimitOverrunError):
            raise _Reject(431, "header line too long") from None
        if not line:
            raise asyncio.IncompleteReadError(b"", None)
        return line

    async def _respond(self, writer: asyncio.StreamWriter, code: int, ctype: str, body: bytes,
                       head_only: bool) -> None:
        headers = [f"HTTP/1.1 {code} {_REASONS[code]}", f"Content-Type: {ctype}",
                   f"Content-Length: {len(body)}", "Cache-Control: no-store", "Connection: close",
                   "X-Content-Type-Options: nosniff"]
        if ctype.startswith("text/html"):
            headers.append(f"Content-Security-Policy: {_CSP}")
        if code == 405:
            headers.append("Allow: GET, HEAD")
        writer.write(("\r\n".join(headers) + "\r\n\r\n").encode("ascii") + (b"" if head_only else body))
        try:
            async with asyncio.timeout(self.write_timeout_s):
                await writer.drain()
        except TimeoutError:
            writer.transport.abort()   # a client that does not read gets cut off

    async def _linger(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Close after the client has read the answer.

        Closing a socket with unread request bytes in it (a body we did not
        read, a request we refused before reading it) makes the kernel send a
        reset, which can destroy the answer before the client reads it. So:
        stop writing, discard what still comes for a moment, then close.
        """
        if writer.transport.is_closing():
            return
        try:
            if writer.can_write_eof():
                writer.write_eof()
            async with asyncio.timeout(self.linger_s):
                while await reader.read(65536):
                    pass
        except OSError:   # TimeoutError is one; so is a reset (ENOTCONN on write_eof)
            pass
        if reader.at_eof():
            writer.close()
        else:
            writer.transport.abort()   # still sending after the linger: cut it off


# ---------------------------------------------------------------- the page

_COLUMNS = ["peer", "rank", "state", "heartbeat age", "neighbours", "env steps/s", "rounds/s",
            "bytes in", "bytes out", "codec ratio", "staleness", "buffer", "last error"]

# Must format exactly like _cells below, so the page looks the same before and after a refresh
# (report.si and report.fixed round as toFixed does; test_http_review runs both on the same numbers).
_SCRIPT = r"""
"use strict";
function si(v, unit) {
  if (typeof v !== "number" || !isFinite(v)) return "-";
  unit = unit || "";
  for (const [d, s] of [[1e9, "G"], [1e6, "M"], [1e3, "k"]])
    if (Math.abs(v) >= d) return (v / d).toFixed(1) + s + unit;
  return (Number.isInteger(v) || Math.abs(v) >= 10 ? v.toFixed(0) : v.toFixed(1)) + unit;
}
function fixed(v, n) { return typeof v === "number" && isFinite(v) ? v.toFixed(n) : "-"; }
function cells(p) {
  return [p.id, si(p.rank), p.left ? "left" : p.state,
          fixed(p.heartbeat_age_s, 2) + (p.heartbeat_age_s == null ? "" : " s"),
          p.neighbours.join(", "), si(p.env_steps_per_s), si(p.rounds_per_s),
          si(p.bytes_in, "B") + " (" + si(p.bytes_in_per_s, "B") + "/s)",
          si(p.bytes_out, "B") + " (" + si(p.bytes_out_per_s, "B") + "/s)",
          fixed(p.codec_ratio, 3), si(p.staleness), si(p.buffer_size), p.last_error || ""];
}
function row(values, cls) {
  const tr = document.createElement("tr");
  if (cls) tr.className = cls;
  for (const v of values) { const td = document.createElement("td"); td.textContent = v; tr.appendChild(td); }
  return tr;
}
let refreshes = 0;
async function refresh() {
  try {
    const r = await fetch("/status.json", {cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    const d = await r.json();
    document.getElementById("epoch").textContent = d.epoch;
    document.getElementById("uptime").textContent = fixed(d.uptime_s, 1) + " s";
    document.getElementById("members").textContent = d.members;
    const rows = document.getElementById("rows");
    rows.replaceChildren(...d.peers.map(p => {
      const tr = row(cells(p), "peer state-" + p.state);
      tr.dataset.peer = p.id;
      return tr;
    }));
    const ev = document.getElementById("events");
    ev.replaceChildren(...d.log.slice().reverse().map(e =>
      row([new Date(e.time * 1000).toLocaleTimeString(), e.event, e.peer])));
    refreshes += 1;
    document.body.dataset.refreshed = refreshes;
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    document.getElementById("updated").textContent = "coordinator unreachable (" + e.message + ")";
  }
}
refresh();
setInterval(refresh, 1000);
"""

_STYLE = """
body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin-bottom: 1.5em; }
th, td { padding: 3px 9px; border-bottom: 1px solid #ddd; text-align: right; white-space: nowrap; }
th:first-child, td:first-child, td:nth-child(3), td:nth-child(5), td:last-child { text-align: left; }
tr.state-suspect { background: #fff4d6; } tr.state-dead { color: #999; }
#summary { color: #555; }
"""

# The page runs only its own inline script: whatever a peer puts in its id or
# stats is shown as text, and even a slip in escaping could not run code.
_CSP = ("default-src 'none'; style-src 'unsafe-inline'; connect-src 'self'; "
        f"script-src 'sha256-{base64.b64encode(hashlib.sha256(_SCRIPT.encode()).digest()).decode()}'")


def _cells(p: dict[str, Any]) -> list[str]:
    age = p["heartbeat_age_s"]
    # a member that left is dead by its own wish: shown as such (the row is styled as dead)
    return [p["id"], si(p["rank"]), "left" if p.get("left") else str(p["state"]),
            fixed(age, 2) + ("" if age is None else " s"),
            ", ".join(p["neighbours"]), si(p["env_steps_per_s"]), si(p["rounds_per_s"]),
            f"{si(p['bytes_in'], 'B')} ({si(p['bytes_in_per_s'], 'B')}/s)",
            f"{si(p['bytes_out'], 'B')} ({si(p['bytes_out_per_s'], 'B')}/s)",
            fixed(p["codec_ratio"], 3), si(p["staleness"]), si(p["buffer_size"]), p["last_error"]]


def render_page(doc: dict[str, Any]) -> str:
    """The status page, rows rendered on the server (it reads without JS) and refreshed by JS."""
    e = html.escape
    rows = "\n".join(
        f'<tr class="peer state-{e(str(p["state"]))}" data-peer="{e(p["id"])}">'
        + "".join(f"<td>{e(c)}</td>" for c in _cells(p)) + "</tr>" for p in doc["peers"])
    events = "\n".join(
        f"<tr><td>{time.strftime('%H:%M:%S', time.localtime(x['time']))}</td><td>{e(x['event'])}</td>"
        f"<td>{e(x['peer'])}</td></tr>" for x in reversed(doc["log"]))
    run = e(doc.get("run") or "swarm")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{run} · swarm status</title>
<style>{_STYLE}</style></head>
<body data-refreshed="0">
<h1>{run}</h1>
<p id="summary">coordinator {e(str(doc.get("coordinator")))} · epoch <b id="epoch">{e(str(doc.get("epoch")))}</b>
· uptime <span id="uptime">{fixed(doc.get("uptime_s"), 1)} s</span> · members <span id="members">{doc.get("members")}</span>
· <span id="updated">rendered by the coordinator</span></p>
<table id="peers"><thead><tr>{"".join(f"<th>{c}</th>" for c in _COLUMNS)}</tr></thead>
<tbody id="rows">
{rows}
</tbody></table>
<h2>Membership log</h2>
<table id="log"><thead><tr><th>time</th><th>event</th><th>peer</th></tr></thead>
<tbody id="events">
{events}
</tbody></table>
<script>{_SCRIPT}</script>
</body></html>
"""
