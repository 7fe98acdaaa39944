"""domain_xml's own serialiser writes what ElementTree writes, user input
escaped alike, for every shape of domain and volume peerctl makes."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from engine.hypervisor import domain_xml as module
from engine.hypervisor.domain_xml import DomainSpec, domain_xml, volume_xml

HOSTILE = 'a<b>&"c\'\n\t\r]]>'
UUID = "7e2d64ae-7a16-4f43-9b73-8c2b1e0ad0a1"
SPECS = {
    "test driver, blank disk": DomainSpec(uuid=UUID, name="vm1", vcpus=1, memory_mb=64,
                                          disk_gb=1, domain_type="test",
                                          disk_path="/pool/x.qcow2", owner="h1"),
    "kernel boot, hostile text": DomainSpec(
        uuid=UUID, name=HOSTILE, vcpus=2, memory_mb=128, disk_gb=0, domain_type="kvm",
        kernel="/k&", initrd="/i<", cmdline=f"console=ttyS0 {HOSTILE}",
        console_log=f"/log/{HOSTILE}", owner="h1", image=f"http://x/?a=1&b={HOSTILE}",
        extra_metadata={"required": "A,B", "ha": "restart", "x": HOSTILE}),
    "networks and seed": DomainSpec(
        uuid=UUID, name="vm2", vcpus=1, memory_mb=64, disk_gb=1, domain_type="qemu",
        disk_path="/pool/y.qcow2", networks=("n1", "n2"), seed_path="/pool/seed.iso",
        offer={"n1": {"kind": "bridge", "source": "br0"},
               "n2": {"kind": "network", "source": "default"}},
        extra_metadata={"macs": "52:54:00:00:00:01,52:54:00:00:00:02"}, owner="h2"),
}


def as_element_tree_writes(monkeypatch, make):
    monkeypatch.setattr(module, "serialised", lambda root: ET.tostring(root, encoding="unicode"))
    try:
        return make()
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("shape", sorted(SPECS))
def test_a_domain_is_written_as_element_tree_writes_it(shape, monkeypatch):
    spec = SPECS[shape]
    ours = domain_xml(spec)
    assert ours == as_element_tree_writes(monkeypatch, lambda: domain_xml(spec))
    root = ET.fromstring(ours)
    # hostile text comes back as it was (XML reads a bare CR in text as a newline)
    assert root.findtext("name") == spec.name.replace("\r", "\n")


def test_volumes_are_written_as_element_tree_writes_them(monkeypatch):
    for args, kwargs in [((HOSTILE, 10, "raw"), {}),
                         (("d.qcow2", 1 << 30, "qcow2"),
                          {"backing_path": f"/b/{HOSTILE}", "backing_format": "qcow2"})]:
        ours = volume_xml(*args, **kwargs)
        assert ours == as_element_tree_writes(monkeypatch, lambda: volume_xml(*args, **kwargs))
