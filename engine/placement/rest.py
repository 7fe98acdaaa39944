"""The placement interface over an OpenStack Placement REST API.

Microversion 1.39 (``consumer_type`` on every allocation write), token
``X-Auth-Token`` (``admin`` for a noauth2 deployment).  Input is checked
here first, with the same rules and messages as the etcd backend, so that
bad input never reaches the server; what only the server knows maps back:

- 400 -> :class:`PlacementError` (``NotFound`` for a provider that does not exist);
- 409 ``placement.concurrent_update`` -> ``Conflict("concurrent_update")``,
  retried internally when the caller did not pin a generation;
- 409 "violate inventory constraints", or deleting a provider in use or
  with children -> :class:`PlacementError`;
- no answer (connection refused, timeout) or 502/503/504 ->
  :class:`~engine.errors.PlacementUnavailable` (exit 3, not bad input);
- other 409 on allocations -> ``Conflict("capacity_exceeded")``.

Candidates come from ``GET /allocation_candidates`` and are ordered with the
same weigher as the etcd backend, from the provider summaries.  With a
``limit``, Placement itself chooses which candidates come back; they are then
ordered.  Moving allocations to a migration consumer and reverting it are one
``POST /allocations`` each, which Placement applies atomically.
"""
from __future__ import annotations

import fnmatch
import re

import requests
import structlog

from engine.placement.api import ANY, Placement, subtree
from engine.placement.candidates import order
from engine.placement.model import (Conflict, NotFound, PlacementError, SHARING_TRAIT,
                                    PlacementUnavailable,
                                    STANDARD_RESOURCE_CLASSES, check_trait_name, check_uuid,
                                    normalize_inventories,
                                    empty_consumer, same_holding,
                                    check_resource_class_name)
from engine.placement.query import parse_query

__all__ = ["RestPlacement", "MICROVERSION"]

log = structlog.get_logger("placement")
MICROVERSION = "1.39"


class RestPlacement(Placement):
    backend = "openstack"

    def __init__(self, url: str, token: str = "admin", timeout: float = 30.0):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.session = requests.Session()
        self.session.headers.update({"X-Auth-Token": token, "Accept": "application/json",
                                     "OpenStack-API-Version": f"placement {MICROVERSION}"})
        self._names: dict[str, str] = {}

    def close(self) -> None:
        self.session.close()

    # -- HTTP ----------------------------------------------------------------------

    def _call(self, method: str, path: str, body=None, params=None, allow=()):
        try:
            reply = self.session.request(method, self.url + path, json=body, params=params,
                                         timeout=self.timeout)
        except requests.RequestException as exc:
            raise PlacementUnavailable(f"placement at {self.url} unreachable "
                                       f"({type(exc).__name__})", self.url) from None
        if reply.status_code < 300 or reply.status_code in allow:
            return reply
        if reply.status_code in (502, 503, 504):
            raise PlacementUnavailable(f"placement at {self.url} unavailable "
                                       f"({reply.status_code} {reply.reason})", self.url)
        try:
            error = reply.json()["errors"][0]
            detail, code = error.get("detail", ""), error.get("code", "")
        except (ValueError, KeyError, IndexError):
            detail, code = reply.text.strip(), ""
        detail = " ".join(detail.split())
        if reply.status_code == 404 or "does not exist" in detail or "No resource provider" in detail:
            raise NotFound(detail)
        if reply.status_code == 409:
            if code == "placement.concurrent_update":
                raise Conflict("concurrent_update", detail)
            if "violate inventory constraints" in detail:
                raise PlacementError(detail)
            if code in ("placement.inventory.inuse", "placement.duplicate_name",
                        "placement.resource_provider.inuse",
                        "placement.resource_provider.cannot_delete_parent"):
                raise PlacementError(detail)
            raise Conflict("capacity_exceeded", detail)
        raise PlacementError(f"placement said {reply.status_code}: {detail}")

    def _get(self, path: str, **params):
        return self._call("GET", path, params=params or None).json()

    # -- providers -----------------------------------------------------------------

    def _uuid_named(self, name: str) -> str | None:
        found = self._get("/resource_providers", name=name)["resource_providers"]
        return found[0]["uuid"] if found else None

    def _document(self, rp: dict) -> dict:
        u = rp["uuid"]
        self._names[u] = rp["name"]
        inventories = self._get(f"/resource_providers/{u}/inventories")["inventories"]
        return {"uuid": u, "name": rp["name"], "parent": rp.get("parent_provider_uuid"),
                "root": rp.get("root_provider_uuid") or u, "generation": rp["generation"],
                "inventories": {rc: {k: inv[k] for k in ("total", "reserved", "min_unit",
                                                          "max_unit", "step_size",
                                                          "allocation_ratio")}
                                for rc, inv in inventories.items()},
                "usages": {rc: n for rc, n in
                           self._get(f"/resource_providers/{u}/usages")["usages"].items() if n},
                "traits": sorted(self._get(f"/resource_providers/{u}/traits")["traits"]),
                "aggregates": sorted(self._get(f"/resource_providers/{u}/aggregates")["aggregates"])}

    def provider(self, ref: str) -> dict:
        uuid = self._resolve(ref)
        reply = self._call("GET", f"/resource_providers/{uuid}", allow=(404,))
        if reply.status_code == 404:
            raise NotFound(f"no provider with uuid {uuid}")
        return self._document(reply.json())

    def providers(self, name_glob: str | None = None) -> list[dict]:
        rps = self._get("/resource_providers")["resource_providers"]
        if name_glob:
            rps = [rp for rp in rps if fnmatch.fnmatchcase(rp["name"], name_glob)]
        return sorted((self._document(rp) for rp in rps), key=lambda d: (d["name"], d["uuid"]))

    def _ensure_provider(self, name: str, uuid: str | None, parent: str | None) -> dict:
        for _ in range(self.retries):
            found = self._get("/resource_providers", name=name)["resource_providers"]
            if found:
                if uuid and found[0]["uuid"] != uuid:
                    raise PlacementError(f"provider name {name!r} is taken by {found[0]['uuid']}")
                return self._document(found[0])
            body = {"name": name}
            if uuid:
                body["uuid"] = uuid
            if parent:
                body["parent_provider_uuid"] = self.provider(parent)["uuid"]
            reply = self._call("POST", "/resource_providers", body, allow=(409,))
            if reply.status_code == 409:
                if uuid and "uuid" in reply.text.lower() and "name" not in reply.text.lower():
                    raise PlacementError(f"provider uuid {uuid} is taken by another name")
                continue    # created by someone else meanwhile: read it
            log.info("placement.provider_created", name=name, uuid=reply.json()["uuid"],
                     parent=body.get("parent_provider_uuid"))
            return self._document(reply.json())
        raise Conflict("concurrent_update", f"provider {name!r} kept changing")

    def _subtree(self, uuid: str) -> list[str]:
        tree = self._get("/resource_providers", in_tree=uuid)["resource_providers"]
        return subtree(uuid, {rp["uuid"]: {"parent": rp.get("parent_provider_uuid")}
                              for rp in tree})

    def delete_provider(self, ref: str) -> None:
        self._call("DELETE", f"/resource_providers/{self._resolve(ref)}")

    def ensure_resource_class(self, name: str) -> bool:
        """True when this call created the class."""
        check_resource_class_name(name)
        if name not in STANDARD_RESOURCE_CLASSES:
            return self._call("PUT", f"/resource_classes/{name}").status_code == 201
        return False

    def _with_new_names(self, kind: str, names, write):
        """Create the missing CUSTOM_ ``kind`` (resource_classes or traits) that
        ``write`` needs, run it, and delete again the ones created here when it
        fails: a refused write leaves no new names behind."""
        created = []
        try:
            for name in names:
                if name.startswith("CUSTOM_") and self._call(
                        "PUT", f"/{kind}/{name}").status_code == 201:
                    created.append(name)
            return write()
        except BaseException:
            for name in created:    # in use by someone meanwhile (409): theirs now
                try:
                    self._call("DELETE", f"/{kind}/{name}", allow=(404, 409))
                except (PlacementError, PlacementUnavailable):
                    pass
            raise

    def _current(self, uuid: str, generation) -> dict:
        """The provider's document; NotFound, or a Conflict on a stale
        ``generation``, before anything is written."""
        doc = self.provider(uuid)
        if generation is not None and doc["generation"] != generation:
            raise Conflict("concurrent_update", f"provider {doc['name']} is at generation "
                           f"{doc['generation']}, not {generation}")
        return doc

    def _update(self, ref: str, generation, put) -> dict:
        uuid = self._resolve(ref)
        for _ in range(self.retries):
            current = generation
            if current is None:
                reply = self._call("GET", f"/resource_providers/{uuid}", allow=(404,))
                if reply.status_code == 404:
                    raise NotFound(f"no provider with uuid {uuid}")
                current = reply.json()["generation"]
            try:
                put(uuid, current)
                return self.provider(uuid)
            except Conflict as exc:
                if generation is not None or exc.reason != "concurrent_update":
                    raise
        raise Conflict("concurrent_update", f"provider {ref} kept changing")

    def set_inventory(self, ref: str, inventories: dict, *,
                      generation: int | None = None) -> dict:
        inventories = normalize_inventories(inventories)
        uuid = self._resolve(ref)
        doc = self._current(uuid, generation)   # NotFound before creating any class
        in_use = [rc for rc, n in doc["usages"].items() if n and rc not in inventories]
        if in_use:
            raise PlacementError(f"cannot remove inventory of {in_use} from "
                                 f"{doc['name']}: in use")
        return self._with_new_names("resource_classes", sorted(inventories), lambda: self._update(
            uuid, generation, lambda u, g: self._call(
                "PUT", f"/resource_providers/{u}/inventories",
                {"resource_provider_generation": g, "inventories": inventories})))

    def set_traits(self, ref: str, traits, *, generation: int | None = None) -> dict:
        traits = sorted({check_trait_name(t) for t in traits})
        uuid = self._resolve(ref)
        self._current(uuid, generation)     # NotFound before creating any trait
        return self._with_new_names("traits", traits, lambda: self._update(
            uuid, generation, lambda u, g: self._call(
                "PUT", f"/resource_providers/{u}/traits",
                {"resource_provider_generation": g, "traits": traits})))

    def set_aggregates(self, ref: str, aggregates, *,
                       generation: int | None = None) -> dict:
        aggregates = sorted({check_uuid(a, "aggregate") for a in aggregates})
        return self._update(ref, generation, lambda u, g: self._call(
            "PUT", f"/resource_providers/{u}/aggregates",
            {"resource_provider_generation": g, "aggregates": aggregates}))

    # -- candidates ----------------------------------------------------------------

    def _name(self, uuid: str) -> str:
        if uuid not in self._names:
            for rp in self._get("/resource_providers")["resource_providers"]:
                self._names[rp["uuid"]] = rp["name"]
        return self._names.get(uuid, uuid)

    def candidates(self, query, *, required: str | None = None,
                   limit: int | None = None) -> list[dict]:
        query = parse_query(query, required, limit)
        for group in query.groups:      # Placement answers no candidates; we say why
            if group.in_tree and self._call("GET", f"/resource_providers/{group.in_tree}",
                                            allow=(404,)).status_code == 404:
                raise NotFound(f"in_tree{group.suffix}: no provider with uuid {group.in_tree}")
        reply = self._get("/allocation_candidates", **_multi(query.to_params()))
        summaries = reply["provider_summaries"]
        found = []
        for request in reply["allocation_requests"]:
            allocations = {rp: dict(a["resources"]) for rp, a in request["allocations"].items()}
            local = [rp for rp in allocations
                     if SHARING_TRAIT not in summaries[rp].get("traits", [])] or list(allocations)
            root = summaries[sorted(local)[0]]["root_provider_uuid"]
            found.append({"allocations": allocations, "host": self._name(root), "root": root,
                          "mappings": request.get("mappings", {})})

        def capacity_used(rp, rc):
            resource = summaries[rp]["resources"][rc]
            return resource["capacity"], resource["used"]
        return order(found, capacity_used, query.limit)

    # -- allocations ---------------------------------------------------------------

    def allocations(self, consumer: str) -> dict:
        consumer = check_uuid(consumer, "consumer")
        got = self._get(f"/allocations/{consumer}")
        if not got.get("allocations"):
            return empty_consumer(consumer)
        return {"consumer": consumer, "generation": got.get("consumer_generation"),
                "project": got.get("project_id"), "user": got.get("user_id"),
                "consumer_type": got.get("consumer_type"),
                "allocations": {rp: dict(a["resources"]) for rp, a in got["allocations"].items()}}

    def all_allocations(self) -> list[dict]:
        consumers = set()
        for rp in self._get("/resource_providers")["resource_providers"]:
            consumers |= set(self._get(f"/resource_providers/{rp['uuid']}/allocations")["allocations"])
        return [self.allocations(c) for c in sorted(consumers)]

    @staticmethod
    def _body(doc: dict, generation) -> dict:
        return {"allocations": {rp: {"resources": res} for rp, res in doc["allocations"].items()},
                "project_id": doc["project"], "user_id": doc["user"],
                "consumer_type": doc["consumer_type"], "consumer_generation": generation}

    def _claim(self, consumer: str, want: dict, consumer_generation) -> dict:
        for rc in {rc for res in want["allocations"].values() for rc in res}:
            if rc not in STANDARD_RESOURCE_CLASSES:
                if self._call("GET", f"/resource_classes/{rc}", allow=(404,)).status_code == 404:
                    raise PlacementError(f"unknown resource class(es) ['{rc}']: no such custom class")
        hidden = None
        for _ in range(self.retries):
            generation = consumer_generation
            if generation is ANY:
                have = self.allocations(consumer)
                if same_holding(have, want):
                    return have
                generation = have["generation"]
                if generation is None and hidden is not None:
                    generation = hidden
            try:
                self._call("PUT", f"/allocations/{consumer}", self._body(want, generation))
                return self.allocations(consumer)
            except Conflict as exc:
                if exc.reason != "concurrent_update":
                    raise
                self.races_lost += 1
                have = self.allocations(consumer)
                if same_holding(have, want):
                    return have
                if consumer_generation is not ANY:
                    raise
                # A failed write can leave Placement holding an empty consumer
                # that GET /allocations does not show; its generation is only
                # told in the conflict message.
                seen = re.search(r"expected (\d+) but got", str(exc))
                hidden = int(seen.group(1)) if seen and have["generation"] is None else None
        raise Conflict("concurrent_update",
                       f"providers kept changing: {self.retries} attempts lost the race")

    def release(self, consumer: str) -> None:
        consumer = check_uuid(consumer, "consumer")
        self._call("DELETE", f"/allocations/{consumer}", allow=(404,))

    def _write_consumers(self, want: dict, expect: dict) -> dict:
        self._call("POST", "/allocations",
                   {c: self._body(doc, expect[c]) for c, doc in want.items()})
        return {c: self.allocations(c) for c in want}


def _multi(params: list[tuple[str, str]]) -> dict:
    """requests wants repeated keys as lists."""
    result: dict[str, list] = {}
    for key, value in params:
        result.setdefault(key, []).append(value)
    return result
