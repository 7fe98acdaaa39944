"""Booting and destroying VMs through automations, on libvirt's test driver.

Members (m*) lead the automations; targets (t*) host the VMs, so killing a
member never takes VMs with it (each peer's test:///default hypervisor lives
in its process).  What the cluster believes (vms/, placement) is checked
against what the hypervisors really hold (the `inventory` request).
"""
import collections

import pytest

from engine.core import api
from engine.placement import open_placement
from tests.support import ROOT, wait_for, wait_until
from tests.support.cluster import finished
from tests.support.vms import (ENV, allocations, booted, inventory, published,
                               reconcile_every, run, start)
from tests.support.hooks import (assert_each_index_ran_once, counting_hook, failing_hook,
                                 serial_hook, write_hook)



def assert_one_to_one(store, result_vms, hosts):
    """Every VM runs exactly once, where the result says, with one allocation."""
    held = inventory(store, hosts)
    running = collections.Counter(d["name"] for h in hosts for d in held[h]["domains"]
                                  if d["name"] != "test")
    assert all(n == 1 for n in running.values()), f"VMs running twice: {running}"
    assert set(running) == {vm["name"] for vm in result_vms}
    for vm in result_vms:
        assert vm["state"] == "running"
        assert any(d["uuid"] == vm["uuid"] for d in held[vm["host"]]["domains"])
    consumers = allocations(store)
    assert set(consumers) == {vm["uuid"] for vm in result_vms}, "orphan or missing allocations"
    placement = open_placement("etcd", store)
    for vm in result_vms:
        (provider,) = consumers[vm["uuid"]]["allocations"]
        assert placement.provider(provider)["name"] == vm["host"]
    wait_for(lambda: sorted(v["name"] for v in published(store) if v["name"] != "test")
             == sorted(vm["name"] for vm in result_vms), what="vms/ to match")


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_boot_twenty_vms_survives_sigkill_of_the_initiator(cluster, store, tmp_path):
    """Claims run on the initiator 16 VMs to a step, one step at a time
    (~2 s each), so when the initiator is killed some VMs are built and
    others not yet claimed: the new initiator must carry the automation on,
    appending their steps."""
    hooks = str(tmp_path / "hooks")
    builds = counting_hook(hooks, request="build", sleep=0.1)
    member_hooks = str(tmp_path / "member-hooks")
    serial_hook(member_hooks, "claim_vms", 2.0)
    start(cluster, store, ["t1", "t2", "t3"], hooks=hooks)
    start(cluster, store, ["m1", "m2", "m3"], hooks=member_hooks)
    names = [f"vm{i:02d}" for i in range(20)]
    automation_id = run(store, "boot", booted(names), prefer=["m1", "m2", "m3"])

    def builds_done(task):
        return sum(e["request"] == "build" and e["status"] == "ok" for e in task["log"])
    task = wait_until(lambda: api.get_task(store, automation_id),
                      lambda t: builds_done(t) >= 3, what="3 builds done")
    killed = task["initiator"]
    cluster.kill(killed)
    at_kill = api.get_task(store, automation_id)       # the dead one appends no more
    assert at_kill["state"] == "running"
    appended = sum(e["request"] == "build" for e in at_kill["log"])
    assert 1 <= builds_done(at_kill) <= 19 and appended < 20, \
        f"the kill did not land mid-way: {builds_done(at_kill)} built, {appended} sent"
    last_index = max(e["index"] for e in at_kill["log"])

    task = finished(store, automation_id)
    assert task["state"] == "done", task["error"]
    assert task["initiator"] not in (None, killed)
    after = [e for e in task["log"] if e["index"] > last_index]
    assert sum(e["request"] == "build" for e in after) == 20 - appended, \
        "the new initiator must send the builds the dead one had not"
    assert_each_index_ran_once(builds, automation_id)
    assert_one_to_one(store, task["result"]["vms"], ["t1", "t2", "t3"])


def test_target_killed_during_build_goes_to_an_alternate(cluster, store, tmp_path):
    hooks = tmp_path / "hooks"
    marker = tmp_path / "hang-once"
    marker.write_text("")
    write_hook(hooks, "build", "pre", f"""
if os.path.exists({str(marker)!r}):     # the first build only: hang
    os.remove({str(marker)!r})
    time.sleep(60)
""")
    start(cluster, store, ["t1", "t2"], hooks=str(hooks))
    start(cluster, store, ["m1"])
    automation_id = run(store, "boot", booted(["db1"]), prefer=["m1"], members=1)
    task = wait_until(lambda: api.get_task(store, automation_id),
                      lambda t: any(e["request"] == "build" and e["status"] == "running"
                                    for e in t["log"]),
                      what="the first build to hang")
    doomed = next(e["target"] for e in task["log"] if e["request"] == "build")
    survivor = {"t1": "t2", "t2": "t1"}[doomed]
    cluster.kill(doomed)
    task = finished(store, automation_id)
    assert task["state"] == "done", task["error"]
    (vm,) = task["result"]["vms"]
    assert vm["host"] == survivor
    statuses = [(e["request"], e["target"], e["status"]) for e in task["log"]]
    assert ("build", doomed, "lost") in statuses
    placement = open_placement("etcd", store)
    assert placement.provider(doomed)["usages"].get("VCPU", 0) == 0, "dead host's claim kept"
    assert_one_to_one(store, [vm], [survivor])


def test_failing_pre_hook_sends_the_vm_to_an_alternate(cluster, store, tmp_path):
    hooks = tmp_path / "hooks"
    failing_hook(hooks, "build", "disk array offline")
    start(cluster, store, ["t1"], hooks=str(hooks))
    start(cluster, store, ["t2", "m1"])
    # t2 already carries a VM, so placement prefers the emptier t1 first.
    first = finished(store, run(store, "boot", booted(["warm"], on="t2"), prefer=["m1"]))
    assert first["state"] == "done", first["error"]
    task = finished(store, run(store, "boot", booted(["app1"]), prefer=["m1"]))
    assert task["state"] == "done", task["error"]
    (vm,) = task["result"]["vms"]
    assert vm["host"] == "t2"
    failed = [e for e in task["log"] if e["request"] == "build" and e["target"] == "t1"]
    assert failed and failed[0]["status"] == "error"
    assert "disk array offline" in failed[0]["error"]
    assert_one_to_one(store, first["result"]["vms"] + [vm], ["t1", "t2"])


def test_destroy_by_pattern_leaves_nothing_behind(cluster, store):
    start(cluster, store, ["t1", "t2"])
    start(cluster, store, ["m1"])
    boot = finished(store, run(store, "boot", booted(["web1", "web2", "web3", "db1"]),
                               prefer=["m1"]))
    assert boot["state"] == "done", boot["error"]
    wait_for(lambda: len([v for v in published(store) if v["name"] != "test"]) == 4,
             what="4 VMs published")
    done = cluster.cli("--format", "json", "destroy", "web*", "--yes")
    assert done.returncode == 0, done.stderr
    import json
    destroyed = json.loads(done.stdout)
    assert sorted(v["name"] for v in destroyed["vms"]) == ["web1", "web2", "web3"]
    held = inventory(store, ["t1", "t2"])
    names = {d["name"] for h in held.values() for d in h["domains"]}
    assert names - {"test"} == {"db1"}
    db1 = next(v for v in boot["result"]["vms"] if v["name"] == "db1")
    for host, state in held.items():
        leftovers = [v for v in state["volumes"] if not v.startswith(db1["uuid"])
                     and not v.startswith("image-")]
        assert not leftovers, f"{host} kept volumes {leftovers}"
    left = allocations(store)
    assert set(left) == {db1["uuid"]}, (
        f"allocations left: {left}\nboot: {boot['result']}\n"
        f"destroy log: {api.get_task(store, destroyed['automation'])['log']}")
    wait_for(lambda: sorted(v["name"] for v in published(store) if v["name"] != "test")
             == ["db1"], what="vms/ without the web VMs")


def test_a_finished_boot_is_published_in_the_same_instant(cluster, store):
    """The build handler publishes its VM before replying: once boot reports
    done, one read of vms/ (no polling) shows every VM running.  The targets'
    publishers get no libvirt events and an hour-long period, so only the
    build itself can have written the records."""
    quiet = {"PEERCTL_PUBLISH_EVENTS": "0", "PEERCTL_PUBLISH_INTERVAL": "3600"}
    for name in ["t1", "t2"]:
        cluster.start_peer(name, env={**ENV, **quiet})
    start(cluster, store, ["m1"])
    placement = open_placement("etcd", store)
    wait_for(lambda: {"t1", "t2"} <= {p["name"] for p in placement.providers()},
             what="t1 and t2 registered")
    boot = finished(store, run(store, "boot", booted([f"now{i}" for i in range(4)]),
                               prefer=["m1"]))
    kvs, _ = store.range("vms/")                   # one read, right away
    assert boot["state"] == "done", boot["error"]
    records = {kv.key: kv.value for kv in kvs}
    for vm in boot["result"]["vms"]:
        assert records.get(f"vms/{vm['host']}/{vm['uuid']}") == {
            "host": vm["host"], "name": vm["name"], "uuid": vm["uuid"], "state": "running",
            "vcpus": 1, "memory_mb": 64, "disk_gb": 1, "ha": "none", "want": "running"}, \
            (vm, records)


def test_reconciler_releases_orphans_but_not_claims_in_flight(cluster, store, tmp_path):
    import uuid as uuidlib
    hooks = tmp_path / "hooks"
    write_hook(hooks, "build", "pre", f"""
if os.path.exists({str(tmp_path / "hang")!r}):
    time.sleep(60)
""")
    start(cluster, store, ["t1", "m1"], hooks={"t1": str(hooks)}, env=reconcile_every(0.3))
    kept = finished(store, run(store, "boot", booted(["kept"]), prefer=["m1"]))
    assert kept["state"] == "done", kept["error"]
    placement = open_placement("etcd", store)
    t1 = placement.provider("t1")["uuid"]
    orphan = str(uuidlib.uuid4())
    placement.claim(orphan, {t1: {"VCPU": 1, "MEMORY_MB": 64}}, project="p", user="u")
    (tmp_path / "hang").write_text("")
    in_flight = run(store, "boot", booted(["slow"]), prefer=["m1"])
    wait_for(lambda: any(e["request"] == "build" and e["status"] == "running"
                         for e in api.get_task(store, in_flight)["log"]), what="build hanging")
    wait_for(lambda: orphan not in allocations(store), what="orphan released")
    # Several passes later the claim of the running boot is still held.
    first = store.get("reconcile/report").value["time"]
    wait_for(lambda: store.get("reconcile/report").value["time"] > first + 1.0, what="more passes")
    held = allocations(store)
    kept_uuid = kept["result"]["vms"][0]["uuid"]
    assert kept_uuid in held
    assert len(held) == 2, "the in-flight boot's claim must stay while it runs"
    api.abort(store, in_flight)
    wait_for(lambda: set(allocations(store)) == {kept_uuid}, what="aborted boot's claim released")


def _node_xml(path, host, domains):
    """A test-driver host file holding ``domains`` [(uuid, name)], each
    running, owned by ``host`` in peerctl's metadata: what a host's libvirtd
    still holds when its peer comes back after a SIGKILL."""
    from engine.core.handlers import load_request_handlers
    load_request_handlers()
    from engine.hypervisor.domain.domain_xml import DomainSpec, domain_xml
    xml = "".join(domain_xml(DomainSpec(uuid=u, name=n, vcpus=1, memory_mb=64, disk_gb=1,
                                        domain_type="test", owner=host))
                  for u, n in domains)
    path.write_text("<node><cpu><nodes>1</nodes><sockets>1</sockets><cores>8</cores>"
                    "<threads>1</threads><active>8</active><mhz>2000</mhz>"
                    "<model>i686</model></cpu><memory>16777216</memory>" + xml + "</node>")
    return f"test://{path}"


def test_lost_build_leaves_no_ghost_record_and_no_ghost_domain_on_return(
        cluster, store, tmp_path):
    """t1's peer is SIGKILLed right after it built (and published) db1: the
    build is `lost`, db1 goes to t2.  While t1 is dead the reconciler drops
    its ghost `vms/` record; when t1 comes back with a libvirtd that kept
    the domain (simulated: a test-driver host file preloaded with it), t1
    destroys that copy (disowned there) before publishing.  A running copy
    of t2's `warm`, which nothing says t1 gave up, is left alone and
    reported (it could be the only one), as a peerctl domain nobody placed
    (`stray`) is kept and reported; neither is listed."""
    hooks = tmp_path / "hooks"
    write_hook(hooks, "build", "post", f"""
import signal
sys.path.insert(0, {ROOT!r})
from engine.core.store import Store
store = Store(os.environ["PEERCTL_ETCD"], os.environ["PEERCTL_CLUSTER"])
key = "vms/" + event["host"] + "/" + event["args"]["uuid"]
deadline = time.monotonic() + 20
while store.get(key) is None and time.monotonic() < deadline:
    time.sleep(0.05)
os.kill(os.getppid(), signal.SIGKILL)
""")
    start(cluster, store, ["t1"], hooks=str(hooks), env=reconcile_every(0.3))
    start(cluster, store, ["t2", "m1"], env=reconcile_every(0.3))
    # t2 already carries a VM, so placement prefers the emptier t1 first.
    warm = finished(store, run(store, "boot", booted(["warm"], on="t2"), prefer=["m1"]))
    assert warm["state"] == "done", warm["error"]
    (warm_vm,) = warm["result"]["vms"]
    task = finished(store, run(store, "boot", booted(["db1"]), prefer=["m1"]))
    assert task["state"] == "done", task["error"]
    (vm,) = task["result"]["vms"]
    assert vm["host"] == "t2"
    statuses = [(e["request"], e["target"], e["status"]) for e in task["log"]]
    assert ("build", "t1", "lost") in statuses
    assert [s for r, _, s in statuses if r == "disown"] == ["ok"]
    assert store.get(f"disowned/t1/{vm['uuid']}") is not None
    assert cluster.peers["t1"].poll() is not None, "the hook did not kill t1"

    wait_for(lambda: store.get(f"vms/t1/{vm['uuid']}") is None,
             what="the reconciler to drop dead t1's ghost record")
    assert sorted((v["host"], v["name"]) for v in published(store) if v["name"] != "test") \
        == [("t2", "db1"), ("t2", "warm")]

    stray = "5e1f0000-0000-4000-8000-000000000001"
    uri = _node_xml(tmp_path / "t1-libvirtd.xml", "t1",
                    [(vm["uuid"], "db1"), (warm_vm["uuid"], "warm"), (stray, "stray")])
    cluster.start_peer("t1", libvirt=uri, env={**ENV, **reconcile_every(0.3)})
    wait_for(lambda: "t1" in api.live_hosts(store), what="t1 back")
    held = inventory(store, ["t1", "t2"])
    assert sorted(d["name"] for d in held["t1"]["domains"]) == ["stray", "warm"], held["t1"]
    assert not [v for v in held["t1"]["volumes"] if v.startswith(vm["uuid"])]
    assert store.get(f"disowned/t1/{vm['uuid']}") is None, "mark kept after the sweep"
    running = collections.Counter(d["uuid"] for h in held.values() for d in h["domains"])
    assert running[vm["uuid"]] == 1 and running[warm_vm["uuid"]] == 2, running
    assert f"ghost_vm_running_left_alone host=t1 uuid={warm_vm['uuid']}" in " ".join(
        cluster.log("t1").split()), "the copy left alone was not reported"
    placement = open_placement("etcd", store)
    t2 = placement.provider("t2")["uuid"]
    assert {c: list(a["allocations"]) for c, a in allocations(store).items()} == \
        {vm["uuid"]: [t2], warm_vm["uuid"]: [t2]}, "stray must not be touched"
    # A domain with peerctl's metadata but no record is no VM of the cluster:
    # a publisher never makes one exist.  It is kept, and said once.
    wait_for(lambda: "vm_without_record" in cluster.log("t1") and "stray" in cluster.log("t1"),
             what="t1 to report stray")
    assert sorted((v["host"], v["name"]) for v in published(store) if v["name"] != "test") \
        == [("t2", "db1"), ("t2", "warm")]
    assert "ghost_vm_destroyed" in cluster.log("t1")


@pytest.mark.slow      # several seconds: the third tier keeps the quick one under 6 min
def test_destroy_of_a_vm_on_a_dead_host_disowns_it_and_releases_its_allocation(
        cluster, store):
    """t1 is SIGKILLed with web1 on it: destroy cannot reach it (its steps
    are lost), so it disowns web1 there and releases the allocation; the
    reconciler drops the dead host's record, and t1, back, clears the mark."""
    start(cluster, store, ["t1", "m1"], env=reconcile_every(0.3))
    boot = finished(store, run(store, "boot", booted(["web1"], on="t1"), prefer=["m1"]))
    assert boot["state"] == "done", boot["error"]
    (vm,) = boot["result"]["vms"]
    assert set(allocations(store)) == {vm["uuid"]}
    cluster.kill("t1")
    wait_for(lambda: "t1" not in api.live_hosts(store), what="t1 dead")

    task = finished(store, run(store, "destroy", {"vms": [
        {"host": "t1", "name": "web1", "uuid": vm["uuid"]}]}, prefer=["m1"]))
    assert task["state"] == "done", task["error"]
    assert [(v["uuid"], v["state"]) for v in task["result"]["vms"]] \
        == [(vm["uuid"], "disowned")]
    assert {e["status"] for e in task["log"] if e["request"] == "destroy"} == {"lost"}
    assert allocations(store) == {}, "the dead host's VM keeps no allocation"
    mark = store.get(f"disowned/t1/{vm['uuid']}").value
    assert mark["automation"] == task["id"]
    wait_for(lambda: store.get(f"vms/t1/{vm['uuid']}") is None,
             what="the reconciler to drop dead t1's record")

    cluster.start_peer("t1", env=ENV)
    wait_for(lambda: store.get(f"disowned/t1/{vm['uuid']}") is None,
             what="t1, back without the VM, to drop the mark")


def test_every_host_failing_the_build_ends_in_error_with_nothing_left(cluster, store, tmp_path):
    hooks = tmp_path / "hooks"
    failing_hook(hooks, "build", "disk array offline")
    start(cluster, store, ["t1", "t2"], hooks=str(hooks))
    start(cluster, store, ["m1"])
    task = finished(store, run(store, "boot", booted(["doomed"]), prefer=["m1"]))
    assert task["state"] == "failed"
    (vm,) = task["result"]["vms"]
    assert vm["state"] == "error" and vm["host"] is None
    assert "t1: disk array offline" in vm["error"] and "t2: disk array offline" in vm["error"]
    assert "doomed" in task["error"]
    builds = sorted(e["target"] for e in task["log"] if e["request"] == "build")
    assert builds == ["t1", "t2"], "each host tried once, then no alternate left"
    assert allocations(store) == {}, "the claim must be released"
    held = inventory(store, ["t1", "t2"])
    assert not [d for h in held.values() for d in h["domains"] if d["uuid"] == vm["uuid"]]
    assert not [v for h in held.values() for v in h["volumes"] if v.startswith(vm["uuid"])]
    assert not [v for v in published(store) if v["uuid"] == vm["uuid"]]


def test_a_deposed_reconciler_releases_nothing(store):
    """A reconciler whose lease expired (paused, partitioned) still believes
    it leads; etcd refuses its fenced release and it stops with Deposed."""
    import uuid as uuidlib
    from engine.core.election import Candidacy
    from engine.errors import Deposed
    from engine.hypervisor.host.reconciler import reconcile_once
    from engine.core.session import Session
    placement = open_placement("etcd", store)
    rp = placement.ensure_provider("h1")
    placement.set_inventory(rp["uuid"], {"VCPU": 8, "MEMORY_MB": 4096})
    orphan = str(uuidlib.uuid4())
    placement.claim(orphan, {rp["uuid"]: {"VCPU": 1}}, project="p", user="u")
    old, new = Session(store, 5), Session(store, 5)
    try:
        deposed = Candidacy(store, old, "singleton/reconciler/", "old")
        assert deposed.is_leader()
        store.revoke(old.lease)             # its lease expires while it is paused
        leader = Candidacy(store, new, "singleton/reconciler/", "new")
        assert leader.is_leader()
        try:
            reconcile_once(store, placement, {orphan}, fence=deposed, host="old")
        except Deposed:
            pass
        else:
            raise AssertionError("a deposed reconciler's pass went through")
        assert orphan in allocations(store), "a deposed reconciler released an allocation"
        assert store.get("reconcile/report") is None
        report = reconcile_once(store, placement, {orphan}, fence=leader, host="new")
        assert report["released"] == [orphan] and report["host"] == "new"
        assert allocations(store) == {}
    finally:
        old.close()
        new.close()


def test_one_reconciler_at_a_time_and_another_takes_over(cluster, store):
    start(cluster, store, ["h1", "h2", "h3"], env=reconcile_every(0.2))

    def reporters(n, exclude=()):
        """The hosts that wrote the next ``n`` reports (after any by ``exclude``)."""
        seen = {}
        def more():
            kv = store.get("reconcile/report")
            if kv and kv.value["host"] not in exclude:
                seen[kv.mod_revision] = kv.value["host"]
            return len(seen) >= n
        wait_for(more, what=f"{n} reconcile reports")
        return set(seen.values())
    (first,) = reporters(5)
    cluster.kill(first)
    (second,) = reporters(5, exclude={first})
    assert second != first


def test_builds_on_one_host_run_in_parallel(cluster, store, tmp_path):
    """Four builds for one host: each request (pre hook, handler, post hook)
    spans the pre hook's start to the post hook's end, and all four spans
    share a moment, so the peer's pool ran them at once, not in turn."""
    hooks = tmp_path / "hooks"
    spans = tmp_path / "spans.log"
    for phase, pause in (("pre", 1.0), ("post", 0.0)):
        write_hook(hooks, "build", phase, f"""
with open({str(spans)!r}, "a") as log:
    log.write(f"{{event['index']}} {phase} {{time.time()}}\\n")
time.sleep({pause})
""")
    start(cluster, store, ["t1"], hooks=str(hooks))
    start(cluster, store, ["m1"])
    task = finished(store, run(store, "boot", booted(["p1", "p2", "p3", "p4"]), prefer=["m1"]))
    assert task["state"] == "done", task["error"]
    times = collections.defaultdict(dict)
    for line in spans.read_text().split("\n"):
        if line:
            index, phase, at = line.split()
            times[index][phase] = float(at)
    assert len(times) == 4 and all(len(t) == 2 for t in times.values()), times
    last_start = max(t["pre"] for t in times.values())
    first_end = min(t["post"] for t in times.values())
    assert last_start < first_end, f"builds ran in turn, not at once: {dict(times)}"
    assert_one_to_one(store, task["result"]["vms"], ["t1"])
