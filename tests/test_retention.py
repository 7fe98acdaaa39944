"""Retention: Proxmox's keep-* semantics, in order, and chains never cut."""
import datetime

from engine.backups.retention import plan

DAY = 86400.0


def at(day, hour=0):
    """A time on day ``day`` of November 2026 (UTC), at ``hour``."""
    return datetime.datetime(2026, 11, day, hour, tzinfo=datetime.timezone.utc).timestamp()


def fulls(*times):
    return [{"id": f"b{i}", "time": t, "kind": "full", "parent": None}
            for i, t in enumerate(times)]


def ids(backups):
    return [b["id"] for b in backups]


def test_no_option_keeps_everything():
    backups = fulls(at(1), at(2))
    assert plan(backups, {}) == (backups, [])


def test_keep_last_keeps_the_newest_and_drops_the_rest_newest_first():
    kept, dropped = plan(fulls(at(1), at(2), at(3), at(4)), {"last": 2})
    assert (ids(kept), ids(dropped)) == (["b3", "b2"], ["b1", "b0"])


def test_keep_daily_keeps_each_days_newest_for_that_many_days():
    backups = fulls(at(1, 1), at(1, 5), at(2, 1), at(2, 9), at(3, 2))
    kept, _ = plan(backups, {"daily": 2})
    assert ids(kept) == ["b4", "b3"]


def test_options_apply_in_order_and_skip_periods_already_kept():
    # last 1 keeps day 3's; daily 2 then counts days 2 and 1, not day 3 again
    backups = fulls(at(1, 1), at(2, 1), at(2, 9), at(3, 2), at(3, 4))
    kept, dropped = plan(backups, {"last": 1, "daily": 2})
    assert ids(kept) == ["b4", "b2", "b0"]
    assert ids(dropped) == ["b3", "b1"]


def test_keep_weekly_counts_iso_weeks():
    backups = fulls(at(2), at(4), at(9), at(16), at(17))   # ISO weeks 45, 45, 46, 47, 47
    kept, _ = plan(backups, {"weekly": 2})
    assert ids(kept) == ["b4", "b2"]


def test_a_dropped_backup_stays_while_a_kept_incremental_needs_it():
    chain = [{"id": "f", "time": at(1), "kind": "full", "parent": None},
             {"id": "i1", "time": at(2), "kind": "incremental", "parent": "f"},
             {"id": "i2", "time": at(3), "kind": "incremental", "parent": "i1"},
             {"id": "g", "time": at(4), "kind": "full", "parent": None}]
    kept, dropped = plan(chain, {"last": 2})
    assert ids(kept) == ["g", "i2", "i1", "f"] and dropped == []
    kept, dropped = plan(chain + [{"id": "j", "time": at(5), "kind": "incremental",
                                   "parent": "g"}], {"last": 2})
    assert ids(kept) == ["j", "g"] and ids(dropped) == ["i2", "i1", "f"]
