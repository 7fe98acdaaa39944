"""What the tests share, and the one place they share it from.

- this package: :data:`ROOT`, :data:`PEERCTL`, :data:`TEST_AUTOMATIONS`,
  :func:`wait_for`, the one poll-until-true every test uses, and
  :func:`wait_until`, the same poll that returns what it read once it is
  acceptable; :func:`last_write`, what proves that nothing was written;
- :mod:`.cluster`: real peer processes and the real command line
  (``Cluster``, ``start_peers``, ``alive``, ``finished``);
- :mod:`.hooks`: request hooks that count, record or fail executions;
- :mod:`.handlers`: request handlers called in this process, on a host of the
  test's own (``host`` fixture, ``call``);
- :mod:`.image_sources`: the image sources a test lists for its own image
  directory or loopback server (``allow_images``);
- :mod:`.history`: an in-memory executor for replay tests, no etcd;
  :mod:`.etcd_history`: etcd's own history of a prefix, event by event;
- :mod:`.raw`: bytes put into etcd as they are, past peerctl's encoding;
- :mod:`.terminal`: a command on a pty of its own;
- :mod:`.placement`: the placement fixtures, one contract over two backends;
  :mod:`.placement_server` serves a real OpenStack Placement,
  :mod:`.placement_claimer` is a claiming process (run by path);
- :mod:`.qemu_guest`: the real-QEMU tier's guest, and why it is skipped.
- :mod:`.libvirtd_pair`: two private libvirtd daemons, two KVM hosts on this
  machine (``libvirtd_pair`` fixture).
- :mod:`.nspawn`: a debootstrapped bookworm booted under systemd
  (``systemd-nspawn -b``), where the .deb is installed (``Machine``).
- :mod:`.api_client`: the HTTP API's client (JSON calls, ``/v1/events``);
  :mod:`.api_server`: the API served from the test's process, and the
  browser the page's tests drive; :mod:`.secured_etcd`: a TLS etcd with
  roles on and a certificate per role.
- :mod:`.releases`: releases of peerctl built from the working tree;
  :mod:`.carry_worker`: a process that saves or restores the test driver's
  domains; :mod:`.bench_runs`: a benchmark's smoke run and bad options,
  checked (:mod:`.bench_leftovers`: what a run may leave behind).

Test modules import from here, never from each other.
"""
from __future__ import annotations

import os
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PEERCTL = os.path.join(ROOT, "peerctl.py")
# Automations only tests register (PEERCTL_AUTOMATIONS_PATH names it).
TEST_AUTOMATIONS = os.path.join(ROOT, "tests", "automations")

__all__ = ["ROOT", "PEERCTL", "TEST_AUTOMATIONS", "freeze", "one_line", "only_line",
           "wait_for", "wait_until"]


def one_line(done) -> str:
    """The one line a finished command said on stderr (blank lines aside),
    with no traceback."""
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    return lines[0]


def only_line(done) -> str:
    """:func:`one_line`, and nothing on stdout."""
    assert done.stdout == "", done.stdout
    return one_line(done)


def wait_for(predicate, timeout=20.0, interval=0.05, what="condition"):
    """Poll ``predicate`` until it returns a truthy value (returned) or
    ``timeout`` seconds pass (AssertionError naming ``what``)."""
    return wait_until(predicate, bool, timeout=timeout, interval=interval, what=what)


def wait_until(read, accept, timeout=20.0, interval=0.05, what="condition"):
    """Poll ``read()`` until ``accept`` holds for what it read, and return
    that; after ``timeout`` seconds, AssertionError naming ``what``.

        task = wait_until(lambda: api.get_task(store, id), lambda t: t["log"],
                          what="the first step")
    """
    deadline = time.monotonic() + timeout
    while True:
        began = time.monotonic()
        value = read()
        if accept(value):
            return value
        now = time.monotonic()
        if now > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        # A read that costs a process (a command) is polled at most half
        # the time: the machine's CPUs go to what the test waits for.
        time.sleep(max(interval, min(now - began, 0.5)) if interval else 0)


def last_write(store) -> tuple[int, int]:
    """What changes with any write to the store's cluster: the newest mod
    revision of its keys and how many there are (a delete).  etcd's own
    revision is the whole server's, which other tests' leases move as they
    expire: equal before and after, this says nothing was written here."""
    kvs, _ = store.range("", keys_only=True)
    return max((kv.mod_revision for kv in kvs), default=0), len(kvs)


def revisions_since(store, revision: int) -> set[int]:
    """The revisions after ``revision`` at which keys of the store's cluster
    were last written: one per transaction that wrote them (unless a later
    one wrote the same keys again).  etcd's own revision is the whole
    server's, which other tests' leases move as they expire."""
    kvs, _ = store.range("")
    return {kv.mod_revision for kv in kvs if kv.mod_revision > revision}


def freeze(pid: int) -> None:
    """SIGSTOP process ``pid`` and return once every one of its threads has
    stopped (kill() returns before a busy multi-threaded process, etcd, is
    stopped: it may still answer what was sent meanwhile)."""
    import signal
    os.kill(pid, signal.SIGSTOP)

    def states():
        found = []
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/stat", "rb") as f:
                    found.append(f.read().rsplit(b")", 1)[1].split()[0])
            except OSError:
                pass            # a thread that ended
        return found
    wait_for(lambda: all(state in (b"T", b"t") for state in states()),
             what=f"every thread of process {pid} to stop")
