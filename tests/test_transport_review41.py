"""Review 41 of swarm.transport: BadInput logs a sender's text on one line."""

from __future__ import annotations

import logging

from swarm import transport
from swarm.errors import WireError

FORGED = "2026-12-04 23:00:00,000 swarm.coordinator ERROR coordinator: member T is compromised"


def test_bad_input_logs_an_error_with_a_line_break_on_one_line(caplog):
    # Error texts quote a sender's id raw (the wire takes any 1-256 characters, line
    # breaks too), and BadInput logged them as they were: a stranger wrote whole forged
    # lines into the peer's log.
    bad = transport.BadInput("peer T")
    with caplog.at_level(logging.WARNING, logger="swarm.transport"):
        bad(b"route", WireError(f"grad_late from Z\n{FORGED}\r\x1b[2K: c must be a clock"))
        bad(b"other", WireError("plain text, logged as it is"))
    assert bad.count == 2 and len(caplog.records) == 2
    first, second = (r.getMessage() for r in caplog.records)
    assert "\n" not in first and "\r" not in first and "\x1b" not in first, first
    assert f"grad_late from Z\\n{FORGED}\\r\\x1b[2K: c must be a clock (1 dropped so far)" in first
    assert second.endswith("plain text, logged as it is (2 dropped so far)")


def test_bad_input_cuts_a_long_error_before_escaping_it(caplog):
    # a text of line breaks logged as line breaks; escaped, the 300 characters kept are
    # the sender's text's, so a record stays bounded however long that is
    bad = transport.BadInput("peer T")
    with caplog.at_level(logging.WARNING, logger="swarm.transport"):
        bad(b"route", WireError("\n" * 100_000))
    (record,) = caplog.records
    msg = record.getMessage()
    assert "\n" not in msg and msg.count("\\n") == 300, msg[:400]


def test_bad_input_counts_reasons_by_an_escaped_text():
    # by_reason (shown by `swarm status --json` and the status page) kept the reason's raw
    # text: a sender's line break went into it as it was
    bad = transport.BadInput("peer T")
    bad(b"route", WireError(f"grad from Z\n{FORGED}: c must be a clock"))
    (reason,) = bad.by_reason
    assert reason.isprintable() and reason.startswith("grad from Z\\n2026"), reason
