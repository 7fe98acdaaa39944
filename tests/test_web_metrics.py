"""``/metrics`` (engine/web/metrics.py): what a cluster did, as Prometheus
families, from a cache that etcd's watches keep; this host's domains from
libvirt, under the names the libvirt exporters use."""
from __future__ import annotations

import uuid
from collections import Counter
from contextlib import contextmanager

import libvirt
from prometheus_client.parser import text_string_to_metric_families

from engine.core import keys
from engine.core.store import Store
from engine.hypervisor.domain.domain_xml import DomainSpec, domain_xml
from engine.web.metrics import CONTENT_TYPE, ClusterMetrics
from tests.support import wait_for, wait_until
from tests.support.cluster import boot_vms
from tests.support.records import listed_hosts, put_vm
from tests.support.tcp_proxy import TcpProxy


@contextmanager
def watching(store, **options):
    """A ClusterMetrics of this process, started and settled."""
    metrics = ClusterMetrics(store, **options).start()
    try:
        assert metrics.wait_ready(20)
        yield metrics
    finally:
        metrics.stop()


def scrape(metrics) -> dict:
    """``{family name: {(sample name, labels...): value}}`` of one render."""
    found = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        found[family.name] = {(s.name, *sorted(s.labels.items())): s.value
                              for s in family.samples}
    return found


def value(found: dict, family: str, sample: str | None = None, **labels):
    return found.get(family, {}).get((sample or family, *sorted(labels.items())))


def samples(found: dict) -> int:
    return sum(len(series) for series in found.values())


def automations(found: dict) -> Counter:
    return Counter({(dict(labels)["kind"], dict(labels)["state"]): n
                    for (_, *labels), n in found["peerctl_automations"].items() if n})


def ended(found: dict, kind: str, outcome: str = "done") -> float:
    return value(found, "peerctl_automation_duration_seconds",
                 "peerctl_automation_duration_seconds_count", kind=kind, outcome=outcome) or 0


def test_what_a_cluster_did_is_counted_and_more_automations_add_no_series(
        cluster, store, two_hosts):
    with watching(store) as metrics:
        boot_vms(cluster, "web1", "web2", on="host1")
        cluster.cli_json("ping")
        done = Counter((t["kind"], t["state"]) for t in cluster.cli_json("tasks", "--all"))
        found = wait_until(lambda: scrape(metrics), lambda f: automations(f) == done,
                           what=f"automations {dict(done)}")

        for kind in ("boot", "ping"):
            assert ended(found, kind) == done[(kind, "done")] >= 1
            histogram = found["peerctl_automation_duration_seconds"]
            buckets = [n for (name, *labels), n in histogram.items()
                       if name.endswith("_bucket") and ("kind", kind) in labels]
            assert buckets == sorted(buckets) and buckets[-1] == ended(found, kind)
            assert value(found, "peerctl_automation_duration_seconds",
                         "peerctl_automation_duration_seconds_sum", kind=kind,
                         outcome="done") > 0
        assert value(found, "peerctl_hosts", status="up") == 2
        assert value(found, "peerctl_hosts", status="down") == 0
        assert value(found, "peerctl_vms", state="running") == 2
        for provider in cluster.cli_json("placement", "providers"):
            for rc, inventory in provider["inventories"].items():
                where = {"host": provider["name"], "resource_class": rc}
                assert value(found, "peerctl_placement_capacity", **where) == int(
                    (inventory["total"] - inventory["reserved"]) * inventory["allocation_ratio"])
                assert value(found, "peerctl_placement_used", **where) == provider["usages"][rc]
                assert value(found, "peerctl_placement_reserved", **where) == \
                    inventory["reserved"]
        assert value(found, "peerctl_placement_used", host="host1", resource_class="VCPU") == 2
        assert value(found, "peerctl_etcd_up") == 1
        assert value(found, "peerctl_etcd_db_size_bytes") > 0
        assert value(found, "peerctl_ha_recoveries", "peerctl_ha_recoveries_total") == 0
        assert not [name for name in found if "libvirt" in name]

        before, pings = samples(found), ended(found, "ping")
        for _ in range(5):
            cluster.cli_json("ping")
        found = wait_until(lambda: scrape(metrics), lambda f: ended(f, "ping") == pings + 5,
                           what="five more pings observed")
        assert automations(found)[("ping", "done")] == pings + 5
        assert samples(found) == before


class ReadsRefused:
    """A store whose reads fail once :meth:`refuse` is called: watches and
    status polls go through."""

    def __init__(self, store):
        self._store = store
        self.refusing = False

    def refuse(self):
        self.refusing = True

    def __getattr__(self, name):
        if name in ("get", "range", "txn", "revision", "changed_since") and self.refusing:
            raise AssertionError(f"a scrape read etcd ({name})")
        return getattr(self._store, name)


def test_a_scrape_reads_nothing_from_etcd_yet_sees_every_change(store):
    guarded = ReadsRefused(store)
    with watching(guarded) as metrics:
        guarded.refuse()
        listed_hosts(store, ["host1"])
        put_vm(store, "host1", "db1")
        put_vm(store, "host1", "db2", state="shutoff")
        task = {"id": "t1", "kind": "ping", "state": "running", "created": 1000.0}
        store.put(keys.task("t1"), task)
        store.put(keys.task("t1"), {**task, "state": "failed", "finished": 1002.0})

        found = wait_until(lambda: scrape(metrics),
                           lambda f: ended(f, "ping", "failed") == 1
                           and value(f, "peerctl_vms", state="shutoff") == 1,
                           what="the records written meanwhile")
        assert value(found, "peerctl_hosts", status="up") == 1
        assert value(found, "peerctl_vms", state="running") == 1
        assert value(found, "peerctl_automations", kind="ping", state="failed") == 1
        assert value(found, "peerctl_automations", kind="ping", state="running") == 0
        assert value(found, "peerctl_automation_duration_seconds",
                     "peerctl_automation_duration_seconds_sum", kind="ping",
                     outcome="failed") == 2.0
        for le, count in (("1.0", 0), ("2.5", 1), ("+Inf", 1)):
            assert value(found, "peerctl_automation_duration_seconds",
                         "peerctl_automation_duration_seconds_bucket", kind="ping",
                         outcome="failed", le=le) == count
        assert ClusterMetrics.CONTENT_TYPE == CONTENT_TYPE == \
            "text/plain; version=0.0.4; charset=utf-8"


def healed(proxy) -> bool:
    """The proxy listens again (its old listener is let go once a client
    knocked on it)."""
    try:
        proxy.heal()
        return True
    except OSError:
        return False


def test_what_changed_while_cut_off_past_a_compaction_arrives_with_a_fresh_read(own_etcd):
    direct = Store(own_etcd.url, "m")
    proxy = TcpProxy("127.0.0.1", own_etcd.client_port).start()
    cut_off = Store(proxy.url, "m")
    running = {"id": "t1", "kind": "boot", "state": "running", "created": 1000.0}
    direct.put(keys.task("t1"), running)
    vm = put_vm(direct, "host1", "db1")        # host1 is no live host: the VM is unknown
    try:
        with watching(cut_off, etcd_poll=0.2) as metrics:
            assert value(scrape(metrics), "peerctl_vms", state="unknown") == 1
            proxy.cut()
            wait_until(lambda: value(scrape(metrics), "peerctl_etcd_up"), lambda up: up == 0,
                       what="etcd seen down")
            direct.put(keys.task("t1"), {**running, "state": "done", "finished": 1030.0})
            direct.put(keys.task("t2"), {"id": "t2", "kind": "boot", "state": "failed",
                                         "created": 1100.0, "finished": 1100.5})
            direct.delete(keys.vm("host1", vm))
            direct.compact(direct.revision())
            wait_for(lambda: healed(proxy), what="the proxy listening again")

            found = wait_until(lambda: scrape(metrics),
                               lambda f: ended(f, "boot") == 1 and ended(f, "boot", "failed") == 1
                               and value(f, "peerctl_vms", state="unknown") == 0
                               and value(f, "peerctl_etcd_up") == 1,    # its own poll, apart
                               timeout=30, what="the changes made while cut off, etcd up")
            assert value(found, "peerctl_automation_duration_seconds",
                         "peerctl_automation_duration_seconds_sum", kind="boot",
                         outcome="done") == 30.0
            assert value(found, "peerctl_automations", kind="boot", state="running") == 0
            assert value(found, "peerctl_etcd_up") == 1
    finally:
        proxy.cut()
        cut_off.close()
        direct.close()


def test_each_ha_restart_noted_in_a_vm_record_is_counted_once(store):
    vm = str(uuid.uuid4())

    def noted(host, **restarts):
        store.put(keys.vm(host, vm), {"host": host, "name": "db1", "uuid": vm,
                                      "state": "running", "vcpus": 1, "memory_mb": 64,
                                      "disk_gb": 1, "ha": "restart", "restarts": restarts})

    def counted(metrics, n):
        wait_until(lambda: value(scrape(metrics), "peerctl_ha_recoveries",
                                 "peerctl_ha_recoveries_total"),
                   lambda total: total == n, what=f"{n} HA restarts counted")

    noted("host1", a1=100.0)
    with watching(store) as metrics:
        counted(metrics, 1)                     # what the records held at start
        noted("host1", a1=100.0)                # a publisher's rewrite: nothing new
        noted("host1", a1=100.0, a2=200.0)      # restarted in place
        counted(metrics, 2)
        noted("host2", a3=300.0)                # restarted elsewhere ...
        store.delete(keys.vm("host1", vm))      # ... and its dead host's record dropped
        noted("host3", a3=300.0)                # then moved, its restarts with it
        store.delete(keys.vm("host2", vm))
        noted("host3", a3=300.0, a4=400.0)
        counted(metrics, 4)


def test_this_hosts_domains_are_read_from_libvirt_under_the_exporters_names(store):
    owner = "metrics-" + uuid.uuid4().hex[:8]
    name = owner + "-web"
    conn = libvirt.open("test:///default")      # this process's test driver, shared while open
    dom = conn.defineXML(domain_xml(DomainSpec(
        uuid=str(uuid.uuid4()), name=name, vcpus=2, memory_mb=128, disk_gb=1,
        domain_type="test", owner=owner, disk_path="/nowhere/web.qcow2", networks=("default",),
        offer={"default": {"kind": "network", "source": "default"}})))
    dom.create()
    try:
        with watching(store, host=owner, libvirt_uri="test:///default") as metrics:
            found = scrape(metrics)
        ours = {"domain": name, "uuid": dom.UUIDString()}
        assert value(found, "peerctl_libvirt_up") == 1
        assert {dict(labels)["domain"] for (_, *labels) in
                found["libvirt_domain_info_virtual_cpus"]} == {name}     # not "test"
        assert value(found, "libvirt_domain_info_virtual_cpus", **ours) == 2
        assert value(found, "libvirt_domain_info_maximum_memory_bytes", **ours) == 128 * 2 ** 20
        assert value(found, "libvirt_domain_info_memory_usage_bytes", **ours) == 128 * 2 ** 20
        assert value(found, "libvirt_domain_info_vstate", **ours) == libvirt.VIR_DOMAIN_RUNNING
        assert value(found, "libvirt_domain_info_cpu_time_seconds",
                     "libvirt_domain_info_cpu_time_seconds_total", **ours) > 0
        for family in ("read_bytes", "write_bytes", "read_requests", "write_requests"):
            assert value(found, f"libvirt_domain_block_stats_{family}",
                         f"libvirt_domain_block_stats_{family}_total",
                         target_device="vda", **ours) >= 0
        for family in ("receive_bytes", "transmit_bytes", "receive_packets", "transmit_packets"):
            assert value(found, f"libvirt_domain_interface_stats_{family}",
                         f"libvirt_domain_interface_stats_{family}_total",
                         target_device="testnet0", **ours) >= 0
        assert "libvirt_domain_vcpu_delay_seconds" in found     # the test driver has none

        with watching(store, host="nobody", libvirt_uri="test:///default") as metrics:
            found = scrape(metrics)
        assert value(found, "peerctl_libvirt_up") == 1
        assert found["libvirt_domain_info_virtual_cpus"] == {}

        gone = "test+unix:///default?socket=/nonexistent/libvirt-sock"
        with watching(store, host=owner, libvirt_uri=gone) as metrics:
            found = scrape(metrics)
        assert value(found, "peerctl_libvirt_up") == 0
        assert not [family for family in found if family.startswith("libvirt_")]
        assert value(found, "peerctl_etcd_up") == 1
    finally:
        dom.destroy()
        dom.undefine()
        conn.close()
