"""One side of a hand-over on ``test:///default``, as a process of its own
(the test driver's domains live in the process that made them).

    python tests/support/carry_worker.py build STATE_DIR CARRY_FILE
    python tests/support/carry_worker.py restore STATE_DIR CARRY_FILE [TIMES]
    python tests/support/carry_worker.py use STATE_DIR CARRY_FILE

- ``build``: host ``h1`` builds VMs as its peer would (:func:`engine.hypervisor.host.vm.build`,
  with their pool, volumes and networks): ``web`` (an image overlay, a
  seed, a network; rebooted with token ``t1``, so its live metadata
  differs from its definition) left running, ``db`` (a blank disk, a
  snapshot) paused, ``old`` (two snapshots) shut off; ``passing`` is a
  transient domain with peerctl metadata (a migration's arrival before it
  is persisted); the driver's own ``test`` is adopted (metadata written);
  then :func:`engine.hypervisor.host.carry.save`.  Prints ``{"saved": n,
  "uuids": {name: uuid}, "has": ...}``.
- ``restore``: :func:`engine.hypervisor.host.carry.restore` TIMES times (1),
  then prints ``{"restored": [n, ...], "error": text or None, "seconds": s,
  "has": ...}``;
  ``has`` is what the process has then, as ``build`` printed it.
- ``use``: restore once, then what the VMs' handlers make of them: ``web``
  rebooted again with token ``t1`` (found done), ``db`` resumed, ``old``
  started, ``web`` destroyed (its volumes found and deleted); prints each
  reply, and ``has``.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
import uuid as uuidlib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

import libvirt  # noqa: E402
import structlog  # noqa: E402

from engine.errors import Failed  # noqa: E402
from engine.hypervisor.host import carry, vm  # noqa: E402
from engine.hypervisor.domain.domain_xml import (NAMESPACE, disk_paths, read_metadata,  # noqa: E402
                                          read_reboot_token, write_metadata)
from engine.hypervisor.host.hostctx import HostContext  # noqa: E402
from engine.hypervisor.domain.networks import parse_offer  # noqa: E402
from engine.hypervisor.domain.records import vm_state  # noqa: E402

URI = "test:///default"
PASSING = "00000000-0000-4000-8000-00000000c0de"
SSH_KEY = ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB8B2XuR7aHq4Yy3ecAc8V1nPZ1b4pV0m9s3rXyq8nQ1 "
           "carry@test")


def host_of(state_dir: str) -> HostContext:
    return HostContext("h1", URI, None, state_dir, offer=parse_offer("default"))


def build(state_dir: str, path: str) -> dict:
    host = host_of(state_dir)
    image = os.path.join(state_dir, "images", "image.raw")   # the default image source
    os.makedirs(os.path.dirname(image), exist_ok=True)
    with open(image, "wb") as f:
        f.write(b"\0" * 4096)
    uuids = {name: str(uuidlib.uuid4()) for name in ("web", "db", "old")}
    vm.build(host, {"uuid": uuids["web"], "name": "web", "vcpus": 1, "memory_mb": 64,
                    "disk_gb": 1, "image": f"file://{image}", "networks": ["default"],
                    "seed": {"hostname": "web", "user_data": "#cloud-config\n",
                             "ssh_keys": [SSH_KEY]}, "ha": "restart"})
    vm.reboot(host, {"uuid": uuids["web"], "token": "t1"})
    vm.build(host, {"uuid": uuids["db"], "name": "db", "vcpus": 2, "memory_mb": 128,
                    "disk_gb": 2, "image": None})
    snapshot(host, uuids["db"], "before-upgrade")
    vm.suspend(host, {"uuid": uuids["db"]})
    vm.build(host, {"uuid": uuids["old"], "name": "old", "vcpus": 1, "memory_mb": 32,
                    "disk_gb": 1, "image": None})
    vm.stop(host, {"uuid": uuids["old"], "timeout": 5})
    snapshot(host, uuids["old"], "first")
    snapshot(host, uuids["old"], "second")
    host.conn.lookupByUUIDString(uuids["old"]).setAutostart(1)
    host.conn.createXML(
        f"<domain type='test'><name>passing</name><uuid>{PASSING}</uuid>"
        f"<metadata><peerctl:vm xmlns:peerctl='{NAMESPACE}'><peerctl:host>h1</peerctl:host>"
        "<peerctl:disk_gb>0</peerctl:disk_gb></peerctl:vm></metadata>"
        "<memory unit='MiB'>32</memory><os><type>hvm</type></os></domain>", 0)
    write_metadata(host.conn.lookupByName("test"), {"host": "h1", "disk_gb": 0})
    saved = carry.save(host.conn, path)
    return {"saved": saved, "uuids": {**uuids, "passing": PASSING}, "has": has(host.conn)}


def snapshot(host, uuid: str, name: str) -> None:
    """A snapshot as ``snapshots.create`` takes one on the test driver."""
    host.conn.lookupByUUIDString(uuid).snapshotCreateXML(
        f"<domainsnapshot><name>{name}</name><description>peerctl automation a-{name}"
        "</description></domainsnapshot>", 0)


def restore(state_dir: str, path: str, times: int) -> dict:
    conn = host_of(state_dir).conn
    restored, error = [], None
    began = time.monotonic()
    try:
        for _ in range(times):
            restored.append(carry.restore(conn, path))
    except Failed as exc:
        error = str(exc)
    return {"restored": restored, "error": error, "seconds": time.monotonic() - began,
            "has": has(conn)}


def use(state_dir: str, path: str) -> dict:
    host = host_of(state_dir)
    carry.restore(host.conn, path)
    uuids = {name: host.conn.lookupByName(name).UUIDString() for name in ("web", "db", "old")}
    return {"reboot": vm.reboot(host, {"uuid": uuids["web"], "token": "t1"}),
            "resume": vm.resume(host, {"uuid": uuids["db"]}),
            "start": vm.start(host, {"uuid": uuids["old"]}),
            "destroy": vm.destroy(host, {"uuid": uuids["web"]}),
            "has": has(host.conn)}


def has(conn) -> dict:
    """Everything the process's test driver holds, comparable across processes."""
    return {"domains": {dom.UUIDString(): domain(dom) for dom in conn.listAllDomains(0)},
            "pools": {pool.name(): {"active": bool(pool.isActive()),
                                    "autostart": bool(pool.autostart()),
                                    "volumes": sorted(v.name() for v in pool.listAllVolumes(0))}
                      for pool in conn.listAllStoragePools(0)},
            "networks": {net.name(): bool(net.isActive()) for net in conn.listAllNetworks(0)}}


def domain(dom) -> dict:
    secure = libvirt.VIR_DOMAIN_XML_SECURE
    persistent = bool(dom.isPersistent())
    return {"name": dom.name(), "state": vm_state(dom), "persistent": persistent,
            "autostart": persistent and bool(dom.autostart()),
            "metadata": read_metadata(dom), "reboot_token": read_reboot_token(dom),
            "disks": disk_paths(dom.XMLDesc(0)),
            "snapshots": sorted(s.getName() + ("*" if s.isCurrent() else "")
                                for s in dom.listAllSnapshots(0)),
            "config": dom.XMLDesc(secure | libvirt.VIR_DOMAIN_XML_INACTIVE)
            if persistent else None,
            # the live XML but for the domain id, which each run has its own
            "live": re.sub(r" id='\d+'", "", dom.XMLDesc(secure)) if dom.isActive() else None}


def main(argv: list[str]) -> int:
    # The handlers' log lines go to stderr: stdout is the JSON answer.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    command, state_dir, path = argv[:3]
    if command == "build":
        out = build(state_dir, path)
    elif command == "restore":
        out = restore(state_dir, path, int(argv[3]) if len(argv) > 3 else 1)
    elif command == "use":
        out = use(state_dir, path)
    else:
        sys.stderr.write(f"carry_worker: unknown command {command!r} (build, restore, use)\n")
        return 2
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
