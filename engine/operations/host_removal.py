"""Taking a host out of the cluster for good (``host remove``, docs/deploy.md).

:func:`plan_removal` reads what the host leaves behind, writing nothing:
its VMs (which must be moved first: ``evacuate``), every key named after
it, its placement provider and the allocations on it, its etcd user, and
what was stored there for other VMs (backups, replicas, disks kept aside);
:func:`refuse_what_blocks` refuses, in one line and before any write, a
host with VMs (unless they are to be evacuated first) or in a host lease.
:func:`remove_host` then removes it, in an order a crash cannot spoil:

0. the host is drained (nothing new lands there) and its VMs looked for
   again;
1. the tombstone ``removed/<host>`` (``engine/core/removed.py``), state
   ``removing``: from here on the host's peer cannot register, and a peer
   serving now stops and exits;
2. it waits until no lease holds ``hosts/<host>`` (the peer left);
3. its etcd user goes (``peer-<host>``, which ``tls roles`` made);
4. what was stored there is marked lost, never dropped: a backup record
   keeps ``lost``, a replication loses its replica (its next update makes
   one elsewhere) and keeps ``lost``;
5. the allocations on its provider, then the provider;
6. one transaction deletes every key named after the host and turns the
   tombstone to ``removed``.

Every step is idempotent and the tombstone says the removal is unfinished,
so a removal cut short anywhere (a SIGKILL, etcd away) is finished by
running it again; nothing is orphaned: the host is listed (down) until the
last step, which removes its records all at once.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.core import keys
from engine.core.failpoints import crash
from engine.core.store import Delete, Put, absent
from engine.errors import Failed, NoSuch, PermissionDenied, Refused

from .admit import unredeemed
from .specs import check_name


__all__ = ["Removal", "plan_removal", "refuse_what_blocks", "remove_host", "dry_run",
           "PEER_LEAVES"]

PEER_LEAVES = 60.0      # how long a serving peer has to stop once fenced (its
                        # running requests finish first, up to 30 s)

# Every key named after a host, besides hosts/ and hostcfg/: single keys,
# then prefixes holding one key per VM or automation (deleted as prefixes:
# one transaction, however many).  vms/<host>/ is listed, never deleted
# here: a VM's record goes only with the VM (docs/keyspace.md), and a host
# with VMs is refused.
_SINGLE = (keys.drained, keys.reserved, keys.recovery)
_PREFIXES = (keys.member, keys.inbox, keys.disowned, keys.foreign, keys.own_volumes, keys.aside)


@dataclass
class Removal:
    """What removing ``host`` acts on, as read (a dry run shows it)."""
    host: str
    alive: bool                         # a lease holds hosts/<host>: its peer serves
    vms: list[dict]                     # vmlist's rows of the VMs on it
    keys: list[str]                     # the keys named after it
    provider: dict | None               # its placement provider {uuid, name}
    allocations: list[str]              # consumers holding resources on that provider
    user: str | None                    # its etcd user, when etcd has one
    leases: list[str]                   # host leases not ended that name it
    kept: list[dict] = field(default_factory=list)     # stored there for others
    tombstone: dict | None = None       # a removal begun before

    @property
    def removed(self) -> list[str]:
        """Everything the removal deletes, one line each (the JSON's ``removed``):
        not its VMs' records and allocations, which their moves carry away."""
        moving = {vm["uuid"] for vm in self.vms}
        found = [key for key in self.keys if not key.startswith(keys.vm(self.host))]
        found += [f"placement/allocation/{c}" for c in self.allocations if c not in moving]
        if self.provider:
            found.append(f"placement/provider/{self.provider['name']} ({self.provider['uuid']})")
        if self.user:
            found.append(f"etcd user {self.user}")
        return found

    @property
    def done(self) -> bool:
        """Nothing left: removed before (its tombstone says so)."""
        return (self.tombstone is not None and self.tombstone.get("state") == "removed"
                and not self.keys and not self.provider and not self.user and not self.vms)


def plan_removal(ctx, host: str) -> Removal:
    """What removing ``host`` would do, read now; :class:`NoSuch` when the
    cluster never had it."""
    check_name(host, "host name")
    store = ctx.store()
    from engine.cluster import read_vms
    from engine.core import removed as removal
    from engine.core.credentials import peer_user
    from engine.core.hosts import is_live_record
    found: list[str] = []
    live = store.get(keys.host(host))
    for key in (keys.host(host), keys.host_config(host), *(f(host) for f in _SINGLE)):
        if store.get(key) is not None:
            found.append(key)
    for prefix in (keys.vm, *_PREFIXES):    # each spelled with its trailing /
        found += [kv.key for kv in store.range(prefix(host), keys_only=True)[0]]
    found += unredeemed(store, host)
    provider, allocations = _provider(ctx, host)
    try:
        user = peer_user(host) if store.auth_user_delete(peer_user(host), dry_run=True) else None
    except PermissionDenied as exc:
        raise PermissionDenied(f"host remove deletes {host}'s etcd user {peer_user(host)}: "
                               f"that needs etcd's root ({exc})", exc.role) from None
    tombstone = removal.read(store, host)
    if not found and provider is None and user is None and tombstone is None:
        raise NoSuch(f"no host {host!r} in cluster {store.cluster}", result=_doc(host, "failed"))
    from engine.natural import natural_key
    vms = sorted((vm for vm in read_vms(store) if vm["host"] == host),
                 key=lambda vm: natural_key(vm["name"]))
    from engine.leases.model import LIVE_STATES
    from engine.leases.records import all_leases
    leases = [lease["lease"] for lease in all_leases(store)
              if lease.get("state") in LIVE_STATES and host in (lease.get("hosts") or [])]
    return Removal(host, live is not None and is_live_record(live), vms, sorted(found),
                   provider, allocations, user, leases, _stored_there(store, host), tombstone)


def _provider(ctx, host: str) -> tuple[dict | None, list[str]]:
    from engine.errors import NotFound
    with ctx.placement() as placement:
        try:
            provider = placement.provider(host)
        except NotFound:
            return None, []
        held = [doc["consumer"] for doc in placement.all_allocations()
                if provider["uuid"] in (doc.get("allocations") or {})]
    return {"uuid": provider["uuid"], "name": provider["name"]}, held


def _stored_there(store, host: str) -> list[dict]:
    """Backups, replicas and disks kept aside that live on ``host``: what its
    removal loses (``state`` lost), one row each."""
    from engine.backups import records, replicas
    from engine.core.values import readable
    kept = [{"kind": "backup", "id": b["id"], "vm": b.get("vm"), "uuid": b.get("uuid"),
             "state": "lost", "why": f"stored on {host}: the record is kept, marked lost"}
            for b in records.recorded(store) if b.get("target") == host]
    for record in replicas.read_all(store):
        replica, lost = record.get("replica") or {}, record.get("lost") or {}
        # lost: marked so by an attempt that this one finishes
        if host in (replica.get("host"), lost.get("host")):
            kept.append({"kind": "replica", "id": record["uuid"], "vm": record.get("vm"),
                         "uuid": record["uuid"], "state": "lost",
                         "why": f"stored on {host}: the next update makes a new one elsewhere"})
    for kv in store.range(keys.aside(host))[0]:
        aside = readable(kv) or {}
        kept.append({"kind": "aside", "id": keys.suffix(kv.key, keys.aside(host)),
                     "vm": aside.get("name"), "uuid": aside.get("uuid"), "state": "lost",
                     "why": f"disks kept aside on {host}: gone with it"})
    return kept


def refuse_what_blocks(removal: Removal, evacuate: bool) -> None:
    """One line, nothing written: VMs there without ``evacuate``; a host
    lease holding it."""
    host = removal.host
    if removal.vms and not evacuate:
        names = ", ".join(vm["name"] for vm in removal.vms[:3])
        more = f" and {len(removal.vms) - 3} more" if len(removal.vms) > 3 else ""
        raise Refused(f"host {host} has {len(removal.vms)} VM"
                      f"{'s' if len(removal.vms) != 1 else ''} ({names}{more}): move them "
                      f"first, or remove it with --evacuate", result=_doc(host, "failed"))
    if removal.leases or keys.reserved(host) in removal.keys:
        named = f" {removal.leases[0]}" if removal.leases else ""
        raise Refused(f"host {host} is in host lease{named} (pending or active): delete the "
                      f"lease first (lease delete{named})", result=_doc(host, "failed"))


def remove_host(ctx, host: str, *, by: str, leave_within: float = PEER_LEAVES,
                moved: list | None = None, automation: str | None = None) -> dict:
    """Remove ``host`` (steps 1 to 6 above); the document ``{host,
    automation, state, moved, removed, kept}``.  Its VMs must be gone
    (``Refused`` otherwise, before anything is written)."""
    removal = plan_removal(ctx, host)
    if removal.done:
        return _doc(host, "done", moved, [], removal.tombstone.get("kept") or [], automation)
    refuse_what_blocks(removal, evacuate=False)
    store = ctx.store()
    if removal.tombstone is None or removal.tombstone.get("state") != "removing":
        # nothing new lands there while it goes; then look again for VMs
        _drain(ctx, host, by)
        removal = plan_removal(ctx, host)
        refuse_what_blocks(removal, evacuate=False)
    _fence(store, removal, by)
    crash("host remove fenced")
    _wait_peer_left(store, host, leave_within)
    removal = plan_removal(ctx, host)           # as it is now the peer is gone
    refuse_what_blocks(removal, evacuate=False)
    if removal.user:
        store.auth_user_delete(removal.user)
    _mark_lost(store, host, removal.kept)
    _drop_provider(ctx, removal)
    crash("host remove provider")
    kept = removal.kept
    singles = [keys.host(host), keys.host_config(host), *(f(host) for f in _SINGLE)]
    done = store.txn([absent(keys.host(host))] if keys.host(host) not in removal.keys else [],
                     [*(Delete(key) for key in singles),
                      *(Delete(key) for key in unredeemed(store, host)),
                      *(Delete(prefix(host), prefix=True) for prefix in _PREFIXES),
                      Put(keys.removed(host), {**removal.tombstone, "state": "removed",
                                                "finished": time.time(), "kept": kept})])
    if not done.succeeded:
        raise Failed(f"host {host} registered again while being removed: run host remove "
                     f"{host} again", result=_doc(host, "failed"))
    return _doc(host, "done", moved, removal.removed, kept, automation)


def _drain(ctx, host: str, by: str) -> None:
    from engine.placement.drains import set_drained
    with ctx.placement() as placement:
        set_drained(ctx.store(), [host], True, by=by, placement=placement)


def _fence(store, removal: Removal, by: str) -> None:
    """The tombstone, state ``removing`` (its first time kept on a rerun)."""
    record = removal.tombstone if removal.tombstone and \
        removal.tombstone.get("state") == "removing" else None
    record = record or {"host": removal.host, "state": "removing", "time": time.time(),
                        "by": by}
    store.put(keys.removed(removal.host), record)
    removal.tombstone = record


def _wait_peer_left(store, host: str, within: float) -> None:
    """Until no lease holds ``hosts/<host>`` (a fenced peer gives its lease
    back as it exits; a dead one's lapses within its TTL)."""
    from engine.core.hosts import is_live_record
    deadline = time.monotonic() + within
    while True:
        kv = store.get(keys.host(host))
        if kv is None or not is_live_record(kv):
            return
        if time.monotonic() >= deadline:
            raise Failed(f"{host}'s peer still serves after {within:.0f} s (hosts/{host} is "
                         f"held by its lease): stop it, then run host remove {host} again; "
                         f"it cannot register any more", result=_doc(host, "failed"))
        time.sleep(0.2)


def _mark_lost(store, host: str, kept: list[dict]) -> None:
    """Backups and replicas stored on ``host`` say so in their records."""
    from engine.backups import records, replicas
    lost = {"host": host, "time": time.time(), "why": f"host {host} was removed"}
    for row in kept:
        if row["kind"] == "backup":
            records.mark_lost(store, row["id"], lost)
        elif row["kind"] == "replica":
            def forget(record, lost=lost):
                if record is None or (record.get("replica") or {}).get("host") != host:
                    return None, None, [], []
                return None, {**record, "replica": None,
                              "lost": {**lost, "seq": record["replica"].get("seq")}}, [], []
            replicas.change(store, row["id"], forget)


def _drop_provider(ctx, removal: Removal) -> None:
    """The allocations on the host's provider, then the provider."""
    if removal.provider is None:
        return
    from engine.errors import NotFound
    from engine.placement.model import Conflict
    uuid = removal.provider["uuid"]
    with ctx.placement() as placement:
        for consumer in removal.allocations:
            for _ in range(10):
                doc = placement.allocations(consumer)
                rest = {rp: amounts for rp, amounts in (doc.get("allocations") or {}).items()
                        if rp != uuid}
                try:
                    if len(rest) == len(doc.get("allocations") or {}):
                        break
                    if rest:
                        placement.claim(consumer, rest, project=doc["project"], user=doc["user"],
                                        consumer_type=doc.get("consumer_type") or "INSTANCE",
                                        consumer_generation=doc["generation"])
                    else:
                        placement.release(consumer)
                    break
                except Conflict:
                    continue
        try:
            placement.delete_provider(uuid)
        except NotFound:
            pass


def _doc(host: str, state: str, moved=None, removed=None, kept=None,
         automation: str | None = None) -> dict:
    return {"host": host, "automation": automation, "state": state, "moved": moved or [],
            "removed": removed or [], "kept": kept or []}


def dry_run(removal: Removal, moving: list[dict]) -> dict:
    """A dry run's document: what would move, be removed and be kept."""
    return _doc(removal.host, "dry-run", moving, removal.removed, removal.kept)
