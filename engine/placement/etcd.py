"""Placement kept in etcd, next to the rest of the cluster's state.

Keys, relative to the cluster prefix (values are msgpack maps):

- ``placement/rp/<uuid>``: the whole provider ``{uuid, name, parent, root,
  generation, inventories, usages, traits, aggregates}``.  Usages live in the
  provider document so that one compare on its mod revision covers
  everything a claim depends on, and the generation moves with every change;
- ``placement/name/<name>`` -> uuid: names are unique, created in the same
  transaction as the provider;
- ``placement/rc/<CUSTOM_X>``: custom resource classes that exist;
- ``placement/bucket/<first two characters of a uuid>``: put by every
  transaction that writes a provider of that bucket, so that a large
  provider view reads only the buckets that changed
  (``engine/placement/view.py``);
- ``placement/drained/<uuid>`` -> ``{RC: reserved}``: what a drained
  provider's reserved amounts were, written in the drain's transaction and
  put back (and deleted) by undraining;
- ``placement/consumer/<uuid>``: ``{consumer, generation, project, user,
  consumer_type, allocations: {rp_uuid: {RC: n}}}``.

A claim reads the consumers and providers it touches in one atomic read,
checks capacity, and writes new usages and the consumer documents in one
transaction guarded by the mod revision of every key read.  A lost compare is
re-read and re-checked: still fits -> try again (up to ``retries`` times, as
Placement's allocation_conflict_retry_count), no longer fits ->
``Conflict("capacity_exceeded")``.  Nothing else ever writes usages, so
usages always equal the sum of the allocations, and a claiming process killed
at any moment leaves a whole allocation or none.
"""
from __future__ import annotations

import fnmatch
import functools
import threading
import time
import uuid as uuidlib
import weakref
from copy import deepcopy

import structlog

from engine.placement.api import ANY, Placement, subtree
from engine.placement.candidates import find_candidates, layout_of, order
from engine.placement.model import (DISABLED_TRAIT, Conflict, NotFound, PlacementError,
                                    STANDARD_RESOURCE_CLASSES, amount_problem, capacity,
                                    check_resource_class_name, check_trait_name, check_uuid,
                                    consumer_doc, normalize_allocations, normalize_inventories,
                                    empty_consumer, same_holding)
from engine.placement.query import parse_query
from engine.placement.view import stamped, view_of
from engine.core import keys
from engine.core.store import KV, Delete, Get, Put, absent, modified_at
from engine.core.values import Shape, declare, readable, shape

__all__ = ["EtcdPlacement"]

log = structlog.get_logger("placement")

# Per store: provider name -> the uuid last found for it (checked on each use).
_named: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_named_lock = threading.Lock()
_NAMED_MAX = 4096

RP, NAME, RC, CONSUMER, DRAINED = (keys.placement(part) for part in
                                   ("rp/", "name/", "rc/", "consumer/", "drained/"))


# claim_new_together places on a view brought up to date at most this long ago
CLAIM_VIEW_AGE = 0.1
_NUMBER_TYPES = frozenset((int, float))     # exact types: a bool is no number here


def _numbers(mapping) -> bool:
    """Every value an int or a float (checked on every provider read: kept cheap)."""
    types = _NUMBER_TYPES
    for n in mapping.values():
        if type(n) not in types:
            return False
    return True


def _provider_problem(doc) -> str | None:
    for rc, inventory in doc["inventories"].items():
        if not isinstance(inventory, dict) or not _numbers(inventory):
            return f"inventory {rc!r} is not a mapping of numbers"
    if not _numbers(doc["usages"]):
        return "usages are not all numbers"
    return None


def _consumer_problem(doc) -> str | None:
    for rp, resources in doc["allocations"].items():
        if not isinstance(resources, dict) or not _numbers(resources):
            return f"allocation on {rp!r} is not a mapping of numbers"
    return None


class _ProviderShape(Shape):
    """A provider document's shape, checked in one pass when it holds (every
    provider a claim or a query reads that changed is checked)."""

    def problem(self, value) -> str | None:
        if _PROVIDER_FIELDS.problem(value) is None and _provider_problem(value) is None:
            return None
        return super().problem(value)       # the full path says what is wrong


_PROVIDER_FIELDS = shape("resource provider", None, uuid=str, name=str, root=str,
                         generation=int, inventories=dict, usages=dict, traits=list,
                         aggregates=list)
PROVIDER = _ProviderShape(_PROVIDER_FIELDS.name, _PROVIDER_FIELDS.fields, _provider_problem)
CONSUMER_DOC = shape("consumer", _consumer_problem, consumer=str, allocations=dict)
declare(RP + "*", PROVIDER)
declare(NAME + "*", shape("provider name", None, str))
declare(CONSUMER + "*", CONSUMER_DOC)
declare(DRAINED + "*", shape("drained provider's saved reserved"))
declare(RC + "*", None)


@functools.lru_cache(maxsize=64)
def _parsed(spec: str, required: str | None, limit: int | None):
    """A query string parsed once (the Query stays inside :meth:`candidates`,
    which never changes it)."""
    return parse_query(spec, required, limit)


def _readable(kvs) -> list:
    """``kvs`` whose values can be read (the rest are reported and skipped)."""
    return [kv for kv in kvs if readable(kv) is not None]


class EtcdPlacement(Placement):
    backend = "etcd"

    def __init__(self, store):
        self.store = store
        self._view = view_of(store)     # every provider, read again only where changed

    # -- reading -------------------------------------------------------------------

    def _uuid_named(self, name: str) -> str | None:
        return readable(self.store.get(NAME + name))

    def _remembered(self, ref: str) -> dict | None:
        """The provider ``ref`` names when the uuid this store last found
        for that name still holds a provider of that name (one read, not
        two: the peer's stats tick asks for its own provider by name), else
        None."""
        with _named_lock:
            uuid = _named.setdefault(self.store, {}).get(ref)
        if uuid is None:
            return None
        doc = readable(self.store.get(RP + uuid))
        return doc if isinstance(doc, dict) and doc.get("name") == ref else None

    def _read(self, uuid: str):
        kv = self.store.get(RP + uuid)
        if readable(kv) is None:
            raise NotFound(f"no provider with uuid {uuid}"
                           + (" (its record is unreadable)" if kv is not None else ""))
        return kv

    def provider(self, ref: str) -> dict:
        doc = self._remembered(ref)
        if doc is not None:
            return doc
        uuid = self._resolve(ref)
        doc = self._read(uuid).value
        if uuid != ref:
            with _named_lock:
                names = _named.setdefault(self.store, {})
                if len(names) >= _NAMED_MAX:
                    names.clear()
                names[ref] = uuid
        return doc

    def providers(self, name_glob: str | None = None) -> list[dict]:
        kvs, _ = self.store.range(RP)
        docs = [kv.value for kv in _readable(kvs)]
        if name_glob:
            docs = [d for d in docs if fnmatch.fnmatchcase(d["name"], name_glob)]
        return sorted(docs, key=lambda d: (d["name"], d["uuid"]))

    def _custom_classes(self) -> set:
        kvs, _ = self.store.range(RC, keys_only=True)
        return {kv.key[len(RC):] for kv in kvs}

    def _check_classes_exist(self, classes) -> None:
        custom = {rc for rc in classes if rc not in STANDARD_RESOURCE_CLASSES}
        missing = custom - self._custom_classes() if custom else set()
        if missing:
            raise PlacementError(f"unknown resource class(es) {sorted(missing)}: "
                                 "no such custom class")

    # -- providers -----------------------------------------------------------------

    def _ensure_provider(self, name: str, uuid: str | None, parent: str | None) -> dict:
        for _ in range(self.retries):
            existing = self.store.get(NAME + name)
            if existing is not None:
                doc = self._read(existing.value).value
                if uuid and doc["uuid"] != uuid:
                    raise PlacementError(f"provider name {name!r} is taken by {doc['uuid']}")
                return doc
            parent_kv = None
            if parent:
                parent_kv = self._read(self._resolve(parent))
            new_uuid = uuid or str(uuidlib.uuid4())
            if self.store.get(RP + new_uuid) is not None:
                raise PlacementError(f"provider uuid {new_uuid} is taken by another name")
            doc = {"uuid": new_uuid, "name": name,
                   "parent": parent_kv.value["uuid"] if parent_kv else None,
                   "root": parent_kv.value["root"] if parent_kv else new_uuid,
                   "generation": 0, "inventories": {}, "usages": {}, "traits": [],
                   "aggregates": []}
            compares = [absent(NAME + name), absent(RP + new_uuid)]
            puts = [Put(RP + new_uuid, doc), Put(NAME + name, new_uuid)]
            if parent_kv:   # re-put the parent so that a concurrent delete of it fails
                compares.append(modified_at(parent_kv.key, parent_kv.mod_revision))
                puts.append(Put(parent_kv.key, parent_kv.value))
            done = self.store.txn(compares, stamped(puts))
            if done.succeeded:
                self._view.saw(KV(RP + new_uuid, deepcopy(doc), done.revision, done.revision, 1, 0),
                               checked=True)
                log.info("placement.provider_created", name=name, uuid=new_uuid,
                         parent=doc["parent"])
                return doc
        raise Conflict("concurrent_update", f"provider {name!r} kept changing")

    def delete_provider(self, ref: str) -> None:
        uuid = self._resolve(ref)
        kv = self._read(uuid)
        if any(kv.value["usages"].values()):
            raise PlacementError(f"provider {kv.value['name']} has allocations")
        kvs = _readable(self.store.range(RP)[0])
        if any(other.value["parent"] == uuid for other in kvs):
            raise PlacementError(f"provider {kv.value['name']} has child providers")
        done = self.store.txn([modified_at(kv.key, kv.mod_revision)],
                              stamped([Delete(kv.key), Delete(NAME + kv.value["name"]),
                                       Delete(DRAINED + uuid)]))
        if not done.succeeded:
            raise Conflict("concurrent_update", f"provider {kv.value['name']} changed meanwhile")
        self._view.gone(kv.key, done.revision)

    def ensure_resource_class(self, name: str) -> None:
        check_resource_class_name(name)
        if name not in STANDARD_RESOURCE_CLASSES:
            self.store.create(RC + name, {})

    def _update(self, ref: str, generation, change) -> dict:
        """Read-modify-write one provider document, bumping its generation."""
        uuid = self._resolve(ref)
        for _ in range(self.retries):
            kv = self._read(uuid)
            doc = dict(kv.value)
            if generation is not None and doc["generation"] != generation:
                raise Conflict("concurrent_update", f"provider {doc['name']} is at generation "
                               f"{doc['generation']}, not {generation}")
            extra = change(doc) or []
            doc["generation"] += 1
            done = self.store.txn([modified_at(kv.key, kv.mod_revision)],
                                  stamped([Put(kv.key, doc), *extra]))
            if done.succeeded:
                self._view.saw(KV(kv.key, deepcopy(doc), kv.create_revision, done.revision, 0, 0),
                               checked=True)
                return doc
            if generation is not None:
                raise Conflict("concurrent_update", f"provider {doc['name']} changed meanwhile")
        raise Conflict("concurrent_update", f"provider {ref} kept changing")

    def set_inventory(self, ref: str, inventories: dict, *,
                      generation: int | None = None) -> dict:
        inventories = normalize_inventories(inventories)
        custom = [rc for rc in inventories if rc not in STANDARD_RESOURCE_CLASSES]

        def change(doc):
            in_use = [rc for rc, n in doc["usages"].items() if n and rc not in inventories]
            if in_use:
                raise PlacementError(f"cannot remove inventory of {in_use} from "
                                     f"{doc['name']}: in use")
            doc["inventories"] = inventories
            return [Put(RC + rc, {}) for rc in custom]
        return self._update(ref, generation, change)

    def set_traits(self, ref: str, traits, *, generation: int | None = None) -> dict:
        traits = sorted({check_trait_name(t) for t in traits})

        def change(doc):
            doc["traits"] = traits
        return self._update(ref, generation, change)

    def set_aggregates(self, ref: str, aggregates, *,
                       generation: int | None = None) -> dict:
        aggregates = sorted({check_uuid(a, "aggregate") for a in aggregates})

        def change(doc):
            doc["aggregates"] = aggregates
        return self._update(ref, generation, change)

    def settle(self) -> None:
        """After undrains (``drain(..., settle=False)``): return once any
        claim placed from now on sees them.  Claims place on views up to
        :data:`CLAIM_VIEW_AGE` old, and nothing they compare changed with
        an undrain: this waits until every view read before it is older."""
        if getattr(self, "_undrained", False):
            time.sleep(CLAIM_VIEW_AGE)
            self._undrained = False

    def drain(self, ref: str, drained: bool = True, *, settle: bool = True) -> dict:
        """One transaction over ``ref`` and every provider below it (a host's
        NUMA cells, devices): reserved = total for every class plus trait
        COMPUTE_STATUS_DISABLED on each, the reserved amounts replaced kept
        under ``placement/drained/<uuid>``; undraining puts them back (capped
        at the total, which may have changed meanwhile) and drops the trait.
        The transaction compares every provider of the subtree, and creating
        a child re-puts its parent, so a child added meanwhile is not missed.
        Undraining a drained provider returns only once any claim placed
        afterwards sees it open (:meth:`settle`; with ``settle=False`` the
        caller settles, once for several undrains)."""
        uuid = self._resolve(ref)
        for _ in range(self.retries):
            kvs, revision = self.store.range(RP)
            by_uuid = {kv.value["uuid"]: kv for kv in _readable(kvs)}
            if uuid not in by_uuid:
                raise NotFound(f"no provider with uuid {uuid}")
            tree = subtree(uuid, {u: kv.value for u, kv in by_uuid.items()})
            saved_kvs, _ = self.store.range(DRAINED, revision=revision)
            saved_by_uuid = {kv.key[len(DRAINED):]: kv for kv in saved_kvs}
            compares, ops, docs = [], [], {}
            for u in tree:
                kv = by_uuid[u]
                doc = dict(kv.value)
                ops.extend(_drain_doc(doc, saved_by_uuid.get(u), drained))
                doc["generation"] += 1
                docs[u] = doc
                compares.append(modified_at(kv.key, kv.mod_revision))
                ops.append(Put(kv.key, doc))
            done = self.store.txn(compares, stamped(ops))
            if done.succeeded:
                for u, doc in docs.items():
                    self._view.saw(KV(RP + u, deepcopy(doc), 0, done.revision, 0, 0), checked=True)
                if not drained and any(DISABLED_TRAIT in by_uuid[u].value["traits"] for u in tree):
                    self._undrained = True
                    if settle:
                        self.settle()
                return docs[uuid]
        raise Conflict("concurrent_update", f"provider {ref} kept changing while draining")

    # -- candidates ----------------------------------------------------------------

    def candidates(self, query, *, required: str | None = None,
                   limit: int | None = None) -> list[dict]:
        """Computed from the provider view (``engine/placement/view.py``):
        one read of what changed since the last query."""
        text = isinstance(query, str) and isinstance(required, (str, type(None)))
        query = _parsed(query, required, limit) if text else parse_query(query, required, limit)
        self._check_classes_exist(query.resource_classes)
        providers, layout = self.provider_view()
        for group in query.groups:
            if group.in_tree and group.in_tree not in providers:
                raise NotFound(f"in_tree{group.suffix}: no provider with uuid {group.in_tree}")
        memo = self._view.memo(_memo_key(query), layout)
        return order(find_candidates(providers, query, query.limit, layout, memo),
                     limit=query.limit)

    def claim_new_together(self, claims) -> list[dict | None]:
        """Place and claim new consumers in one transaction
        (:mod:`engine.placement.together`): each ``claim`` (``consumer``,
        ``query``, ``required``, ``allowed(host)``, ``owner``) takes the best
        candidate its ``allowed`` accepts, computed on the providers as the
        view holds them now plus the usages of the claims placed before it.
        The write is :meth:`write` with every consumer expected absent: the
        compares hold only if no provider changed and no consumer exists;
        a lost race is read again and re-checked there.  Returns, per claim,
        ``{consumer, allocations, host}``, or None for a claim that found
        no candidate here (it is then claimed alone, on a fresh read).
        Raises what :meth:`write` raises: nothing is then claimed.

        The view may be up to :data:`CLAIM_VIEW_AGE` seconds old: no read
        when this process's last placement read or write brought it up to
        date since (each write carries that read: ``ProviderView.rider``).
        What changed since on a provider a claim takes makes the write lose
        and be judged again on what etcd holds, as any lost race is; a host
        that gained room meanwhile is seen by the next batch."""
        providers, layout = self._view.derived(layout_of, of_structure=True,
                                               max_age=CLAIM_VIEW_AGE)
        placed, want, results = {}, {}, []
        view, checked = providers, set()
        for claim in claims:
            query = _parsed(claim.query, claim.required, None)
            if (claim.query, claim.required) not in checked:
                self._check_classes_exist(query.resource_classes)
                checked.add((claim.query, claim.required))
            # Per query, the weights kept with the view (candidates' own):
            # each claim weighs again only the hosts whose documents changed
            # since, the batch's claims before it or other writers.
            memo = self._view.memo(_memo_key(query), layout)
            ordered = order(find_candidates(view, query, None, layout, memo))
            if claim.prefer:
                ordered.sort(key=lambda c: c["host"] != claim.prefer)
            best = next((c for c in ordered if claim.allowed(c["host"])), None)
            if best is None or claim.consumer in want or _bad_uuid(claim.consumer):
                results.append(None)
                continue
            allocations = normalize_allocations(best["allocations"])
            view = dict(view)       # a new object: the memo's ranking is made again
            for rp, resources in allocations.items():
                usages = dict(view[rp]["usages"])
                for rc, n in resources.items():
                    usages[rc] = usages.get(rc, 0) + n
                view[rp] = dict(view[rp], usages=usages)
            want[claim.consumer] = consumer_doc(claim.consumer, allocations, **claim.owner)
            placed[claim.consumer] = best["host"]
            results.append(claim.consumer)
        if want:
            self._write(want, {c: None for c in want})
        return [None if c is None else {"consumer": c, "allocations": want[c]["allocations"],
                                        "host": placed[c]} for c in results]

    def release_together(self, consumers: list[str]) -> None:
        """Release every consumer in one transaction (``release`` for each,
        at once: the same read, compares and retries)."""
        consumers = [check_uuid(c, "consumer") for c in consumers]
        self._write({c: None for c in consumers}, {c: ANY for c in consumers})

    # -- for batched writers (engine/placement/moves.py, claim_new_together) -------

    def provider_view(self) -> tuple[dict, object]:
        """``(providers, layout)``: every provider document (uuid -> doc) as
        the view holds it now, after one read of what changed, and its
        :func:`~engine.placement.candidates.layout_of`: what :meth:`candidates`
        places on.  Both are shared with every other reader: never change
        them (copy a document to add a batch's usages)."""
        return self._view.derived(layout_of, of_structure=True)

    def read_consumers(self, consumers: list[str]) -> dict[str, dict | None]:
        """Consumer uuid -> its document, or None where it has none, all
        read at one revision in one round trip.  Raises
        :class:`PlacementError` when a document is unreadable."""
        read = self._snapshot(consumers, [])
        return {c: readable(read[CONSUMER + c]) for c in consumers}

    def write(self, want: dict, expect: dict) -> dict:
        """Give each consumer in ``want`` its document (None: no allocations),
        all in one transaction that compares every consumer and provider it
        depends on, and return the documents written.  ``expect``: consumer
        -> the generation it must be at, None for 'must not exist', or
        :data:`~engine.placement.api.ANY`.  A lost race is read again and
        re-checked (up to ``retries`` times); what no longer fits raises
        :class:`Conflict` (``capacity_exceeded``), a consumer not at its
        expected generation ``Conflict`` (``concurrent_update``): nothing is
        then written.  A write that changes nothing is answered at once."""
        return self._write(want, expect)

    # -- allocations ---------------------------------------------------------------

    def allocations(self, consumer: str) -> dict:
        consumer = check_uuid(consumer, "consumer")
        return readable(self.store.get(CONSUMER + consumer)) or empty_consumer(consumer)

    def all_allocations(self) -> list[dict]:
        kvs, _ = self.store.range(CONSUMER)
        return sorted((kv.value for kv in _readable(kvs)), key=lambda d: d["consumer"])

    def _claim(self, consumer: str, want: dict, consumer_generation) -> dict:
        return self._write({consumer: want}, {consumer: consumer_generation})[consumer]

    def release(self, consumer: str) -> None:
        consumer = check_uuid(consumer, "consumer")
        self._write({consumer: None}, {consumer: ANY})

    def _write_consumers(self, want: dict, expect: dict) -> dict:
        return self._write({c: doc if doc["allocations"] else None for c, doc in want.items()},
                           expect)

    def _snapshot(self, consumers, providers) -> dict:
        """Consumers and providers read at one revision."""
        keys = [CONSUMER + c for c in consumers] + [RP + p for p in providers]
        return self._found(keys, self.store.txn([], [Get(k) for k in keys]).ranges)

    def _found(self, keys: list, ranges: list) -> dict:
        """key -> KV or None, from the ranges of a transaction's Gets."""
        found = {}
        for key, kvs in zip(keys, ranges):
            found[key] = kvs[0] if kvs else None
            if found[key] is not None and readable(
                    found[key], PROVIDER if key.startswith(RP) else CONSUMER_DOC) is None:
                raise PlacementError(f"{key} is unreadable: nothing can be claimed over it "
                                     "until it is repaired or removed (peerctl scrub)")
            if found[key] is not None and key.startswith(RP):
                self._view.saw(found[key], checked=True)    # fresher than the view, maybe
        return found

    def _write(self, want: dict, expect: dict) -> dict:
        """Give each consumer in ``want`` its document (None: no allocations)
        in one transaction.  ``expect``: consumer -> generation, None for
        'must not exist', or ANY.

        Each attempt is one transaction whose failure branch reads back
        every key it compared, so a lost race costs one round trip, not two.
        New consumers start from the provider documents of the view the
        candidates came from, without a read: the compares make a stale one
        lose, and only a fresh read may conclude capacity_exceeded, so
        nothing is decided on stale data."""
        wanted_rps = {rp for doc in want.values() if doc for rp in doc["allocations"]}
        self._check_classes_exist({rc for doc in want.values() if doc
                                   for res in doc["allocations"].values() for rc in res})
        read, guessed = None, False
        seen = {rp: self._view.kv(rp) for rp in wanted_rps}
        if (all(g is None for g in expect.values()) and all(want.values())
                and all(seen.values())):
            read = {CONSUMER + c: None for c in want}
            read.update({RP + rp: kv for rp, kv in seen.items()})
            guessed = True
        for _ in range(self.retries):
            if read is None:
                read = self._snapshot(want, wanted_rps)
            old = {c: read[CONSUMER + c] for c in want}
            old_rps = {rp for kv in old.values() if kv for rp in kv.value["allocations"]}
            if any(RP + rp not in read for rp in old_rps):
                read = self._snapshot(want, wanted_rps | old_rps)
                old = {c: read[CONSUMER + c] for c in want}
                if any(RP + rp not in read for kv in old.values() if kv
                       for rp in kv.value["allocations"]):
                    read = None
                    continue        # the consumer moved meanwhile: read again
            for rp in sorted(wanted_rps):
                if read[RP + rp] is None:
                    raise NotFound(f"no provider with uuid {rp}")
            if all(_same(old[c], doc) for c, doc in want.items()):
                return {c: (old[c].value if old[c] else empty_consumer(c)) for c in want}
            for c, generation in expect.items():
                current = old[c].value["generation"] if old[c] else None
                if generation is not ANY and generation != current:
                    raise Conflict("concurrent_update", f"consumer {c} is at generation "
                                   f"{current}, not {generation}")
            try:
                done, outcome = self._attempt(want, read)
            except Conflict:
                if not guessed:
                    raise
                done, outcome = False, None     # judged on the view: read and judge again
            if done:
                return outcome
            read, guessed = outcome, False
        raise Conflict("concurrent_update",
                       f"providers kept changing: {self.retries} attempts lost the race")

    def _attempt(self, want: dict, read: dict) -> tuple[bool, dict | None]:
        """One transaction from what was ``read``: ``(True, consumer docs)``,
        or ``(False, what the keys of read hold now)`` when one changed."""
        compares, ops, docs, rps = [], [], {}, {}
        old = {c: read[CONSUMER + c] for c in want}
        for key, kv in read.items():
            if key.startswith(RP) and kv is not None:
                rps[kv.value["uuid"]] = dict(kv.value, usages=dict(kv.value["usages"]))
                compares.append(modified_at(key, kv.mod_revision))
        for c, kv in old.items():
            compares.append(modified_at(kv.key, kv.mod_revision) if kv else absent(CONSUMER + c))
            for rp, res in (kv.value["allocations"] if kv else {}).items():
                for rc, n in res.items():
                    rps[rp]["usages"][rc] = rps[rp]["usages"].get(rc, 0) - n
        before = {rp: dict(read[RP + rp].value["usages"]) for rp in rps}
        for c, doc in want.items():
            for rp, res in (doc["allocations"] if doc else {}).items():
                for rc, n in res.items():
                    self._check_fits(rps[rp], rc, n, before[rp].get(rc, 0))
                    rps[rp]["usages"][rc] = rps[rp]["usages"].get(rc, 0) + n
            if doc:
                generation = (old[c].value["generation"] if old[c] else 0) + 1
                docs[c] = dict(doc, generation=generation)
                ops.append(Put(CONSUMER + c, docs[c]))
            else:
                docs[c] = empty_consumer(c)
                if old[c]:
                    ops.append(Delete(CONSUMER + c))
        for rp, doc in rps.items():
            doc["usages"] = {rc: n for rc, n in doc["usages"].items() if n}
            doc["generation"] += 1
            ops.append(Put(RP + rp, doc))
        keys = list(read)
        rider = self._view.rider()      # what changed among the providers, read with it
        riding = [rider[0]] if rider else []
        result = self.store.txn(compares, stamped(ops) + riding, [Get(k) for k in keys] + riding)
        if rider:
            self._view.carried(rider, result.ranges[-1], result.counts[-1], result.revision)
        if result.succeeded:
            for rp, doc in rps.items():
                self._view.saw(KV(RP + rp, doc, 0, result.revision, 0, 0), checked=True)
            return True, docs
        self.races_lost += 1
        return False, self._found(keys, result.ranges[:len(keys)])

    @staticmethod
    def _check_fits(rp: dict, rc: str, amount: int, before: int) -> None:
        """``rp['usages']`` holds usage without this claim's consumers (and
        with those of the same write checked so far); ``before``: the
        provider's usage before the write.  A write that uses no more of a
        provider than it did always fits there: moving a VM's allocations to
        its migration consumer on a drained or shrunk host is not a claim."""
        inv = rp["inventories"].get(rc)
        if inv is None:
            raise Conflict("capacity_exceeded",
                           f"provider {rp['name']} has no inventory of {rc}")
        problem = amount_problem(inv, amount)
        if problem:
            raise PlacementError(f"{amount} {rc} on provider {rp['name']}: {problem}")
        used = rp["usages"].get(rc, 0)
        if used + amount > capacity(inv) and used + amount > before:
            raise Conflict("capacity_exceeded",
                           f"provider {rp['name']} cannot fit {amount} {rc}: "
                           f"{used} used of {capacity(inv)}")


def _drain_doc(doc: dict, saved_kv, drained: bool) -> list:
    """Drain (or undrain) one provider document in place; the etcd ops that
    keep (or drop) its saved reserved amounts.  ``saved_kv``: its
    ``placement/drained/<uuid>`` key as read with ``doc``."""
    key = DRAINED + doc["uuid"]
    traits = set(doc["traits"])
    inventories = doc["inventories"]
    if drained:
        if saved_kv:
            saved = saved_kv.value
        elif DISABLED_TRAIT in traits:      # drained before reserved was kept
            saved = {}
        else:
            saved = {rc: inv["reserved"] for rc, inv in inventories.items()}
        doc["inventories"] = {rc: {**inv, "reserved": inv["total"]}
                              for rc, inv in inventories.items()}
        doc["traits"] = sorted(traits | {DISABLED_TRAIT})
        return [Put(key, saved)]
    if saved_kv or DISABLED_TRAIT in traits:    # else not drained: leave reserved
        saved = saved_kv.value if saved_kv else {}
        doc["inventories"] = {rc: {**inv, "reserved": min(saved.get(rc, 0), inv["total"])}
                              for rc, inv in inventories.items()}
    doc["traits"] = sorted(traits - {DISABLED_TRAIT})
    return [Delete(key)] if saved_kv else []


def _memo_key(query) -> tuple:
    """What the weights a query computes depend on: the query, its limit aside."""
    return tuple(p for p in query.to_params() if p[0] != "limit")


def _bad_uuid(consumer) -> bool:
    try:
        check_uuid(consumer, "consumer")
    except PlacementError:
        return True
    return False


def _same(kv, doc) -> bool:
    if doc is None:
        return kv is None
    return kv is not None and same_holding(kv.value, doc)
