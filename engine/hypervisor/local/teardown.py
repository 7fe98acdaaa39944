"""Taking the embedded KVM hosts of ``up --libvirt qemu`` down: what
``down`` does once the peers and etcd are stopped, so that nothing ``up``
started is left running.

In this order:
- the guests, unless kept: an ACPI shutdown each, all at once (a paused
  guest is resumed first, or it could not hear it); those still running
  after ``guest_timeout`` seconds are powered off.  A daemon that no longer
  runs while its guests do is started again for them (and stopped below);
  if it cannot be, their QEMU gets SIGTERM;
- the guests' network (:mod:`engine.hypervisor.local.localnet`) once no guest
  runs: its dnsmasq outlives libvirtd otherwise, and keeps the namespace;
- each daemon's libvirtd, then its virtlogd (kept while a guest it logs
  runs: the guest's console goes through it);
- the network namespaces, when ``up`` made them and nothing runs in them
  any more: a rack's hosts' (with their guest bridges), then its switch,
  which is kept while a host's is.

Promises:
- every process is stopped by a PID read from a record or from libvirt's
  own PID and status files, after checking the PID still runs what was
  recorded (a command line, a QEMU, a dnsmasq in the namespace); nothing is
  stopped by name;
- one entry per thing, ``{name, role, pid, what}``: role ``guest``,
  ``dnsmasq``, ``libvirtd``, ``virtlogd`` or ``netns``; what ``shut down``,
  ``powered off``, ``stopped``, ``killed``, ``kept``, ``not running`` or
  (the namespace) ``deleted`` or ``not there``;
- killed at any point, running it again finishes the work (failpoint
  ``down_guests``: just after the guests were asked to shut down).
"""
from __future__ import annotations

import time

from engine.core import failpoints
from engine.hypervisor.local.daemons import (PrivateLibvirtd, delete_netns, netns_exists, netns_pids,
                                       cmdline, terminate)
from engine.hypervisor.local.rack import Rack

__all__ = ["take_down", "GUEST_TIMEOUT"]

GUEST_TIMEOUT = 30.0        # seconds a guest has to shut down before it is powered off
_NOTE_EVERY = 5.0           # a progress line this often while guests shut down
_SETTLE = 5.0               # seconds a stopped process may take to leave the namespace


def take_down(records: list[dict], netns: dict, *, keep_guests: bool = False,
              guest_timeout: float = GUEST_TIMEOUT, say=lambda message: None) -> list[dict]:
    """Stop what the daemons of ``records`` (``up.json``'s ``daemons``) run,
    then them, then the namespace ``netns`` (``up.json``'s, updated with
    ``deleted``); the entries, in that order.  ``say`` gets progress lines."""
    daemons = [(record["host"], PrivateLibvirtd.from_record(record)) for record in records]
    if keep_guests:
        entries = [_entry(f"{host}/{name}", "guest", pid, "kept")
                   for host, daemon in daemons for name, pid in sorted(daemon.guest_pids().items())]
    else:
        entries = _shut_down_guests(daemons, guest_timeout, say)
    guests_left = any(daemon.guest_pids() for _, daemon in daemons)
    entries += _stop_network(daemons, keep=guests_left)
    if any(daemon.running() for _, daemon in daemons):
        say(f"stopping {len(daemons)} libvirtd")
    for record, (host, daemon) in zip(records, daemons):
        pids = {"libvirtd": daemon.record()["pid"] or record.get("pid"),
                "virtlogd": daemon.record()["virtlogd"]["pid"]
                or (record.get("virtlogd") or {}).get("pid")}
        outcome = daemon.stop()
        for what in ("libvirtd", "virtlogd"):
            entries.append(_entry(f"{host}/{what}", what, pids[what], outcome[what]))
    if netns.get("created") and netns.get("name"):
        settle = 0.0 if guests_left else _SETTLE
        rack = Rack.from_record(netns)
        hosts = [{"name": rack.netns(host)} for host in rack.hosts]
        for host in hosts:              # a rack's machines, then its switch
            entries.append(_delete_namespace(host, settle))
        if all(host["deleted"] for host in hosts):
            entries.append(_delete_namespace(netns, settle))
        else:
            netns["deleted"] = False
            entries.append(_entry(f"netns {netns['name']}", "netns", None, "kept",
                                  inside=[h["name"] for h in hosts if not h["deleted"]]))
    return entries


def _entry(name: str, role: str, pid, what: str, **more) -> dict:
    return {"name": name, "role": role, "pid": pid, "what": what, **more}


# -- guests -------------------------------------------------------------------------

def _shut_down_guests(daemons: list, timeout: float, say) -> list[dict]:
    """An ACPI shutdown for every running guest, powered off after ``timeout``."""
    import libvirt
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)     # raised, not printed
    entries, waiting, conns = [], [], []
    for host, daemon in daemons:
        pids = daemon.guest_pids()
        if not pids:
            continue
        conn = _connect(daemon, say)
        if conn is None:        # no libvirt to ask: QEMU's own clean exit on SIGTERM
            for name, pid in sorted(pids.items()):
                what = terminate(pid, _still(daemon, name, pid), timeout)
                entries.append(_entry(f"{host}/{name}", "guest", pid,
                                      "shut down" if what == "stopped" else "powered off"))
            continue
        conns.append(conn)
        for name, pid in sorted(pids.items()):
            try:
                dom = conn.lookupByName(name)
                if dom.state()[0] == libvirt.VIR_DOMAIN_PAUSED:
                    dom.resume()
                dom.shutdown()
            except libvirt.libvirtError:
                pass            # not listening, or gone: powered off below if it still runs
            waiting.append((host, daemon, conn, name, pid))
    try:
        if waiting:
            say(f"shutting down {len(waiting)} guest{'s' if len(waiting) != 1 else ''} "
                f"({', '.join(f'{h}/{n}' for h, _, _, n, _ in waiting)}): ACPI, powered off "
                f"after {timeout:g} s (--guest-timeout)")
        failpoints.crash("down_guests")
        entries += _wait_or_power_off(waiting, timeout, say)
    finally:
        for conn in conns:
            try:
                conn.close()
            except Exception:
                pass
    return entries


def _connect(daemon: PrivateLibvirtd, say):
    """A connection to ``daemon``, started again if it stopped while its
    guests run; None when it cannot be had."""
    import libvirt

    from engine.errors import Failed
    if not daemon.running():
        if daemon.netns and not netns_exists(daemon.netns):
            return None
        say(f"starting {daemon.dir}'s libvirtd again: its guests still run")
        try:
            daemon.start()
        except Failed as exc:
            say(f"could not: {exc}".splitlines()[0])
            return None
    try:
        return libvirt.open(daemon.uri)
    except libvirt.libvirtError:
        return None


def _still(daemon: PrivateLibvirtd, name: str, pid: int):
    return lambda: daemon.guest_pids().get(name) == pid


def _wait_or_power_off(waiting: list, timeout: float, say) -> list[dict]:
    import libvirt
    entries = []
    started = time.monotonic()
    deadline, next_note = started + timeout, started + _NOTE_EVERY
    while True:
        for guest in list(waiting):
            host, daemon, _conn, name, pid = guest
            if not _still(daemon, name, pid)():
                entries.append(_entry(f"{host}/{name}", "guest", pid, "shut down"))
                waiting.remove(guest)
        now = time.monotonic()
        if not waiting or now >= deadline:
            break
        if now >= next_note:
            say(f"  {len(waiting)} still running after {now - started:.0f} s: "
                + ", ".join(f"{h}/{n}" for h, _, _, n, _ in waiting))
            next_note = now + _NOTE_EVERY
        time.sleep(0.2)
    if waiting:
        say(f"powering off {', '.join(f'{h}/{n}' for h, _, _, n, _ in waiting)}: "
            f"no shutdown within {timeout:g} s")
    for host, daemon, conn, name, pid in waiting:
        try:
            conn.lookupByName(name).destroy()
        except libvirt.libvirtError:
            terminate(pid, _still(daemon, name, pid), 5.0)
        entries.append(_entry(f"{host}/{name}", "guest", pid, "powered off"))
    return entries


# -- the guests' network and the namespace -----------------------------------------------

def _stop_network(daemons: list, keep: bool) -> list[dict]:
    """The network's dnsmasq (one, on the owning daemon): kept while guests
    run, else stopped through its daemon, or by PID when the daemon is gone."""
    from engine.hypervisor.local.localnet import stop_local_network
    found = [(host, daemon, daemon.dnsmasq_pid()) for host, daemon in daemons]
    found = [(host, daemon, pid) for host, daemon, pid in found if pid]
    if keep:
        return [_entry(f"{host}/dnsmasq", "dnsmasq", pid, "kept") for host, _, pid in found]
    stop_local_network([daemon.uri for _, daemon in daemons if daemon.running()])
    entries = []
    for host, daemon, pid in found:
        _, what = daemon.stop_dnsmasq()          # "not running": the network took it along
        entries.append(_entry(f"{host}/dnsmasq", "dnsmasq", pid,
                              "stopped" if what == "not running" else what))
    return entries


def _delete_namespace(netns: dict, settle: float) -> dict:
    """Delete the namespace if nothing runs in it (after ``settle`` seconds
    for what was stopped to be gone): its entry, saying what keeps it
    otherwise."""
    name = netns["name"]
    existed = netns_exists(name)
    netns["deleted"] = delete_netns(name, settle)
    if netns["deleted"]:
        return _entry(f"netns {name}", "netns", None, "deleted" if existed else "not there")
    inside = [f"{(cmdline(pid) or ['?'])[0].rsplit('/', 1)[-1]} pid {pid}"
              for pid in netns_pids(name)]
    return _entry(f"netns {name}", "netns", None, "kept", inside=inside)
