"""No VM forgotten: a VM peerctl made stays listed until an automation ends
it, whatever happens to its domain or to the peer that built it (real etcd,
real peers, the real command line, libvirt's test driver).

A peer's ``test:///`` hypervisor lives in its process, so a SIGKILLed peer
started again finds its domains gone, exactly as a host that rebooted fast
or a hypervisor that lost them.  A failpoint (``responded build``) kills a
peer right after its build's response is written, before its publisher
ever looked at the VM.
"""
import pytest

from engine.core import api, failpoints, keys
from engine.placement import open_placement
from tests.support import wait_for, wait_until
from tests.support.cluster import finished
from tests.support.vms import ENV, SMALL, allocations, big_test_host, reconcile_every, run

CLI_SMALL = "VCPU:1,MEMORY_MB:64,DISK_GB:1"
QUIET = {"PEERCTL_PUBLISH_EVENTS": "0", "PEERCTL_PUBLISH_INTERVAL": "3600"}


class Hosts:
    """Peers on big test-driver hosts, each with its own environment, that a
    test kills and starts again by name."""

    def __init__(self, cluster, store, tmp_path, margin=1.0, env=None):
        self.cluster, self.store, self.tmp_path = cluster, store, tmp_path
        self.margin = margin
        self.env = {**ENV, **reconcile_every(0.5), **(env or {})}

    def start(self, *names, env=None):
        for name in names:
            uri = big_test_host(self.tmp_path / f"{name}.xml")
            self.cluster.start_peer(name, libvirt=uri,
                                    extra_args=["--ha-margin", str(self.margin)],
                                    env={**self.env, **(env or {})})
        wait_for(lambda: set(names) <= set(api.live_hosts(self.store)), what=f"{names} alive")
        placement = open_placement("etcd", self.store)
        wait_for(lambda: set(names) <= {p["name"] for p in placement.providers()
                                        if p.get("inventories")},
                 what="providers registered")

    def dead(self, name):
        wait_for(lambda: name not in api.live_hosts(self.store), timeout=20,
                 what=f"{name}'s lease to expire")


def vmlist(cluster):
    """``vmlist`` by name; each VM is listed once, whatever is under way."""
    listed = cluster.cli_json("vmlist")
    names = [vm["name"] for vm in listed]
    assert len(names) == len(set(names)), f"listed twice: {names}"
    return {vm["name"]: vm for vm in listed}


def held_on(store):
    """consumer -> the host names its allocations are on."""
    placement = open_placement("etcd", store)
    names = {p["uuid"]: p["name"] for p in placement.providers()}
    return {consumer: sorted(names.get(rp, rp) for rp in held["allocations"])
            for consumer, held in allocations(store).items()}


def reconciler_passes(store, count):
    """Wait until the reconciler has made ``count`` more passes."""
    seen = []

    def passed():
        report = store.get(keys.RECONCILE_REPORT)
        if report is not None and report.value["time"] not in seen:
            seen.append(report.value["time"])
        return len(seen) > count
    wait_for(passed, timeout=30, what=f"{count} reconciler passes")


def boot_on(store, name, host, ha=False, members=("m1",)):
    """Boot ``name`` on ``host``, led by ``members`` (so that ``host`` only
    runs the build, as an executor); its uuid."""
    vm = {"name": name, "resources": SMALL, "on": host, **({"ha": "restart"} if ha else {})}
    task = finished(store, run(store, "boot", {"vms": [vm]}, prefer=list(members),
                               members=len(members)))
    assert task["state"] == "done", task["error"]
    [built] = task["result"]["vms"]
    assert (built["host"], built["state"]) == (host, "running")
    return built["uuid"]


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_a_vanished_domain_is_kept_missing_and_an_ha_one_restarted(cluster, store, tmp_path):
    """h1's peer is SIGKILLed and started again at once, within its lease:
    its domains are gone.  The HA VM runs again, rebuilt on another host
    (its domain is not on h1 any more) by an ``ha_restart`` whose initiator
    is SIGKILLed at its first placement step, and is counted once; the
    other is listed ``missing`` on h1, its allocation kept through five
    reconciler passes, until ``destroy`` clears both."""
    armed = tmp_path / "failpoints"
    armed.write_text("")
    hosts = Hosts(cluster, store, tmp_path, margin=60,  # never a dead-host recovery here
                  env={failpoints.ENV: str(armed)})
    hosts.start("h1", "h2", "h3")
    doc = cluster.cli_json("boot", "web1", "--resources", CLI_SMALL, "--network", "none",
                           "--on", "h1", "--ha", "restart")
    web1 = doc["vms"][0]["uuid"]
    db1 = cluster.cli_json("boot", "db1", "--resources", CLI_SMALL, "--network", "none",
                           "--on", "h1")["vms"][0]["uuid"]
    failpoints.arm(str(armed), ["append claim_move"])

    cluster.kill("h1")
    hosts.start("h1")

    def settled():
        for name in ("h1", "h2", "h3"):     # the initiator the failpoint killed: h1 too
            if cluster.peers[name].poll() is not None:
                hosts.start(name)
        vms = vmlist(cluster)
        return vms if vms.get("web1", {}).get("host") in ("h2", "h3") \
            and vms["web1"]["state"] == "running" and vms["web1"]["restarts"] == 1 \
            and vms["db1"]["state"] == "missing" else None
    vms = wait_for(settled, timeout=60, what="web1 running elsewhere, db1 missing on h1")
    assert [point for point, *_ in failpoints.fired(str(armed))] == ["append claim_move"]
    assert vms["web1"]["uuid"] == web1 and vms["web1"]["recovered"]["from"] == "h1"
    assert (vms["db1"]["uuid"], vms["db1"]["host"]) == (db1, "h1")
    table = cluster.cli("vmlist", "-o", "+restarts")
    assert "missing" in table.stdout and "Restarts" in table.stdout

    reconciler_passes(store, 5)
    assert held_on(store) == {web1: [vms["web1"]["host"]], db1: ["h1"]}
    wait_for(lambda: store.range(keys.restart())[0] == [], what="the restart request dropped")
    assert [v["name"] for v in cluster.cli_json("vmlist", "web1")] == ["web1"]

    gone = cluster.cli_json("destroy", "db1", "--yes")
    assert gone["vms"][0]["state"] == "destroyed", gone
    assert set(vmlist(cluster)) == {"web1"}
    assert held_on(store) == {web1: [vms["web1"]["host"]]}


@pytest.mark.slow     # several HA restarts within a real time window
def test_restarts_stop_after_the_stated_number_within_the_window(cluster, store, tmp_path):
    """With ``PEERCTL_HA_MAX_RESTARTS=1``, web1 vanishes twice: the first
    time it is rebuilt elsewhere, the second it is left ``missing``, its
    request marked given up, and ``vmlist`` counts the one restart."""
    hosts = Hosts(cluster, store, tmp_path, margin=60,
                  env={"PEERCTL_HA_MAX_RESTARTS": "1"})
    hosts.start("h1", "h2")
    cluster.cli_json("boot", "web1", "--resources", CLI_SMALL, "--network", "none",
                     "--on", "h1", "--ha", "restart")
    cluster.kill("h1")
    hosts.start("h1")
    wait_until(lambda: vmlist(cluster)["web1"],
               lambda vm: vm["host"] == "h2" and vm["state"] == "running",
               timeout=60, what="web1 rebuilt on h2")
    cluster.kill("h2")
    hosts.start("h2")
    uuid = vmlist(cluster)["web1"]["uuid"]

    def given_up():
        request = store.get(keys.restart(uuid))
        return request is not None and request.value.get("gave_up")
    wait_for(given_up, timeout=30, what="the second restart given up")
    vm = vmlist(cluster)["web1"]
    assert (vm["host"], vm["state"], vm["restarts"]) == ("h2", "missing", 1)
    assert "vm_restart_given_up" in "".join(cluster.log(h) for h in ("h1", "h2"))


@pytest.mark.slow       # a long scenario: a crash and a TTL
def test_a_host_killed_right_after_a_build_replied_takes_no_vm_with_it(
        cluster, store, tmp_path):
    """The build's response is written, then its host's peer dies before its
    publisher ran: the HA VM is restarted elsewhere; the other is listed
    ``unknown`` while its host is dead, then ``missing`` once it is back
    (its domain died with the peer), never forgotten."""
    armed = tmp_path / "failpoints"
    armed.write_text("")
    hosts = Hosts(cluster, store, tmp_path, env=QUIET)
    hosts.start("m1", "m2")
    hosts.start("t1", env={failpoints.ENV: str(armed)})

    failpoints.arm(str(armed), ["responded build"])
    web1 = boot_on(store, "web1", "t1", ha=True, members=("m1", "m2"))
    assert [point for point, *_ in failpoints.fired(str(armed))] == ["responded build"]
    hosts.dead("t1")

    def restarted():
        vm = vmlist(cluster).get("web1", {})
        return vm if vm.get("host") in ("m1", "m2") and vm["state"] == "running" else None
    vm = wait_for(restarted, timeout=60, what="web1 running elsewhere")
    assert vm["uuid"] == web1 and vm["recovered"]["from"] == "t1"
    assert held_on(store)[web1] == [vm["host"]]

    hosts.start("t1", env={failpoints.ENV: str(armed)})
    failpoints.arm(str(armed), ["responded build"])
    db1 = boot_on(store, "db1", "t1", members=("m1", "m2"))
    hosts.dead("t1")
    assert (vmlist(cluster)["db1"]["host"], vmlist(cluster)["db1"]["state"]) == \
        ("t1", "unknown")
    hosts.start("t1")
    wait_for(lambda: vmlist(cluster)["db1"]["state"] == "missing", what="db1 missing")
    reconciler_passes(store, 3)
    assert held_on(store) == {web1: [vm["host"]], db1: ["t1"]}
    assert set(vmlist(cluster)) == {"web1", "db1"}


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_a_vm_recovered_onto_a_host_that_then_dies_is_recovered_again(
        cluster, store, tmp_path):
    """web1's host h1 dies; the recovery rebuilds it on h2, whose peer dies
    right after its build replied; h1 is back by then (empty): web1 is
    recovered from h2 onto h1.  Listed once all along, one allocation."""
    armed = tmp_path / "failpoints"
    armed.write_text("")
    hosts = Hosts(cluster, store, tmp_path)
    hosts.start("m1", "h1")
    hosts.start("h2", env={failpoints.ENV: str(armed)})
    cluster.cli_json("drain", "m1")                       # m1 leads, hosts nothing
    web1 = boot_on(store, "web1", "h1", ha=True)

    failpoints.arm(str(armed), ["responded build"])
    cluster.kill("h1")
    wait_for(lambda: store.get(keys.recovery("h1")) is not None, timeout=30,
             what="h1's recovery to start")
    wait_for(lambda: failpoints.fired(str(armed)), timeout=60, what="h2 to die after its build")
    first = finished(store, store.get(keys.recovery("h1")).value["automation"])
    assert first["result"]["vms"][0]["state"] == "restarted"
    assert first["result"]["vms"][0]["host"] == "h2"
    hosts.start("h1")

    def recovered_again():
        vm = vmlist(cluster).get("web1", {})
        return vm if (vm.get("host"), vm.get("state")) == ("h1", "running") else None
    vm = wait_for(recovered_again, timeout=60, what="web1 running on h1 again")
    assert vm["uuid"] == web1 and vm["recovered"]["from"] == "h2"
    assert [v["name"] for v in cluster.cli_json("vmlist")] == ["web1"]
    assert held_on(store) == {web1: ["h1"]}
