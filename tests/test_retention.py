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


# -- what a schedule prunes (issue 48): only its own backups ---------------------------

def made(backup_id, t, schedule=None, kind="full", parent=None, protected=False):
    return {"id": backup_id, "time": t, "kind": kind, "parent": parent,
            **({"schedule": schedule} if schedule else {}),
            **({"protected": True} if protected else {})}


def test_a_schedule_prunes_only_what_it_made():
    from engine.backups.retention import schedule_drops
    backups = [made("hand1", at(1)), made("hand2", at(2)), made("other", at(3), "s2"),
               made("s-a", at(4), "s1"), made("s-b", at(5), "s1"), made("s-c", at(6), "s1")]
    assert ids(schedule_drops(backups, "s1", {"last": 1})) == ["s-b", "s-a"]
    assert ids(schedule_drops(backups, "s2", {"last": 1})) == []


def test_a_protected_or_held_backup_is_never_dropped_and_does_not_count():
    from engine.backups.retention import schedule_drops
    backups = [made("s-a", at(1), "s1", protected=True), made("s-b", at(2), "s1"),
               made("s-c", at(3), "s1"), made("s-d", at(4), "s1")]
    assert ids(schedule_drops(backups, "s1", {"last": 1})) == ["s-c", "s-b"]
    assert ids(schedule_drops(backups, "s1", {"last": 1}, spared={"s-b"})) == ["s-c"]


def test_a_schedules_backup_that_a_kept_one_builds_on_stays():
    from engine.backups.retention import schedule_drops
    # a manual incremental on top of the schedule's oldest: that chain stays whole
    backups = [made("s-a", at(1), "s1"), made("hand", at(2), kind="incremental", parent="s-a"),
               made("s-b", at(3), "s1"), made("s-c", at(4), "s1")]
    assert ids(schedule_drops(backups, "s1", {"last": 1})) == ["s-b"]
