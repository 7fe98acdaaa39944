"""The VM lifecycle on one host: build, start, stop, reboot, suspend, resume,
destroy, disown, set_ha and vm_info, through libvirt-python only.  ``requests/vm.py``
registers each as the request of the same name.

Every one is idempotent by VM uuid: run again with the same args it
finds what the first run did and carries on from there (a build that died
after defining its domain starts it; a destroy of a VM already gone still
sweeps the pool for its volumes).  ``reboot`` is the one that cannot
tell by itself: a ``reboot`` that carries a ``token`` records it on the
running domain (live metadata), and the same token again finds the reboot
done.  Without a token, twice is two reboots.

Arguments (all of them): ``uuid`` (required), ``name`` (for messages).
``build`` adds ``name``, ``vcpus``, ``memory_mb``, ``disk_gb``, ``image``
(http(s)/file URL or None) and optionally ``kernel``, ``initrd``,
``cmdline`` (direct kernel boot from files on the host), ``accel``
(``kvm`` or ``tcg``; default KVM when /dev/kvm exists) and ``required``
(the traits the VM was placed with, kept in its metadata so that a move
honours them), ``networks`` (names of networks this host offers, one
interface each, MACs derived from the uuid) and ``seed`` (``{hostname,
user_data, ssh_keys}``: a cloud-init NoCloud seed, built here as a
read-only CD-ROM volume ``<uuid>-seed.iso`` and kept in the domain's
metadata so that a move rebuilds it), ``ha`` (``restart`` or ``none``, the
default), ``recovered`` (``{from, time}``: an HA restart, see
docs/ha.md), ``restored`` (``{backup, time}``: a VM rebuilt from a backup)
and ``disk_ready`` (its disk ``<uuid>.qcow2`` is in the pool already, made
by ``restore_disks``: used as it is).  Before it replies, ``build`` records the VM's definition
(``vmdef/<uuid>``, :mod:`engine.hypervisor.domain.definition`) and writes its
``vms/<host>/<uuid>`` record (:func:`engine.hypervisor.host.vmpublish.publish_domain`),
so a finished boot is listed.  ``set_ha`` changes the policy later.
``stop`` takes an optional ``timeout`` in seconds for the ACPI shutdown
before it destroys.
"""
from __future__ import annotations

import math
import os
import re
import time
import xml.etree.ElementTree as ET

import libvirt
import structlog

from engine.backups import replicas
from engine.core import failpoints, keys
from engine.core.store import Put
from engine.core.values import readable
from engine.errors import RequestError
from engine.hypervisor.storage import images
from engine.hypervisor.domain import seed
from engine.hypervisor.domain.definition import (definition_record, record_definition,
                                          seed_from_metadata, seed_metadata)
from engine.hypervisor.domain.networks import mac_for
from engine.hypervisor.domain.shapes import HA_POLICIES
from engine.hypervisor.domain.records import vm_record, vm_state
from engine.hypervisor.host.vmpublish import forget, publish_domain, publish_new
from engine.hypervisor.host.vm_home import leave
from engine.hypervisor.domain.lookup import (
    find_domain, libvirt_call, require_domain, uuid_arg, vm_label, vm_lock)
from engine.hypervisor.domain.domain_xml import (ACCELERATORS, DomainSpec, domain_type, domain_xml,
                                        read_metadata, read_reboot_token,
                                        record_reboot_token, write_metadata)

__all__ = ["build", "start", "stop", "reboot", "suspend", "resume", "destroy", "disown",
           "vm_info", "set_ha", "ha_start", "console_log_path", "seed_from_metadata",
           "find_domain", "DEFAULT_STOP_TIMEOUT"]

log = structlog.get_logger("peerctl.vm")

DEFAULT_STOP_TIMEOUT = 60.0
MAX_INTERFACES = 8
SEED_SUFFIX = "-seed.iso"

def console_log_path(host, uuid: str) -> str:
    return os.path.join(os.path.abspath(host.state_dir), "console", f"{uuid}.log")


# -- arguments ---------------------------------------------------------------

def _positive_int(args: dict, key: str, minimum: int = 1) -> int:
    value = args.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise RequestError(f"{key} must be an integer >= {minimum}, got {value!r}")
    return value


def _seconds(args: dict, key: str, default: float) -> float:
    """A finite number of seconds >= 0 (``default`` when absent)."""
    value = args.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value) or value < 0:
        raise RequestError(f"{key} must be a number of seconds >= 0, got {value!r}")
    return float(value)


def _host_file(args: dict, key: str) -> str | None:
    value = args.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not os.path.isabs(value) or not os.path.isfile(value):
        raise RequestError(f"{key} {value!r}: not an absolute path to a file on this host")
    return value


def _reply(uuid: str, dom) -> dict:
    return {"uuid": uuid, "state": vm_state(dom)}


# -- build -------------------------------------------------------------------

def build(host, args: dict) -> dict:
    uuid = uuid_arg(args)
    name = args.get("name")
    if not isinstance(name, str) or not name or len(name) > 64 or "/" in name:
        raise RequestError(f"bad VM name {name!r} (1-64 characters, no '/')")
    vcpus = _positive_int(args, "vcpus")
    memory_mb = _positive_int(args, "memory_mb", 16)
    disk_gb = _positive_int(args, "disk_gb", 0)
    image = args.get("image")
    if image is not None and not isinstance(image, str):
        raise RequestError(f"image must be a URL, got {image!r}")
    kernel, initrd = _host_file(args, "kernel"), _host_file(args, "initrd")
    cmdline = args.get("cmdline")
    if initrd and not kernel:
        raise RequestError("initrd given without kernel")
    if cmdline is not None and (not isinstance(cmdline, str) or not kernel):
        raise RequestError("cmdline must be a string and needs a kernel")
    required = args.get("required")
    if required is not None and (not isinstance(required, str) or len(required) > 1000):
        raise RequestError(f"required must be a trait list like 'HW_CPU_X86_AVX2,CUSTOM_SSD', "
                           f"got {required!r}")
    accel = args.get("accel")
    if accel is not None and accel not in ACCELERATORS:
        raise RequestError(f"accel must be one of {', '.join(ACCELERATORS)}, got {accel!r}")
    nets = _networks(host, args)
    seed_args = seed.check_seed_args(args.get("seed"))
    marks = {"ha": ha_arg(args), **_recovered(args), **_restored(args), **_macs(args)}
    disk_ready = bool(args.get("disk_ready"))

    with vm_lock(host, uuid):
        dom = find_domain(host, uuid)
        defined = dom is None
        if defined:
            dom = _define(host, uuid, name, vcpus, memory_mb, disk_gb, image,
                          kernel, initrd, cmdline, accel, required, nets, seed_args, marks,
                          disk_ready)
        if vm_state(dom) in ("shutoff", "building"):
            libvirt_call(f"cannot start {vm_label(args, uuid)}", dom.create)
            log.info("vm_started", vm=name, uuid=uuid)
        if host.store is not None:
            # What it was built from, for an HA restart elsewhere; then,
            # before replying, its record: when boot reports done, vms/
            # already shows the VM (a pattern or vmlist right after sees it).
            if not (defined and _record_new(host, dom)):
                record_definition(host.store, dom)
                publish_domain(host.store, host.host, dom, want="running")
        return {"uuid": uuid, "name": dom.name(), "host": host.host, "state": vm_state(dom)}


def _record_new(host, dom) -> bool:
    """A VM this build defined: its definition and its ``vms/`` record in
    one transaction that holds only while neither key exists (the usual
    case: nobody has written them).  False, writing nothing, otherwise (a
    rebuild, an HA restart, the publisher got there first): then each is
    written the usual way, read and compared first."""
    return publish_new(host.store, host.host, dom, "running",
                       {keys.vm_definition(dom.UUIDString()): definition_record(dom)})


def ha_arg(args: dict) -> str | None:
    """The ``ha`` argument: ``restart`` is kept in the metadata, ``none``
    (the default) is the absence of it."""
    value = args.get("ha", "none")
    if value is None:
        value = "none"
    if value not in HA_POLICIES:
        raise RequestError(f"ha must be one of {', '.join(HA_POLICIES)}, got {value!r}")
    return None if value == "none" else value


_MAC = re.compile(r"[0-9a-f]{2}(:[0-9a-f]{2}){5}\Z")


def _macs(args: dict) -> dict:
    """``macs``: an adopted VM's own MACs (comma-separated), kept in its
    metadata so that a rebuild gives its interfaces the same ones."""
    value = args.get("macs")
    if value is None:
        return {}
    if not isinstance(value, str) or not all(_MAC.match(m) for m in value.split(",")):
        raise RequestError(f"macs must be MAC addresses separated by commas, got {value!r}")
    return {"macs": value}


def _recovered(args: dict) -> dict:
    """``recovered: {from, time, data_as_of?}``: an HA restart of a VM
    whose host died (``data_as_of``: the time of the replica it restarted
    from); the domain's metadata says so for as long as it lives."""
    value = args.get("recovered")
    if value is None:
        return {}
    if not isinstance(value, dict) or not isinstance(value.get("from"), str) \
            or not isinstance(value.get("time"), (int, float)):
        raise RequestError(f"recovered must be {{from: HOST, time: SECONDS}}, got {value!r}")
    as_of = value.get("data_as_of")
    if as_of is not None and not isinstance(as_of, (int, float)):
        raise RequestError(f"recovered's data_as_of must be seconds, got {as_of!r}")
    return {"recovered_from": value["from"], "recovered_at": repr(float(value["time"])),
            **({"recovered_data_as_of": repr(float(as_of))} if as_of is not None else {})}


def _restored(args: dict) -> dict:
    """``restored: {backup, time}``: a VM rebuilt from a backup (whose data
    dates from ``time``); the domain's metadata says so for as long as it
    lives."""
    value = args.get("restored")
    if value is None:
        return {}
    if not isinstance(value, dict) or not isinstance(value.get("backup"), str) \
            or not isinstance(value.get("time"), (int, float)):
        raise RequestError(f"restored must be {{backup: ID, time: SECONDS}}, got {value!r}")
    return {"restored_from": value["backup"], "restored_at": repr(float(value["time"]))}


def _networks(host, args: dict) -> list[str]:
    """The ``networks`` argument: names this host offers."""
    names = args.get("networks") or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names) \
            or len(names) > MAX_INTERFACES:
        raise RequestError(f"networks must be a list of at most {MAX_INTERFACES} names, "
                           f"got {names!r}")
    return offered_here(host, names)


def offered_here(host, names: list[str]) -> list[str]:
    """``names``, if this host offers every one of those networks."""
    missing = sorted(set(names) - set(host.offer))
    if missing:
        raise RequestError(f"host {host.host} does not offer network"
                           f"{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    return names


def make_seed(host, pool, uuid: str, seed_args: dict, networks: list[str]):
    """Volume ``<uuid>-seed.iso`` holding the NoCloud seed; its path."""
    macs = [mac_for(uuid, index) for index in range(len(networks))]
    iso = seed.build_iso(seed.seed_files(uuid, seed_args["hostname"], seed_args["user_data"],
                                         seed_args["ssh_keys"], macs))
    return images.ensure_seed(host, pool, f"{uuid}{SEED_SUFFIX}", iso).path()


def _define(host, uuid, name, vcpus, memory_mb, disk_gb, image, kernel, initrd, cmdline,
            accel, required=None, nets=(), seed_args=None, marks=None, disk_ready=False):
    conn = host.conn
    try:
        other = conn.lookupByName(name)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN:
            raise
    else:
        raise RequestError(f"host {host.host} already has a VM named {name!r} "
                           f"(uuid {other.UUIDString()})")

    try:
        dtype = domain_type(conn.getType(), accel)
    except ValueError as exc:
        raise RequestError(str(exc)) from None
    pool = images.ensure_pool(host)
    disk_path = None
    try:
        if disk_ready:          # made by restore_disks: the VM's disk, as restored
            disk = images.lookup(pool, f"{uuid}.qcow2")
            if disk is None:
                raise RequestError(f"VM {name!r}: its restored disk {uuid}.qcow2 is not in "
                                   f"the pool of {host.host}")
            disk_path = disk.path()
        elif image:
            base, base_format = images.ensure_base(host, pool, image)
            disk = images.ensure_overlay(host, pool, f"{uuid}.qcow2", base, base_format,
                                         disk_gb)
            disk_path = disk.path()
        elif disk_gb:
            disk_path = images.ensure_blank(pool, f"{uuid}.qcow2", disk_gb).path()
        seed_file = make_seed(host, pool, uuid, seed_args, list(nets)) if seed_args else None
        failpoints.crash("build seeded")
        console = console_log_path(host, uuid)
        os.makedirs(os.path.dirname(console), exist_ok=True)
        spec = DomainSpec(uuid=uuid, name=name, vcpus=vcpus, memory_mb=memory_mb,
                          disk_gb=disk_gb, domain_type=dtype,
                          disk_path=disk_path, image=image, kernel=kernel,
                          initrd=initrd, cmdline=cmdline, console_log=console,
                          owner=host.host, networks=tuple(nets), offer=host.offer,
                          seed_path=seed_file,
                          extra_metadata={**({"required": required} if required else {}),
                                          **({"seed": seed_metadata(seed_args)}
                                             if seed_args else {}),
                                          **{k: v for k, v in (marks or {}).items() if v}})
        dom = libvirt_call(f"cannot define VM {name!r}", conn.defineXML, domain_xml(spec))
    except BaseException:
        # Nothing refers to this VM's volumes yet: take them back.
        images.delete_volumes(pool, uuid)
        raise
    log.info("vm_defined", vm=name, uuid=uuid, image=image, disk=disk_path)
    return dom


# -- lifecycle ---------------------------------------------------------------

def start(host, args: dict) -> dict:
    uuid, dom = require_domain(host, args)
    with vm_lock(host, uuid):
        state = vm_state(dom)
        if state == "paused":
            libvirt_call(f"cannot resume {vm_label(args, uuid)}", dom.resume)
        elif state in ("shutoff", "error", "building"):
            _amend_old_disks(host, dom)
            libvirt_call(f"cannot start {vm_label(args, uuid)}", dom.create)
        _want(host, dom, "running")
        return _reply(uuid, dom)


def _amend_old_disks(host, dom) -> None:
    """qcow2 version 2 disks (peerctl's before backups) made version 3, so
    that they can carry checkpoints: safe only now, the VM shut off."""
    if host.conn.getType().upper() == "TEST":
        return
    from engine.hypervisor.storage import qcow2
    from engine.hypervisor.domain.disks import disks_of
    for disk in disks_of(host.conn, ET.fromstring(dom.XMLDesc(0))):
        if disk["format"] == "qcow2" and \
                qcow2.version(host.conn.storageVolLookupByPath(disk["path"])) == "0.10":
            qcow2.amend_to_v3(disk["path"])
            log.info("disk_amended", vm=dom.name(), disk=disk["dev"], compat="1.1")


def _want(host, dom, want: str) -> None:
    """Record in the VM's ``vms/`` record the state this request leaves it
    in (``want``): a VM down though its ``want`` is up has crashed.  A stop
    records it before it acts, a start once it has: either way a look at
    the VM in between never takes a wanted stop for a crash."""
    if host.store is not None:
        publish_domain(host.store, host.host, dom, want=want, create=False)


def stop(host, args: dict) -> dict:
    """ACPI shutdown; the guest gets ``timeout`` seconds, then is destroyed."""
    uuid, dom = require_domain(host, args)
    timeout = _seconds(args, "timeout", DEFAULT_STOP_TIMEOUT)
    with vm_lock(host, uuid):
        _want(host, dom, "shutoff")
        if vm_state(dom) == "shutoff":
            return {**_reply(uuid, dom), "forced": False}
        if vm_state(dom) == "paused":
            libvirt_call(f"cannot resume {vm_label(args, uuid)}", dom.resume)
        try:
            dom.shutdown()
        except libvirt.libvirtError as exc:
            log.info("vm_acpi_shutdown_refused", uuid=uuid, error=exc.get_error_message())
        deadline = time.monotonic() + timeout
        while vm_state(dom) != "shutoff" and time.monotonic() < deadline:
            time.sleep(0.2)
        forced = vm_state(dom) != "shutoff"
        if forced:
            log.info("vm_stop_forced", uuid=uuid, timeout=timeout)
            _destroy_domain(dom)
        return {**_reply(uuid, dom), "forced": forced}


def reboot(host, args: dict) -> dict:
    uuid, dom = require_domain(host, args)
    token = args.get("token")
    if token is not None and (not isinstance(token, str) or not token):
        raise RequestError(f"bad reboot token {token!r}")
    with vm_lock(host, uuid):
        state = vm_state(dom)
        if token and state == "running" and read_reboot_token(dom) == token:
            return {**_reply(uuid, dom), "rebooted": False}     # done by an earlier run
        if state == "running":
            libvirt_call(f"cannot reboot {vm_label(args, uuid)}", dom.reboot, 0)
        elif state == "paused":
            libvirt_call(f"cannot reset {vm_label(args, uuid)}", dom.reset, 0)
            libvirt_call(f"cannot resume {vm_label(args, uuid)}", dom.resume)
        else:
            libvirt_call(f"cannot start {vm_label(args, uuid)}", dom.create)
        if token:
            # After the reboot, not before: a crash in between reboots twice
            # on a retry, which is better than not at all.
            libvirt_call(f"cannot record the reboot of {vm_label(args, uuid)}",
                          record_reboot_token, dom, token)
        _want(host, dom, "running")
        return {**_reply(uuid, dom), "rebooted": True}


def _pause_or_resume(host, args: dict, verb: str, before: str, after: str) -> dict:
    """``verb`` a VM that is ``before``; one already ``after`` is left as it is."""
    uuid, dom = require_domain(host, args)
    with vm_lock(host, uuid):
        state = vm_state(dom)
        if state == before:
            libvirt_call(f"cannot {verb} {vm_label(args, uuid)}", getattr(dom, verb))
        elif state != after:
            raise RequestError(f"cannot {verb} {vm_label(args, uuid)}: it is {state}")
        _want(host, dom, after)
        return _reply(uuid, dom)


def suspend(host, args: dict) -> dict:
    return _pause_or_resume(host, args, "suspend", "running", "paused")


def resume(host, args: dict) -> dict:
    return _pause_or_resume(host, args, "resume", "paused", "running")


def _destroy_domain(dom) -> None:
    try:
        dom.destroy()
    except libvirt.libvirtError as exc:
        if exc.get_error_code() not in (libvirt.VIR_ERR_OPERATION_INVALID,
                                        libvirt.VIR_ERR_NO_DOMAIN):
            raise RequestError(f"cannot destroy VM {dom.name()!r}: "
                               f"{exc.get_error_message()}") from None


def power_off_and_undefine(dom, label: str) -> None:
    """Power ``dom`` off if it runs and undefine it (a domain already gone
    is fine); its volumes stay.  The caller holds the VM's lock."""
    if dom.isActive():
        _destroy_domain(dom)
    flags = (libvirt.VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
             | libvirt.VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
             | libvirt.VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA     # backups' checkpoints
             | libvirt.VIR_DOMAIN_UNDEFINE_NVRAM)
    try:
        dom.undefineFlags(flags)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            pass
        elif exc.get_error_code() in (libvirt.VIR_ERR_NO_SUPPORT,
                                      libvirt.VIR_ERR_INVALID_ARG):
            libvirt_call(f"cannot undefine {label}", dom.undefine)
        else:
            raise RequestError(f"cannot undefine {label}: {exc.get_error_message()}") \
                from None
    log.info("vm_undefined", uuid=dom.UUIDString())


def destroy(host, args: dict) -> dict:
    """Power off, undefine, delete the VM's volumes and console log, then
    its ``vms/`` record here.  A VM already gone is fine: its leftovers are
    swept all the same."""
    uuid = uuid_arg(args)
    with vm_lock(host, uuid):
        dom = find_domain(host, uuid)
        if dom is not None:
            power_off_and_undefine(dom, vm_label(args, uuid))
        deleted = images.delete_volumes(images.ensure_pool(host), uuid)
        deleted += _delete_own_volumes(host, uuid)
        try:
            os.unlink(console_log_path(host, uuid))
        except FileNotFoundError:
            pass
        if host.store is not None:
            forget(host.store, host.host, uuid)
            host.store.delete(keys.snapshot(uuid, ""), prefix=True)    # gone with its disks
            replicas.vm_destroyed(host.store, uuid)     # its replica goes now, not next update
        return {"uuid": uuid, "state": "destroyed", "volumes_deleted": deleted}


def _delete_own_volumes(host, uuid: str) -> list[str]:
    """Delete the volumes ``ownvols/<host>/<uuid>`` names (an adopted VM's
    disks, under the names they had), then that record; their paths."""
    if host.store is None:
        return []
    key = keys.own_volumes(host.host, uuid)
    kv = host.store.get(key)
    record = readable(kv) if kv is not None else None       # shape OWN_VOLUMES: paths a list
    deleted = []
    for path in record["paths"] if record is not None else []:
        if not isinstance(path, str):
            continue
        try:
            host.conn.storageVolLookupByPath(path).delete(0)
            deleted.append(path)
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_STORAGE_VOL:
                raise RequestError(f"cannot delete volume {path}: "
                                   f"{exc.get_error_message()}") from None
    if kv is not None:
        host.store.delete(key)
    return deleted


def disown(host, args: dict) -> dict:
    """Record that VM ``uuid`` must not stay on host ``args['host']``.

    Sent by ``boot`` after a build there failed or was lost, before it
    takes an alternate: that host's peer destroys any copy it holds, now or
    whenever it comes back (its libvirtd may have outlived it), and the
    reconciler drops the copy's ``vms/`` record while the host is dead.
    With ``keep`` (an HA restart elsewhere) that host keeps the copy's disks
    aside instead of deleting them: they may hold data someone needs.
    Runs anywhere (it only writes etcd); a put, so running it twice is once.
    That host's ``vms/`` record of the VM goes in the same transaction (the
    VM is no longer there for the cluster), unless a move or an HA restart
    carries the VM: its record is then that automation's to settle
    (:mod:`engine.hypervisor.host.vm_home`).
    """
    uuid = uuid_arg(args)
    target = args.get("host")
    if not isinstance(target, str) or not target:
        raise RequestError(f"disown needs the host the VM must leave, got {target!r}")
    mark = Put(keys.disowned(target, uuid),
               {"uuid": uuid, "host": target, "automation": args.get("automation"),
                "reason": args.get("reason"), "time": time.time(),
                **({"keep": True} if args.get("keep") else {})})
    leave(host.store, target, uuid, [mark])
    return {"uuid": uuid, "host": target}


def set_ha(host, args: dict) -> dict:
    """``{uuid, ha}``: the VM's HA policy, in its domain's metadata (which
    the guard reads when it fences, see :mod:`engine.hypervisor.ha.guard`) and
    its record; the VM's definition is recorded if it was not, so that it
    can be rebuilt elsewhere.  Setting what is already set is a no-op."""
    uuid, dom = require_domain(host, args)
    policy = ha_arg(args)
    with vm_lock(host, uuid):
        if host.store is not None:
            # Before the policy: an HA VM always has a definition to restart from.
            if host.store.get(keys.vm_definition(uuid)) is None:
                record_definition(host.store, dom)
        if read_metadata(dom).get("ha") != policy:
            libvirt_call(f"cannot set the HA policy of {vm_label(args, uuid)}",
                          write_metadata, dom, {"ha": policy})
        if host.store is not None:
            publish_domain(host.store, host.host, dom, create=False)
        return {"uuid": uuid, "name": dom.name(), "host": host.host,
                "ha": policy or "none"}


def ha_start(host, args: dict) -> dict:
    """Start again, in place, an HA VM found down or missing here (the
    ``ha_restart`` automation, under the VM's lock).  ``{uuid, state,
    restarted, why?}``: ``state: absent`` when this host has no such domain
    (the automation then rebuilds it elsewhere); a VM running again, or
    stopped on purpose meanwhile (its record's ``want`` is ``shutoff``), is
    left as it is."""
    uuid = uuid_arg(args)
    with vm_lock(host, uuid):
        dom = find_domain(host, uuid)
        if dom is None:
            return {"uuid": uuid, "state": "absent", "restarted": False}
        state = vm_state(dom)
        if state in ("running", "paused"):
            return {"uuid": uuid, "state": state, "restarted": False, "why": f"{state} already"}
        record = host.store.get(keys.vm(host.host, uuid)) if host.store is not None else None
        if record is not None and isinstance(record.value, dict) \
                and record.value.get("want") == "shutoff":
            return {"uuid": uuid, "state": state, "restarted": False,
                    "why": "stopped on purpose"}
        libvirt_call(f"cannot start {vm_label(args, uuid)}", dom.create)
        log.warning("vm_restarted_in_place", vm=dom.name(), uuid=uuid)
        _want(host, dom, "running")
        return {"uuid": uuid, "state": vm_state(dom), "restarted": True}


def vm_info(host, args: dict) -> dict:
    """The VM's record as ``vmlist`` shows it; ``state: absent`` when the
    host has no such VM."""
    uuid = uuid_arg(args)
    dom = find_domain(host, uuid)
    if dom is None:
        return {"uuid": uuid, "host": host.host, "state": "absent"}
    return vm_record(host.host, dom)
