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
