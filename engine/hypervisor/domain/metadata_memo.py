"""Each domain's peerctl metadata (and the running domain's maximum
memory) remembered per UUID while libvirt's events say it has not changed,
so that the scans that look at every domain (each stats tick, each
reconcile of the VM publisher) read only what changed.

Promises:

- a memo answers only while it is armed: its owner (the VM publisher) arms
  it once it listens for libvirt's lifecycle and metadata-change events on
  the host, and disarms it, forgetting everything, when that listening
  ends (a connection closed or found dead, a publisher stopped); it is
  armed afresh, empty, on a new listening.  Unarmed, every look reads
  libvirt;
- an event naming a domain forgets it (:meth:`MetadataMemo.forget`), one
  naming none forgets every domain;
- a change this process makes (``domain_xml.write_metadata``, an
  adoption's or ``unmanage``'s own ``setMetadata``) forgets the domain in
  every memo of the process at once (:func:`forget_everywhere`), not after
  the event's delay;
- a read that an event or a forget overtook is not kept: the next look
  reads libvirt again (each domain's entry carries a count of the forgets
  it went through).

What is kept is the metadata as :func:`engine.hypervisor.domain.domain_xml.read_metadata`
parsed it; callers must not change the dict they are given.
"""
from __future__ import annotations

import threading
import weakref

__all__ = ["MetadataMemo", "forget_everywhere"]

_MAX_FORGETS = 4096     # domains whose forgets are counted, at most

_memos: "weakref.WeakSet" = weakref.WeakSet()
_memos_guard = threading.Lock()


class MetadataMemo:
    def __init__(self):
        self._lock = threading.Lock()
        self._armed = False
        self._kept: dict[str, dict] = {}        # uuid -> {what: value}
        self._forgets: dict[str, int] = {}      # uuid -> forgets seen (a read's ticket)
        self._epoch = 0                         # bumped by each forget of everything
        self.reads = 0                          # libvirt reads made through this memo
        with _memos_guard:
            _memos.add(self)

    @property
    def armed(self) -> bool:
        return self._armed

    def arm(self) -> None:
        """Events are listened for from now on: start remembering, empty."""
        with self._lock:
            self._kept.clear()
            self._epoch += 1
            self._armed = True

    def disarm(self) -> None:
        """Events may be missed from now on: forget all, remember nothing."""
        with self._lock:
            self._armed = False
            self._kept.clear()
            self._epoch += 1

    def forget(self, uuid: str | None = None) -> None:
        """Domain ``uuid`` may have changed (None: any domain may have)."""
        with self._lock:
            if uuid is None:
                self._kept.clear()
                self._epoch += 1
            else:
                self._kept.pop(uuid, None)
                self._forgets[uuid] = self._forgets.get(uuid, 0) + 1

    def read(self, uuid: str, reader, what: str = "metadata"):
        """Domain ``uuid``'s ``what`` (its metadata, or another fact only a
        lifecycle or metadata event changes, such as a running domain's
        maximum memory): as remembered, else ``reader()`` (kept when no
        forget came meanwhile and the memo is armed)."""
        with self._lock:
            kept = self._kept.get(uuid)
            if kept is not None and what in kept:
                return kept[what]
            ticket = (self._armed, self._epoch, self._forgets.get(uuid, 0))
        value = reader()
        self.reads += 1
        with self._lock:
            if ticket[0] and ticket == (self._armed, self._epoch, self._forgets.get(uuid, 0)):
                self._kept.setdefault(uuid, {})[what] = value
        return value

    def known(self, uuids) -> None:
        """Forget the domains not in ``uuids`` (gone from a whole listing),
        so that what is kept stays as small as the host."""
        with self._lock:
            for uuid in set(self._kept) - set(uuids):
                del self._kept[uuid]
            if len(self._forgets) > _MAX_FORGETS:
                self._forgets.clear()
                self._epoch += 1        # reads in flight then are not kept


def forget_everywhere(uuid: str) -> None:
    """This process changed domain ``uuid``'s metadata: every memo forgets it."""
    with _memos_guard:
        memos = list(_memos)
    for memo in memos:
        memo.forget(uuid)
