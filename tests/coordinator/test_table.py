"""Member table rules, without sockets."""

from __future__ import annotations

import pytest

from swarm.coordinator import DEAD, MemberTable
from swarm.errors import MembershipError


def test_ranks_views_and_epochs():
    t = MemberTable()
    for i in range(3):
        t.join(f"p{i}", f"tcp://h:{i}", -1, 1, b"r%d" % i)
    v = t.publish()
    assert v.epoch == 1 and [m.id for m in v.members] == ["p0", "p1", "p2"]
    assert [m.rank for m in v.members] == [0, 1, 2]
    assert t.mark_dead("p1", "crash") and not t.mark_dead("p1", "crash")
    v = t.publish()
    assert v.epoch == 2 and v.ids == ["p0", "p2"]
    # the lowest free rank is reused
    assert t.join("p3", "tcp://h:3", -1, 1, b"r3").rank == 1


def test_duplicate_and_rank_conflicts():
    t = MemberTable()
    t.join("a", "tcp://h:1", 0, 10, b"r")
    assert t.join("a", "tcp://h:1", 0, 10, b"r2").route == b"r2"   # retry of the same process
    with pytest.raises(MembershipError, match="already alive"):
        t.join("a", "tcp://h:9", -1, 11, b"x")
    with pytest.raises(MembershipError, match="rank 0 is held"):
        t.join("b", "tcp://h:2", 0, 1, b"y")
    t.mark_dead("a", "crash")
    assert t.get("a").state == DEAD
    assert t.join("a", "tcp://h:9", -1, 11, b"x").incarnation == 11   # restarted process


def test_epochs_continue_after_restart():
    t = MemberTable()                 # a fresh coordinator
    t.join("a", "tcp://h:1", 2, 5, b"r", last_epoch=41)
    assert t.publish().epoch == 42


def test_returning_id_gets_its_rank_back_and_replace_rules():
    t = MemberTable()
    for i in range(3):
        t.join(f"p{i}", f"tcp://h:{i}", -1, 1, b"r")
    t.mark_dead("p1", "crash")
    t.join("new", "tcp://h:9", -1, 1, b"r")         # takes the lowest free rank: 1
    assert t.get("new").rank == 1
    t.mark_dead("new", "left")
    assert t.join("p1", "tcp://h:5", -1, 2, b"r", replace=True).rank == 1   # p1's role, rank 1
    with pytest.raises(MembershipError, match="no such member"):
        t.join("ghost", "tcp://h:6", -1, 1, b"r", replace=True)
    with pytest.raises(MembershipError, match="replacement waits"):
        t.join("p0", "tcp://h:7", -1, 9, b"r", replace=True)


def test_a_live_id_belongs_to_the_key_it_joined_with():
    t = MemberTable()
    t.join("b", "tcp://h:1", -1, 10, b"r", key="KEY-B")
    # the same incarnation (status shows it) from another key: refused, nothing changes
    with pytest.raises(MembershipError, match="another CURVE key"):
        t.join("b", "tcp://evil:1", -1, 10, b"x", key="KEY-A", last_epoch=99)
    rec = t.get("b")
    assert (rec.addr, rec.route, rec.key, t.epoch) == ("tcp://h:1", b"r", "KEY-B", 0)
    assert t.join("b", "tcp://h:1", -1, 10, b"r2", key="KEY-B").route == b"r2"   # its own retry
    # a dead member's id may be taken by another key (a replacement on another host)
    t.mark_dead("b", "crash")
    assert t.join("b", "tcp://h2:1", -1, 11, b"y", key="KEY-A", replace=True).key == "KEY-A"


def test_a_refused_join_changes_nothing():
    # the epoch was raised from a join's last_epoch before some refusals
    t = MemberTable()
    t.join("a", "tcp://h:1", 0, 10, b"r")
    t.join("b", "tcp://h:2", 1, 10, b"r")
    t.mark_dead("b", "crash")
    before = [(m.id, m.addr, m.rank, m.incarnation, m.route, m.state) for m in t.members.values()]
    for args, match in [
        (("a", "tcp://h:9", -1, 11), "already alive"),
        (("a", "tcp://h:9", -1, 9), "held by a newer process"),
        (("c", "tcp://h:9", 0, 1), "rank 0 is held"),
        (("ghost", "tcp://h:9", -1, 1), "no such member"),
        (("c", "tcp://h:9", 2**64 - 1, 1), r"rank 18446744073709551615 is out of range: -1 \(any free rank\)"),
        (("c", "tcp://h:9", -2, 1), "rank -2 is out of range"),
    ]:
        with pytest.raises(MembershipError, match=match):
            t.join(*args, b"x", last_epoch=99, replace=args[0] == "ghost")
        assert t.epoch == 0
    assert [(m.id, m.addr, m.rank, m.incarnation, m.route, m.state) for m in t.members.values()] == before
    # an admitted join still continues above what it saw: a retry of the same process ...
    assert t.join("a", "tcp://h:1", 0, 10, b"r2", last_epoch=7).route == b"r2" and t.epoch == 7
    # ... and one that takes a dead member's id (a rejoin after a coordinator restart)
    t.join("b", "tcp://h:2", 1, 11, b"r", last_epoch=12)
    assert t.publish().epoch == 13


def test_a_suspect_that_joins_again_is_alive_without_its_cause():
    # The repeated join of the same process made a suspect alive but kept the cause of the
    # suspicion, which the page shows as a live member's last error until the next one
    # (a heartbeat or a probe_ack clear it, but only from suspect)
    from swarm.coordinator.table import ALIVE, SUSPECT

    t = MemberTable()
    rec = t.join("p0", "tcp://127.0.0.1:9000", -1, 7, b"r0")
    t.publish()
    rec.state, rec.cause = SUSPECT, "heartbeat timeout"   # what the coordinator's probe sets
    t.join("p0", "tcp://127.0.0.1:9000", -1, 7, b"r1")
    assert (rec.state, rec.cause) == (ALIVE, "")


def test_a_join_that_makes_the_member_list_exactly_max_view_bytes_is_admitted():
    sizes = [MemberTable.entry_bytes(p, f"tcp://h:{i}", i, "") for i, p in enumerate("abc")]
    t = MemberTable(max_view_bytes=sizes[0] + sizes[1])
    t.join("a", "tcp://h:0", -1, 1, b"r")
    t.join("b", "tcp://h:1", -1, 1, b"r")            # fills the room exactly: it fits
    assert (t.live(), t.view_bytes) == (2, t.max_view_bytes)
    full = sum(sizes)
    with pytest.raises(MembershipError, match=f"^the view is full: with 'c' its member list would be {full} bytes, "
                                              rf"over the {full - sizes[2]} that fit in a view message \(2 members\)"):
        t.join("c", "tcp://h:2", -1, 1, b"r")
    assert (t.live(), t.view_bytes) == (2, t.max_view_bytes)


def test_a_join_after_one_refused_for_view_room_takes_the_lowest_free_rank():
    # the refused join had picked rank 2 before its entry was found too big: the next join
    # skipped it, and ranks (which seed environments and name agents) got a hole
    t = MemberTable(max_view_bytes=200)
    t.join("a", "tcp://h:0", -1, 1, b"r")
    t.join("b", "tcp://h:1", -1, 1, b"r")
    with pytest.raises(MembershipError, match="^the view is full"):
        t.join("x" * 300, "tcp://h:9", -1, 1, b"r")
    assert t.join("c", "tcp://h:2", -1, 1, b"r").rank == 2
    assert [m.rank for m in t.publish().members] == [0, 1, 2]
