"""How every request on a host finds the VM it acts on, and the few rules
all of them share: the VM's uuid read from a request's arguments, the words
that name the VM in an error, one request at a time per VM on this peer,
and a libvirt error turned into a :class:`~engine.errors.RequestError`.

Promises: :func:`find_domain` never returns another peer's domain (on a
shared libvirtd) nor a foreign one; :func:`vm_lock` is one lock per
``(libvirt URI, uuid)`` for the life of the process."""
from __future__ import annotations

import threading
import uuid as uuidlib
from collections import defaultdict

import libvirt

from engine.errors import RequestError
from engine.hypervisor.domain.domain_xml import read_metadata

__all__ = ["find_domain", "require_domain", "vm_lock", "uuid_arg", "vm_label", "libvirt_call"]

_guard = threading.Lock()
_vm_locks: dict[tuple, threading.Lock] = defaultdict(threading.Lock)


def vm_lock(host, uuid: str) -> threading.Lock:
    """One request at a time per VM on this peer (the pool runs several)."""
    with _guard:
        return _vm_locks[(host.libvirt_uri, uuid)]


def uuid_arg(args: dict) -> str:
    """The request's ``uuid`` argument, in canonical form."""
    value = args.get("uuid")
    try:
        return str(uuidlib.UUID(str(value)))
    except (ValueError, TypeError):
        raise RequestError(f"bad uuid {value!r}") from None


def vm_label(args: dict, uuid: str) -> str:
    """How an error names the VM: by its name when the request gave one."""
    return f"VM {args['name']!r} ({uuid})" if args.get("name") else f"VM {uuid}"


def find_domain(host, uuid: str):
    """This host's libvirt domain ``uuid``, or None: how every request
    finds the VM it acts on.  Another peer's domain on a shared libvirtd
    counts as absent, and so does a foreign domain (no peerctl metadata:
    made by someone else, or let go by ``unmanage``): no request ever acts
    on one, except ``adopt``'s.  A libvirt error other than "no such
    domain" is raised as it is."""
    try:
        dom = host.conn.lookupByUUIDString(uuid)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return None
        raise
    return dom if read_metadata(dom).get("host") == host.host else None


def require_domain(host, args: dict):
    """``(uuid, domain)`` of the request's VM on this host, or a
    :class:`~engine.errors.RequestError` saying it is not here."""
    uuid = uuid_arg(args)
    dom = find_domain(host, uuid)
    if dom is None:
        raise RequestError(f"{vm_label(args, uuid)} is not on host {host.host}")
    return uuid, dom


def libvirt_call(what: str, fn, *fn_args):
    """``fn(*fn_args)``, a libvirt error raised as ``RequestError("what: ...")``."""
    try:
        return fn(*fn_args)
    except libvirt.libvirtError as exc:
        raise RequestError(f"{what}: {exc.get_error_message()}") from None
