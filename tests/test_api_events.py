"""``/v1/events``: a client following one peer's stream while 50 VMs boot
sees every change exactly once, even when that peer is SIGKILLed and the
client resumes on another with ``Last-Event-ID``; a revision compaction
removed answers 410.  A batched stream (``?batch=MS&step_values=false``,
the page's) carries the same changes in fewer messages and resumes as
exactly."""
from __future__ import annotations

import threading

import pytest
import requests

from engine.core import api as engine_api
from engine.web.events import kind_of
from tests.support import wait_for
from tests.support.api_client import ApiClient, api_peer_args, free_port
from tests.support.cluster import finished
from tests.support.hooks import counting_hook

VMS = 50
TINY_VM = "VCPU:1,MEMORY_MB:32,DISK_GB:1"


@pytest.fixture
def two_apis(cluster, store, tmp_path):
    """host1 and host2 take VMs, each build slowed a little so that a boot
    of 50 takes a few seconds; host2 and host3 serve the API; host3 is
    drained, so that killing it loses no VM."""
    ports = {"host2": free_port(), "host3": free_port()}
    hooks = tmp_path / "hooks"
    counting_hook(hooks, request="build", sleep=0.2)
    for host in ("host1", "host2", "host3"):
        cluster.start_peer(host, extra_args=["--hooks", str(hooks)]
                           + (api_peer_args(ports[host]) if host in ports else []))
    wait_for(lambda: {"host1", "host2", "host3"} <= set(engine_api.live_hosts(store)),
             what="three peers")
    wait_for(lambda: len(cluster.cli_json("placement", "providers")) == 3, what="providers")
    cluster.cli_json("drain", "host3")
    secret = cluster.cli_json("token", "create", "--role", "viewer")["secret"]
    clients = {host: ApiClient(f"http://127.0.0.1:{port}", secret)
               for host, port in ports.items()}
    for client in clients.values():
        wait_for(lambda c=client: _up(c), what="the APIs")
    return clients


def _up(client) -> bool:
    try:
        return client.get("/v1/hosts")[0] == 200
    except OSError:
        return False


class Follower:
    """Reads a stream on a thread, keeping every change and the last id."""

    def __init__(self):
        self.changes: list[tuple[int, dict]] = []
        self.ids: list[int] = []
        self.last: int | None = None
        self.hello = threading.Event()

    def follow(self, client, last_event_id=None) -> threading.Thread:
        def run():
            try:
                for event in client.events(last_event_id):
                    self.ids.append(event.revision)
                    self.last = event.revision
                    if event.event == "hello":
                        self.hello.set()
                    for change in event.doc["changes"]:
                        self.changes.append((event.revision, change))
            except requests.RequestException:
                pass
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def vm_states(self) -> dict[str, list[str]]:
        seen: dict[str, list[str]] = {}
        for _, change in self.changes:
            if change["kind"] == "vm" and change["type"] == "put":
                seen.setdefault(change["key"], []).append(change["value"].get("state"))
        return seen


def test_a_client_resumes_on_another_peer_and_misses_nothing(cluster, store, two_apis):
    follower = Follower()
    first = follower.follow(two_apis["host3"])
    assert follower.hello.wait(20)
    names = [f"e{i:02d}" for i in range(VMS)]
    doc = cluster.cli_json("boot", *names, "--resources", TINY_VM, "--detach")
    # midway: some VMs are running, not all
    wait_for(lambda: 5 <= sum(1 for states in follower.vm_states().values()
                              if "running" in states), what="some VMs running on the stream")
    cluster.kill("host3")
    assert engine_api.get_task(store, doc["automation"])["state"] == "running"
    first.join(30)
    assert not first.is_alive()
    resumed_from = follower.last
    second = follower.follow(two_apis["host2"], last_event_id=resumed_from)
    assert finished(store, doc["automation"], timeout=120)["state"] == "done"
    records = {kv.key: kv for kv in store.range("vms/")[0]}
    assert len(records) == VMS
    # everything etcd did to each VM record, and nothing twice
    wait_for(lambda: all(len(follower.vm_states().get(key, [])) == kv.version
                         for key, kv in records.items()), timeout=30,
             what="every VM record's every version on the stream")
    assert follower.ids == sorted(set(follower.ids)), "ids repeat or go back"
    until = follower.last
    seen = [(revision, change) for revision, change in list(follower.changes)
            if revision <= until]
    assert _shown(seen) == _shown(history(store, follower.ids[0], until))
    for key, states in follower.vm_states().items():
        became_running = sum(1 for before, now in zip([None] + states, states)
                             if now == "running" and before != "running")
        assert became_running == 1, (key, states)
    assert any(revision > resumed_from for revision, _ in follower.changes)
    assert second.is_alive()        # still following host2, which goes on


def history(store, after: int, until: int) -> list[tuple[int, dict]]:
    """What etcd did after revision ``after`` up to ``until``, through a
    watch of this process: the changes a stream shows."""
    seen, done = [], threading.Event()

    def on_events(events, revision):
        if isinstance(events, Exception):
            done.set()
            return
        for event in events:
            if event.kv.mod_revision <= until and kind_of(event.kv.key):
                seen.append((event.kv.mod_revision, {"type": event.kind,
                                                     "key": event.kv.key}))
        if revision >= until:
            done.set()
    cancel = store.watch("", after + 1, on_events)
    try:
        assert done.wait(20)
    finally:
        cancel()
    return seen


def _shown(changes) -> list[tuple[int, str, str]]:
    return [(revision, change["type"], change["key"]) for revision, change in changes]


def test_a_compacted_revision_answers_410(cluster, store, two_apis):
    client = two_apis["host2"]
    old = store.revision()
    cluster.cli_json("undrain", "host3")
    cluster.cli_json("drain", "host3")
    store.compact(store.revision())
    response = client.session.get(client.url + "/v1/events",
                                  headers={"Last-Event-ID": str(old)}, timeout=10)
    assert response.status_code == 410
    assert "list again" in response.json()["error"]
    future = client.session.get(client.url + "/v1/events",
                                headers={"Last-Event-ID": str(store.revision() + 1000)},
                                timeout=10)
    assert future.status_code == 410
    bad = client.session.get(client.url + "/v1/events", headers={"Last-Event-ID": "soon"},
                             timeout=10)
    assert bad.status_code == 400 and "Last-Event-ID" in bad.json()["error"]


def test_a_boot_started_through_a_peer_outlives_that_peer(cluster, store, two_apis):
    operator = ApiClient(two_apis["host3"].url,
                         cluster.cli_json("token", "create", "--role", "operator")["secret"])
    names = [f"k{i}" for i in range(6)]
    status, doc, _ = operator.post("/v1/vms", {"names": names, "resources": TINY_VM})
    assert status == 202
    cluster.kill("host3")           # the peer that took the request, SIGKILLed at once
    assert finished(store, doc["automation"], timeout=120)["state"] == "done"
    listed = cluster.cli_json("vmlist")
    assert sorted(vm["name"] for vm in listed) == names       # each once, none lost
    assert {vm["state"] for vm in listed} == {"running"}
    status, task, _ = two_apis["host2"].get(f"/v1/automations/{doc['automation']}")
    assert status == 200 and task["state"] == "done"


LIGHT = {"batch": "300", "step_values": "false"}


class Batched:
    """A ``?batch=300&step_values=false`` stream read on a thread: its
    messages, and each change with the revision it carries."""

    def __init__(self, client, last_event_id=None):
        self.messages: list = []
        self.hello = threading.Event()
        threading.Thread(target=self._read, args=(client, last_event_id), daemon=True).start()

    def _read(self, client, last_event_id):
        try:
            for event in client.events(last_event_id, timeout=120, query=LIGHT):
                self.messages.append(event)
                self.hello.set()
        except requests.RequestException:
            pass

    def changes(self, until: int) -> list[tuple[int, dict]]:
        return [(change["revision"], change) for event in list(self.messages)
                if event.event == "change" for change in event.doc["changes"]
                if change["revision"] <= until]

    def reached(self, revision: int) -> bool:
        return any(event.revision >= revision for event in list(self.messages))


def test_a_batched_stream_carries_every_change_in_fewer_messages(cluster, store, two_apis):
    client = two_apis["host2"]
    follower = Batched(client)
    assert follower.hello.wait(20)
    since = follower.messages[0].revision
    doc = cluster.cli_json("boot", *[f"b{i:02d}" for i in range(20)],
                           "--resources", TINY_VM, "--detach")
    assert finished(store, doc["automation"], timeout=120)["state"] == "done"
    until = store.revision()
    wait_for(lambda: follower.reached(until), timeout=30, what="the stream up to the boot's end")
    seen = follower.changes(until)
    assert _shown(seen) == _shown(history(store, since, until)), "a change lost, doubled or moved"
    changes = [event for event in follower.messages[1:] if event.revision <= until]
    assert len(changes) < len({revision for revision, _ in seen}) / 2, \
        "revisions were not gathered into fewer messages"
    for event in changes:       # a message's id is its newest revision
        assert event.revision == max(change["revision"] for change in event.doc["changes"])
    assert any(change["kind"] == "step" for _, change in seen)
    assert all(change["value"] is None for _, change in seen if change["kind"] == "step")
    assert all(change["value"]["name"] for _, change in seen
               if change["kind"] == "vm" and change["type"] == "put")
    # resuming from a batched message's id misses nothing after it
    middle = changes[len(changes) // 2].revision
    resumed = Batched(client, last_event_id=middle)
    wait_for(lambda: resumed.reached(until), timeout=30, what="the resumed stream")
    assert _shown(resumed.changes(until)) == _shown(history(store, middle, until))


def test_a_bad_batch_or_step_values_answers_400(two_apis):
    client = two_apis["host2"]
    for query, said in [({"batch": "0"}, "batch"), ({"batch": "soon"}, "batch"),
                        ({"batch": "5000"}, "batch"), ({"step_values": "maybe"}, "step_values")]:
        response = client.session.get(client.url + "/v1/events", params=query, timeout=10)
        assert response.status_code == 400 and said in response.json()["error"], query
