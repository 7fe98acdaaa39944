"""What the graphs' sampler reads (engine/hypervisor/host/graph_sampler.py):
a VM's figures as libvirt gives them, with what it does not give absent,
never zero; the host's from psutil; a sample of a libvirt with peerctl's
domains on the test driver."""
from __future__ import annotations

import libvirt

from engine.hypervisor.host.domain_stats import DomainFigures
from engine.hypervisor.host.graph_sampler import GraphSampler, host_reading, vm_reading
from engine.hypervisor.host.graphs import Reading

RUNNING, SHUTOFF = libvirt.VIR_DOMAIN_RUNNING, libvirt.VIR_DOMAIN_SHUTOFF


def figures(state=RUNNING, disks=(), nics=()) -> DomainFigures:
    return DomainFigures("web1", "u1", state, 4096, 2048, 2, 7_000_000_000,
                         list(disks), list(nics))


def test_a_running_vm_sums_its_devices_and_gives_its_cpu_time_over_its_vcpus():
    read = vm_reading(figures(disks=[("vda", 100, 200, 1, 2), ("vdb", 1, 2, 1, 1)],
                              nics=[("vnet0", 10, 20, 1, 1)]))
    assert read == Reading(cpu_s=7.0, cpus=2, mem_bytes=2048 * 1024, disk_read=101,
                           disk_written=202, net_rx=10, net_tx=20)


def test_devices_libvirt_reports_nothing_for_are_absent_not_zero():
    read = vm_reading(figures(disks=[("vda", 5, 6, 0, 0)]))
    assert (read.net_rx, read.net_tx) == (None, None)
    assert read.disk_read == 5


def test_a_vm_not_running_has_every_figure_absent():
    assert vm_reading(figures(state=SHUTOFF, disks=[("vda", 5, 6, 0, 0)])) == Reading()


def test_the_host_reads_its_cpu_memory_and_counters():
    read = host_reading()
    assert read.cpus >= 1 and read.cpu_s > 0 and read.mem_bytes > 0


def test_a_sample_on_the_test_driver_keeps_the_host_and_leaves_out_domains_not_peerctls():
    sampler = GraphSampler("host1", "test:///default")     # its one domain has no metadata
    try:
        sampler.sample(1_800_000_000.0)
        sampler.sample(1_800_000_010.0)
    finally:
        sampler.stop()
    hour = sampler.graphs.host_series("hour", 1_800_000_010.0)
    assert hour["series"]["mem_bytes"][-1] > 0 and hour["series"]["cpu_pct"][-1] is not None
    assert sampler.graphs.vms() == set()
