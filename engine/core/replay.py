"""Workers as replayable generators: the deterministic heart of an automation.

A worker is a generator function ``worker(ctx, **args)`` that yields
:class:`Request` objects (or ``ctx.all([...])`` / ``ctx.first([...])`` over
requests and child workers) and receives their outcomes.  Its whole state is
a function of the history it was fed, so any peer can rebuild it from the log
in etcd.

The :class:`Replayer` is an event-sourced simulation: responses are delivered
in the order etcd committed them (their revision), and after each delivery
every worker that can move runs until it blocks again.  The live initiator and
a peer replaying after a crash feed the same responses in the same order, so
they reach the same states and yield the same requests.  Each yielded request
is identified by ``(worker path, sequence number)``; when the log already holds
that step, its fingerprint must match, otherwise the automation is *stuck*
(the code changed under a running automation) and nothing more is written.

No etcd is needed here; tests feed histories by hand.
"""
from __future__ import annotations

import hashlib
import inspect
import random
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any, Callable

import msgpack

from engine.errors import Failed, NonDeterminism, WorkerFailed

__all__ = ["Request", "Response", "Context", "Replayer", "NewRequest",
           "NonDeterminism", "WorkerFailed", "Failed", "fingerprint", "LoggedStep", "TIMER"]

# The request name of a durable timer (``ctx.sleep_until``): the initiator
# answers it itself, no executor runs it.
TIMER = "sleep"
TIMER_DEADLINE = 10 * 365 * 86400.0

_NAMESPACE = uuidlib.UUID("5f1b9c62-4c3e-4e8e-9a57-0c9f1d6b7a21")


@dataclass(frozen=True)
class Request:
    """One stateless, idempotent step run by ``target`` (or the initiator)."""
    name: str
    args: dict = field(default_factory=dict)
    target: str | None = None
    deadline: float = 60.0          # seconds until a `timeout` response
    label: str | None = None        # what progress views group by (VM, host)
    # A local step's response normally rides on the next append (one
    # transaction per step); True writes it as soon as the step ran, so that
    # a crash of the initiator right after cannot make the worker send it
    # again (events that hooks count, such as a lease's start and end).
    write_at_once: bool = False


@dataclass(frozen=True)
class Response:
    status: str                     # ok | error | timeout | lost
    value: Any = None
    error: str | None = None
    executor: str | None = None
    time: float = 0.0               # when it was written (executor's clock)
    revision: int = 0               # etcd revision it landed at: the delivery order
    requested: float = 0.0          # when the request was appended (initiator's clock)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class LoggedStep:
    """What the log holds for one step."""
    index: int
    worker: str
    seq: int
    fingerprint: str
    description: str = ""
    # What was logged, when known, so that a mismatch can say what differs.
    worker_name: str | None = None
    request: str | None = None
    target: str | None = None
    args: Any = None


@dataclass(frozen=True)
class NewRequest:
    """A step the workers yielded that the log does not hold yet."""
    worker: str
    seq: int
    worker_name: str
    request: Request
    fingerprint: str


class _WorkerBug(Exception):
    """What a worker yielded, or how it was called, cannot be run: a bug in
    the worker's code.  The whole automation fails (every replay alike)."""


def fingerprint(worker_name: str, request: Request) -> str:
    blob = msgpack.packb([worker_name, request.name, request.target,
                          _canonical(request.args)], use_bin_type=True)
    return hashlib.sha1(blob).hexdigest()[:16]


def _short(value, limit: int = 80) -> str:
    """What a worker yielded, the same on every replay (no memory addresses)."""
    if isinstance(value, Request):
        return f"request {value.name}{'@' + value.target if value.target else ''}"
    text = repr(value)
    if " at 0x" in text:
        return f"a {type(value).__name__}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _describe(name: str, path: str, exc: Exception) -> str:
    """A worker's unexpected exception, naming the worker."""
    return f"worker {name} ({path}) raised {type(exc).__name__}: {exc}"


def _mismatch(step: LoggedStep, frame, seq: int, yielded: Request) -> str:
    """Why a re-yielded step differs from the logged one, naming the step."""
    where = f"step {step.index} (worker {frame.path} {frame.name}, call {seq})"
    now = f"{yielded.name}{'@' + yielded.target if yielded.target else ''}"
    same_request = step.request == yielded.name and step.target == yielded.target
    if same_request and _canonical(step.args) != _canonical(yielded.args):
        return (f"{where}: the arguments of {now} differ: the log holds "
                f"{_shorten(step.args)} but the code now yields {_shorten(yielded.args)}")
    if same_request and step.worker_name not in (None, frame.name):
        return (f"{where}: the log holds {now} from worker {step.worker_name} "
                f"but the code now yields it from worker {frame.name}")
    return (f"{where}: the log holds {step.description or step.fingerprint} "
            f"but the code now yields {now}")


def _shorten(value, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _canonical(value):
    if isinstance(value, dict):
        return sorted((str(k), _canonical(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


# -- what workers yield -------------------------------------------------------

@dataclass
class _Child:
    func: Callable
    args: tuple
    kwargs: dict
    label: str | None


@dataclass
class _All:
    items: list


@dataclass
class _First:
    items: list


class Context:
    """Handed to every worker: deterministic helpers and fan-out."""

    def __init__(self, automation_id: str, path: str, version: int, created: float,
                 label: str | None, replayer: "Replayer"):
        self.automation_id = automation_id
        self.path = path
        self.version = version
        self.label = label
        self._replayer = replayer
        self._created = created
        self.random = random.Random(f"{automation_id}/{path}")

    def now(self) -> float:
        """Time of the latest response delivered: the same on every replay."""
        return self._replayer.clock or self._created

    @property
    def aborted(self) -> bool:
        """``abort`` was asked and this automation cleans up (see
        :func:`engine.core.registry.automation`): the workers should undo
        what they must and stop starting new work.  It turns true at a
        logged point, so every replay sees it at the same place."""
        return self._replayer.aborted

    def sleep_until(self, when: float, label: str | None = None) -> Request:
        """A durable timer: yield it to sleep until epoch time ``when``.

        The wake-up time is logged with the step, and the initiator (any
        member that leads, after any crash) answers it at that time, at once
        when the time has passed.  The answer is ``{"woke": why, "at": t,
        "why": [...]}``: ``why`` is ``"time"``, ``"nudge"`` (someone called
        :func:`engine.core.api.nudge`; ``why`` lists what they said) or
        ``"abort"`` (an automation that cleans up was aborted).  Like every
        response it is logged, so each replay wakes the worker once, at the
        same point, and ``ctx.now()`` advances to the logged time."""
        return Request(TIMER, {"until": float(when)}, None, TIMER_DEADLINE,
                       label if label is not None else self.label)

    def uuid(self, name: str) -> str:
        """A uuid derived from the automation, stable across replays."""
        return str(uuidlib.uuid5(_NAMESPACE, f"{self.automation_id}/{name}"))

    def worker(self, func: Callable, *args, label: str | None = None, **kwargs) -> _Child:
        return _Child(func, args, kwargs, label)

    def all(self, items) -> _All:
        """Wait for every item; the result is the list of their outcomes."""
        return _All(list(items))

    def first(self, items) -> _First:
        """Wait for the first item to finish: ``(position, outcome)``."""
        return _First(list(items))


# -- the simulation -----------------------------------------------------------

class _Node:
    """Something a worker waits on."""
    resolved = False
    value: Any = None
    error: str | None = None


class _RequestNode(_Node):
    def __init__(self, key):
        self.key = key


class _ChildNode(_Node):
    def __init__(self, frame: "_Frame"):
        self.frame = frame


class _GroupNode(_Node):
    def __init__(self, children: list[_Node], first: bool):
        self.children = children
        self.first = first


class _Frame:
    def __init__(self, path, name, generator, ctx, parent_node=None):
        self.path = path
        self.name = name
        self.generator = generator
        self.ctx = ctx
        self.seq = 0
        self.children = 0
        self.waiting: _Node | None = None
        self.finished = False
        self.node = parent_node         # the _ChildNode a parent waits on


class Replayer:
    """Drives a worker tree from a history of logged steps and responses."""

    def __init__(self, automation_id: str, worker: Callable, args: dict,
                 version: int = 1, created: float = 0.0,
                 logged: dict[tuple[str, int], LoggedStep] | None = None):
        self.automation_id = automation_id
        self.version = version
        self.created = created
        self.clock = 0.0
        self.logged: dict[tuple[str, int], LoggedStep] = {}
        # For spotting a worker that now yields fewer steps than the log holds:
        # path -> the steps logged for it; path -> its children with logged steps.
        self._logged_by_path: dict[str, list[LoggedStep]] = {}
        self._logged_children: dict[str, dict[int, LoggedStep]] = {}
        for step in (logged or {}).values():
            self._note_logged(step)
        self.new: list[NewRequest] = []         # yielded, not in the log yet
        self.finished = False
        self.aborted = False
        self.result: Any = None
        self.error: str | None = None
        self._responses: dict[int, Response] = {}
        self._waiting_requests: dict[int, _RequestNode] = {}
        self._unbound: dict[tuple[str, int], _RequestNode] = {}
        self._runnable: list[tuple[_Frame, Any, str | None]] = []
        self.broken = False             # a worker bug ended it: nothing runs any more
        self.root: _Frame | None = None
        try:
            self.root = self._spawn("0", worker, (), dict(args), None, None)
        except _WorkerBug as exc:
            self._broken(str(exc))
        self._run()

    # -- feeding ------------------------------------------------------------

    def bind(self, step: LoggedStep) -> None:
        """The log now holds ``step`` (appended by us after a NewRequest)."""
        self._note_logged(step)
        node = self._unbound.pop((step.worker, step.seq), None)
        if node is not None:
            self._attach(node, step.index)
            self._run()

    def deliver(self, index: int, response: Response) -> None:
        """Feed one response, in revision order, and run what it unblocks."""
        if index in self._responses:
            return
        self._responses[index] = response
        self.clock = max(self.clock, response.time)
        node = self._waiting_requests.pop(index, None)
        if node is not None:
            self._resolve(node, response, None)
            self._run()

    def deliver_abort(self) -> None:
        """The workers are told of an abort: ``ctx.aborted`` is true from here
        on (fed in revision order among the responses, like them)."""
        self.aborted = True

    def take_new(self) -> list[NewRequest]:
        if self.broken:
            self.new.clear()
        new, self.new = self.new, []
        return new

    # -- internals ----------------------------------------------------------

    def _broken(self, error: str) -> None:
        """A worker bug: the automation fails now, whatever else was running."""
        self.finished, self.result, self.error = True, None, error
        self.broken = True
        self._runnable.clear()
        self.new.clear()

    def _spawn(self, path, func, args, kwargs, label, node) -> _Frame:
        ctx = Context(self.automation_id, path, self.version, self.created, label, self)
        name = getattr(func, "__name__", repr(func))
        if not callable(func):
            raise _WorkerBug(f"worker {name} ({path}) cannot run: {func!r} is not callable")
        plain = not inspect.isgeneratorfunction(func)
        try:
            generator = func(ctx, *args, **kwargs)
        except Exception as exc:
            if not plain:       # calling a generator function only binds the arguments
                raise _WorkerBug(f"worker {name} ({path}) cannot start: "
                                 f"{type(exc).__name__}: {exc}") from None
            generator, error = None, _describe(name, path, exc)
        else:
            error = None
        frame = _Frame(path, name, generator, ctx, node)
        if error is not None or not hasattr(generator, "send"):   # a plain function: done at once
            self._frame_done(frame, None if error else generator, error)
            return frame
        self._runnable.append((frame, None, None))
        return frame

    def _run(self):
        while self._runnable and not self.broken:
            frame, value, error = self._runnable.pop(0)
            self._step(frame, value, error)

    def _step(self, frame: _Frame, value, error):
        try:
            if error is not None:
                yielded = frame.generator.throw(WorkerFailed(error))
            else:
                yielded = frame.generator.send(value)
        except StopIteration as stop:
            self._frame_done(frame, stop.value, None)
            return
        except NonDeterminism:
            raise
        except WorkerFailed as exc:
            self._frame_done(frame, None, str(exc))
            return
        except Failed as exc:
            self._frame_done(frame, exc.result, str(exc))
            return
        except Exception as exc:    # the worker failed: its parent hears of it
            self._frame_done(frame, None, _describe(frame.name, frame.path, exc))
            return
        try:
            node = self._node_for(frame, yielded)
        except NonDeterminism:
            raise
        except _WorkerBug as exc:
            self._broken(str(exc))
            return
        except Exception as exc:    # e.g. arguments msgpack cannot carry
            self._broken(f"worker {frame.name} ({frame.path}) yielded {_short(yielded)}: "
                         f"{type(exc).__name__}: {exc}")
            return
        if node.resolved:
            self._runnable.append((frame, node.value, node.error))
        else:
            frame.waiting = node

    def _note_logged(self, step: LoggedStep) -> None:
        self.logged[(step.worker, step.seq)] = step
        self._logged_by_path.setdefault(step.worker, []).append(step)
        path = step.worker
        while "." in path:
            parent, _, position = path.rpartition(".")
            known = self._logged_children.setdefault(parent, {})
            first = known.get(int(position))
            if first is None or step.index < first.index:
                known[int(position)] = step
            path = parent

    def _check_nothing_left(self, frame: _Frame) -> None:
        """A worker that ends while the log holds steps it (or a child it no
        longer starts) yielded before: the code changed under the log."""
        left = [(step, None) for step in self._logged_by_path.get(frame.path, ())
                if step.seq >= frame.seq]
        left += [(step, f"{frame.path}.{position}")
                 for position, step in self._logged_children.get(frame.path, {}).items()
                 if position >= frame.children]
        if not left:
            return
        step, child = min(left, key=lambda item: item[0].index)
        held = step.description or step.fingerprint
        if child is None:
            raise NonDeterminism(
                f"step {step.index} (worker {frame.path} {frame.name}, call {step.seq}): "
                f"the log holds {held} but the code now ends the worker before yielding it")
        raise NonDeterminism(
            f"step {step.index} (worker {step.worker}, call {step.seq}): the log holds {held} "
            f"but worker {frame.path} {frame.name} now ends without starting worker {child}")

    def _frame_done(self, frame, result, error):
        frame.finished = True
        self._check_nothing_left(frame)
        if frame.node is not None:
            self._resolve(frame.node, result, error)
        elif frame.path == "0":
            self.finished, self.result, self.error = True, result, error

    def _node_for(self, frame: _Frame, yielded) -> _Node:
        if isinstance(yielded, Request):
            key = (frame.path, frame.seq)
            frame.seq += 1
            node = _RequestNode(key)
            node.owner = frame
            fp = fingerprint(frame.name, yielded)
            step = self.logged.get(key)
            if step is None:
                self._unbound[key] = node
                self.new.append(NewRequest(frame.path, key[1], frame.name, yielded, fp))
            else:
                if step.fingerprint != fp:
                    raise NonDeterminism(_mismatch(step, frame, key[1], yielded))
                self._attach(node, step.index)
            return node
        if isinstance(yielded, _Child):
            child_path = f"{frame.path}.{frame.children}"
            frame.children += 1
            node = _ChildNode(None)
            node.owner = frame
            node.frame = self._spawn(child_path, yielded.func, yielded.args,
                                     yielded.kwargs, yielded.label, node)
            return node
        if isinstance(yielded, (_All, _First)):
            children = [self._node_for(frame, item) for item in yielded.items]
            group = _GroupNode(children, isinstance(yielded, _First))
            group.owner = frame
            for child in children:
                child.group = group
            self._check_group(group)
            return group
        raise _WorkerBug(f"worker {frame.name} ({frame.path}) yielded {_short(yielded)}: "
                         "yield a Request, ctx.worker(...), ctx.all(...) or ctx.first(...)")

    def _attach(self, node: _RequestNode, index: int):
        response = self._responses.get(index)
        if response is not None:
            self._resolve(node, response, None)
        else:
            self._waiting_requests[index] = node

    def _resolve(self, node: _Node, value, error):
        if node.resolved:
            return
        node.resolved, node.value, node.error = True, value, error
        group = getattr(node, "group", None)
        if group is not None:
            self._check_group(group)
        else:
            self._wake(node)

    def _check_group(self, group: _GroupNode):
        if group.resolved:
            return
        if group.first:
            done = [(i, c) for i, c in enumerate(group.children) if c.resolved]
            if not done:
                return
            position, child = done[0]
            self._resolve_group(group, (position, child.value), child.error)
        elif all(c.resolved for c in group.children):
            errors = [c.error for c in group.children if c.error]
            self._resolve_group(group, [c.value for c in group.children],
                                "; ".join(errors) if errors else None)

    def _resolve_group(self, group, value, error):
        group.resolved, group.value, group.error = True, value, error
        outer = getattr(group, "group", None)
        if outer is not None:
            self._check_group(outer)
        else:
            self._wake(group)

    def _wake(self, node: _Node):
        frame = getattr(node, "owner", None)
        if frame is None or frame.waiting is not node or frame.finished:
            return
        frame.waiting = None
        self._runnable.append((frame, node.value, node.error))
