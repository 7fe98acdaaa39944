"""The pieces of leases that need no etcd: times, names, and what the
command line draws."""
import pytest

from engine.errors import UsageError
from engine.commandline import lease_views
from engine.operations import lease_docs
from engine.leases.model import check_name, lease_trait
from engine.leases.times import human_span, iso, parse_span, parse_time

NOW = 1_800_000_000.0       # 2027-01-15T08:00:00Z


@pytest.mark.parametrize("text, expected", [
    ("now", NOW), ("+90s", NOW + 90), ("+2h", NOW + 7200), ("+1d12h", NOW + 129600),
    ("2027-01-15T08:00:00Z", NOW), ("2027-01-15T08:00", NOW),
    ("2027-01-15T09:00:00+01:00", NOW), ("2027-01-15", NOW - 8 * 3600)])
def test_times_people_write(text, expected):
    assert parse_time(text, now=NOW) == expected


@pytest.mark.parametrize("text", ["tomorrow", "+", "+0s", "+-5m", "+5x", "2027-13-01", ""])
def test_bad_times_are_usage_errors_naming_the_value(text):
    with pytest.raises(UsageError, match="bad --start"):
        parse_time(text, "--start", now=NOW)


def test_spans_and_iso_round_trip():
    assert parse_span("2w") == 14 * 86400
    assert human_span(93784) == "1d2h3m" and human_span(42) == "42s"
    assert iso(NOW) == "2027-01-15T08:00:00Z" and iso(None) == "-"


@pytest.mark.parametrize("name", ["Maint", "-x", "a/b", "a" * 64, "", "a b"])
def test_bad_lease_names(name):
    with pytest.raises(UsageError, match="bad lease name"):
        check_name(name)


def test_each_lease_has_its_own_trait():
    assert lease_trait("a-b") != lease_trait("a_b")
    assert lease_trait("x").startswith("CUSTOM_LEASE_") and lease_trait("x").isupper()


def entry(name, kind, start, end, hosts=None, slots=None):
    return {"lease": name, "kind": kind, "start": NOW + start * 3600,
            "end": NOW + end * 3600, "hosts": hosts, "slots": slots,
            "resources": {"VCPU": 1} if slots else None}


def test_the_calendar_draws_hosts_over_time_with_a_legend():
    entries = [entry("maint", "hosts", 12, 36, hosts=["h1"]),
               entry("ci", "capacity", 0, 24, slots={"h2": 2}),
               entry("more", "capacity", 12, 24, slots={"h2": 1})]
    text = lease_views.calendar_text(entries, ["h1", "h2", "h3"], NOW, NOW + 48 * 3600, width=48)
    rows = {line.split()[0]: line.split()[1] for line in text.splitlines()[1:4]}
    assert rows["h1"] == "." * 12 + "B" * 24 + "." * 12
    assert rows["h2"] == "a" * 12 + "*" * 12 + "." * 24
    assert rows["h3"] == "." * 48
    assert "one column = 1h" in text
    assert any(line.split()[:2] == ["B", "maint"] for line in text.splitlines())
    doc = lease_docs.calendar_doc(entries, ["h1", "h2", "h3"], NOW, NOW + 48 * 3600, "h2")
    assert list(doc["hosts"]) == ["h2"]
    assert [(i["lease"], i["slots"]) for i in doc["hosts"]["h2"]] == [("ci", 2), ("more", 1)]
