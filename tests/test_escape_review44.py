"""Review 44: the log and `swarm status` show a peer's text in one escaped form.

The transport's log lines escaped a sender's text by the repr of the whole of it
when any character was not printable, so a backslash in it was doubled there, while
`swarm status` (and the watch table) escape only the characters that are not
printable: the same id read ``a\\\\b\\n`` in the log and ``a\\b\\n`` in the table, and
grepping the log for an id seen in the table found nothing."""

from __future__ import annotations

import asyncio
import logging

from swarmtest import linked_pair, until

from swarm import transport
from swarm.cli import format_status, query_status
from swarm.coordinator.report import PeerRates, format_table, status_document
from swarm.errors import WireError

#: an id with a backslash in it, as a config may give one (it is printable)
SLASHED = "a\\b"


def _status(member_id: str) -> dict:
    """A coordinator's status reply with one member, ``member_id``."""
    return {"coordinator": "tcp://127.0.0.1:5555", "epoch": 3, "uptime_s": 1.0, "view": {"members": [[member_id]]},
            "members": [{"id": member_id, "rank": 0, "addr": "tcp://127.0.0.1:7000", "state": "alive",
                         "incarnation": 1, "heartbeat_age_s": 0.1, "stats_age_s": 0.1, "linked_epoch": 3,
                         "neighbours": [], "cause": "", "stats": {}}],
            "log": []}


def test_the_log_and_the_status_tables_escape_an_id_with_a_backslash_and_a_line_break_alike(caplog):
    evil = "a\\b\n"
    shown = "a\\b\\n"   # the backslash as it is, the line break as its escape
    bad = transport.BadInput("peer T")
    with caplog.at_level(logging.WARNING, logger="swarm.transport"):
        bad(b"route", WireError(f"reading from {evil}: v must be a number"))
    (record,) = caplog.records
    assert f"reading from {shown}: v must be a number" in record.getMessage(), record.getMessage()
    assert list(bad.by_reason) == [f"reading from {shown}"]
    once = format_status(_status(evil))
    watch = format_table(status_document(_status(evil), PeerRates(), run="r"), width=200)
    for text in (once, watch):
        assert any(line.startswith(shown + " ") for line in text.splitlines()), text


def test_a_peers_log_line_names_a_sender_as_swarm_status_shows_it(caplog):
    # end to end: a member whose id has a backslash sends a message that a handler of
    # its neighbour refuses, quoting the id and a line break the sender put in its body
    async def main() -> tuple[str, str]:
        async with linked_pair(ids=(SLASHED, "b")) as (a, b):
            def refuses(msg):
                raise WireError(f"reading from {msg.src}: {msg.body['v']} is not a number")

            b.on("reading", refuses)
            with caplog.at_level(logging.WARNING, logger="swarm.transport"):
                assert await a.send("b", "reading", {"v": "1\n2"}, timeout=1.0)
                await until(lambda: b.counters.malformed == 1, 10.0, "the refused message counted")
            (record,) = [r for r in caplog.records if "dropped malformed" in r.getMessage()]
            return record.getMessage(), format_status(await query_status(a.config.coordinators[0]))

    logged, table = asyncio.run(main())
    (row,) = [line for line in table.splitlines() if line.startswith("a")]
    shown = row.split()[0]
    assert shown == SLASHED, row
    assert f"reading from {shown}: 1\\n2 is not a number" in logged, logged
    assert f"dropped malformed message from {shown}: " in logged, logged   # the sender's slot too
