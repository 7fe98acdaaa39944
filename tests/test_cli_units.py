"""The command line's pure parts, one scenario each, with no subprocess and no
etcd: patterns, resource specs, totals lines, the validators of endpoints and
durations, and reading the cluster (engine/cluster.py) and scrubbing it over a
keyspace held in memory."""
from __future__ import annotations

import argparse
import uuid

import pytest

from engine.commandline import build_parser
from engine.commandline.context import Context, warn_unreadable
from engine.commandline.hosts import host_totals
from engine.commandline.settings import DEFAULTS
from engine.commandline.vms import vm_totals
from engine.operations.select import check_glob, host_pattern, match_vms, vm_pattern
from engine.operations.specs import parse_resources, parse_traits
from engine import cluster
from engine.core import keys, values, validate
from engine.core.store import KV, Delete, Get, Put, TxnResult
from engine.errors import Failed, UsageError


# -- patterns --------------------------------------------------------------------

def test_a_glob_with_an_unclosed_bracket_is_a_usage_error():
    """'web[1' would never match anything: say so instead of listing nothing."""
    with pytest.raises(UsageError, match=r"bad VM pattern 'web\[1': unclosed '\['"):
        check_glob("web[1", "VM pattern")
    assert check_glob("web[12]*", "VM pattern") == "web[12]*"


def test_a_glob_may_not_be_empty_or_hold_whitespace():
    """An empty pattern or one with a blank in it is a typo, not a wish."""
    with pytest.raises(UsageError, match="empty host pattern"):
        check_glob("", "host pattern")
    with pytest.raises(UsageError, match="whitespace or control character"):
        check_glob("web 1", "VM pattern")


def test_a_host_pattern_defaults_to_every_host_and_has_no_slash():
    """No HOSTGLOB means all hosts; 'host/x' is a VM pattern given by mistake."""
    assert host_pattern(None) == "*"
    assert host_pattern("host1*") == "host1*"
    with pytest.raises(UsageError, match="a host pattern has no '/'"):
        host_pattern("host/x")


@pytest.mark.parametrize("text, parsed", [
    ("*webfront*", ("*", "*webfront*")), ("host17/*sql*", ("host17", "*sql*"))])
def test_a_vm_pattern_is_hostglob_slash_vmglob_or_vmglob_on_any_host(text, parsed):
    """'VMGLOB' alone matches on every host."""
    assert vm_pattern(text) == parsed


@pytest.mark.parametrize("text, why", [
    ("a/b/c", "more than one '/'"), ("host1/", "empty VM part"), ("/vm1", "empty host part")])
def test_a_vm_pattern_with_a_bad_slash_names_what_is_wrong(text, why):
    """Each malformed pattern says which part is wrong."""
    with pytest.raises(UsageError, match=why):
        vm_pattern(text)


def test_match_vms_keeps_listing_order_lists_each_vm_once_and_names_the_misses():
    """Two patterns matching the same VM give it once; a pattern matching none is named."""
    vms = [{"host": "host1", "name": "web1", "uuid": "u1"},
           {"host": "host2", "name": "web2", "uuid": "u2"},
           {"host": "host2", "name": "db1", "uuid": "u3"}]
    hits, unmatched = match_vms(vms, ["host2/*", "web*", "nothing*"])
    assert [vm["uuid"] for vm in hits] == ["u2", "u3", "u1"]
    assert unmatched == ["nothing*"]


# -- resource specs and traits ---------------------------------------------------

def test_a_short_resource_spec_and_required_traits_give_resources_and_traits():
    """The boot spec and --required read as one request group; forbidden traits keep their '!'."""
    resources, traits = parse_resources("VCPU:1,MEMORY_MB:256,DISK_GB:1",
                                                "HW_CPU_X86_AVX2,!CUSTOM_SLOW")
    assert resources == {"VCPU": 1, "MEMORY_MB": 256, "DISK_GB": 1}
    assert traits == ["HW_CPU_X86_AVX2", "!CUSTOM_SLOW"]


def test_the_placement_query_form_is_accepted_as_a_resource_spec():
    """'resources=...&required=...' is Placement's own spelling of the same spec."""
    assert parse_resources("resources=VCPU:2&required=!CUSTOM_SLOW") == \
        ({"VCPU": 2}, ["!CUSTOM_SLOW"])


@pytest.mark.parametrize("spec, named", [
    ("VCPU:x", "bad resource spec 'VCPU:x'"), ("VCPU:1,BOGUS", "BOGUS"),
    ("VCPU:0", "VCPU"), ("resources=VCPU:1&bogus=1", "bogus"),
    ("resources1=VCPU:1&resources2=VCPU:1&group_policy=none", "one request group")])
def test_a_bad_resource_spec_is_a_usage_error_naming_it(spec, named):
    """Placement's parser judges the spec; the message names the spec."""
    with pytest.raises(UsageError, match=named):
        parse_resources(spec)


def test_a_bad_required_trait_is_blamed_on_the_traits_not_the_spec():
    """A well-formed but unknown trait is a bad --required, the spec being fine."""
    with pytest.raises(UsageError, match="bad --required 'NOT_A_KNOWN_TRAIT'"):
        parse_resources("VCPU:1", "NOT_A_KNOWN_TRAIT")


def test_traits_are_names_each_with_at_most_one_bang():
    """'A,!B' lists a required and a forbidden trait; '!!FOO' is a typo."""
    assert parse_traits("HW_CPU_X86_AVX2, !CUSTOM_SLOW") == \
        ["HW_CPU_X86_AVX2", "!CUSTOM_SLOW"]
    assert parse_traits(None) == []
    for bad in ("!!FOO", "not a trait", "lower_case"):
        with pytest.raises(UsageError, match="bad trait"):
            parse_traits(bad)


# -- totals lines ----------------------------------------------------------------

def test_host_totals_count_only_the_hosts_that_responded_and_name_the_others():
    """A down host adds nothing to the totals and is named on its own line."""
    hosts = [
        {"host": "host1", "alive": True, "enabled": True, "vcpus": 4, "cpu_usage": 95.0,
         "vms": 2, "memory_mb": 8192, "free_memory_mb": 4096, "disk_gb": 100,
         "free_disk_gb": 60},
        {"host": "host2", "alive": True, "enabled": False, "vcpus": 4, "cpu_usage": 5.0,
         "vms": 1, "memory_mb": 8192, "free_memory_mb": 8192, "disk_gb": 100,
         "free_disk_gb": 100},
        {"host": "host3", "alive": False, "vcpus": 64, "vms": 9, "memory_mb": 1 << 20}]
    lines = host_totals(hosts).splitlines()
    assert lines[0] == ("2 hosts responded (1 enabled, 1 busy) for a total of 8 cores "
                        "hosting 3 VMs")
    assert lines[1] == "CPU: 50% used, 50% free"
    assert lines[2].startswith("Memory: ") and lines[3].startswith("Disk: ")
    assert lines[4] == "1 host not responding: host3"


def test_host_totals_of_no_host_are_zero_and_do_not_divide_by_zero():
    """An empty cluster still gets a totals line."""
    assert host_totals([]).splitlines()[:2] == [
        "0 hosts responded (0 enabled, 0 busy) for a total of 0 cores hosting 0 VMs",
        "CPU: 0% used, 100% free"]


def test_vm_totals_count_states_hosts_and_resources():
    """One line: how many VMs in which states, on how many hosts, using what."""
    vms = [{"host": "host1", "state": "running", "vcpus": 1, "memory_mb": 256, "disk_gb": 1},
           {"host": "host1", "state": "shutoff", "vcpus": 2, "memory_mb": 512, "disk_gb": 1},
           {"host": "host2", "state": "running", "vcpus": 1, "memory_mb": 256, "disk_gb": 2}]
    line = vm_totals(vms)
    assert line.startswith("3 VMs (2 running, 1 shutoff) on 2 hosts using 4 vCPUs, ")
    assert vm_totals([]).startswith("0 VMs (none) on 0 hosts using 0 vCPUs")


# -- validators ------------------------------------------------------------------

def test_endpoints_may_omit_the_scheme_and_the_port():
    """'10.0.0.2' is http://10.0.0.2:2379, etcd's client port."""
    assert validate.parse_endpoints("http://127.0.0.1:2380, 10.0.0.2") == \
        [("127.0.0.1", 2380), ("10.0.0.2", 2379)]


@pytest.mark.parametrize("text, message", [
    ("", "no etcd endpoint given ('' from --etcd)"),
    (" , ", "no etcd endpoint given"),
    ("http://[::1", "bad etcd endpoint 'http://[::1': Invalid IPv6"),
    ("http://127.0.0.1:99999", "bad etcd endpoint 'http://127.0.0.1:99999': Port out of range"),
    ("http://127.0.0.1:0", "bad etcd endpoint 'http://127.0.0.1:0': port 0"),
    ("ftp://nowhere", "bad etcd endpoint 'ftp://nowhere': want http://HOST:PORT"),
    ("http://h:abc", "bad etcd endpoint 'http://h:abc'")])
def test_a_bad_endpoint_is_a_usage_error_naming_it(text, message):
    """The same check serves --etcd and the store, with the command line's messages."""
    with pytest.raises(UsageError) as raised:
        validate.parse_endpoints(text, "from --etcd")
    assert message in str(raised.value)


def test_the_store_checks_endpoints_with_the_same_validator():
    """engine.core.store has no endpoint grammar of its own."""
    from engine.core import store
    assert store.parse_endpoints is validate.parse_endpoints


@pytest.mark.parametrize("text, seconds", [
    ("3600", 3600.0), ("45s", 45.0), ("30m", 1800.0), ("12H", 43200.0), ("7d", 604800.0),
    (" 1.5h ", 5400.0), (90, 90.0), (0.5, 0.5)])
def test_durations_are_seconds_or_a_number_with_a_unit(text, seconds):
    """What the config's retention says, in seconds."""
    assert validate.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["bogus", "-1d", "1w", "", "d", "1.d", -5, float("nan")])
def test_a_bad_duration_is_a_usage_error_saying_what_is_wanted(text):
    """Negative, unitless garbage or an unknown unit names the value and where it is."""
    with pytest.raises(UsageError) as raised:
        validate.parse_duration(text, "retention", "in conf/peerctl.conf")
    assert str(raised.value).startswith(f"bad retention {text!r} in conf/peerctl.conf (want ")


def test_the_peer_reads_durations_with_the_same_validator():
    """engine.peer's retention and the command line's check agree by construction."""
    from engine import peer
    assert peer.parse_duration is validate.parse_duration


# -- reading the cluster over an in-memory keyspace ------------------------------

class MemoryStore:
    """The few Store calls engine/cluster.py and engine/operations/scrub.py make, over a dict."""

    def __init__(self, data: dict):
        self.revision = 1
        self.kvs = {}
        for key, value in data.items():
            # hosts/ keys are held by a lease, as a peer writes them
            self.put(key, value, lease=7 if key.startswith(keys.host()) else 0)

    def put(self, key, value, lease=0):
        self.revision += 1
        self.kvs[key] = KV(key, value, self.revision, self.revision, 1, lease)

    def range(self, prefix, keys_only=False, revision=0):
        kvs = [kv for key, kv in sorted(self.kvs.items()) if key.startswith(prefix)]
        if keys_only:
            kvs = [KV(kv.key, None, kv.create_revision, kv.mod_revision, 1, kv.lease)
                   for kv in kvs]
        return kvs, self.revision

    def txn(self, compares, success=(), failure=()):
        ok = all(self.kvs.get(c.key) is not None and self.kvs[c.key].mod_revision == c.operand
                 for c in compares)
        ranges = []
        for op in (success if ok else failure):
            if isinstance(op, Get):
                ranges.append(self.range(op.key)[0] if op.prefix else
                              [kv for kv in [self.kvs.get(op.key)] if kv])
            elif isinstance(op, Delete):
                self.kvs.pop(op.key, None)
            elif isinstance(op, Put):
                self.put(op.key, op.value)
        return TxnResult(ok, self.revision, ranges)


@pytest.fixture
def warnings():
    """What the command line would print, one entry per unreadable key
    (``(key, why)``; ``(key, why, "in part")`` for a key read in part)."""
    seen = []
    values.set_reporter(lambda key, why, skipped: seen.append(
        (key, why) if skipped else (key, why, "in part")))
    yield seen
    values.set_reporter(None)


def fresh(name: str) -> str:
    """A host name of this test only: each key is reported once per process."""
    return f"{name}-{uuid.uuid4().hex[:6]}"


def test_hosts_merge_the_kept_record_with_the_live_one_and_count_vms(warnings):
    """A host ever seen is listed; alive when it has a live record; drained stays drained."""
    up, gone = fresh("host1"), fresh("host2")
    store = MemoryStore({
        keys.host_config(up): {"host": up, "enabled": False},
        keys.host_config(gone): {"host": gone, "vcpus": 8},
        keys.host(up): {"host": up, "vcpus": 4, "enabled": True},
        keys.vm(gone, "u1"): {"host": gone, "name": "a", "uuid": "u1", "state": "running"},
        keys.vm(gone, "u2"): {"host": gone, "name": "b", "uuid": "u2", "state": "running"}})
    hosts = {h["host"]: h for h in cluster.read_hosts(store)}
    assert hosts[up]["alive"] and hosts[up]["status"] == "disabled" and hosts[up]["vcpus"] == 4
    assert hosts[gone]["status"] == "down" and hosts[gone]["vms"] == 2
    assert warnings == []


def test_an_unreadable_host_record_is_skipped_and_reported_once(warnings):
    """A hand-written 'hosts/h9' that is no record neither crashes nor shows up."""
    good, bad = fresh("host1"), fresh("h9")
    store = MemoryStore({keys.host(good): {"host": good},
                         keys.host(bad): [4],
                         keys.host_config(bad): "not a mapping"})
    assert [h["host"] for h in cluster.read_hosts(store)] == [good]
    assert [h["host"] for h in cluster.read_hosts(store)] == [good]
    assert sorted(warnings) == sorted([
        (keys.host(bad), "not a host record (a list, want a mapping)"),
        (keys.host_config(bad), "not a host record (a str, want a mapping)")])


def test_a_vm_record_without_its_fields_is_skipped(warnings):
    """vmlist lists the readable VMs and warns about the rest."""
    host = fresh("host1")
    store = MemoryStore({
        keys.host(host): {"host": host},
        keys.vm(host, "u1"): {"host": host, "name": "web1", "uuid": "u1", "state": "running",
                              "vcpus": 1, "memory_mb": 256, "disk_gb": 1},
        keys.vm(host, "u2"): {"name": "web2"}})
    assert cluster.read_vms(store) == [{"host": host, "name": "web1", "uuid": "u1",
                                        "state": "running", "vcpus": 1, "memory_mb": 256,
                                        "disk_gb": 1, "ip": None, "addresses": [],
                                        "ha": "none", "recovered": None, "crashed": False,
                                        "restarts": 0, "state_reason": None,
                                        "qemu_log": None}]
    assert [key for key, _ in warnings] == [keys.vm(host, "u2")]


def test_a_vm_an_ha_restart_rebuilt_elsewhere_is_listed_once_where_it_runs(warnings):
    """Between its build on host2 and its unlock, a recovery leaves two
    records of the VM: it is listed once, on host2; a VM whose recovery has
    built nothing yet stays listed where it was."""
    old, new = fresh("host1"), fresh("host2")
    record = {"name": "web1", "uuid": "u1", "ha": "restart", "vcpus": 1, "memory_mb": 64,
              "disk_gb": 1}
    store = MemoryStore({
        keys.host(old): {"host": old}, keys.host(new): {"host": new},
        keys.vm(old, "u1"): {**record, "host": old, "state": "missing"},
        keys.vm(new, "u1"): {**record, "host": new, "state": "running"},
        keys.vm(old, "u2"): {**record, "host": old, "state": "missing", "uuid": "u2",
                             "name": "web2"},
        keys.lock("vm/u1"): {"owner": "a1", "kind": "recover", "host": old},
        keys.lock("vm/u2"): {"owner": "a1", "kind": "recover", "host": old}})
    assert sorted((vm["name"], vm["host"], vm["state"]) for vm in cluster.read_vms(store)) \
        == [("web1", new, "running"), ("web2", old, "missing")]


def test_a_vm_whose_host_is_dead_is_unknown_and_a_bad_policy_reads_none(warnings):
    """The record is what the dead host last wrote: nobody can tell its
    state.  A policy that is not restart or none counts as none."""
    up, down = fresh("host1"), fresh("host2")
    store = MemoryStore({
        keys.host(up): {"host": up},
        keys.vm(up, "u1"): {"host": up, "name": "web1", "uuid": "u1", "state": "running",
                            "ha": "restart", "recovered": {"from": down, "time": 5.0}},
        keys.vm(down, "u2"): {"host": down, "name": "web2", "uuid": "u2", "state": "running",
                              "ha": "always", "recovered": "yes"}})
    vms = {vm["name"]: vm for vm in cluster.read_vms(store)}
    assert (vms["web1"]["state"], vms["web1"]["ha"], vms["web1"]["recovered"]) == \
        ("running", "restart", {"from": down, "time": 5.0, "data_as_of": None})
    assert (vms["web2"]["state"], vms["web2"]["ha"], vms["web2"]["recovered"]) == \
        ("unknown", "none", None)


def test_bad_addresses_in_a_vm_record_cost_only_those_entries(warnings):
    """Garbage in a record's addresses is dropped entry by entry; ip is the
    first IPv4 of what is left, else the first IPv6."""
    host = fresh("host1")
    good4 = {"interface": "vnet0", "mac": "52:00:00:00:00:01", "addr": "10.9.0.5", "prefix": 24}
    good6 = {"interface": "vnet0", "mac": "52:00:00:00:00:01", "addr": "fd00::5", "prefix": 64}
    store = MemoryStore({
        keys.vm(host, "u1"): {"host": host, "name": "web1", "uuid": "u1", "state": "running",
                              "addresses": [good6, {"addr": "x"}, 7,
                                            {**good4, "addr": "not-an-ip"}, good4]},
        keys.vm(host, "u2"): {"host": host, "name": "web2", "uuid": "u2", "state": "running",
                              "addresses": "10.0.0.1"}})
    vms = {vm["name"]: vm for vm in cluster.read_vms(store)}
    assert vms["web1"]["addresses"] == [good6, good4] and vms["web1"]["ip"] == "10.9.0.5"
    assert vms["web2"]["addresses"] == [] and vms["web2"]["ip"] is None
    assert warnings == []


def test_a_figure_that_is_no_number_reads_none_and_costs_nothing_else(warnings):
    """Integers, floats and None pass as they are; a bool or a string is a
    bad figure: None, the key reported once, in part."""
    host = fresh("host1")
    store = MemoryStore({
        keys.host(host): {"host": host, "vcpus": 4.0, "memory_mb": "4G", "disk_gb": None},
        keys.vm(host, "u1"): {"host": host, "name": "web1", "uuid": "u1", "state": "running",
                              "vcpus": False, "memory_mb": 256.5, "disk_gb": 1}})
    for _ in range(2):
        (vm,) = cluster.read_vms(store)
        (record,) = cluster.read_hosts(store)
    assert (vm["vcpus"], vm["memory_mb"], vm["disk_gb"]) == (None, 256.5, 1)
    assert (record["vcpus"], record["memory_mb"], record["disk_gb"]) == (4.0, None, None)
    assert sorted(warnings) == [
        (keys.host(host), "not a number, shown as missing: 'memory_mb' (a str)", "in part"),
        (keys.vm(host, "u1"), "not a number, shown as missing: 'vcpus' (a bool)", "in part")]


def test_a_host_is_ready_once_alive_with_a_stocked_provider():
    """up waits for both: the live record and a provider holding inventory."""
    ready, empty, dead = fresh("host1"), fresh("host2"), fresh("host3")
    data = {keys.host(ready): {"host": ready}, keys.host(empty): {"host": empty}}
    for name, inventories in ((ready, {"VCPU": {"total": 4}}), (empty, {}),
                              (dead, {"VCPU": {"total": 4}})):
        rp = str(uuid.uuid4())
        data[keys.placement("name/") + name] = rp
        data[keys.placement("rp/") + rp] = {
            "uuid": rp, "name": name, "root": rp, "generation": 1, "inventories": inventories,
            "usages": {}, "traits": [], "aggregates": []}
    assert cluster.ready_hosts(MemoryStore(data), [ready, empty, dead]) == {ready}


def test_the_warning_line_names_the_key_and_the_problem(capsys):
    """One line on stderr, stdout untouched (it may carry JSON)."""
    warn_unreadable("hosts/h9", "not a host record: no 'host'")
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "peerctl: warning: skipped unreadable key hosts/h9: not a host record: no 'host'\n"
    warn_unreadable("vms/h9/u1", "not a number, shown as missing: 'vcpus' (a str)",
                            skipped=False)
    assert capsys.readouterr().err == ("peerctl: warning: partly unreadable key vms/h9/u1: "
                                       "not a number, shown as missing: 'vcpus' (a str)\n")


# -- scrub -----------------------------------------------------------------------

def scrub(store, capsys, *flags, json=True):
    """Run ``peerctl scrub`` on ``store``: (exit code, what it printed)."""
    args = build_parser().parse_args(["scrub", *flags])
    ctx = Context(args, dict(DEFAULTS, format="json" if json else "table"))
    ctx._store = store
    code = args.func(ctx)
    return code, capsys.readouterr().out


def test_scrub_lists_the_unreadable_keys_and_deletes_only_with_delete(capsys):
    """Without --delete nothing goes; with --delete --yes exactly the bad keys go."""
    import json as jsonlib
    bad = fresh("h9")
    store = MemoryStore({keys.host(bad): "h9", keys.host("ok"): {"host": "ok"}})
    code, out = scrub(store, capsys)
    assert code == 0
    assert jsonlib.loads(out) == {
        "keys": [{"key": keys.host(bad), "why": "not a host record (a str, want a mapping)"}],
        "deleted": []}
    assert keys.host(bad) in store.kvs
    code, out = scrub(store, capsys, "--delete", "--yes")
    assert code == 0 and jsonlib.loads(out)["deleted"] == [keys.host(bad)]
    assert list(store.kvs) == [keys.host("ok")]


def test_scrub_stamps_the_bucket_of_a_provider_it_deletes(capsys):
    """Provider views read only the buckets stamped since their last read: a
    provider that scrub deletes stamps its bucket like any provider write."""
    rp = keys.placement(f"rp/{uuid.uuid4()}")
    store = MemoryStore({rp: "not a provider"})
    code, out = scrub(store, capsys, "--delete", "--yes")
    assert code == 0 and rp not in store.kvs
    assert keys.placement("bucket/" + rp[len(keys.placement("rp/")):][:2]) in store.kvs


def test_scrub_shows_a_table_of_key_and_problem(capsys):
    """The table has the columns Key and Problem, then a count."""
    bad = fresh("h9")
    code, out = scrub(MemoryStore({keys.host(bad): [1]}), capsys, json=False)
    lines = out.splitlines()
    assert code == 0 and lines[0].split() == ["Key", "Problem"]
    assert lines[1].split()[0] == keys.host(bad) and lines[-1] == "1 unreadable key"


def test_scrub_delete_without_a_terminal_needs_yes_only_when_there_is_something_to_delete(
        capsys, monkeypatch):
    """A script must say --yes before keys go; nothing is deleted before it
    does.  With no unreadable key there is nothing to confirm: exit 0."""
    monkeypatch.setattr("sys.stdin", argparse.Namespace(isatty=lambda: False))
    bad = fresh("h9")
    store = MemoryStore({keys.host(bad): 4})
    with pytest.raises(UsageError, match="add --yes"):
        scrub(store, capsys, "--delete")
    assert keys.host(bad) in store.kvs
    code, out = scrub(MemoryStore({keys.host("ok"): {"host": "ok"}}), capsys, "--delete")
    assert code == 0 and '"deleted": []' in out


def test_scrub_delete_asks_on_a_terminal_and_keeps_the_keys_on_no(capsys, monkeypatch):
    """Anything but yes at the prompt: exit 1, nothing deleted."""
    monkeypatch.setattr("sys.stdin", argparse.Namespace(isatty=lambda: True,
                                                        readline=lambda: "n\n"))
    bad = fresh("h9")
    store = MemoryStore({keys.host(bad): 4})
    with pytest.raises(Failed, match="nothing done"):
        scrub(store, capsys, "--delete")
    assert keys.host(bad) in store.kvs
