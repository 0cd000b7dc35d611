"""Ctrl-Z on `swarm run` while it waits for its coordinator (the forty-ninth session's own
review): the wait's 20 s ran on while everything was stopped, and a run continued more
than 20 s later failed with "the coordinator did not answer ... within 20 s" (exit 2)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from swarm.experiment import launch


def test_the_coordinator_wait_does_not_count_the_time_the_run_was_stopped(monkeypatch):
    intr = launch._Interrupt()
    calls: list[float] = []

    def status(addr):
        calls.append(time.monotonic())
        if len(calls) == 3:          # Ctrl-Z here, fg 4 s later (the coordinator stopped too)
            time.sleep(4.0)
            intr.stopped_s += 4.0
        return {"epoch": 1} if len(calls) == 6 else None

    monkeypatch.setattr(launch, "_status", status)
    coord = SimpleNamespace(proc=SimpleNamespace(poll=lambda: None), log="coordinator.log", how=lambda: "")
    # 3 s to answer, not counting the 4 s stopped: it answers at its sixth query, ~4.5 s in
    assert launch._wait_coordinator(None, coord, "tcp://127.0.0.1:1", timeout=3.0, intr=intr) == {"epoch": 1}
    assert len(calls) == 6
