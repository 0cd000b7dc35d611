"""Review 46: `swarm status --coordinator A,B` after a failover.

`swarm status` (and ``--watch``) answered from the first address that answered. Once the
primary A had died, B had taken over and A had been started again, A stood by with an
empty table and was still the first to answer: a script read 0 members and ``--watch``
showed an empty swarm for good, while B served every peer. A standby's answer now sends
the question on to the others (the one it sees as active first); it is the answer only
when no active coordinator answers, and then the table says it is a standby's.
"""

from __future__ import annotations

import json
import os
import subprocess

from coordinator.test_ha_review45 import primary_and_standby
from swarmtest import ROOT, SWARM, status, wait_for

from swarm.coordinator.report import PeerRates, format_table, status_document


def swarm_status(*args: str, env: dict[str, str] | None = None) -> str:
    p = subprocess.run([*SWARM, "status", "--timeout", "1", *args], capture_output=True, text=True, timeout=60,
                       cwd=ROOT, env={**os.environ, **(env or {})})
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


def test_status_of_a_list_asks_past_a_standby_for_the_active_coordinator(procs):
    a, b, ca, cb = primary_and_standby(procs)   # A active first, B standing by
    for pid in ("pa", "pb"):
        procs.start("peer", "--coordinator", f"{a},{b}", "--id", pid, name=pid)

    def serves_both(addr: str) -> bool:
        st = status(addr)
        return st["mode"] == "active" and sorted(m["id"] for m in st["members"] if m["state"] == "alive") == [
            "pa", "pb"]

    wait_for(lambda: serves_both(a), 30, what="A serving both peers")
    ca.kill()
    ca.wait()
    wait_for(lambda: serves_both(b), 30, what="B taken over, serving both peers")
    # A again, at its address: it stands by for B (and, with a long takeover_s, keeps
    # standing by below once B is gone too)
    procs.start("coordinator", "--bind", a, "--others", b, "--set", "coordinator.takeover_s=600", name="a2")
    wait_for(lambda: (st := status(a))["mode"] == "standby" and st["others"][0]["state"] == "active", 20,
             what="A back, standing by for B")
    # and B has heard it since (B's table below shows how B sees A: "no answer" until then)
    wait_for(lambda: status(b)["others"][0]["state"] == "standby", 20, what="B seeing A stand by")

    for args, env in (((f"--coordinator={a},{b}",), None), ((), {"SWARM_COORDINATOR": f"{a},{b}"})):
        st = json.loads(swarm_status("--json", *args, env=env))
        assert (st["coordinator"], st["mode"]) == (b, "active"), (st["coordinator"], st["mode"])
        assert sorted(m["id"] for m in st["members"]) == ["pa", "pb"]
    table = swarm_status("--coordinator", f"{a},{b}")
    assert table.startswith(f"coordinator {b} ") and table.splitlines()[1] == f"mode active  {a}: standby", table

    # no active coordinator answers: the standby's table, which says what it is
    cb.kill()
    cb.wait()
    st = json.loads(swarm_status("--json", "--coordinator", f"{a},{b}"))
    assert (st["coordinator"], st["mode"], st["members"]) == (a, "standby", []), st
    note = "this coordinator stands by: its table lists no members until it takes over"
    table = swarm_status("--coordinator", f"{a},{b}").splitlines()
    assert table[0].startswith(f"coordinator {a} ") and table[1:3] == [f"mode standby  {b}: active", note], table
    watched = format_table(status_document(status(a), PeerRates(), http=st["http"])).splitlines()
    assert watched[1].startswith("mode standby  ") and watched[2] == note, watched
