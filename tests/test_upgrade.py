"""Rolling upgrade: a second release of peerctl reaches every host through
the cluster, one host at a time, with nothing interrupted (docs/upgrade.md).

The second release is this tree with its version bumped to 0.2.0, a
feature level one above this tree's (``NEXT``), and ``ping`` given a
version 2 that needs that level (:func:`second_release`).  A cluster these
tests start is new, so its first peer sets it at this tree's level
(``NOW``)."""
from __future__ import annotations

import collections
import threading

import pytest

from engine.core import api, failpoints, keys
from engine.core.features import SUPPORTED
from tests.support import wait_for, wait_until
from tests.support.cluster import finished, start_peers
from tests.support.hooks import assert_each_index_ran_once, counting_hook
from tests.support.releases import build_packages, build_release

TTL = 5         # a production TTL: the hand-over must fit well inside it
NOW, NEXT = SUPPORTED, SUPPORTED + 1     # this tree's level, the second release's

PING_V2 = '''
"""ping, version 2: the same rounds, needing the second release's feature level."""
from engine.core.registry import automation
from automations.ping import ping as ping_v1


@automation("ping", version=2, feature_level=%d)
def ping(ctx, hosts, rounds=1, deadline=10.0):
    result = yield from ping_v1(ctx, hosts, rounds, deadline)
    return {**result, "version": 2}
''' % NEXT


def second_release(tmp_path, version="0.2.0", **files) -> str:
    import os
    from tests.support import ROOT
    with open(os.path.join(ROOT, "engine", "core", "features.py")) as f:
        features = f.read().replace(f"SUPPORTED = {NOW} ", f"SUPPORTED = {NEXT} ")
    assert f"SUPPORTED = {NEXT} " in features
    return build_release(str(tmp_path / "releases"), version,
                         files={"engine/core/features.py": features,
                                "automations/ping_v2.py": PING_V2, **files})


def hosts_now(cluster) -> dict:
    return {h["host"]: h for h in cluster.cli_json("hostlist") if h["alive"]}


def leases_of(store, names) -> dict:
    return {name: store.get(keys.host(name)).lease for name in names}


def upgrade(cluster, *args, expect_rc=0):
    return cluster.cli_json("upgrade", *args, "--yes", expect_rc=expect_rc, timeout=300)


def start_hosts(cluster, store, names, tmp_path, env=None):
    hooks = str(tmp_path / "hooks")
    logs = {request: counting_hook(hooks, request=request, log_name=f"{request}.log")
            for request in ("ping", "build", "lease_start")}
    start_peers(cluster, store, names, hooks=hooks, env=env, ttl=TTL)
    wait_for(lambda: set(names) <= {p["name"] for p in cluster.cli_json(
        "placement", "providers")}, what="providers of the hosts")
    return logs


class Stream:
    """Boots and migrations between two hosts, one after another, until
    stopped: every automation they start, to check afterwards.  The two
    hosts stay out of the lease's way: a lease clears its host of other VMs,
    and a stream VM it moved could not be migrated from where it was listed."""
    def __init__(self, cluster, between=("host1", "host2")):
        self.cluster, self.between = cluster, between
        self.stop = threading.Event()
        self.automations, self.errors, self.names = [], [], []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        n = 0
        while not self.stop.is_set():
            n += 1
            name = f"s{n}"
            first, other = self.between if n % 2 else self.between[::-1]
            done = self.cluster.cli("--format", "json", "boot", name, "--network", "none",
                                    "--resources", "VCPU:1,MEMORY_MB:64,DISK_GB:1",
                                    "--on", first, timeout=120)
            self._note(done, name)
            if done.returncode == 0:
                self.names.append(name)
                moved = self.cluster.cli("--format", "json", "migrate", name, "--to", other,
                                         timeout=120)
                self._note(moved, f"migrate {name}")

    def _note(self, done, what):
        import json
        try:
            doc = json.loads(done.stdout)
        except ValueError:
            doc = {}
        if doc.get("automation"):
            self.automations.append(doc["automation"])
        if done.returncode != 0:
            self.errors.append(f"{what}: {done.stderr.strip()[-300:]}")

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(300)


@pytest.mark.slow       # three hand-overs under a stream of work: about a minute
def test_a_rolling_upgrade_interrupts_no_automation_vm_ping_or_lease(cluster, store, tmp_path):
    names = ["host1", "host2", "host3"]
    logs = start_hosts(cluster, store, names, tmp_path)
    before = hosts_now(cluster)
    assert {h["feature_level"] for h in before.values()} == {NOW}
    leases = leases_of(store, names)
    booted = cluster.cli_json("boot", "keep1", "keep2", "keep3", "--network", "none",
                              "--resources", "VCPU:1,MEMORY_MB:64,DISK_GB:1")
    assert booted["state"] == "done", booted
    kept = {vm["name"]: (vm["host"], vm["uuid"]) for vm in cluster.cli_json("vmlist")}

    added = cluster.cli_json("code", "add", second_release(tmp_path))
    assert added["version"] == "0.2.0" and len(added["sha256"]) == 64, added

    ping = api.start_automation(store, "ping", {"hosts": names, "rounds": 500})
    lease = cluster.cli_json("lease", "create", "during", "--hosts", "1", "--on", "host3",
                             "--start", "+4s", "--end", "+10m")
    with Stream(cluster) as stream:
        wait_for(lambda: len(stream.names) >= 1, timeout=60, what="the stream's first boot")
        done = upgrade(cluster, "--to", "0.2.0")
    assert done["state"] == "done", done
    assert [(h["host"], h["state"]) for h in done["hosts"]] == \
        [(n, "upgraded") for n in names], done
    assert all(0 <= h["out_of_service_s"] < TTL for h in done["hosts"]), done

    # every host on the new release, on the lease it had: never seen dead
    after = hosts_now(cluster)
    assert {h["version"].split("+")[0] for h in after.values()} == {"0.2.0"}, after
    assert {h["feature_level"] for h in after.values()} == {NEXT}
    assert leases_of(store, names) == leases
    # the VMs that were there are still there, once each (the lease may
    # have moved some off the host it took)
    listed = collections.Counter(vm["uuid"] for vm in cluster.cli_json("vmlist"))
    assert set(listed.values()) == {1}, listed
    now = {vm["name"]: (vm["uuid"], vm["state"]) for vm in cluster.cli_json("vmlist")}
    assert {n: now[n] for n in kept} == {n: (uuid, "running") for n, (_, uuid) in kept.items()}

    # the ping never missed, and no step ran twice
    task = finished(store, ping, timeout=180)
    assert task["state"] == "done", task["error"]
    replies = task["result"]["replies"]
    assert len(replies) == 1500 and {r["status"] for r in replies} == {"ok"}
    assert len(assert_each_index_ran_once(logs["ping"], ping)) == 1500
    assert stream.errors == [] and len(stream.automations) >= 2, stream.errors
    for automation in stream.automations:
        task = finished(store, automation, timeout=120)
        assert task["state"] == "done", (automation, task["error"])
        assert_each_index_ran_once(logs["build"], automation)
    # the lease started once, through the hand-overs
    started = wait_until(lambda: cluster.cli_json("lease", "show", "during"),
                         lambda doc: doc["state"] == "active", timeout=60,
                         what="the lease active")
    runs = assert_each_index_ran_once(logs["lease_start"], started["automation"])
    assert len(runs) == 1 and lease["hosts"] == started["hosts"]


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_the_wheel_of_a_release_upgrades_three_hosts(cluster, store, tmp_path):
    """``python -m build``'s wheel, added with ``code add``, is a release
    like a source archive: each host installs the tree under its
    peerctl_tree/ and its peer hands over to it, on the same lease."""
    from engine.hypervisor.local.daemons import cmdline
    names = ["host1", "host2", "host3"]
    start_hosts(cluster, store, names, tmp_path)
    leases = leases_of(store, names)
    booted = cluster.cli_json("boot", "stays", "--network", "none", "--on", "host2",
                              "--resources", "VCPU:1,MEMORY_MB:64,DISK_GB:1")
    assert booted["state"] == "done", booted
    built = build_packages(tmp_path / "packages", "0.2.0")
    assert cluster.cli_json("code", "add", built["wheel"])["commit"] == built["commit"]

    done = upgrade(cluster, "--to", "0.2.0")
    assert done["state"] == "done", done
    assert [(h["host"], h["state"]) for h in done["hosts"]] == \
        [(n, "upgraded") for n in names], done
    after = hosts_now(cluster)
    assert {n: after[n]["version"] for n in names} == \
        {n: f"0.2.0+{built['commit'][:8]}" for n in names}, after
    assert leases_of(store, names) == leases
    for name in names:
        tree = cluster.state_dir(name) / "releases" / "0.2.0"
        assert str(tree / "peerctl.py") in cmdline(cluster.pid(name)), name
    assert [(vm["name"], vm["state"]) for vm in cluster.cli_json("vmlist", "host2/*")] == \
        [("stays", "running")]
    assert cluster.cli_json("ping")["state"] == "done"


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_a_host_restarted_from_its_package_runs_the_release_upgrade_chose(cluster, store,
                                                                          tmp_path):
    """After ``upgrade --to 0.2.0``, host1 is started again from the tree
    it was first started from (systemd after an ``apt upgrade``): it runs
    0.2.0, the release the cluster chose, and says so in one line."""
    names = ["host1", "host2"]
    start_hosts(cluster, store, names, tmp_path)
    cluster.cli_json("code", "add", second_release(tmp_path))
    assert upgrade(cluster, "--to", "0.2.0")["state"] == "done"
    cluster.kill("host1")
    wait_for(lambda: not hosts_now(cluster).get("host1"), timeout=30, what="host1 gone")
    cluster.start_peer("host1", ttl=TTL)
    wait_for(lambda: hosts_now(cluster).get("host1"), timeout=60, what="host1 back")
    assert hosts_now(cluster)["host1"]["version"].startswith("0.2.0")
    said = [line for line in cluster.log("host1").splitlines() if "running release" in line]
    assert said[-1].startswith("peerctl: running release 0.2.0, this host's choice by "
                               "`upgrade`, not this tree's 0.1.0"), said


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_a_release_that_cannot_start_is_rolled_back_on_the_first_host_only(
        cluster, store, tmp_path):
    names = ["host1", "host2"]
    start_hosts(cluster, store, names, tmp_path)
    leases = leases_of(store, names)
    before = hosts_now(cluster)
    booted = cluster.cli_json("boot", "stays", "--network", "none", "--on", "host1",
                              "--resources", "VCPU:1,MEMORY_MB:64,DISK_GB:1")
    assert booted["state"] == "done", booted
    broken = build_release(str(tmp_path / "releases"), "0.2.1", files={
        "engine/peer.py": "raise SystemExit('peerctl 0.2.1 cannot start: broken on purpose')\n"})
    cluster.cli_json("code", "add", broken)

    done = upgrade(cluster, "--to", "0.2.1", "--deadline", "20", expect_rc=1)
    assert done["state"] == "failed", done
    rows = {h["host"]: h for h in done["hosts"]}
    assert rows["host1"]["state"] == "failed"
    assert "rolled back" in rows["host1"]["error"]
    assert "broken on purpose" in rows["host1"]["error"], rows["host1"]
    assert rows["host2"]["state"] == "skipped"
    after = hosts_now(cluster)
    assert {n: after[n]["version"] for n in names} == {n: before[n]["version"] for n in names}
    assert store.get(keys.host("host1")).value["rolled_back"]["to"] == "0.2.1"
    assert leases_of(store, names) == leases
    assert [vm["name"] for vm in cluster.cli_json("vmlist", "host1/*")] == ["stays"]
    # host1 still serves: a ping goes through it
    assert cluster.cli_json("ping", "host1")["state"] == "done"


@pytest.mark.slow       # a long scenario: four upgrades and a rollback
def test_mixed_releases_keep_working_and_the_feature_level_waits_for_the_last(
        cluster, store, tmp_path):
    names = ["host1", "host2", "host3"]
    start_hosts(cluster, store, names, tmp_path)
    cluster.cli_json("code", "add", second_release(tmp_path))
    done = upgrade(cluster, "--to", "0.2.0", "host[12]")
    assert [h["host"] for h in done["hosts"]] == ["host1", "host2"], done

    # host3 is left on the old release: the cluster works, new automations
    # keep the shapes every peer knows
    refused = cluster.cli("cluster", "feature-level", str(NEXT))
    assert refused.returncode == 1 and "host3" in refused.stderr and \
        len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert cluster.cli_json("cluster", "feature-level")["level"] == NOW
    booted = cluster.cli_json("boot", "mixed", "--network", "none",
                              "--resources", "VCPU:1,MEMORY_MB:64,DISK_GB:1")
    assert booted["state"] == "done", booted
    ping = api.start_automation(store, "ping", {"hosts": names, "rounds": 3})
    assert finished(store, ping)["state"] == "done"
    assert store.get(keys.spec(ping)).value["version"] == 1

    # host1 goes back, then forward again
    back = upgrade(cluster, "--rollback", "host1")
    assert [(h["host"], h["state"]) for h in back["hosts"]] == [("host1", "upgraded")], back
    assert hosts_now(cluster)["host1"]["feature_level"] == NOW
    upgrade(cluster, "--to", "0.2.0")
    levels = cluster.cli_json("cluster", "feature-level", str(NEXT))
    assert levels["level"] == NEXT and levels["previous"] == NOW, levels

    # now the new shape is written, and going back is refused
    ping = start_ping_v2(store, names, tmp_path)
    assert store.get(keys.spec(ping)).value["version"] == 2
    assert finished(store, ping)["result"]["version"] == 2
    refused = cluster.cli("upgrade", "--rollback", "--yes")
    assert refused.returncode == 1 and f"feature level is {NEXT}" in refused.stderr, refused.stderr


def start_ping_v2(store, names, tmp_path):
    """Start ping as a peer of the new release would: this process must
    know ping's version 2 to record it."""
    from tests.support.cluster import start_automation
    code = tmp_path / "v2-automations"
    code.mkdir(exist_ok=True)
    (code / "ping_v2.py").write_text(PING_V2)
    return start_automation(store, "ping", {"hosts": names, "rounds": 2}, code=str(code))


def plan_args(cluster, release, hostglob):
    from engine.operations import Context
    from engine.operations.upgrade import plan_upgrade
    return plan_upgrade(Context(cluster.etcd_url, cluster.name), release, hostglob).args


def handed_over(cluster, host) -> int:
    """How many times ``host``'s peers handed the host over (all its logs)."""
    return cluster.log(host).count("handing_over")


@pytest.mark.slow       # a crash scenario: the initiator SIGKILLed between two hosts
def test_an_upgrade_resumes_when_its_initiator_dies_between_hosts(cluster, store, tmp_path):
    """Members m1-m3 lead the upgrade of host1-host3; a failpoint kills the
    leader just before it appends host2's ``upgrade_host`` (log index 2).
    Another member resumes: every host is upgraded, each handed over once."""
    armed = tmp_path / "failpoints"
    armed.write_text("")
    names, members = ["host1", "host2", "host3"], ["m1", "m2", "m3"]
    start_hosts(cluster, store, names, tmp_path)
    start_peers(cluster, store, members, env={failpoints.ENV: str(armed)}, ttl=TTL)
    cluster.cli_json("code", "add", second_release(tmp_path))
    failpoints.arm(str(armed), ["append 2"])

    upgrading = api.start_automation(store, "upgrade", plan_args(cluster, "0.2.0", "host*"),
                                     prefer=members)
    task = finished(store, upgrading, timeout=180)
    assert task["state"] == "done", task["error"]
    assert [p for p, _, _ in failpoints.fired(str(armed))] == ["append 2"]
    assert sum(cluster.peers[m].poll() is not None for m in members) == 1
    assert [(h["host"], h["state"]) for h in task["result"]["hosts"]] == \
        [(n, "upgraded") for n in names]
    asked = collections.Counter(e["label"] for e in task["log"] if e["request"] == "upgrade_host")
    assert asked == {n: 1 for n in names}, asked
    assert {n: handed_over(cluster, n) for n in names} == {n: 1 for n in names}
    assert {h["version"].split("+")[0] for h in hosts_now(cluster).values()
            if h["host"] in names} == {"0.2.0"}


@pytest.mark.slow       # a crash scenario: the peer being upgraded SIGKILLed mid-install
def test_a_peer_killed_mid_install_comes_back_and_the_upgrade_goes_on(cluster, store, tmp_path):
    """host1's peer dies just after unpacking the release (failpoint
    ``release_unpacked``).  Restarted as an operator would, it comes back
    on the release it ran (the new one was never chosen), the upgrade's
    request reaches it again, and it finishes: both hosts on 0.2.0, no
    partial install left behind."""
    armed = tmp_path / "failpoints"
    armed.write_text("")
    names = ["host1", "host2"]
    env = {failpoints.ENV: str(armed)}
    start_hosts(cluster, store, names, tmp_path, env=env)
    cluster.cli_json("code", "add", second_release(tmp_path))
    failpoints.arm(str(armed), ["release_unpacked"])
    upgrading = api.start_automation(store, "upgrade", plan_args(cluster, "0.2.0", "host*"))

    restarted = []

    def restart_the_dead():
        for host in names:
            if cluster.peers[host].poll() is not None and cluster.successor(host) is None:
                cluster.start_peer(host, ttl=TTL, env=env,
                                   extra_args=["--hooks", str(tmp_path / "hooks")])
                restarted.append(host)
        task = api.get_task(store, upgrading)
        return task if task["state"] in keys.TERMINAL_STATES else None
    task = wait_for(restart_the_dead, timeout=180, interval=0.1,
                    what="the upgrade to finish through the crash")
    assert task["state"] == "done", task["error"]
    assert [p for p, _, _ in failpoints.fired(str(armed))] == ["release_unpacked"]
    assert restarted == ["host1"]
    log = cluster.log("host1")
    after_crash = log[log.index("session_started", log.index("session_started") + 1):]
    assert "version=0.1.0" in after_crash.splitlines()[0], "it did not come back on the old code"
    assert [(h["host"], h["state"]) for h in task["result"]["hosts"]] == \
        [(n, "upgraded") for n in names]
    releases = cluster.state_dir("host1") / "releases"
    assert sorted(p.name for p in releases.iterdir() if p.is_dir()) == ["0.2.0"]


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def processes_under(path) -> list[str]:
    import os
    return [line for line in (command_line(int(p)) for p in os.listdir("/proc") if p.isdigit())
            if str(path) in line]


def test_a_process_in_the_middle_of_exec_is_never_taken_for_gone(tmp_path):
    """A peer becoming its host's current release exec()s; for an instant the
    kernel shows its command line empty. Whoever asks then (``up`` waiting for
    its peers, ``down``) must still see it running."""
    import subprocess
    import sys
    from engine.hypervisor.local.daemons import cmdline
    script = tmp_path / "execs.py"
    script.write_text("import os, sys\n"
                      "n = int(sys.argv[1])\n"
                      "if n:\n"
                      "    os.execv(sys.executable, [sys.executable, '-S', __file__, str(n - 1)])\n"
                      "sys.stdin.read()\n")
    child = subprocess.Popen([sys.executable, "-S", str(script), "150"], stdin=subprocess.PIPE)
    try:
        seen = []
        while not seen or seen[-1][-1] != "0":
            seen.append(cmdline(child.pid))
            assert seen[-1], f"a live process read as gone after {len(seen)} reads"
    finally:
        child.communicate(b"", timeout=30)
    assert cmdline(child.pid) == []


@pytest.mark.slow       # two `up`s and two `down`s of a local cluster
def test_up_and_down_follow_each_hosts_current_release(tmp_path, cluster_name):
    """`up`, an upgrade, `down`: nothing left running (down finds the
    processes the hand-over started); `up` again: the peers run from their
    host's current release, and `down` stops them."""
    import json
    import os
    import subprocess
    import sys
    from tests.support import PEERCTL
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERCTL_")}
    env.update(PEERCTL_CLUSTER=cluster_name, PEERCTL_CONF=os.devnull, PYTHONUNBUFFERED="1")

    def local(*args, rc=0):
        done = subprocess.run([sys.executable, PEERCTL, "--format", "json", *args],
                              capture_output=True, text=True, env=env, cwd=str(tmp_path),
                              timeout=300, stdin=subprocess.DEVNULL)
        assert done.returncode == rc, (args, done.stdout, done.stderr)
        return json.loads(done.stdout) if done.stdout.strip() else None

    state = tmp_path / "state"
    try:
        local("up", "--hosts", "2")
        local("code", "add", build_release(str(tmp_path / "releases"), "0.2.0"))
        done = local("upgrade", "--to", "0.2.0", "--yes")
        assert [h["state"] for h in done["hosts"]] == ["upgraded", "upgraded"], done
        peers = [line for line in processes_under(state) if " peer " in line]
        assert len(peers) == 2 and all("releases/0.2.0/peerctl.py" in p for p in peers), peers

        stopped = local("down")
        assert processes_under(state) == [], "down left a process running"
        assert {row["what"] for row in stopped["stopped"] if row["role"] == "peer"} <= \
            {"stopped", "killed"}, stopped

        local("up")
        peers = [line for line in processes_under(state) if " peer " in line]
        assert len(peers) == 2 and all("releases/0.2.0/peerctl.py" in p for p in peers), peers
        rows = local("hostlist")
        assert {h["version"].split("+")[0] for h in rows if h["alive"]} == {"0.2.0"}, rows
    finally:
        subprocess.run([sys.executable, PEERCTL, "down"], env=env, cwd=str(tmp_path),
                       capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
    assert processes_under(state) == []


@pytest.mark.parametrize("argv, rc, said", [
    (["upgrade", "--yes"], 2, "upgrade needs --to VERSION or --rollback"),
    (["upgrade", "--to", "0.2.0", "--rollback", "--yes"], 2, "one of them"),
    (["upgrade", "--to", "9.9.9", "--yes"], 1, "no release '9.9.9'"),
    (["upgrade", "--to", "0.2.0", "--parallel", "0", "--yes"], 2, "--parallel"),
    (["upgrade", "--to", "0.2.0", "--parallel", "99", "--yes"], 2, "bad --parallel 99"),
    (["upgrade", "--to", "0.2.0", "nohost*", "--yes"], 1, "no live host matches 'nohost*'"),
    (["upgrade", "--rollback", "--yes"], 1, "no live host matching '*' has a previous release"),
    (["upgrade", "--to", "0.2.0"], 2, "add --yes to confirm"),
    (["cluster", "feature-level", "0"], 2, "feature-level"),
    (["cluster", "feature-level", "two"], 2, "feature-level"),
    (["cluster", "feature-level", str(NEXT + 1)], 1,
     f"feature level {NEXT + 1} is not supported by host1"),
])
def test_bad_upgrade_commands_say_one_line_and_start_nothing(cluster, store, tmp_path, argv,
                                                            rc, said):
    start_peers(cluster, store, ["host1"])
    cluster.cli_json("code", "add", second_release(tmp_path))
    before = store.range("")[0]
    done = cluster.cli(*argv)
    assert done.returncode == rc, (done.stdout, done.stderr)
    errors = [line for line in done.stderr.splitlines() if line.startswith("peerctl: ")]
    assert len(errors) == 1 and said in errors[0], done.stderr
    assert "Traceback" not in done.stderr
    changed = {kv.key for kv in store.range("")[0]} - {kv.key for kv in before}
    assert not [k for k in changed if k.startswith(("auto/", "tasks/", "cluster/"))], changed


def test_a_feature_level_garbled_in_etcd_is_one_line(cluster, store):
    store.put("cluster/feature_level", {"level": "high"})
    done = cluster.cli("cluster", "feature-level")
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1 and "cluster/feature_level" in \
        done.stderr, done.stderr


@pytest.mark.slow       # a new release that takes two TTLs to start
def test_a_release_slow_to_start_never_lets_the_hosts_lease_lapse(cluster, store, tmp_path):
    """The new process spends 2 TTLs importing before it adopts the lease:
    the old one renews it meanwhile, so the host never looks dead."""
    import os
    from tests.support import ROOT
    names = ["host1", "host2"]
    start_hosts(cluster, store, names, tmp_path)
    leases = leases_of(store, names)
    with open(os.path.join(ROOT, "engine", "peer.py")) as f:
        slow_peer = f.read().replace("from __future__ import annotations\n",
                                     "from __future__ import annotations\nimport time as _t\n"
                                     f"_t.sleep({2 * TTL})\n", 1)
    assert "_t.sleep" in slow_peer
    cluster.cli_json("code", "add", build_release(str(tmp_path / "releases"), "0.2.2",
                                                  files={"engine/peer.py": slow_peer}))
    done = upgrade(cluster, "--to", "0.2.2", "host1")
    assert [(h["host"], h["state"]) for h in done["hosts"]] == [("host1", "upgraded")], done
    # the same lease: it never expired (an expired lease is never granted again)
    assert leases_of(store, names) == leases
    assert store.get(keys.recovery("host1")) is None


def test_a_new_cluster_starts_at_this_trees_level_and_one_that_had_hosts_keeps_its_own(
        cluster, store):
    start_peers(cluster, store, ["host1"])
    assert cluster.cli_json("cluster", "feature-level")["level"] == NOW

    # a cluster from before the level existed: hosts, no level; its peers
    # must not raise it on their own (an older release may still run there)
    cluster.kill("host1")
    store.delete("cluster/feature_level")
    start_peers(cluster, store, ["host1", "host2"])
    assert cluster.cli_json("cluster", "feature-level")["level"] == 1
    assert store.get("cluster/feature_level") is None
