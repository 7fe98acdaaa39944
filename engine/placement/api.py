"""The placement interface both backends implement.

A provider is referred to by uuid or by name (``ref``).  Every method that
writes either writes all it was asked to or nothing:

- bad input raises :class:`PlacementError` (``NotFound`` for an unknown
  provider), before anything is written;
- a lost race raises :class:`Conflict` with ``reason`` ``concurrent_update``
  (retry at once) or ``capacity_exceeded`` (take an alternate candidate).

Claims replace the consumer's allocations, like ``PUT /allocations/{uuid}``;
claiming again what the consumer already holds changes nothing and succeeds,
so a claim whose reply was lost can simply be repeated.
"""
from __future__ import annotations

import abc
import uuid as uuidlib

from engine.placement.model import (DISABLED_TRAIT, Conflict, NotFound, PlacementError,
                                    check_uuid, consumer_doc, normalize_allocations)

__all__ = ["Placement", "ANY", "subtree"]


class _Any:
    def __repr__(self):
        return "ANY"


ANY = _Any()    # "whatever the consumer generation is now"


class Placement(abc.ABC):
    backend = "?"
    retries = 10        # Placement's allocation_conflict_retry_count
    # Writes lost to a concurrent writer and retried or reported (a count kept
    # per instance, for tests and the bench: proof that a race really raced).
    races_lost = 0

    # -- providers -----------------------------------------------------------

    def ensure_provider(self, name: str, *, uuid: str | None = None,
                        parent: str | None = None) -> dict:
        """The provider called ``name``, created (with ``uuid``) if missing;
        the name and uuid are checked here, once for every backend."""
        if not isinstance(name, str) or not name or len(name) > 200 or "/" in name:
            raise PlacementError(f"bad provider name {name!r}")
        uuid = check_uuid(uuid, "provider uuid") if uuid else None
        return self._ensure_provider(name, uuid, parent)

    @abc.abstractmethod
    def _ensure_provider(self, name: str, uuid: str | None, parent: str | None) -> dict:
        """``ensure_provider`` once its arguments are checked."""

    @abc.abstractmethod
    def provider(self, ref: str) -> dict:
        """One provider with inventories, usages, traits, aggregates."""

    @abc.abstractmethod
    def providers(self, name_glob: str | None = None) -> list[dict]:
        """Providers whose name matches the shell glob, sorted by name."""

    @abc.abstractmethod
    def delete_provider(self, ref: str) -> None:
        """Delete a provider without children or allocations."""

    @abc.abstractmethod
    def ensure_resource_class(self, name: str) -> None:
        """Create the CUSTOM_ resource class ``name`` if missing."""

    @abc.abstractmethod
    def set_inventory(self, ref: str, inventories: dict, *,
                      generation: int | None = None) -> dict:
        """Replace the provider's inventories: ``{RC: total | {total, reserved,
        min_unit, max_unit, step_size, allocation_ratio}}``."""

    @abc.abstractmethod
    def set_traits(self, ref: str, traits, *, generation: int | None = None) -> dict:
        """Replace the provider's traits (CUSTOM_ traits are created)."""

    @abc.abstractmethod
    def set_aggregates(self, ref: str, aggregates, *,
                       generation: int | None = None) -> dict:
        """Replace the provider's aggregate uuids."""

    # -- allocations -----------------------------------------------------------

    @abc.abstractmethod
    def candidates(self, query, *, required: str | None = None,
                   limit: int | None = None) -> list[dict]:
        """``[{allocations, host, root, mappings, weight}]``, least loaded first;
        the first is the pick, the rest its alternates."""

    def claim(self, consumer: str, allocations: dict, *, project: str, user: str,
              consumer_type: str = "INSTANCE", consumer_generation=ANY) -> dict:
        """Set the consumer's allocations ``{rp_uuid: {RC: n}}`` in one step.
        Checked here, once for every backend: the consumer uuid, the
        allocations' shape and amounts, at least one allocation (else
        ``release``), the owner fields; then the backend writes."""
        consumer = check_uuid(consumer, "consumer")
        allocations = normalize_allocations(allocations)
        if not allocations:
            raise PlacementError("a claim needs at least one allocation (use release)")
        want = consumer_doc(consumer, allocations, project, user, consumer_type)
        return self._claim(consumer, want, consumer_generation)

    @abc.abstractmethod
    def _claim(self, consumer: str, want: dict, consumer_generation) -> dict:
        """Write ``want`` (a checked consumer document) for ``consumer`` if
        its generation is ``consumer_generation`` (ANY: whatever it is)."""

    @abc.abstractmethod
    def allocations(self, consumer: str) -> dict:
        """``{consumer, generation, project, user, consumer_type, allocations}``;
        allocations are empty (generation None) for an unknown consumer."""

    @abc.abstractmethod
    def all_allocations(self) -> list[dict]:
        """Every consumer holding allocations, sorted by consumer uuid."""

    @abc.abstractmethod
    def release(self, consumer: str) -> None:
        """Drop the consumer's allocations (nothing to do when it has none)."""

    @abc.abstractmethod
    def _write_consumers(self, want: dict, expect: dict) -> dict:
        """Give every consumer in ``want`` its document (``consumer_doc``;
        empty allocations drop the consumer) in one atomic write.  ``expect``:
        consumer -> its generation now, None for 'must not exist'.  Returns
        the new documents by consumer."""

    def move_to_migration(self, instance: str, migration: str,
                          destination: dict) -> dict:
        """Atomically: the instance's allocations move to consumer ``migration``
        and the instance is claimed on ``destination``.  Returns the
        instance's new allocations document.  Repeating a move that is done
        changes nothing."""
        instance = check_uuid(instance, "instance consumer")
        migration = check_uuid(migration, "migration consumer")
        if instance == migration:
            raise PlacementError("migration consumer must differ from the instance")
        destination = normalize_allocations(destination)
        if not destination:
            raise PlacementError("move_to_migration needs destination allocations")
        for _ in range(self.retries):
            inst, mig = self.allocations(instance), self.allocations(migration)
            if mig["allocations"]:
                if inst["allocations"] == destination:
                    return inst                         # done already (a retry)
                raise PlacementError(f"migration {migration} already holds allocations")
            if not inst["allocations"]:
                raise NotFound(f"instance {instance} holds no allocations to move")
            want = {
                migration: consumer_doc(migration, inst["allocations"], inst["project"],
                                        inst["user"], "MIGRATION"),
                instance: consumer_doc(instance, destination, inst["project"],
                                       inst["user"], inst["consumer_type"])}
            try:
                return self._write_consumers(want, {migration: None,
                                                    instance: inst["generation"]})[instance]
            except Conflict as exc:
                if exc.reason != "concurrent_update":
                    raise
        raise Conflict("concurrent_update", f"instance {instance} kept changing")

    def take(self, holder: str, instance: str, provider: str, amounts: dict, *,
             project: str, user: str) -> dict:
        """Atomically: ``amounts`` ``{RC: n}`` on ``provider`` pass from
        consumer ``holder`` (a reservation) to ``instance`` (which held
        nothing).  Refused with ``Conflict("capacity_exceeded")`` when the
        holder holds less there.  Returns the instance's document.
        Repeating a take that is done changes nothing."""
        holder = check_uuid(holder, "holder consumer")
        instance = check_uuid(instance, "instance consumer")
        provider = self._resolve(provider)
        wanted = normalize_allocations({provider: amounts})
        if holder == instance or not wanted:
            raise PlacementError("take needs two consumers and some amounts")
        for _ in range(self.retries):
            held, inst = self.allocations(holder), self.allocations(instance)
            if inst["allocations"]:
                if inst["allocations"] == wanted:
                    return inst                         # done already (a retry)
                raise PlacementError(f"consumer {instance} already holds allocations")
            there = held["allocations"].get(provider, {})
            if any(there.get(rc, 0) < n for rc, n in wanted[provider].items()):
                raise Conflict("capacity_exceeded",
                               f"consumer {holder} holds too little on {provider}")
            left = {rc: there[rc] - wanted[provider].get(rc, 0) for rc in there}
            left = {rc: n for rc, n in left.items() if n > 0}
            rest = {rp: res for rp, res in held["allocations"].items() if rp != provider}
            if left:
                rest[provider] = left
            want = {holder: consumer_doc(holder, rest, held["project"], held["user"],
                                         held["consumer_type"]) if rest
                    else dict(held, allocations={}),
                    instance: consumer_doc(instance, wanted, project, user, "INSTANCE")}
            try:
                return self._write_consumers(want, {holder: held["generation"],
                                                    instance: None})[instance]
            except Conflict as exc:
                if exc.reason != "concurrent_update":
                    raise
        raise Conflict("concurrent_update", f"consumer {holder} kept changing")

    def give_back(self, instance: str, holder: str) -> dict | None:
        """The reverse of :meth:`take`: ``instance``'s allocations join
        ``holder``'s in one write (the holder must still hold something,
        else the instance's are simply released).  Idempotent."""
        holder = check_uuid(holder, "holder consumer")
        instance = check_uuid(instance, "instance consumer")
        for _ in range(self.retries):
            held, inst = self.allocations(holder), self.allocations(instance)
            if not inst["allocations"]:
                return held
            if not held["allocations"]:
                self.release(instance)
                return None
            merged = {rp: dict(res) for rp, res in held["allocations"].items()}
            for rp, res in inst["allocations"].items():
                for rc, n in res.items():
                    merged.setdefault(rp, {})[rc] = merged.get(rp, {}).get(rc, 0) + n
            want = {holder: consumer_doc(holder, merged, held["project"], held["user"],
                                         held["consumer_type"]),
                    instance: dict(inst, allocations={})}
            try:
                return self._write_consumers(want, {holder: held["generation"],
                                                    instance: inst["generation"]})[holder]
            except Conflict as exc:
                if exc.reason != "concurrent_update":
                    raise
        raise Conflict("concurrent_update", f"consumer {holder} kept changing")

    def revert_migration(self, instance: str, migration: str) -> dict:
        """Atomically: the instance gets back what ``migration`` holds, which
        is dropped; the destination allocations are freed."""
        instance = check_uuid(instance, "instance consumer")
        migration = check_uuid(migration, "migration consumer")
        for _ in range(self.retries):
            inst, mig = self.allocations(instance), self.allocations(migration)
            if not mig["allocations"]:
                raise NotFound(f"migration {migration} holds no allocations to revert")
            want = {instance: consumer_doc(instance, mig["allocations"], mig["project"],
                                           mig["user"], inst["consumer_type"] or "INSTANCE"),
                    migration: dict(mig, allocations={})}
            try:
                return self._write_consumers(want, {instance: inst["generation"],
                                                    migration: mig["generation"]})[instance]
            except Conflict as exc:
                if exc.reason != "concurrent_update":
                    raise
        raise Conflict("concurrent_update", f"instance {instance} kept changing")

    def close(self) -> None:
        pass

    @abc.abstractmethod
    def _uuid_named(self, name: str) -> str | None:
        """The uuid of the provider called ``name``, None if there is none."""

    def _resolve(self, ref: str) -> str:
        """uuid of a provider given its uuid or name."""
        if not isinstance(ref, str) or not ref:
            raise PlacementError(f"bad provider reference {ref!r}")
        try:
            return str(uuidlib.UUID(ref))
        except ValueError:
            uuid = self._uuid_named(ref)
            if uuid is None:
                raise NotFound(f"no provider named {ref!r}") from None
            return uuid

    # -- built on the above ------------------------------------------------------

    def _subtree(self, uuid: str) -> list[str]:
        """``uuid`` and every provider below it, parents before children."""
        return subtree(uuid, {p["uuid"]: p for p in self.providers()})

    def settle(self) -> None:
        """Return once any claim placed from now on sees the undrains made
        with ``drain(..., settle=False)``: at once here, where every claim
        reads Placement afresh; the etcd backend's claims read views a
        moment old, and it waits that moment out."""

    def drain(self, ref: str, drained: bool = True, *, settle: bool = True) -> dict:
        """Draining sets reserved to total for every class (no new claims fit)
        and adds COMPUTE_STATUS_DISABLED, on ``ref`` and on every provider
        below it (a host's NUMA cells, devices); undraining a drained
        provider sets its reserved back to 0 (the amounts from before the
        drain are not kept anywhere: Placement has no field to keep them in)
        and leaves a provider that is not drained as it is.  Returns
        ``ref``'s provider document.

        This generic version writes each provider in turn, two writes each
        (traits and inventory), as Placement's API offers no single one:
        draining goes top down and undraining bottom up, so that an
        interrupted call leaves the top provider marked drained and can be
        repeated.  The etcd backend overrides it with one transaction that
        also restores the previous reserved.  ``settle``: return only once
        any claim placed afterwards sees an undrain (:meth:`settle`)."""
        uuid = self._resolve(ref)
        self.provider(uuid)                     # NotFound before anything else
        tree = self._subtree(uuid)
        docs = {u: self._drain_one(u, drained)
                for u in (tree if drained else reversed(tree))}
        return docs[uuid]

    def _drain_one(self, uuid: str, drained: bool) -> dict:
        """The trait is the mark: set before the inventory when draining,
        dropped after it when undraining, so an interrupted call leaves it
        and the next undrain resets reserved.  A provider without the mark
        is not drained and undraining leaves its reserved alone."""
        for _ in range(self.retries):
            rp = self.provider(uuid)
            marked = DISABLED_TRAIT in rp["traits"]
            try:
                if drained and not marked:
                    rp = self.set_traits(uuid, sorted({*rp["traits"], DISABLED_TRAIT}),
                                         generation=rp["generation"])
                if drained or marked:
                    inventories = {rc: {**inv, "reserved": inv["total"] if drained else 0}
                                   for rc, inv in rp["inventories"].items()}
                    if inventories != rp["inventories"]:
                        rp = self.set_inventory(uuid, inventories, generation=rp["generation"])
                if not drained and marked:
                    rp = self.set_traits(uuid, sorted(set(rp["traits"]) - {DISABLED_TRAIT}),
                                         generation=rp["generation"])
                return rp
            except Conflict:
                continue
        raise Conflict("concurrent_update", f"provider {uuid} kept changing while draining")


def subtree(uuid: str, providers: dict) -> list[str]:
    """``uuid`` and its descendants in ``providers`` (uuid -> document with
    ``parent``), parents before children."""
    children: dict = {}
    for u, p in providers.items():
        if p.get("parent"):
            children.setdefault(p["parent"], []).append(u)
    result, todo = [], [uuid]
    while todo:
        u = todo.pop(0)
        result.append(u)
        todo.extend(sorted(children.get(u, ())))
    return result
