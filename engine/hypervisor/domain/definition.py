"""What a VM is built from, read back from its domain, and kept in etcd.

``vmdef/<uuid>`` holds the arguments of ``build`` that make the same VM
again on another host: size, image, kernel, networks (so the same derived
MACs), traits, cloud-init seed and HA policy.  It is what an HA restart
rebuilds from when the VM's host is dead and its libvirt unreachable.

Promises:
- :func:`definition_of` derives the arguments from the domain alone (its
  inactive XML and peerctl metadata), so a VM built before definitions were
  recorded gets one the first time it is asked for (``set_ha``);
- :func:`record_definition` writes only what changed: recording the same
  VM again writes nothing (a first build writes it with the VM's record,
  in one transaction: :func:`engine.hypervisor.host.vm.build`).
"""
from __future__ import annotations

import time
import xml.etree.ElementTree as ET

import libvirt

from engine.core import keys
from engine.hypervisor.domain import shapes  # noqa: F401  (declares vmdef/)
from engine.hypervisor.domain.domain_xml import read_metadata

__all__ = ["definition_of", "definition_record", "record_definition", "seed_metadata",
           "seed_from_metadata"]

_ACCEL = {"kvm": "kvm", "qemu": "tcg"}


def seed_metadata(seed_args: dict) -> str:
    """The seed's inputs as kept in the domain's metadata (JSON)."""
    import base64
    import json
    return json.dumps({"hostname": seed_args["hostname"],
                       "user_data": base64.b64encode(seed_args["user_data"] or b"").decode(),
                       "ssh_keys": seed_args["ssh_keys"]}, sort_keys=True)


def seed_from_metadata(text: str | None) -> dict | None:
    """The seed's inputs back from the metadata; None when the VM has none."""
    import base64
    import json

    from engine.errors import RequestError
    from engine.hypervisor.domain import seed
    if not text:
        return None
    try:
        value = json.loads(text)
        value["user_data"] = base64.b64decode(value.get("user_data") or "") or None
    except (ValueError, TypeError, AttributeError):
        raise RequestError("the VM's seed metadata is unreadable") from None
    return seed.check_seed_args(value)


def definition_of(dom) -> dict:
    """``build``'s arguments for the same VM (without ``ha``: the policy is
    the record's, see ``vms/``)."""
    root = ET.fromstring(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    meta = read_metadata(dom)
    _state, max_kib, _mem, vcpus, _cpu = dom.info()
    build = {"uuid": dom.UUIDString(), "name": dom.name(), "vcpus": vcpus,
             "memory_mb": max_kib // 1024, "disk_gb": meta.get("disk_gb", 0),
             "image": meta.get("image") or None}
    for field in ("kernel", "initrd", "cmdline"):
        text = root.findtext(f"./os/{field}")
        if text:
            build[field] = text
    accel = _ACCEL.get(root.get("type") or "")
    if accel:
        build["accel"] = accel
    if meta.get("required"):
        build["required"] = meta["required"]
    networks = [n for n in (meta.get("networks") or "").split(",") if n]
    if networks:
        build["networks"] = networks
    if meta.get("macs"):
        build["macs"] = meta["macs"]        # an adopted VM's own MACs
    seed_args = seed_from_metadata(meta.get("seed"))
    if seed_args:
        build["seed"] = seed_args
    return build


def definition_record(dom) -> dict:
    """What ``vmdef/<uuid>`` holds for ``dom`` (:func:`record_definition`
    writes it; a caller may write it in a transaction of its own)."""
    build = definition_of(dom)
    return {"uuid": build["uuid"], "name": build["name"], "build": build,
            "time": time.time()}


def record_definition(store, dom) -> dict:
    """``vmdef/<uuid>`` for ``dom``, written unless it holds that already."""
    from engine.core.values import readable
    value = definition_record(dom)
    key = keys.vm_definition(value["uuid"])
    known = readable(store.get(key))
    if known is not None and known["build"] == value["build"]:
        return known
    store.put(key, value)
    return value
