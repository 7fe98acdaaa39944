"""The graphs a peer keeps of its own host and of the VMs on it: CPU,
memory, disk and network over the last hour (10 s points) and the last day
(5 min points, the averages of the 10 s samples), in memory, as RRD files
keep them (:class:`~engine.core.ring.History`); nothing is written to etcd
or disk.

What is put is a :class:`Reading` per subject (the host, each VM by UUID):
cumulative counters (CPU seconds, bytes read, written, received, sent) and
the memory in use; the series kept (:data:`SERIES`) are rates between two
readings, and the memory as read.  Promises:

- a figure not measured is absent (None when read), never zero: a counter
  missing from either of two readings, or one that went back (a VM
  restarted), gives no rate for that sample; a VM's first reading gives
  its memory but no rates;
- memory is bounded: a fixed amount per subject (about 16 KB, measured
  by ``bench/graphs.py``; docs/page.md, "Graphs"), at most :data:`MOST_VMS` VMs (the
  longest unseen is forgotten for a new one), and a VM not read for
  :data:`FORGET_AFTER` seconds (it left the host, or was destroyed) is
  forgotten;
- a VM on the host whose series are not kept yet (it just arrived, or the
  sampler just started) reads as all absent, in the same shape.

:class:`Graphs` is safe to put into from one thread while others read."""
from __future__ import annotations

import dataclasses
import math
import threading

from engine.core.ring import NAN, History

__all__ = ["Graphs", "Reading", "SERIES", "SPANS", "STEP", "FORGET_AFTER", "MOST_VMS"]

SERIES = ("cpu_pct", "mem_bytes", "disk_read_bytes_per_s", "disk_write_bytes_per_s",
          "net_rx_bytes_per_s", "net_tx_bytes_per_s")
STEP = 10.0                 # seconds between two samples: the hour's resolution
COARSE_STEP = 300.0         # the day's
SPANS = {"hour": ("fine", STEP), "day": ("coarse", COARSE_STEP)}
FORGET_AFTER = 3600.0       # a VM not read for this long has left: its series go
MOST_VMS = 1000             # VMs kept at most; the longest unseen goes for a new one
_DIGITS = (1, 0, 0, 0, 0, 0)    # each series' decimals when read


@dataclasses.dataclass(frozen=True)
class Reading:
    """What was read of a subject at one time; None: not measured.
    ``cpu_s`` is CPU seconds used since some start, ``cpus`` how many CPUs
    100 % is; the four byte counters count since some start too;
    ``mem_bytes`` is the memory in use now."""
    cpu_s: float | None = None
    cpus: int = 1
    mem_bytes: float | None = None
    disk_read: float | None = None
    disk_written: float | None = None
    net_rx: float | None = None
    net_tx: float | None = None


_COUNTERS = ("disk_read", "disk_written", "net_rx", "net_tx")


def _rate(before, now, seconds: float) -> float:
    if before is None or now is None or now < before:
        return NAN
    return (now - before) / seconds


def _row(before: Reading | None, now: Reading, seconds: float) -> list[float]:
    """The series' values from two readings ``seconds`` apart."""
    mem = NAN if now.mem_bytes is None else float(now.mem_bytes)
    if before is None or seconds <= 0:
        return [NAN, mem, NAN, NAN, NAN, NAN]
    cpu = _rate(before.cpu_s, now.cpu_s, seconds)
    cpu = min(max(cpu * 100.0 / max(now.cpus, 1), 0.0), 100.0) if not math.isnan(cpu) else NAN
    return [cpu, mem, *(_rate(getattr(before, name), getattr(now, name), seconds)
                        for name in _COUNTERS)]


class _Subject:
    __slots__ = ("history", "reading", "read_at")

    def __init__(self):
        self.history = History(len(SERIES), STEP, int(3600 // STEP),
                               COARSE_STEP, int(86400 // COARSE_STEP))
        self.reading: Reading | None = None
        self.read_at = 0.0


class Graphs:
    """``host``'s series and those of the VMs on it."""

    def __init__(self, host: str, forget_after: float = FORGET_AFTER, most_vms: int = MOST_VMS):
        self.host = host
        self.forget_after, self.most_vms = forget_after, most_vms
        self._host = _Subject()
        self._vms: dict[str, _Subject] = {}
        self._lock = threading.Lock()

    def put(self, t: float, host: Reading | None, vms: dict[str, Reading]) -> None:
        """The readings of time ``t`` (epoch seconds): the host's (None: not
        read), and ``{uuid: Reading}`` of the VMs read (a VM not among them
        was not read this time)."""
        with self._lock:
            if host is not None:
                _note(self._host, t, host)
            for uuid, reading in vms.items():
                subject = self._vms.get(uuid)
                if subject is None:
                    self._make_room()
                    subject = self._vms[uuid] = _Subject()
                _note(subject, t, reading)
            for uuid in [u for u, s in self._vms.items() if t - s.read_at > self.forget_after]:
                del self._vms[uuid]

    def _make_room(self) -> None:
        if len(self._vms) >= self.most_vms:
            del self._vms[min(self._vms, key=lambda uuid: self._vms[uuid].read_at)]

    def vms(self) -> set[str]:
        """The UUIDs of the VMs whose series are kept."""
        with self._lock:
            return set(self._vms)

    def host_series(self, span: str, now: float) -> dict:
        """``{span, step_s, start, series}`` of the host (see :func:`_answer`)."""
        with self._lock:
            return _answer(self._host, span, now)

    def vm_series(self, uuid: str, span: str, now: float) -> dict:
        """The same of the VM ``uuid``: all absent when none are kept."""
        with self._lock:
            return _answer(self._vms.get(uuid) or _EMPTY, span, now)


def _note(subject: _Subject, t: float, reading: Reading) -> None:
    subject.history.put(t, _row(subject.reading, reading, t - subject.read_at))
    subject.reading, subject.read_at = reading, t


_EMPTY = _Subject()         # never put into: what a VM with no series reads as


def _answer(subject: _Subject, span: str, now: float) -> dict:
    """``{span, step_s, start, series: {name: [value or None, ...]}}``: point
    ``i`` of every series is at ``start + i * step_s`` (epoch seconds), the
    last one the step of ``now``."""
    ring, step = SPANS[span]
    start, columns = getattr(subject.history, ring).read(now)
    return {"span": span, "step_s": int(step), "start": int(start),
            "series": {name: [None if v is None else (round(v, digits) if digits else round(v))
                              for v in column]
                       for name, digits, column in zip(SERIES, _DIGITS, columns)}}
