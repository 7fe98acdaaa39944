"""VM groups: VMs that must stay apart (``spread``) or together (``together``).

Nova's server groups and Proxmox's HA affinity rules: a group of web
front-ends spread over hosts survives one host's death; a group kept
together shares a host.  A VM joins a group when it is booted into it
(``boot --group NAME --spread|--together``) and stays in it for life.

Keys: ``groups/<name>/<uuid>`` (the member: ``{group, rule, uuid, name,
host, leaving, violated, time}``) and ``groupof/<uuid>`` (``{group}``: which
group a VM is in, so that a move finds its group from the uuid alone).

The rule, :func:`allows`, is the one every placement decision applies (the
``claim`` and ``claim_move`` requests, the planners of ``balance`` and of
``--dry-run``):

- ``spread``: a host holding another member (where it is, or where it is
  leaving from during a move) is refused;
- ``together``: only the hosts of the other members that can still take a
  VM (alive, not drained, not the host a move leaves); when none can (the
  group's host died or is being evacuated), any host, and the others follow
  the first to move.

Promises:
- :func:`join` writes a member only while no other member of its group
  changed since the rule was checked (one transaction guarded by the
  group's range): two concurrent claims never both pass a rule that only
  one of them may pass; the loser checks again and places anew;
- a member records where its VM is held (``host``) and, during a move,
  the host it leaves (``leaving``), so a rule counts both;
- ``violated``: the member's host breaks the rule (only an HA restart that
  had no other choice places it so, see docs/placement.md); a later move
  that keeps the rule clears it.
"""
from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable

from engine.core import keys
from engine.core.store import Delete, Put, untouched_since
from engine.core.values import declare, readable, shape
from engine.errors import Conflict, RequestError, UsageError

__all__ = ["RULES", "MEMBER", "check_name", "check_rule", "allows", "occupied", "read_group",
           "read_groups", "group_of", "join", "leave_ops", "member_doc", "rule_of"]

RULES = ("spread", "together")
RACES = 20

MEMBER = shape("group member", group=str, rule=str, uuid=str, name=str, host=str)
GROUP_OF = shape("VM's group", group=str)
declare(keys.group() + "*", MEMBER)
declare(keys.group_of() + "*", GROUP_OF)

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")


def check_name(name) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise UsageError(f"bad group name {name!r}: want letters, digits, '_', '.', '-' "
                         "(at most 63, starting with a letter or digit)")
    return name


def check_rule(rule) -> str:
    if rule not in RULES:
        raise UsageError(f"bad group rule {rule!r}: want {' or '.join(RULES)}")
    return rule


def occupied(members: dict, uuid: str | None = None) -> dict[str, str]:
    """Host -> the name of a member there (its ``host``, or the ``leaving``
    of a member being moved), ``uuid``'s own member left out."""
    taken: dict[str, str] = {}
    for member in members.values():
        if member["uuid"] == uuid:
            continue
        for host in (member.get("host"), member.get("leaving")):
            if host:
                taken.setdefault(host, member["name"])
    return taken


def allows(rule: str, taken: dict[str, str] | Iterable[str],
           usable: Callable[[str], bool] = lambda host: True) -> Callable[[str], bool]:
    """The rule as a test of a host: ``taken`` are the hosts of the other
    members (:func:`occupied`); ``usable(host)``: can that host still take a
    VM (together: a group whose hosts cannot is free to go anywhere)."""
    taken = set(taken)
    if rule == "spread":
        return lambda host: host not in taken
    anchors = {host for host in taken if usable(host)}
    if not anchors:
        return lambda host: True
    return lambda host: host in anchors


def rule_of(members: dict) -> str | None:
    """The group's rule, as its members record it (None: no member)."""
    for member in members.values():
        return member["rule"]
    return None


def read_group(store, name: str) -> tuple[dict, int]:
    """``({uuid: member}, revision)``: the group's members, read at one
    revision (what :func:`join` guards against)."""
    kvs, revision = store.range(keys.group(name) + "/")
    members = {}
    for kv in kvs:
        member = readable(kv)
        if member is not None:
            members[member["uuid"]] = member
    return members, revision


def read_groups(store) -> dict[str, dict]:
    """Every group: ``{name: {uuid: member}}``."""
    groups: dict[str, dict] = {}
    for kv in store.range(keys.group())[0]:
        member = readable(kv)
        if member is not None:
            groups.setdefault(member["group"], {})[member["uuid"]] = member
    return groups


def group_of(store, uuid: str) -> str | None:
    """The name of the group VM ``uuid`` is in, None if it is in none."""
    value = readable(store.get(keys.group_of(uuid)))
    return value["group"] if value else None


def member_doc(group: str, rule: str, uuid: str, name: str, host: str, *,
               leaving: str | None = None, violated: bool = False) -> dict:
    return {"group": group, "rule": rule, "uuid": uuid, "name": name, "host": host,
            "leaving": leaving, "violated": bool(violated), "time": time.time()}


def join(store, member: dict, revision: int, members: dict | None = None) -> bool:
    """Write ``member`` (and its ``groupof/``) if no member of its group
    changed since ``revision``; False when one did (check again).  The
    other ``members`` (as read at ``revision``) whose rule it mends lose
    their ``violated`` mark in the same write."""
    group, uuid = member["group"], member["uuid"]
    prefix = keys.group(group) + "/"
    return store.txn([untouched_since(prefix, _prefix_end(prefix), revision)],
                     [Put(keys.group(group, uuid), member),
                      Put(keys.group_of(uuid), {"group": group}),
                      *_mended(members or {}, member)]).succeeded


def _mended(members: dict, changed: dict) -> list:
    """Writes clearing ``violated`` on the members whose rule holds once
    ``changed`` is where it says (another member moved away from them)."""
    now = {**members, changed["uuid"]: changed}
    return [Put(keys.group(m["group"], m["uuid"]), dict(m, violated=False))
            for m in members.values() if m.get("violated") and m["uuid"] != changed["uuid"]
            and allows(m["rule"], occupied(now, m["uuid"]))(m["host"])]


def leave_ops(group: str, uuid: str) -> list:
    """The writes that take VM ``uuid`` out of ``group``."""
    return [Delete(keys.group(group, uuid)), Delete(keys.group_of(uuid))]


def place(store, group: str, rule: str | None, uuid: str, name: str,
          choose: Callable[[Callable[[str], bool], dict, str], tuple[str, object]], *,
          usable: Callable[[str], bool] = lambda host: True,
          leaving: str | None = None, may_break: bool = False):
    """Place VM ``uuid`` of ``group`` and record it there, race-free.

    ``rule``: the group's rule as asked (None: the group's own; a group
    with no member then has none and is refused).  ``choose(allowed,
    taken, rule)`` picks and claims a host that ``allowed`` accepts and
    returns ``(host, result)``; it raises :class:`RequestError` to refuse
    (its words name the group).
    ``may_break`` (an HA restart): when ``choose`` finds no allowed host,
    it is called again allowing every host, and the member is marked
    ``violated``.  Returns ``result``, once the member is written."""
    for _ in range(RACES):
        members, revision = read_group(store, group)
        have = rule_of(members)
        if rule and have and rule != have:
            raise RequestError(f"group {group!r} is {have}, not {rule}")
        rule_now = have or rule
        if rule_now is None:
            raise RequestError(f"group {group!r} has no VM left to say its rule: "
                               "boot into it with --spread or --together")
        taken = occupied(members, uuid)
        allowed = allows(rule_now, taken, usable)
        try:
            host, result = choose(allowed, taken, rule_now)
        except RequestError:
            if not may_break:
                raise
            host, result = choose(lambda host: True, taken, rule_now)
        member = member_doc(group, rule_now, uuid, name, host, leaving=leaving,
                            violated=not allowed(host))
        if join(store, member, revision, members):
            return result
    raise Conflict("concurrent_update", f"group {group!r} kept changing")


def _prefix_end(prefix: str) -> str:
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def settle(store, uuid: str, host: str | None = None) -> None:
    """A move of VM ``uuid`` ended: confirmed (``host`` None: it stays where
    its member says, and leaves nothing), or reverted (``host``: back
    there).  Nothing to do for a VM in no group."""
    group = group_of(store, uuid)
    if group is None:
        return
    for _ in range(RACES):
        members, revision = read_group(store, group)
        member = members.get(uuid)
        if member is None or (member.get("leaving") is None and host in (None, member["host"])):
            return
        where = host or member["host"]
        allowed = allows(member["rule"], occupied(members, uuid))
        settled = dict(member, host=where, leaving=None, violated=not allowed(where),
                       time=time.time())
        if join(store, settled, revision, members):
            return
    raise Conflict("concurrent_update", f"group {group!r} kept changing")
