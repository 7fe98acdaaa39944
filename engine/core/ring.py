"""Fixed-size ring buffers of measurements in wall-clock time, as RRD files
keep them: what the graphs of a host and of its VMs are drawn from.

A :class:`Ring` holds ``slots`` rows of ``width`` values, one row per
``step`` seconds of wall time (the row of time ``t`` is slot ``t // step``),
the newest row overwriting the oldest.  A :class:`History` is two rings
over the same series: a fine one (the last hour at 10 s) and a coarse one
(the last day at 5 min) whose rows are the averages of the fine samples
that fell in them.

Promises:
- the memory is fixed when the ring is made: ``slots * width`` 4-byte
  floats (``array('f')``), whatever is put in it and for however long;
- a value not measured is NaN when put and ``None`` when read: absent,
  never zero; a row no sample reached (the sampler paused, the clock
  jumped ahead) reads as absent too, and so does a row older than the
  ring's span;
- a sample for a slot already written replaces it; one older than the
  ring's span is ignored;
- a coarse row is the mean of the values present among the fine samples
  of its slot (absent when none was), current after every sample: the
  day's newest point is the average so far.

Nothing here reads a clock: the caller says when.
"""
from __future__ import annotations

import math
from array import array

__all__ = ["Ring", "History", "NAN"]

NAN = float("nan")


class Ring:
    """``slots`` rows of ``width`` floats, one row per ``step`` seconds."""

    __slots__ = ("step", "slots", "width", "values", "newest")

    def __init__(self, step: float, slots: int, width: int):
        if step <= 0 or slots < 1 or width < 1:
            raise ValueError(f"a ring wants a positive step, slots and width: "
                             f"{step}, {slots}, {width}")
        self.step, self.slots, self.width = step, slots, width
        self.values = array("f", [NAN]) * (slots * width)
        self.newest: int | None = None      # the slot number of the newest row written

    def put(self, t: float, row) -> None:
        """The row of time ``t``: ``width`` values, NaN for those not measured."""
        slot = int(t // self.step)
        newest = self.newest
        if newest is not None:
            if slot <= newest - self.slots:
                return                      # older than the span
            if slot > newest:               # the rows skipped since are gaps
                for gap in range(max(newest + 1, slot - self.slots + 1), slot):
                    self._write(gap, (NAN,) * self.width)
        self._write(slot, row)
        if newest is None or slot > newest:
            self.newest = slot

    def _write(self, slot: int, row) -> None:
        at = (slot % self.slots) * self.width
        self.values[at:at + self.width] = array("f", row)

    def read(self, now: float) -> tuple[float, list[list]]:
        """``(start, columns)``: the span ending with the slot of ``now``,
        oldest first; ``start`` is the time of the first row, each column
        one series' ``slots`` values (None: absent)."""
        last = int(now // self.step)
        first = last - self.slots + 1
        columns = [[None] * self.slots for _ in range(self.width)]
        newest = self.newest
        if newest is not None:
            for index, slot in enumerate(range(first, last + 1)):
                if slot > newest or slot <= newest - self.slots:
                    continue
                at = (slot % self.slots) * self.width
                for series in range(self.width):
                    value = self.values[at + series]
                    if not math.isnan(value):
                        columns[series][index] = value
        return first * self.step, columns

    def bytes(self) -> int:
        """What its values take (the rest is a few fixed fields)."""
        return self.values.itemsize * len(self.values)


class History:
    """The same ``width`` series at two resolutions: ``fine`` (``fine_step``
    seconds, ``fine_slots`` rows) and ``coarse``, the averages of the fine
    samples over ``coarse_step`` seconds."""

    __slots__ = ("fine", "coarse", "_slot", "_sums", "_counts")

    def __init__(self, width: int, fine_step: float = 10.0, fine_slots: int = 360,
                 coarse_step: float = 300.0, coarse_slots: int = 288):
        self.fine = Ring(fine_step, fine_slots, width)
        self.coarse = Ring(coarse_step, coarse_slots, width)
        self._slot: int | None = None       # the coarse slot being averaged
        self._sums = array("d", bytes(8 * width))
        self._counts = array("I", bytes(4 * width))

    def put(self, t: float, row) -> None:
        self.fine.put(t, row)
        slot = int(t // self.coarse.step)
        if self._slot is not None and slot < self._slot:
            return                          # the clock went back: the day keeps its average
        if slot != self._slot:
            self._slot = slot
            for series in range(self.coarse.width):
                self._sums[series], self._counts[series] = 0.0, 0
        for series, value in enumerate(row):
            if not math.isnan(value):
                self._sums[series] += value
                self._counts[series] += 1
        self.coarse.put(t, [self._sums[i] / self._counts[i] if self._counts[i] else NAN
                            for i in range(self.coarse.width)])

    def bytes(self) -> int:
        return (self.fine.bytes() + self.coarse.bytes()
                + self._sums.itemsize * len(self._sums)
                + self._counts.itemsize * len(self._counts))
