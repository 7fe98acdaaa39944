"""page benchmark: the web page (``/``) in Chromium, over a cluster of
1,000 VMs on 20 hosts, while VMs stop and start, each figure beside its
reference measured in the same run (issue 52).

    python bench/page.py [--peers 20] [--vms 1000] [--rate 50] [--minutes 10]
                         [--runs 3] [--idle 30] [--smoke]

Starts an etcd of its own and --peers real peers on libvirt's test driver
(``host01`` serves the API and the page on a free loopback port), boots
--vms VMs through the API (one ``POST /v1/vms``; placement spreads them),
and drives Debian's chromium headless through Playwright, logged in with a
page session of a viewer token (its cookie, as ``POST /v1/session`` sets
it).  Then, each figure with its reference and target, PASS or MISS:

- **first render**: from navigation (the document's time origin) to the VM
  list holding every VM and drawing its first rows (over 150 VMs the page
  draws only the rows in view), median of --runs navigations; reference: fetching
  and parsing ``GET /v1/vms`` in the same page.  Target: at most 1 s;
- **main thread**: while --rate VMs a second stop or start (each second,
  one ``POST /v1/vms/stop`` of --rate/2 VMs and one ``POST /v1/vms/start``
  of --rate/2 others stopped a while ago, through the API, as an operator
  would: real automations, real records, their steps on the stream too;
  a bulk boot's pace of VM events),
  the main thread's busy fraction: Chromium's ``TaskDuration`` (CDP
  ``Performance.getMetrics``) over wall time, from a minute into the
  events (the warm-up) to their end; the worst minute beside it (the
  worst second on a smoke run).
  Reference: the same page idle (the peers' own host records still
  arriving) for --idle seconds before.  Target: at most 25 %.  What came
  is counted on a second ``/v1/events`` stream of the same peer: VM record
  changes a second (a VM stopped writes its record more than once), every
  change, and messages (one per etcd revision);
- **scroll**: a programmatic scroll of the page (a step every animation
  frame, down and back, 3 s) while the events still arrive: the p95 of the
  intervals between frames; reference: the same scroll on the idle page.
  Target: at most 2 frames at 60 Hz (33.3 ms), an interval counted to the
  nearest frame (vsync's times jitter: two frames can measure 33.4 ms);
- **tab memory**: the JS heap (``JSHeapUsedSize`` after a forced
  ``HeapProfiler.collectGarbage``) at the end of the events, once the page
  has caught up with what came (a second at most half busy; how long that
  took is said), against after the warm-up (before the events when the
  page did not answer then); the heap before any event beside.  Target:
  within 10 %.  A page far behind the events may not answer a command for
  minutes: every wait for it has a deadline (a minute), and a figure it
  did not answer in time is said so, and missed.

The issue asks for an hour of events; --minutes says how long this run
has them (default 10), and the output says what was run.

``--smoke``: 2 peers, 50 VMs, 10 VMs a second for 4 s, 1 navigation:
every path in well under a minute; its figures are not the issue's.  Work
under /var/tmp/peerctl-bpage-*, removed at the end with every process the
run started (etcd, the peers, chromium), on error, SIGTERM and Ctrl-C too.
Bad options: one line, exit 2, nothing started.  Without chromium or
Playwright: one line saying which, exit 1.

The page is rewritten often: what the bench looks for in its DOM is in
:data:`PAGE`, one place.
"""
from __future__ import annotations

import asyncio
import http.client
import json
import math
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[0] = ROOT   # not bench/: its engine.py would shadow the engine package

import requests  # noqa: E402

from bench.bulk import make_room, wait  # noqa: E402
from bench.options import BadInput, ends_in_one_line, held, whole  # noqa: E402
from bench.processes import load_line, start_peer, stop_processes  # noqa: E402
from engine.core import api, sessions, tokens  # noqa: E402
from engine.core.etcd_server import EtcdServer  # noqa: E402
from engine.core.store import Store  # noqa: E402
from tests.support.api_server import CHROMIUM, browser_skip_reason  # noqa: E402

WORK = "peerctl-bpage-"                 # the work directory's prefix, under /var/tmp
CLUSTER = "page"
RESOURCES = "VCPU:1,MEMORY_MB:32,DISK_GB:1"     # bench/bulk.py's VM: make_room fits them
RENDER_TARGET_S = 1.0
BUSY_TARGET = 0.25
FRAME_MS = 1000 / 60                    # a frame at 60 Hz
FRAME_TARGET = 2                        # frames between two drawn: at most this many
# An interval counts as the whole frames it spans: animation-frame times are
# vsync's, give or take a tenth of a millisecond, so two frames can measure
# 33.4 ms.  Longer than this is a third frame missed.
FRAME_TARGET_MS = (FRAME_TARGET + 0.5) * FRAME_MS
MEMORY_TARGET = 0.10                    # the heap's change, either way
SCROLL_S = 3.0
ANSWER_S = 60.0                         # the longest the page's main thread is waited for
ISSUE_MINUTES = 60
SMOKE = {"peers": 2, "vms": 50, "rate": 10, "seconds": 4.0, "runs": 1, "idle": 2.0,
         "warmup": 1.0, "sample": 1.0, "catch_up": 20.0}
FULL = {"warmup": 60.0, "sample": 60.0, "catch_up": 120.0}

# What the bench reads of the page's DOM, in one place (the page is being
# rewritten: update these, nothing else).
PAGE = {
    "vm rows": "#vms tbody tr[data-vm]",    # the rows drawn (over 150 VMs: those in view)
    "vm count": "#vms-count",               # how many VMs the list holds
    "scrolled": ".vm-scroll",               # the element the VM list scrolls in
}
# A truthy value once the list holds every VM and shows its first rows
# (the page draws only the rows in view): when, since navigation began.
SHOWN = """(count) => document.querySelector(%s)?.textContent === String(count)
                     && document.querySelectorAll(%s).length > 0
                     && performance.now()""" % (json.dumps(PAGE["vm count"]),
                                                json.dumps(PAGE["vm rows"]))
ROWS = "() => Number(document.querySelector(%s)?.textContent || 0)" % json.dumps(
    PAGE["vm count"])
# The reference of the first render: what the page's list costs the browser.
FETCH_VMS = """async () => {
    const started = performance.now();
    const reply = await fetch("/v1/vms");
    const vms = await reply.json();
    return [performance.now() - started, vms.length];
}"""
# Intervals between animation frames while the page scrolls a step a frame.
SCROLL = """async ([selector, ms]) => {
    const scrolled = document.querySelector(selector);
    const intervals = [];
    let last = null, step = 40;
    const end = performance.now() + ms;
    await new Promise((done) => {
        function frame(now) {
            if (last !== null) intervals.push(now - last);
            last = now;
            const before = scrolled.scrollTop;
            scrolled.scrollTop += step;
            if (scrolled.scrollTop === before) step = -step;      // an end: turn back
            if (now < end) requestAnimationFrame(frame); else done();
        }
        requestAnimationFrame(frame);
    });
    return intervals;
}"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least ``q`` of them at or below."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def verdict(met: bool) -> str:
    return "PASS" if met else "MISS"


# -- the cluster ---------------------------------------------------------------------------

def start_cluster(etcd: EtcdServer, workdir: str, count: int, peers: list) -> str:
    """``count`` peers on the test driver, ``host01`` serving the API; each
    added to ``peers`` as it starts.  The API's URL once it answers."""
    port = free_port()
    env = {"PEERCTL_CONF": os.devnull}
    for i in range(1, count + 1):
        serving = ["--api", f"127.0.0.1:{port}"] if i == 1 else []
        with held():
            peers.append(start_peer(etcd.url, CLUSTER, workdir, f"host{i:02d}",
                                    "test:///default", env, args=serving))
    store = Store(etcd.url, CLUSTER)
    try:
        wait(lambda: len(api.live_hosts(store)) == count, timeout=180, interval=0.2)
        wait(lambda: len(store.range("placement/rp/", keys_only=True)[0]) >= count,
             timeout=120, interval=0.2)
    except TimeoutError:
        raise AssertionError(f"{count} peers not up in time (logs: {workdir}/host*.log)") \
            from None
    finally:
        store.close()
    url = f"http://127.0.0.1:{port}/"

    def answers():
        try:
            return requests.get(url + "v1/version", timeout=5).status_code < 500
        except requests.ConnectionError:
            return False
    try:
        wait(answers, timeout=60, interval=0.2)
    except TimeoutError:
        raise AssertionError(f"host01's API did not answer at {url}") from None
    return url


def boot(url: str, operator: requests.Session, names: list[str]) -> float:
    """Seconds to boot ``names`` through the API, one automation."""
    started = time.perf_counter()
    reply = operator.post(url + "v1/vms", json={"names": names, "resources": RESOURCES})
    if reply.status_code != 202:
        raise SystemExit(f"bench/page.py: POST /v1/vms answered {reply.status_code}: "
                         f"{reply.text[:300]}")
    waited = url + reply.headers["Location"].lstrip("/") + "/wait"
    while True:
        done = operator.get(waited, params={"timeout": "240"}, timeout=300)
        state = done.json().get("state") if done.status_code == 200 else None
        if state != "running":
            break
    if state != "done":
        raise SystemExit(f"bench/page.py: the boot ended {done.status_code} {state}: "
                         f"{done.text[:300]}")
    return time.perf_counter() - started


# -- the events --------------------------------------------------------------------------

class Churn(threading.Thread):
    """Each second, stop one batch of ``rate``/2 VMs and start the batch
    stopped half a cycle ago, through the API: ``rate`` VMs a second."""

    def __init__(self, url: str, operator: requests.Session, names: list[str], rate: int):
        super().__init__(daemon=True, name="churn")
        size = max(1, rate // 2)
        self.batches = [names[i:i + size] for i in range(0, len(names) - size + 1, size)]
        self.url, self.operator = url, operator
        self.stopping = threading.Event()
        self.asked = self.refused = 0
        self.refusals: list[str] = []

    def act(self, action: str, names: list[str]) -> None:
        try:
            reply = self.operator.post(self.url + f"v1/vms/{action}",
                                       json={"patterns": names, "yes": True}, timeout=30)
            status, text = reply.status_code, reply.text
        except requests.RequestException as exc:
            status, text = 0, str(exc)
        self.asked += 1
        if status != 202:
            self.refused += 1
            self.refusals.append(f"{action}: {status} {text[:200]}")

    def run(self):
        half = len(self.batches) // 2
        tick, due = 0, time.monotonic()
        while not self.stopping.wait(max(0.0, due - time.monotonic())):
            self.act("stop", self.batches[tick % len(self.batches)])
            if half and tick >= half:
                self.act("start", self.batches[(tick - half) % len(self.batches)])
            tick += 1
            due += 1.0

    def stop(self):
        self.stopping.set()
        if self.ident is not None:      # started
            self.join(60)


class Stream(threading.Thread):
    """A second client of ``/v1/events``: how many changes came, and when."""

    def __init__(self, url: str, secret: str):
        super().__init__(daemon=True, name="events")
        host, _, port = url.split("/")[2].rpartition(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)
        self.secret = secret
        self.times: list[tuple[float, str]] = []     # (when, kind) of each change
        self.messages: list[float] = []              # when each message (a revision) came
        self.ready = threading.Event()
        self.error: str | None = None
        self.closing = False

    def run(self):
        try:
            self.conn.request("GET", "/v1/events", headers={
                "Authorization": f"Bearer {self.secret}", "Accept": "text/event-stream"})
            reply = self.conn.getresponse()
            if reply.status != 200:
                raise RuntimeError(f"/v1/events answered {reply.status}")
            while line := reply.readline():
                if line.startswith(b"data: "):
                    now = time.monotonic()
                    self.ready.set()
                    self.messages.append(now)
                    for change in json.loads(line[6:])["changes"]:
                        self.times.append((now, change.get("kind")))
        except Exception as exc:        # said with the figures, unless it was closed
            if not self.closing:
                self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.ready.set()

    def rate(self, start: float, end: float, kind: str | None = None) -> float:
        """Changes a second between ``start`` and ``end`` (of ``kind`` only)."""
        counted = sum(1 for when, k in self.times
                      if start <= when < end and (kind is None or k == kind))
        return counted / max(end - start, 1e-9)

    def message_rate(self, start: float, end: float) -> float:
        """Messages (etcd revisions) a second between ``start`` and ``end``."""
        return sum(1 for when in self.messages if start <= when < end) / max(end - start, 1e-9)

    def close(self):
        self.closing = True
        if self.conn.sock is not None:
            try:
                self.conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.conn.close()


# -- the browser -------------------------------------------------------------------------
# The browser is driven through Playwright's async API so that every wait
# has a deadline: a page whose main thread is behind the events may not
# answer a CDP command (a forced collection) for minutes.

async def answered(call, seconds: float = ANSWER_S):
    """What ``call`` (a coroutine) returns, or None when the page has not
    answered in ``seconds``."""
    try:
        return await asyncio.wait_for(call, seconds)
    except asyncio.TimeoutError:
        return None


async def metrics(cdp) -> dict:
    """Chromium's counters of the page (the browser answers them, not the
    page's main thread: they come however busy it is)."""
    answer = await answered(cdp.send("Performance.getMetrics"))
    if answer is None:
        raise AssertionError(f"the page's metrics did not come in {ANSWER_S:.0f} s")
    return {m["name"]: m["value"] for m in answer["metrics"]}


def busy(before: dict, after: dict) -> float:
    """The main thread's busy fraction between two readings of the metrics."""
    return ((after["TaskDuration"] - before["TaskDuration"])
            / max(after["Timestamp"] - before["Timestamp"], 1e-9))


async def heap(cdp) -> float | None:
    """The JS heap in use after a forced collection, in bytes (None: the
    page did not answer in time)."""
    if await answered(cdp.send("HeapProfiler.collectGarbage")) is None:
        return None
    return (await metrics(cdp))["JSHeapUsedSize"]


async def scroll(page) -> dict | None:
    answer = await answered(page.evaluate(SCROLL, [PAGE["scrolled"], SCROLL_S * 1000]),
                            SCROLL_S + ANSWER_S)
    if not answer:
        return None
    return {"p95": percentile(answer, 0.95), "frames": len(answer),
            "long": sum(1 for i in answer if i > FRAME_TARGET_MS)}


async def first_render(page, url: str, count: int, runs: int) -> dict:
    """Navigation to every VM's row, ``runs`` times; the reference after."""
    times = []
    for _ in range(runs):
        await page.goto("about:blank")
        await page.goto(url, wait_until="commit")
        shown = await page.wait_for_function(SHOWN, arg=count, polling="raf",
                                             timeout=ANSWER_S * 1000)
        times.append(await shown.json_value() / 1000)
    fetches = []
    for _ in range(max(runs, 3)):
        took, listed = await page.evaluate(FETCH_VMS)
        if listed != count:
            raise SystemExit(f"bench/page.py: GET /v1/vms listed {listed} VMs, not {count}")
        fetches.append(took / 1000)
    return {"times": times, "fetch": statistics.median(fetches),
            "rows": await page.evaluate(ROWS)}


async def caught_up(cdp, within: float) -> float | None:
    """Seconds until the page's main thread is no longer busy with what came
    (a second at most half busy), or None after ``within`` seconds."""
    started = time.monotonic()
    previous = await metrics(cdp)
    while time.monotonic() - started < within:
        await asyncio.sleep(1.0)        # the window measured, not a wait for anything
        now = await metrics(cdp)
        if busy(previous, now) < 0.5:
            return time.monotonic() - started
        previous = now
    return None


async def watched(cdp, sizes: dict, stream: Stream) -> dict:
    """The main thread over the measured events, sampled every
    ``sizes["sample"]`` seconds (a line a minute on long runs)."""
    start, first = time.monotonic(), await metrics(cdp)
    end = start + sizes["seconds"]
    worst, previous, minute = 0.0, first, 0
    while time.monotonic() < end:
        await asyncio.sleep(max(0.0, min(sizes["sample"], end - time.monotonic())))
        now = await metrics(cdp)
        worst = max(worst, busy(previous, now))
        minute += 1
        if sizes["sample"] >= 60:
            print(f"  minute {minute}: main thread busy {busy(previous, now):.1%}, "
                  f"{stream.rate(time.monotonic() - sizes['sample'], time.monotonic(), 'vm'):.1f}"
                  f" VM record changes/s, heap {now['JSHeapUsedSize'] / 2**20:.1f} MiB (no GC)",
                  flush=True)
        previous = now
    stop = time.monotonic()
    return {"busy": busy(first, previous), "worst": worst, "seconds": stop - start,
            "events": stream.rate(start, stop), "vm events": stream.rate(start, stop, "vm"),
            "messages": stream.message_rate(start, stop)}


async def measure(url: str, session: str, names: list[str], churn: Churn, stream: Stream,
                  sizes: dict) -> dict:
    from playwright.async_api import async_playwright
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(executable_path=CHROMIUM,
                                                    args=["--no-sandbox", "--headless=new"])
        try:
            context = await chromium.new_context(viewport={"width": 1200, "height": 900})
            await context.add_cookies([{"name": "peerctl_session", "value": session,
                                        "url": url}])
            page = await context.new_page()
            figures = {"render": await first_render(page, url, len(names), sizes["runs"])}
            cdp = await context.new_cdp_session(page)
            await cdp.send("Performance.enable")
            figures["heap before"] = await heap(cdp)
            idle_start, before = time.monotonic(), await metrics(cdp)
            await asyncio.sleep(sizes["idle"])      # the idle window itself
            idle_end, after = time.monotonic(), await metrics(cdp)
            figures["idle"] = {"busy": busy(before, after), "seconds": idle_end - idle_start,
                               "events": stream.rate(idle_start, idle_end)}
            figures["idle scroll"] = await scroll(page)

            churn.start()
            await asyncio.sleep(sizes["warmup"])    # past the first automations' cards
            figures["heap start"] = await heap(cdp)
            figures["events"] = await watched(cdp, sizes, stream)
            figures["events scroll"] = await scroll(page)
            churn.stop()
            figures["caught up"] = await caught_up(cdp, sizes["catch_up"])
            figures["heap end"] = await heap(cdp)
            return figures
        finally:
            await chromium.close()


# -- the run -----------------------------------------------------------------------------

def scrolled(figure: dict | None) -> str:
    if figure is None:
        return f"no frame (the page did not answer in {ANSWER_S:.0f} s)"
    return (f"{figure['p95']:.1f} ms ({round(figure['p95'] / FRAME_MS)} frames at 60 Hz) "
            f"over {figure['frames']} frames")


def mib(size: float) -> str:
    return f"{size / 2**20:.2f} MiB"


def report(sizes: dict, spread: int, booted_s: float, figures: dict, churn: Churn,
           stream: Stream) -> None:
    render = figures["render"]
    shown = statistics.median(render["times"])
    print(f"first render: {len(render['times'])} navigation(s) to a list of {render['rows']} "
          f"VMs, the rows in view drawn, in {shown:.3f} s median (fastest "
          f"{min(render['times']):.3f}, slowest {max(render['times']):.3f}) vs fetch and "
          f"parse GET /v1/vms in the same page {render['fetch']:.3f} s (target <= "
          f"{RENDER_TARGET_S:g} s): {verdict(shown <= RENDER_TARGET_S)}")
    idle, events = figures["idle"], figures["events"]
    print(f"main thread: busy {events['busy']:.1%} over {events['seconds']:.0f} s of "
          f"{sizes['rate']} VMs stopped or started a second ({events['vm events']:.1f} VM "
          f"record changes/s, {events['events']:.1f} changes in "
          f"{events['messages']:.1f} messages/s on the stream, steps and automations with "
          f"them; worst {sizes['sample']:g} s {events['worst']:.1%}) vs idle "
          f"{idle['busy']:.1%} over {idle['seconds']:.0f} s at {idle['events']:.1f} changes/s "
          f"(target <= {BUSY_TARGET:.0%}): {verdict(events['busy'] <= BUSY_TARGET)}")
    moving, still = figures["events scroll"], figures["idle scroll"]
    smooth = moving is not None and moving["p95"] <= FRAME_TARGET_MS
    print(f"scroll: p95 frame interval {scrolled(moving)}"
          + (f" ({moving['long']} spanning more than {FRAME_TARGET})" if moving else "")
          + f" during the events vs idle {scrolled(still)} (target <= {FRAME_TARGET} frames "
          f"at 60 Hz, {FRAME_TARGET * FRAME_MS:.1f} ms, an interval counted to the nearest "
          f"frame): {verdict(smooth)}")
    before, start, end = figures["heap before"], figures["heap start"], figures["heap end"]
    caught = figures["caught up"]
    settled = (f"the page caught up {caught:.0f} s after the events stopped" if caught is not None
               else f"the page still behind {sizes['catch_up']:.0f} s after the events stopped")
    if end is None:
        print(f"tab memory: JS heap not measured after {events['seconds']:.0f} s of events "
              f"({settled}; no answer in {ANSWER_S:.0f} s) (target within "
              f"±{MEMORY_TARGET:.0%}): MISS")
    else:
        if start is not None:
            reference, what = start, f"after the warm-up ({{:+.1%}}; before any event {mib(before)}"
        else:       # the page did not answer a minute into the events
            reference, what = before, (f"before the events ({{:+.1%}}; none measured after the "
                                       f"warm-up: no answer in {ANSWER_S:.0f} s")
        change = (end - reference) / reference
        print(f"tab memory: JS heap {mib(end)} after {events['seconds']:.0f} s of events vs "
              f"{mib(reference)} {what.format(change)}; after GC; {settled}) (target within "
              f"±{MEMORY_TARGET:.0%}): {verdict(abs(change) <= MEMORY_TARGET)}")
    minutes = events["seconds"] / 60
    print(f"the issue asks for {ISSUE_MINUTES} minutes of events; this run had "
          f"{minutes:.1f} (--minutes {ISSUE_MINUTES} for the issue's)")
    print(f"cluster: {sizes['peers']} peers on test:///default, host01 serving the page; "
          f"{sizes['vms']} VMs booted through the API in {booted_s:.1f} s over {spread} hosts; "
          f"{churn.asked} stop/start requests, {churn.refused} refused"
          + (f" (first: {churn.refusals[0]})" if churn.refusals else "")
          + (f"; the events stream ended: {stream.error}" if stream.error else ""))


def bench(sizes: dict) -> None:
    workdir = tempfile.mkdtemp(prefix=WORK, dir="/var/tmp")
    etcd, peers, store, stream = None, [], None, None
    try:
        with held():
            etcd = EtcdServer(os.path.join(workdir, "etcd")).start()
        url = start_cluster(etcd, workdir, sizes["peers"], peers)
        store = Store(etcd.url, CLUSTER)
        make_room(store, sizes["vms"], sizes["peers"])
        operator = requests.Session()
        operator.headers["Authorization"] = f"Bearer {tokens.create(store, 'operator')['secret']}"
        names = [f"vm{i:04d}" for i in range(1, sizes["vms"] + 1)]
        booted_s = boot(url, operator, names)
        listed = operator.get(url + "v1/vms", timeout=60).json()
        spread = len({vm["host"] for vm in listed})
        print(f"{sizes['vms']} VMs on {spread} of {sizes['peers']} hosts, booted through the "
              f"API in {booted_s:.1f} s; chromium headless, {sizes['runs']} navigation(s), "
              f"idle {sizes['idle']:g} s, then {sizes['rate']} VMs stopped or started a second for "
              f"{sizes['warmup']:g} s of warm-up and {sizes['seconds']:g} s measured",
              flush=True)
        viewer = tokens.create(store, "viewer")["secret"]
        session = sessions.create(store, viewer)[0]
        stream = Stream(url, viewer)
        stream.start()
        if not stream.ready.wait(30) or stream.error:
            raise SystemExit(f"bench/page.py: no event stream: {stream.error or 'in 30 s'}")
        churn = Churn(url, operator, names, sizes["rate"])
        try:
            figures = asyncio.run(measure(url, session, names, churn, stream, sizes))
        finally:
            churn.stop()
        report(sizes, spread, booted_s, figures, churn, stream)
    finally:
        if stream is not None:
            stream.close()
        if store is not None:
            store.close()
        stop_processes(peers)
        if etcd is not None:
            etcd.stop()
        shutil.rmtree(workdir, ignore_errors=True)


@ends_in_one_line("page")
def main() -> int:
    parser = BadInput(description=__doc__.splitlines()[0])
    parser.add_argument("--peers", type=whole(1, 50, "peers"), default=20)
    parser.add_argument("--vms", type=whole(2, 5000, "VMs"), default=1000)
    parser.add_argument("--rate", type=whole(2, 500, "VMs a second"), default=50,
                        help="VMs stopped or started a second while events arrive "
                             "(default 50)")
    parser.add_argument("--minutes", type=whole(1, 600, "minutes"), default=10,
                        help="of events, measured after a minute's warm-up (default 10; "
                             "the issue asks for 60)")
    parser.add_argument("--runs", type=whole(1, 20, "navigations"), default=3,
                        help="navigations timed for the first render (default 3)")
    parser.add_argument("--idle", type=whole(1, 600, "seconds"), default=30,
                        help="seconds of the idle page, the main thread's reference")
    parser.add_argument("--smoke", action="store_true",
                        help="2 peers, 50 VMs, 10 VMs/s for 4 s: every path")
    options = parser.parse_args()
    if options.rate > options.vms:
        parser.error(f"--rate {options.rate} is more than the {options.vms} VMs")
    reason = browser_skip_reason()
    if reason:
        raise SystemExit(f"bench/page.py: {reason}")
    if options.smoke:
        sizes = dict(SMOKE)
    else:
        sizes = {"peers": options.peers, "vms": options.vms, "rate": options.rate,
                 "seconds": options.minutes * 60.0, "runs": options.runs,
                 "idle": float(options.idle), **FULL}
    load_before = os.getloadavg()
    started = time.monotonic()
    bench(sizes)
    print(f"ran {time.monotonic() - started:.0f} s; " + load_line(load_before))
    return 0


if __name__ == "__main__":
    sys.exit(main())
