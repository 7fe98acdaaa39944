"""The checkpoints' definitions a move carries in the destination's domain
XML (``engine/hypervisor/moves/checkpoints.py``), on libvirt's test driver:
they ride in the XML, are read once on the destination, and a checkpoint
libvirt will not define again is left out, saying why.  The test driver
keeps no checkpoints at all, so here every one is left out: that a
checkpoint is defined only with its bitmap whole is proven on QEMU
(tests/test_migration_qemu.py, tests/test_backups_moved_qemu.py).
"""
from __future__ import annotations

import uuid as uuidlib
import xml.etree.ElementTree as ET

import libvirt

from engine.hypervisor.moves import checkpoints

A = ("<domaincheckpoint><name>peerctl-a</name><disks><disk name='vda' checkpoint='bitmap'/>"
     "</disks></domaincheckpoint>")
B = ("<domaincheckpoint><name>peerctl-b</name><parent><name>peerctl-a</name></parent>"
     "<disks><disk name='vda' checkpoint='bitmap'/></disks></domaincheckpoint>")


def domain(uuid: str) -> str:
    return (f"<domain type='test'><name>cp-{uuid[:8]}</name><uuid>{uuid}</uuid>"
            "<memory unit='MiB'>64</memory><os><type>hvm</type></os></domain>")


def test_the_definitions_ride_in_the_xml_once_and_replace_an_earlier_ride():
    once = checkpoints.carried_in(domain(str(uuidlib.uuid4())), [A])
    twice = checkpoints.carried_in(once, [A, B])
    carriers = ET.fromstring(twice).findall(f"./metadata/{{{checkpoints.NAMESPACE}}}checkpoints")
    assert len(carriers) == 1
    assert [c.text for c in carriers[0]] == [A, B]
    bare = checkpoints.carried_in(twice, [])
    assert ET.fromstring(bare).findall(f"./metadata/{{{checkpoints.NAMESPACE}}}checkpoints") \
        == []


def test_the_destination_reads_them_once_and_leaves_out_what_libvirt_refuses():
    conn = libvirt.open("test:///default")
    try:
        uuid = str(uuidlib.uuid4())
        dom = conn.defineXML(checkpoints.carried_in(domain(uuid), [A, B]))
        dom.create()
        settled = checkpoints.settle(dom)
        assert settled["carried"] == [] and list(settled["dropped"]) == ["peerctl-a",
                                                                         "peerctl-b"]
        assert all(settled["dropped"].values()), settled
        assert checkpoints.settle(dom) is None, "read once, then removed"
        for flags in (0, libvirt.VIR_DOMAIN_XML_INACTIVE):
            assert "peerctl-a" not in dom.XMLDesc(flags)
        dom.destroy()
        dom.undefine()

        shut_off = conn.defineXML(checkpoints.carried_in(domain(str(uuidlib.uuid4())), [A]))
        assert checkpoints.settle(shut_off) == {
            "carried": [], "dropped": {"peerctl-a": "the VM does not run here, so its bitmaps "
                                                   "cannot be checked"}}
        assert checkpoints.settle(shut_off) is None
        shut_off.undefine()
        assert checkpoints.described(conn.lookupByName("test"), ["vda"]) == []
    finally:
        conn.close()
