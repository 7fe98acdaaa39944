"""The test driver's stand-in for a libvirtd that outlives the peer.

On a real hypervisor the domains live in libvirtd, and a peer replaced by
a new process (a hand-over to another release, :mod:`engine.releases`)
finds them as it left them.  On ``test:///default`` they live inside the
peer's own process and would die with it.  So the old process
:func:`save`\\ s the test driver's state to a file just before it hands
over, and the new one :func:`restore`\\ s it before it publishes anything.
Only ``test:///default`` needs this (:func:`carries`); any other URI has a
daemon of its own, or (a test driver file) is read afresh by every open.

What is carried: every storage pool (its definition, whether it runs, its
volumes' descriptions: the test driver keeps no content), every network,
and every domain: its persistent definition and, while it runs, its live
XML (so the peerctl ``<metadata>`` of both, a reboot token too), its state
(running, paused, shut off), autostart, and its snapshots (metadata only
on this driver).

Promises:
- :func:`save` replaces the file whole (a temporary file, then a rename),
  or leaves what was there: a half-written file is never read;
- :func:`restore` makes the saved state exist and deletes nothing: what
  exists already (the driver's own ``test`` domain, ``default-pool``,
  ``default`` network, or everything, on a second run) is brought to its
  saved state, never defined twice; what it cannot restore it says, in one
  :class:`~engine.errors.Failed`, after restoring all the rest;
- a missing or unreadable file is a :class:`~engine.errors.Failed` naming
  it; the file is its caller's to remove.
"""
from __future__ import annotations

import copy
import json
import os
import tempfile
import time
import xml.etree.ElementTree as ET

import libvirt

from engine.errors import Failed
from engine.hypervisor.domain.metadata_memo import forget_everywhere
from engine.hypervisor.domain.records import vm_state

__all__ = ["carries", "save", "restore", "FORMAT"]

FORMAT = 1          # the file's shape; a file of another is refused
ACTIVE = ("running", "paused")

# libvirt prints every error on stderr by default; ours become exceptions.
libvirt.registerErrorHandler(lambda _ctx, _err: None, None)


def carries(uri: str) -> bool:
    """Whether a peer on ``uri`` must carry its domains across a hand-over."""
    return uri.rstrip("/") == "test:///default"


# -- save --------------------------------------------------------------------

def save(conn, path: str) -> int:
    """Write the state of ``conn`` (test:///default) to ``path``; the number
    of domains saved."""
    try:
        state = {"format": FORMAT, "time": time.time(),
                 "pools": [_pool(pool) for pool in conn.listAllStoragePools(0)],
                 "networks": [_network(net) for net in conn.listAllNetworks(0)],
                 "domains": [d for d in map(_domain, conn.listAllDomains(0)) if d]}
    except libvirt.libvirtError as exc:
        raise Failed(f"cannot save the test driver's state: {exc.get_error_message()}") \
            from None
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".carry.")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(state, f)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        raise Failed(f"cannot write {path}: {exc.strerror or exc}") from None
    return len(state["domains"])


def _pool(pool) -> dict:
    persistent = bool(pool.isPersistent())
    active = bool(pool.isActive())
    return {"name": pool.name(), "persistent": persistent, "active": active,
            "autostart": persistent and bool(pool.autostart()),
            "xml": pool.XMLDesc(0),     # the test driver has no INACTIVE flag
            "volumes": [vol.XMLDesc(0) for vol in pool.listAllVolumes(0)] if active else []}


def _network(net) -> dict:
    persistent = bool(net.isPersistent())
    return {"name": net.name(), "persistent": persistent, "active": bool(net.isActive()),
            "autostart": persistent and bool(net.autostart()),
            "xml": net.XMLDesc(0)}      # the test driver has no INACTIVE flag


def _domain(dom) -> dict | None:
    """A domain as saved; None if it went away meanwhile (or is going: a
    transient domain that no longer runs)."""
    secure = libvirt.VIR_DOMAIN_XML_SECURE
    try:
        state = vm_state(dom)
        persistent = bool(dom.isPersistent())
        active = state in ACTIVE
        if not (persistent or active):
            return None
        snapshots = dom.listAllSnapshots(libvirt.VIR_DOMAIN_SNAPSHOT_LIST_TOPOLOGICAL)
        return {"uuid": dom.UUIDString(), "name": dom.name(),
                "state": state if active else "shutoff", "persistent": persistent,
                "autostart": persistent and bool(dom.autostart()),
                "config": dom.XMLDesc(secure | libvirt.VIR_DOMAIN_XML_INACTIVE)
                if persistent else None,
                "live": dom.XMLDesc(secure) if active else None,
                # parents first: a snapshot is redefined after its parent
                "snapshots": [{"name": s.getName(), "current": bool(s.isCurrent()),
                               "xml": s.getXMLDesc(libvirt.VIR_DOMAIN_SNAPSHOT_XML_SECURE)}
                              for s in snapshots]}
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return None
        raise


# -- restore -----------------------------------------------------------------

def restore(conn, path: str) -> int:
    """Bring ``conn`` (a fresh process's test:///default) to the state saved
    in ``path``; the number of saved domains now in their saved state."""
    state = _load(path)
    problems = []
    for saved in state["pools"]:
        _attempt(problems, f"pool {saved['name']}", _restore_pool, conn, saved)
    for saved in state["networks"]:
        _attempt(problems, f"network {saved['name']}", _restore_network, conn, saved)
    carried = sum(_attempt(problems, f"domain {saved['name']} ({saved['uuid']})",
                           _restore_domain, conn, saved) is not None
                  for saved in state["domains"])
    if problems:
        raise Failed(f"carried {carried} of {len(state['domains'])} domains from {path}; "
                     f"not restored: {'; '.join(problems)}",
                     result={"carried": carried, "problems": problems})
    return carried


def _load(path: str) -> dict:
    try:
        with open(path) as f:
            state = json.load(f)
    except FileNotFoundError:
        raise Failed(f"carry file {path} is missing: no domain carried") from None
    except (OSError, ValueError) as exc:
        raise Failed(f"carry file {path} is unreadable ({exc}): no domain carried") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT or not all(
            isinstance(state.get(kind), list) for kind in ("pools", "networks", "domains")):
        raise Failed(f"carry file {path} is not a carry file of format {FORMAT}: "
                     "no domain carried")
    return state


def _attempt(problems: list, what: str, fn, *args):
    """``fn(*args)``; on failure, None and one line in ``problems``."""
    try:
        return fn(*args)
    except libvirt.libvirtError as exc:
        problems.append(f"{what}: {exc.get_error_message()}")
    except (KeyError, TypeError, ValueError, ET.ParseError) as exc:
        problems.append(f"{what}: malformed entry ({exc})")
    return None


def _found(lookup, name: str, missing: int):
    try:
        return lookup(name)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == missing:
            return None
        raise


def _restore_pool(conn, saved: dict):
    pool = _found(conn.storagePoolLookupByName, saved["name"], libvirt.VIR_ERR_NO_STORAGE_POOL)
    if pool is None:
        pool = conn.storagePoolDefineXML(saved["xml"], 0) if saved["persistent"] \
            else conn.storagePoolCreateXML(saved["xml"], 0)
    if saved["active"] and not pool.isActive():
        pool.create(0)
    if saved["persistent"] and pool.isPersistent() and bool(pool.autostart()) != saved["autostart"]:
        pool.setAutostart(int(saved["autostart"]))
    if pool.isActive():
        known = {vol.name() for vol in pool.listAllVolumes(0)}
        for xml in saved["volumes"]:
            if ET.fromstring(xml).findtext("name") not in known:
                pool.createXML(xml, 0)
    return pool


def _restore_network(conn, saved: dict):
    net = _found(conn.networkLookupByName, saved["name"], libvirt.VIR_ERR_NO_NETWORK)
    if net is None:
        net = conn.networkDefineXML(saved["xml"]) if saved["persistent"] \
            else conn.networkCreateXML(saved["xml"])
    if saved["active"] and not net.isActive():
        net.create()
    if saved["persistent"] and net.isPersistent() and bool(net.autostart()) != saved["autostart"]:
        net.setAutostart(int(saved["autostart"]))
    return net


def _restore_domain(conn, saved: dict):
    """The domain of ``saved``, defined and in its saved state."""
    if not (saved["persistent"] or saved["state"] in ACTIVE):
        raise ValueError("a transient domain that does not run")
    dom = _found(conn.lookupByUUIDString, saved["uuid"], libvirt.VIR_ERR_NO_DOMAIN)
    ran = dom is not None and vm_state(dom) in ACTIVE
    if saved["persistent"]:
        # Defines it, or makes a transient one persistent, or sets its next
        # boot's definition: the same XML again changes nothing.
        dom = conn.defineXML(saved["config"])
    if saved["state"] in ACTIVE:
        if not ran:
            # The live XML, not the definition: a running domain's live
            # metadata (a reboot token) differs from its next boot's.
            dom = conn.createXML(saved["live"], 0)
        else:
            _live_metadata(dom, saved["live"])
        if saved["state"] == "paused" and vm_state(dom) == "running":
            dom.suspend()
        elif saved["state"] == "running" and vm_state(dom) == "paused":
            dom.resume()
    elif ran:
        dom.destroy()           # saved shut off: stopped, its definition kept
    if saved["persistent"] and bool(dom.autostart()) != saved["autostart"]:
        dom.setAutostart(int(saved["autostart"]))
    _restore_snapshots(dom, saved["snapshots"])
    return dom


def _live_metadata(dom, live: str) -> None:
    """The saved live ``<metadata>`` elements on a domain that already runs
    (the driver's own ``test``, adopted by peerctl; a second restore); one
    that is there already is left as it is."""
    metadata = ET.fromstring(live).find("metadata")
    for element in metadata if metadata is not None else ():
        if not element.tag.startswith("{"):
            continue            # libvirt keeps only namespaced metadata
        namespace = element.tag[1:].partition("}")[0]
        wanted = _bare(element, namespace)
        try:
            if _bare(ET.fromstring(dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, namespace,
                                                libvirt.VIR_DOMAIN_AFFECT_LIVE)),
                     namespace) == wanted:
                continue
        except libvirt.libvirtError as exc:
            if exc.get_error_code() != libvirt.VIR_ERR_NO_DOMAIN_METADATA:
                raise
        try:
            dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, wanted, "peerctl", namespace,
                            libvirt.VIR_DOMAIN_AFFECT_LIVE)
        finally:
            forget_everywhere(dom.UUIDString())


def _bare(element: ET.Element, namespace: str) -> str:
    """``element`` as text with ``namespace`` taken off its tags (libvirt
    puts them back in it itself) and no indentation: two of them compare."""
    element = copy.deepcopy(element)
    element.tail = None
    for node in element.iter():
        if node.tag.startswith(f"{{{namespace}}}"):
            node.tag = node.tag.partition("}")[2]
        for side in ("text", "tail"):       # libvirt's indentation, not content
            if not (getattr(node, side) or "").strip():
                setattr(node, side, None)
    return ET.tostring(element, encoding="unicode")


def _restore_snapshots(dom, snapshots: list) -> None:
    known = set(dom.snapshotListNames(0))
    for snapshot in snapshots:
        if snapshot["name"] in known:
            continue
        flags = libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_REDEFINE
        if snapshot["current"]:
            flags |= libvirt.VIR_DOMAIN_SNAPSHOT_CREATE_CURRENT
        dom.snapshotCreateXML(snapshot["xml"], flags)
