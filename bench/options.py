"""What every benchmark's command line shares: a bad option is one line on
stderr naming the benchmark (``bench/<name>.py: ...``), exit 2, and nothing
started; a run stopped by SIGTERM, Ctrl-C or a wait's deadline is one line
too, once it has cleaned up (:func:`ends_in_one_line`)."""
from __future__ import annotations

import argparse
import contextlib
import signal
import sys

__all__ = ["BadInput", "positive", "whole", "numbers", "ends_in_one_line", "held"]


class BadInput(argparse.ArgumentParser):
    """Bad options: one line and exit 2, nothing started."""

    def error(self, message):
        self.exit(2, f"bench/{self.prog}: {message}\n")


def positive(text: str) -> int:
    """A whole number of at least 1, for an option's ``type``."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is less than 1")
    return value


def whole(low: int, high: int, what: str):
    """An option's type: one whole number from ``low`` to ``high``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{what} from {low} to {high}: {text!r}")
        return value
    return parse


def numbers(low: int, high: int, what: str):
    """An option's type: comma-separated whole numbers from ``low`` to ``high``."""
    def parse(text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a list of {what}: {text!r}") from None
        if any(not low <= v <= high for v in values):
            raise argparse.ArgumentTypeError(f"{what} from {low} to {high}: {text!r}")
        return values
    return parse


_HOLD = {"depth": 0, "pending": None}      # see held()


@contextlib.contextmanager
def ends_in_one_line(name: str):
    """The run of ``bench/<name>.py`` inside (or a decorated ``main``):
    SIGTERM and Ctrl-C end it with "terminated" or "interrupted (everything
    it started is gone)", a wait that timed out (AssertionError) with its
    message; each one line, after the cleanup of the ``finally`` clauses
    inside.  Inside :func:`held`, a signal waits for the block's end."""
    def end(signum, _frame=None):
        if _HOLD["depth"]:
            _HOLD["pending"] = signum
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        else:
            sys.exit(f"bench/{name}.py: terminated (everything it started is gone)")
    _HOLD["end"] = end
    signal.signal(signal.SIGTERM, end)
    signal.signal(signal.SIGINT, end)
    try:
        yield
    except KeyboardInterrupt:
        raise SystemExit(f"bench/{name}.py: interrupted (everything it started is gone)") \
            from None
    except AssertionError as exc:       # a wait timed out: the run stops
        raise SystemExit(f"bench/{name}.py: {exc}") from None


@contextlib.contextmanager
def held():
    """SIGTERM and Ctrl-C wait until the block is over: a process started
    inside is on the run's list (for its cleanup) before the run can end."""
    _HOLD["depth"] += 1
    try:
        yield
    finally:
        _HOLD["depth"] -= 1
        pending, _HOLD["pending"] = _HOLD["pending"], None
        if pending is not None and not _HOLD["depth"]:
            _HOLD["end"](pending)
