"""Networks, addresses and the cloud-init seed on libvirt's test driver.

Handlers run in this process for what only libvirt shows (the domain XML,
the pool's volumes); real peers and the real command line for the rest:
placement by network, the addresses in ``vmlist``, and bad input refused
with one line before anything is written.
"""
from __future__ import annotations

import json
import socket
import struct
import uuid as uuidlib
import xml.etree.ElementTree as ET

import libvirt
import pytest

from engine.core import keys
from engine.errors import RequestError
from engine.hypervisor.storage import images
from engine.hypervisor.domain.domain_xml import SEED_DEV, read_metadata
from engine.hypervisor.domain.arp import arp_interfaces, connected_prefix, tap_devices
from engine.hypervisor.domain.networks import mac_for, network_trait, parse_offer
from engine.placement import open_placement
from tests.support import wait_for
from tests.support.handlers import call, new_host
from tests.support.vms import start

ED25519 = ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGgmb3+8B7OVaxYNxyNS0aQbwlTPOI3ZyUb0AGf0G9lL "
           "alice@laptop")


def vm_args(**overrides):
    args = {"uuid": str(uuidlib.uuid4()), "name": "vm-" + uuidlib.uuid4().hex[:8],
            "vcpus": 1, "memory_mb": 64, "disk_gb": 1, "image": None}
    args.update(overrides)
    return args


def interfaces(dom) -> list[tuple]:
    root = ET.fromstring(dom.XMLDesc(0))
    return [(i.get("type"), i.find("mac").get("address"),
             i.find("source").get(i.get("type"))) for i in root.findall("./devices/interface")]


@pytest.fixture
def lan_host(tmp_path):
    host = new_host(tmp_path / "state")
    host.offer = parse_offer("default, lan=br-lan")
    return host


# -- the domain ----------------------------------------------------------------

def test_one_interface_per_network_in_order_with_macs_from_the_uuid(lan_host):
    args = vm_args(networks=["lan", "default", "lan"])
    call(lan_host, "build", **args)
    dom = lan_host.conn.lookupByUUIDString(args["uuid"])
    assert interfaces(dom) == [("bridge", mac_for(args["uuid"], 0), "br-lan"),
                               ("network", mac_for(args["uuid"], 1), "default"),
                               ("bridge", mac_for(args["uuid"], 2), "br-lan")]
    assert read_metadata(dom)["networks"] == "lan,default,lan"
    # the same uuid and index give the same MAC; another index or VM another
    macs = {mac_for(args["uuid"], i) for i in range(3)} | {mac_for(str(uuidlib.uuid4()), 0)}
    assert len(macs) == 4 and all(int(m[:2], 16) & 0b11 == 0b10 for m in macs)
    # a rebuild of the same VM (same uuid) keeps them
    call(lan_host, "destroy", uuid=args["uuid"])
    call(lan_host, "build", **args)
    assert interfaces(lan_host.conn.lookupByUUIDString(args["uuid"])) == interfaces(dom)
    call(lan_host, "destroy", uuid=args["uuid"])


def test_a_network_the_host_does_not_offer_is_refused_and_nothing_is_built(lan_host):
    args = vm_args(networks=["default", "storage"])
    with pytest.raises(RequestError, match=f"host {lan_host.host} does not offer network "
                                           "storage"):
        call(lan_host, "build", **args)
    assert lan_host.conn.listAllDomains(0) == [] or all(
        d.UUIDString() != args["uuid"] for d in lan_host.conn.listAllDomains(0))
    assert images.volumes_of(images.ensure_pool(lan_host), args["uuid"]) == []


def test_the_seed_is_a_read_only_cdrom_made_with_the_disk_and_deleted_with_the_vm(lan_host):
    seed = {"hostname": "web-1", "user_data": b"#!/bin/sh\necho hi\n", "ssh_keys": [ED25519]}
    args = vm_args(networks=["default"], seed=seed)
    call(lan_host, "build", **args)
    dom = lan_host.conn.lookupByUUIDString(args["uuid"])
    root = ET.fromstring(dom.XMLDesc(0))
    cdrom = [d for d in root.findall("./devices/disk") if d.get("device") == "cdrom"]
    assert len(cdrom) == 1 and cdrom[0].find("target").get("dev") == SEED_DEV
    assert cdrom[0].find("readonly") is not None
    pool = images.ensure_pool(lan_host)
    assert sorted(v.name() for v in images.volumes_of(pool, args["uuid"])) == [
        f"{args['uuid']}-seed.iso", f"{args['uuid']}.qcow2"]
    assert cdrom[0].find("source").get("file") == \
        pool.storageVolLookupByName(f"{args['uuid']}-seed.iso").path()
    kept = json.loads(read_metadata(dom)["seed"])       # a move rebuilds it from this
    assert kept["hostname"] == "web-1" and kept["ssh_keys"] == [ED25519]
    call(lan_host, "destroy", uuid=args["uuid"])
    assert images.volumes_of(pool, args["uuid"]) == []


@pytest.mark.parametrize("seed, why", [
    ({"hostname": "-bad-", "user_data": None, "ssh_keys": []}, "hostname"),
    ({"hostname": "ok", "user_data": b"x" * (64 * 1024 + 1), "ssh_keys": []}, "user"),
    ({"hostname": "ok", "user_data": None, "ssh_keys": ["ssh-rsa AAAAnope"]}, "key"),
    ("a string", "seed")])
def test_a_bad_seed_in_a_request_is_one_line_and_builds_nothing(lan_host, seed, why):
    args = vm_args(seed=seed)
    with pytest.raises(RequestError) as raised:
        call(lan_host, "build", **args)
    assert why in str(raised.value).lower() and "\n" not in str(raised.value)
    assert images.volumes_of(images.ensure_pool(lan_host), args["uuid"]) == []


# -- the cluster ---------------------------------------------------------------

def start_hosts(cluster, store):
    """host1 and host2 offer the default network; host3 also offers lan."""
    start(cluster, store, ["host1", "host2"])
    start(cluster, store, ["host3"], env={"PEERCTL_NETWORKS": "default,lan=br-lan"})
    wait_for(lambda: network_trait("lan") in open_placement("etcd", store).provider(
        "host3")["traits"], what="host3's lan trait")


def test_vms_go_only_where_their_networks_are_and_list_their_addresses(cluster, store):
    start_hosts(cluster, store)
    hosts = {h["host"]: h for h in cluster.cli_json("hostlist")}
    assert hosts["host1"]["networks"] == ["default"]
    assert hosts["host3"]["networks"] == ["default", "lan"]

    doc = cluster.cli_json("boot", "a1", "a2", "a3", "--resources", "VCPU:1,MEMORY_MB:64",
                           "--network", "default", "--network", "lan", "--wait-ip",
                           "--ip-timeout", "60")
    assert {vm["host"] for vm in doc["vms"]} == {"host3"}
    assert all(vm["ip"] for vm in doc["vms"]), doc
    plain = cluster.cli_json("boot", "b1", "--resources", "VCPU:1,MEMORY_MB:64")
    assert plain["vms"][0]["state"] == "running"

    listed = {vm["name"]: vm for vm in cluster.cli_json("vmlist")}
    for name in ("a1", "a2", "a3"):
        vm = listed[name]
        assert [a["mac"] for a in vm["addresses"]] == [mac_for(vm["uuid"], 0),
                                                       mac_for(vm["uuid"], 1)]
        assert vm["ip"] == vm["addresses"][0]["addr"]
        assert set(vm["addresses"][0]) == {"interface", "mac", "addr", "prefix"}
    assert [a["mac"] for a in listed["b1"]["addresses"]] == [mac_for(listed["b1"]["uuid"], 0)]
    table = cluster.cli("vmlist", "a1")
    assert "IP" in table.stdout.splitlines()[0] and listed["a1"]["ip"] in table.stdout

    none = cluster.cli_json("boot", "c1", "--resources", "VCPU:1,MEMORY_MB:64",
                            "--network", "none")
    c1 = [vm for vm in cluster.cli_json("vmlist", "c1")][0]
    assert none["vms"][0]["state"] == "running" and c1["addresses"] == [] and c1["ip"] is None


def test_bad_input_is_one_line_exit_2_and_creates_nothing(cluster, store, tmp_path):
    start(cluster, store, ["host1"])
    big = tmp_path / "big"
    big.write_bytes(b"#cloud-config\n" + b"x" * (64 * 1024))
    key = tmp_path / "key.pub"
    key.write_text("ssh-ed25519 not-base64!! me\n")
    before, _ = store.range(keys.auto(""), keys_only=True)
    for flags, says in [
            (["--network", "storage"], "unknown network storage"),
            (["--network", "bad name"], "bad network name"),
            (["--user-data", str(tmp_path / "missing")], "--user-data"),
            (["--user-data", str(tmp_path)], "directory"),
            (["--user-data", str(big)], "at most 65536"),
            (["--ssh-key", str(key)], "line 1"),
            (["--hostname", "no_underscores"], "hostname")]:
        done = cluster.cli("boot", "x1", "--resources", "VCPU:1,MEMORY_MB:64", *flags)
        assert done.returncode == 2, (flags, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], (flags, done.stderr)
        assert "Traceback" not in done.stderr
    after, _ = store.range(keys.auto(""), keys_only=True)
    assert len(after) == len(before)
    assert cluster.cli_json("vmlist") == []


# -- moves ---------------------------------------------------------------------

def test_a_move_keeps_the_macs_and_rebuilds_the_seed_on_the_destination(tmp_path):
    """Source offers lan as a bridge, the destination as a libvirt network:
    the destination's XML has its own meaning of lan, the same MACs, and a
    seed of its own in its pool; the test driver's move is a re-definition."""
    source = new_host(tmp_path / "src")
    source.offer = parse_offer("default, lan=br-lan")
    dest = new_host(tmp_path / "dst")
    dest.offer = parse_offer("default, lan")
    seed = {"hostname": "mover", "user_data": b"#!/bin/sh\necho moved\n", "ssh_keys": [ED25519]}
    args = vm_args(networks=["lan", "default"], seed=seed)
    call(source, "build", **args)
    described = call(source, "move_describe", uuid=args["uuid"])
    gone = source.conn.lookupByUUIDString(args["uuid"])     # one hypervisor here:
    gone.destroy()                                          # the source's copy leaves
    gone.undefine()
    prepared = call(dest, "move_prepare", uuid=args["uuid"], describe=described)
    call(dest, "move_adopt", uuid=args["uuid"], xml=prepared["xml"], state="running")
    dom = dest.conn.lookupByUUIDString(args["uuid"])
    assert read_metadata(dom)["host"] == dest.host
    assert interfaces(dom) == [("network", mac_for(args["uuid"], 0), "lan"),
                               ("network", mac_for(args["uuid"], 1), "default")]
    pool = images.ensure_pool(dest)
    iso = pool.storageVolLookupByName(f"{args['uuid']}-seed.iso")
    root = ET.fromstring(dom.XMLDesc(0))
    assert [d.find("source").get("file") for d in root.findall("./devices/disk")
            if d.get("device") == "cdrom"] == [iso.path()]

    nowhere = new_host(tmp_path / "bare")
    nowhere.offer = parse_offer("default")
    with pytest.raises(RequestError, match="does not offer network lan"):
        call(nowhere, "move_prepare", uuid=args["uuid"], describe=described)
    call(dest, "destroy", uuid=args["uuid"])
    call(source, "destroy", uuid=args["uuid"])


def test_a_migrated_vm_keeps_its_macs_in_the_listing(cluster, store):
    start_hosts(cluster, store)
    cluster.cli_json("boot", "m1", "--resources", "VCPU:1,MEMORY_MB:64", "--on", "host1",
                     "--hostname", "m1")
    before = cluster.cli_json("vmlist", "m1")[0]
    doc = cluster.cli_json("migrate", "m1", "--to", "host2")
    assert doc["vms"][0]["host"] == "host2", doc
    after = wait_for(lambda: [vm for vm in cluster.cli_json("vmlist", "m1")
                              if vm["host"] == "host2" and vm["addresses"]],
                     what="m1's record on host2")[0]
    assert [a["mac"] for a in after["addresses"]] == [a["mac"] for a in before["addresses"]] \
        == [mac_for(before["uuid"], 0)]
    # lan is only on host3: a VM on lan can go nowhere else
    cluster.cli_json("boot", "m2", "--resources", "VCPU:1,MEMORY_MB:64", "--network", "lan")
    refused = cluster.cli("migrate", "m2")
    assert refused.returncode == 1 and "m2" in refused.stdout + refused.stderr
    assert cluster.cli_json("vmlist", "m2")[0]["host"] == "host3"


# -- addresses found by ARP ------------------------------------------------------

def arp_table(*rows) -> str:
    """``/proc/net/arp`` as the kernel writes it: ``(addr, flags, mac, device)``."""
    lines = ["IP address       HW type     Flags       HW address            Mask     Device"]
    lines += [f"{addr:<16} 0x1         {flags:<11} {mac:<21} *        {device}"
              for addr, flags, mac, device in rows]
    return "\n".join(lines) + "\n"


def route_table(*rows) -> str:
    """``/proc/net/route`` as the kernel writes it (addresses in the host's
    byte order): ``(device, destination, gateway, mask)``."""
    def word(addr):
        return "%08X" % struct.unpack("=I", socket.inet_aton(addr))[0]
    lines = ["Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT"]
    for device, destination, gateway, mask in rows:
        flags = 0x3 if gateway != "0.0.0.0" else 0x1
        lines.append(f"{device}\t{word(destination)}\t{word(gateway)}\t{flags:04X}\t0\t0\t0\t"
                     f"{word(mask)}\t0\t0\t0")
    return "\n".join(lines) + "\n"


def test_an_arp_entry_is_named_as_libvirt_names_the_interface_else_null():
    """The tap device of the domain's interface with that MAC (libvirt's
    <target dev>), or None: never a name made up from the MAC."""
    conn = libvirt.open("test:///default")
    try:
        taps = tap_devices(conn.lookupByName("test"))
    finally:
        conn.close()
    assert taps == {"aa:bb:cc:dd:ee:ff": "testnet0"}
    table = arp_table(("192.168.122.3", "0x2", "AA:BB:CC:DD:EE:FF", "virbr0"),
                      ("192.168.122.4", "0x2", "52:54:00:00:00:09", "virbr0"),
                      ("192.168.122.5", "0x0", "52:54:00:00:00:0a", "virbr0"))  # incomplete
    assert arp_interfaces(table, taps) == [
        ("testnet0", {"hwaddr": "aa:bb:cc:dd:ee:ff",
                      "addrs": [{"addr": "192.168.122.3", "prefix": None}]}),
        (None, {"hwaddr": "52:54:00:00:00:09",
                "addrs": [{"addr": "192.168.122.4", "prefix": None}]})]


def test_an_arp_address_gets_the_prefix_of_its_connected_route_else_null():
    routes = route_table(("eth0", "0.0.0.0", "192.0.2.1", "0.0.0.0"),       # default: no
                         ("eth0", "192.0.2.0", "0.0.0.0", "255.255.255.0"),
                         ("virbr0", "192.168.0.0", "0.0.0.0", "255.255.0.0"),
                         ("virbr1", "192.168.122.0", "0.0.0.0", "255.255.255.0"),
                         ("eth0", "10.9.0.0", "192.0.2.1", "255.255.0.0"))   # via a gateway
    assert connected_prefix(routes, "192.168.122.3") == 24     # the longest that holds it
    assert connected_prefix(routes, "192.168.7.7") == 16
    assert connected_prefix(routes, "192.0.2.77") == 24
    assert connected_prefix(routes, "10.9.0.5") is None
    assert connected_prefix(routes, "203.0.113.9") is None
    assert connected_prefix(open("/proc/net/route").read(), "203.0.113.9") is None


def test_null_interface_and_prefix_are_listed_as_null_and_bad_entries_dropped(cluster, store):
    """An address whose interface libvirt does not name, or whose prefix
    nobody knows, is listed with null; a wrong type still costs its entry."""
    vm_uuid = str(uuidlib.uuid4())
    found = {"interface": None, "mac": "52:54:00:00:00:09", "addr": "192.168.122.4",
             "prefix": None}
    named = {"interface": "vnet0", "mac": "52:54:00:00:00:0a", "addr": "192.168.122.5",
             "prefix": 24}
    store.put(keys.vm("host1", vm_uuid), {
        "host": "host1", "name": "arp1", "uuid": vm_uuid, "state": "running",
        "addresses": [found, {**named, "prefix": "24"}, {**named, "interface": 5},
                      {k: v for k, v in named.items() if k != "prefix"}, named]})
    (vm,) = cluster.cli_json("vmlist")
    assert vm["addresses"] == [found, named] and vm["ip"] == "192.168.122.4"
    table = cluster.cli("vmlist", "-o", "name,addresses")
    assert table.stdout.splitlines()[1].split() == ["arp1", "192.168.122.4",
                                                    "192.168.122.5/24"]
