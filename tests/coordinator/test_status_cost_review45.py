"""Review 45: a status read walked every member's stats again. They are kept as
`bound_stats` left them (plain, up to ~8,000 values a member), and `MemberTable.rows`
reduced each to plain values once more on every read: at 4,000 members whose stats were
that large, one read of the status page held the coordinator's loop for ~8 s, past the
heartbeat timeout, and 42 live members were declared dead while the page was open."""

from __future__ import annotations

from swarm.coordinator.report import MAX_STAT_ITEMS, bound_stats
from swarm.coordinator.table import MemberTable


def test_a_status_row_holds_the_members_kept_stats_without_walking_them_again():
    table = MemberTable()
    big = {f"k{i}": [list(range(MAX_STAT_ITEMS))] * MAX_STAT_ITEMS for i in range(2)}
    for i in range(3):
        rec = table.join(f"m{i}", f"tcp://127.0.0.1:{10000 + i}", -1, 1, b"r%d" % i)
        rec.stats = bound_stats({"nbrs": ["m0", 7, "m2"], **big})
    table.publish()
    for row in table.rows():
        rec = table.get(row["id"])
        # the very dict the heartbeat left: no copy per read, whatever its size
        assert row["stats"] is rec.stats
        assert row["neighbours"] == ["m0", "m2"]
