"""etcd backed up with ``peerctl etcd snapshot`` and restored as
docs/deploy.md says: real peers, a real etcd stopped, wiped and brought
back from the file, a snapshot killed half-way, and the refusals."""
import os
import signal
import stat
import subprocess

import pytest

from engine.core import api, failpoints
from engine.core.etcd_server import EtcdServer
from tests.support import wait_for
from tests.support.cluster import Cluster, finished, start_peers
from tests.support.secured_etcd import SecuredEtcd


@pytest.fixture
def cluster(own_etcd, cluster_name, tmp_path):
    cluster = Cluster(own_etcd.url, cluster_name, tmp_path)
    yield cluster
    cluster.close()


def restore(snapshot: str, etcd: EtcdServer) -> None:
    """docs/deploy.md, "Restore etcd": a fresh data directory made from the
    snapshot, for the member that will run on it (same name, same peer URL)."""
    subprocess.run(["etcdctl", "snapshot", "restore", snapshot, "--name", etcd.name,
                    "--data-dir", etcd.data_dir, "--initial-cluster",
                    f"{etcd.name}={etcd.peer_url}", "--initial-advertise-peer-urls",
                    etcd.peer_url], check=True, capture_output=True,
                   env={**os.environ, "ETCDCTL_API": "3"})


def vm_names(cluster) -> set[str]:
    return {vm["name"] for vm in cluster.cli_json("vmlist")}


@pytest.mark.parametrize("outage", ["brief", "longer than the peers' leases"])
def test_a_restored_snapshot_brings_the_cluster_back(cluster, own_etcd, tmp_path, outage):
    store = cluster.store
    start_peers(cluster, store, ["h1", "h2"])
    booted = cluster.cli("boot", "web1", "web2", "db1", "--resources",
                         "VCPU:1,MEMORY_MB:64,DISK_GB:1")
    assert booted.returncode == 0, booted.stderr
    running = api.start_automation(store, "ping", {"hosts": ["h1", "h2"], "rounds": 40})
    wait_for(lambda: len(api.get_task(store, running)["log"]) >= 3, what="the ping under way")

    saved = cluster.cli("etcd", "snapshot", str(tmp_path / "etcd.db"))
    assert saved.returncode == 0, saved.stderr
    assert "checksum verified" in saved.stdout
    assert stat.S_IMODE(os.stat(tmp_path / "etcd.db").st_mode) == 0o600
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".part")]
    # after the snapshot: a VM moves (the restored etcd will place it where it was)
    db1 = {vm["name"]: vm for vm in cluster.cli_json("vmlist")}["db1"]
    now_on = "h2" if db1["host"] == "h1" else "h1"
    moved = cluster.cli("migrate", "db1", "--to", now_on)
    assert moved.returncode == 0, moved.stderr

    # etcd is lost: its member stopped, its data gone; a new one from the file
    own_etcd.kill()
    os.rename(own_etcd.data_dir, own_etcd.data_dir + ".lost")
    if outage != "brief":
        wait_for(lambda: all("lease_lost" in cluster.log(h) or "session_interrupted"
                             in cluster.log(h) for h in ("h1", "h2")),
                 timeout=30, what="both peers to give their sessions up")
    restore(str(tmp_path / "etcd.db"), own_etcd)
    own_etcd.start()

    if outage != "brief":
        wait_for(lambda: all(cluster.log(h).count("session_started") == 2 for h in ("h1", "h2")),
                 timeout=60, what="both peers in new sessions")
    wait_for(lambda: {h["host"]: h["alive"] for h in cluster.cli_json("hostlist")}
             == {"h1": True, "h2": True}, timeout=60, what="both peers up again")
    assert vm_names(cluster) == {"web1", "web2", "db1"}
    task = finished(store, running, timeout=120)
    assert task["state"] == "done", task.get("error")
    assert all(p.poll() is None for p in cluster.peers.values()), "a peer died meanwhile"
    destroyed = [line for h in ("h1", "h2") for line in cluster.log(h).splitlines()
                 if "ghost_vm_destroyed" in line or "ghost_vm_kept_aside" in line]
    assert not destroyed, destroyed
    if outage != "brief":
        # etcd places db1 where it was before its move; it runs on, where it
        # moved, and its host says so (docs/deploy.md, "What a restore loses")
        assert f"ghost_vm_running_left_alone host={now_on} uuid={db1['uuid']}" in " ".join(
            cluster.log(now_on).split())


def test_a_snapshot_killed_half_way_leaves_no_file_and_the_next_one_is_whole(
        cluster, tmp_path):
    store = cluster.store
    for i in range(200):                    # several chunks of etcd's stream
        store.put(f"filler/{i}", {"pad": "x" * 2000})
    armed = str(tmp_path / "failpoints")
    failpoints.arm(armed, ["snapshot chunk"])
    killed = cluster.cli("etcd", "snapshot", str(tmp_path / "etcd.db"),
                         env={failpoints.ENV: armed})
    assert killed.returncode == -signal.SIGKILL
    assert not (tmp_path / "etcd.db").exists(), "a half snapshot was left as the file"
    leftovers = [f for f in os.listdir(tmp_path) if f.endswith(".part")]
    assert leftovers and all(f.startswith(".etcd.db.") for f in leftovers)

    again = cluster.cli_json("etcd", "snapshot", str(tmp_path / "etcd.db"))
    assert again["bytes"] == os.path.getsize(tmp_path / "etcd.db") > 400_000
    checked = subprocess.run(["etcdctl", "snapshot", "status", str(tmp_path / "etcd.db")],
                             capture_output=True, text=True, env={**os.environ,
                                                                  "ETCDCTL_API": "3"})
    assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize("where", ["exists", "no directory"])
def test_a_snapshot_onto_an_existing_file_or_nowhere_is_one_line_and_writes_nothing(
        cluster, tmp_path, where):
    backups = tmp_path / "backups"
    backups.mkdir()
    target = backups / "etcd.db"
    if where == "exists":
        target.write_bytes(b"yesterday's snapshot")
    else:
        target = backups / "missing" / "etcd.db"
    done = cluster.cli("etcd", "snapshot", str(target))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    if where == "exists":
        assert target.read_bytes() == b"yesterday's snapshot"
    assert sorted(os.listdir(backups)) == (["etcd.db"] if where == "exists" else [])


def test_only_etcds_root_may_take_a_snapshot(tmp_path):
    secured = SecuredEtcd(tmp_path)
    try:
        refused = secured.cli("operator", "etcd", "snapshot", str(tmp_path / "op.db"))
        assert refused.returncode == 4, refused.stderr
        assert not (tmp_path / "op.db").exists()
        taken = secured.cli("root", "etcd", "snapshot", str(tmp_path / "root.db"))
        assert taken.returncode == 0, taken.stderr
    finally:
        secured.close()
