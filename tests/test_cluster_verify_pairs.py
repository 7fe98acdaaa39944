"""``cluster verify``'s checks made from the hosts, with real peers and real
TCP listeners on loopback: each peer publishes a libvirt endpoint where the
test listens (``test+tcp://127.0.0.1:PORT/default``) and a migration port
of its own, which it opens to the others' probes itself.  Closing one
listener makes one line per host that cannot reach it; reopening it makes
verify clean again.  A peer with a wrong clock (the test hook
``$PEERCTL_TEST_CLOCK_OFFSET``) is named, the others are not; and what each
run found is what ``hostlist`` shows."""
from __future__ import annotations

import re
import socket

import pytest

from engine.core import failpoints, keys
from tests.support.cluster import start_peers

NAMES = ["h1", "h2", "h3"]


def listener(port: int = 0) -> socket.socket:
    """A TCP listener on loopback (the kernel completes connections to it)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(64)
    return sock


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def endpoints():
    """{host: its libvirt listener}, closed at the end."""
    listening = {name: listener() for name in NAMES}
    yield listening
    for sock in listening.values():
        sock.close()


def start_published(cluster, store, endpoints, env_of=lambda name: {}):
    for name in NAMES:
        start_peers(cluster, store, [name], env={
            "PEERCTL_LIBVIRT_REMOTE": f"test+tcp://127.0.0.1:"
                                      f"{endpoints[name].getsockname()[1]}/default",
            "PEERCTL_MIGRATION_PORTS": str(free_port()), **env_of(name)})


def verified(cluster, expect_rc):
    done = cluster.cli("cluster", "verify")
    assert done.returncode == expect_rc, (done.stdout, done.stderr)
    assert done.stderr == ""
    return done.stdout.strip().splitlines()


def verdicts(cluster) -> dict:
    return {h["host"]: h["verify"] for h in cluster.cli_json("hostlist")}


CLEAN = ("no problem found: 3 hosts; checked etcd, hosts, versions, libvirt, networks, disk, "
         "certificates, reach, clock, pools")


def test_a_closed_libvirt_port_is_one_line_per_host_that_cannot_reach_it(cluster, store,
                                                                          endpoints):
    start_published(cluster, store, endpoints)
    record = store.get(keys.host("h1")).value
    assert record["migration_address"] == "127.0.0.1"
    assert record["migration_ports"][0] == record["migration_ports"][1]
    assert [line for line in verified(cluster, 1) if not line.startswith("etcd:")] == [
        "1 problem (3 hosts)"]     # a 1-member etcd is the only problem
    assert verdicts(cluster) == {"h1": "ok", "h2": "ok", "h3": "ok"}
    found = cluster.cli_json("cluster", "verify", expect_rc=1)
    assert set(found) == {"problems", "checked", "hosts", "skipped", "clocks",
                          "clock_reference", "automation", "recorded", "time"}
    assert found["skipped"] == [] and found["recorded"] is True
    assert found["clock_reference"] in NAMES and len(found["clocks"]) == 3

    port = endpoints["h3"].getsockname()[1]
    endpoints["h3"].close()
    lines = verified(cluster, 1)
    assert [line for line in lines if line.startswith("reach:")] == [
        f"reach: h1 cannot reach h3's libvirt at 127.0.0.1:{port}: connection refused",
        f"reach: h2 cannot reach h3's libvirt at 127.0.0.1:{port}: connection refused"]
    assert verdicts(cluster) == {"h1": "1 problem", "h2": "1 problem", "h3": "2 problems"}
    table = cluster.cli("hostlist").stdout.splitlines()
    assert "Verify" in table[0].split()
    assert table[3].split()[-1:] == ["problems"] and table[3].split()[0] == "h3"

    endpoints["h3"] = listener(port)
    assert [line for line in verified(cluster, 1) if not line.startswith("etcd:")] == [
        "1 problem (3 hosts)"]
    assert verdicts(cluster) == {"h1": "ok", "h2": "ok", "h3": "ok"}


@pytest.mark.slow      # a scenario of several seconds: the third tier
def test_a_migration_port_nobody_listens_on_is_named(cluster, store, endpoints):
    """far1 is a record with no peer behind it (a host whose peer hangs):
    nothing opens its migration port, and its own probes never run."""
    start_published(cluster, store, endpoints)
    port = free_port()
    lease = store.grant(60)
    store.put(keys.host_config("far1"), {"host": "far1"})
    store.put(keys.host("far1"), {**store.get(keys.host("h1")).value, "host": "far1",
                                  "libvirt_remote": "test:///default",
                                  "migration_ports": [port, port]}, lease)
    reach = [line for line in verified(cluster, 1) if line.startswith("reach:")]
    assert reach == [
        "reach: host far1 did not answer the reachability check: no answer from far1 "
        "within 5.0s",
        f"reach: h1 cannot reach far1's migration port at 127.0.0.1:{port}: connection refused",
        f"reach: h2 cannot reach far1's migration port at 127.0.0.1:{port}: connection refused",
        f"reach: h3 cannot reach far1's migration port at 127.0.0.1:{port}: connection refused"]


def test_a_clock_off_by_3_s_is_named_and_the_others_are_not(cluster, store):
    start_peers(cluster, store, ["h1", "h2"])
    start_peers(cluster, store, ["h3"], env={"PEERCTL_TEST_CLOCK_OFFSET": "3"})
    lines = verified(cluster, 1)
    clocks = [line for line in lines if line.startswith("clock:")]
    assert len(clocks) == 1, lines
    assert re.fullmatch(r"clock: host h3's clock is 3\.0 s ahead of the cluster's \(host "
                        r"h[12]'s, the median of 3 hosts' clocks; measured within "
                        r"[0-9.]+ s\): over 0\.5 s", clocks[0]), clocks[0]
    found = cluster.cli_json("cluster", "verify", expect_rc=1)
    assert {c["host"]: abs(c["offset_s"]) < 0.5 for c in found["clocks"]} == {
        "h1": True, "h2": True, "h3": False}


def test_verify_host_says_only_what_concerns_that_host(cluster, store, endpoints):
    from engine.operations.verify import verify_host
    start_published(cluster, store, endpoints)
    port = endpoints["h3"].getsockname()[1]
    endpoints["h3"].close()

    class Ctx:      # what the operations layer asks of a command's context
        def store(self):
            return store
    assert [p["problem"] for p in verify_host(Ctx(), "h1")] == [
        f"h1 cannot reach h3's libvirt at 127.0.0.1:{port}: connection refused"]
    assert [p["problem"] for p in verify_host(Ctx(), "h3")] == [
        f"h1 cannot reach h3's libvirt at 127.0.0.1:{port}: connection refused",
        f"h2 cannot reach h3's libvirt at 127.0.0.1:{port}: connection refused"]
    assert verdicts(cluster) == {"h1": "1 problem", "h2": None, "h3": "2 problems"}
    assert [p["problem"] for p in verify_host(Ctx(), "h9")] == [
        "host h9 has no record in this cluster: its peer never registered"]


def test_a_verify_killed_before_its_record_leaves_every_host_s_last_outcome(
        cluster, store, endpoints, tmp_path):
    start_published(cluster, store, endpoints)
    endpoints["h3"].close()
    verified(cluster, 1)
    before = verdicts(cluster)
    assert before == {"h1": "1 problem", "h2": "1 problem", "h3": "2 problems"}
    endpoints["h3"] = listener(int(store.get(keys.host("h3")).value["libvirt_remote"]
                                   .split(":")[2].split("/")[0]))
    armed = str(tmp_path / "failpoints")
    failpoints.arm(armed, ["verify record"])
    done = cluster.cli("cluster", "verify", env={"PEERCTL_FAILPOINTS": armed})
    assert done.returncode == -9, (done.stdout, done.stderr)
    assert verdicts(cluster) == before          # none half written
    # its automation had ended before: nothing is left running
    assert {t["state"] for t in cluster.cli_json("tasks", "--all")
            if t["kind"] == "verify_reach"} == {"done"}
    verified(cluster, 1)
    assert verdicts(cluster) == {"h1": "ok", "h2": "ok", "h3": "ok"}
