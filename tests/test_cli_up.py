"""`up` and `down`: the embedded default, a local etcd and N peers on this
machine, started detached and stopped by PID."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import requests

from tests.support import PEERCTL


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return bool(f.read())           # a zombie has an empty command line
    except OSError:
        return False


@pytest.fixture
def local(tmp_path, cluster_name):
    """Run peerctl in tmp_path, with no etcd named: `up` there is the default."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERCTL_")}
    env.update(PEERCTL_CLUSTER=cluster_name, PEERCTL_CONF=os.devnull,
               PYTHONUNBUFFERED="1")

    def cli(*args, timeout=120, extra_env=None):
        return subprocess.run([sys.executable, PEERCTL, *args], capture_output=True,
                              text=True, env={**env, **(extra_env or {})}, cwd=str(tmp_path),
                              timeout=timeout, stdin=subprocess.DEVNULL)
    yield cli
    cli("down")                 # whatever a failed test left running


# Loaded by the peers `up` starts (through PYTHONPATH): each registers its
# placement provider SLOW_REGISTRATION seconds after writing its hosts/ record,
# as a real host measuring its disks may.  This widens the window `up` must
# wait through; the test never sleeps to synchronise.
SLOW_REGISTRATION = 1.5
SITECUSTOMIZE = f"""
import importlib.abc, importlib.util, sys, time

class SlowRegistration(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "engine.placement.host" or "peer" not in sys.argv:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            register = module.register_host

            def register_host(*args, **kwargs):
                time.sleep({SLOW_REGISTRATION})
                return register(*args, **kwargs)
            module.register_host = register_host
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, SlowRegistration())
"""


def processes_naming(path) -> list[int]:
    """PIDs of the processes whose command line names ``path``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and running(int(entry)):
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if str(path).encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_up_again_and_down(local, tmp_path, cluster_name):
    # killed right after recording what it was asked for, before starting
    # anything: the directory is set up with 2 hosts all the same
    armed = tmp_path / "failpoints"
    armed.write_text("up_configured\n")
    killed = local("up", "--hosts", "2", extra_env={"PEERCTL_FAILPOINTS": str(armed)})
    assert killed.returncode == -9, (killed.stdout, killed.stderr)
    assert json.loads((tmp_path / "state" / "up.json").read_text())["config"] == \
        {"hosts": 2, "libvirt": "test:///default"}
    assert processes_naming(tmp_path / "state") == []
    slow = tmp_path / "slow-registration"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(SITECUSTOMIZE)
    # no flags: what the directory was set up with (the default would be 3)
    done = local("--format", "json", "up", extra_env={"PYTHONPATH": str(slow)})
    assert done.returncode == 0, done.stderr
    up = json.loads(done.stdout)
    assert up["state_dir"] == str(tmp_path / "state") and up["cluster"] == cluster_name
    assert [p["host"] for p in up["peers"]] == ["host1", "host2"]
    assert all(p["started"] for p in up["peers"])
    # the contract's shape: scripts find every process `up` started
    assert up["etcd"] == [f"http://127.0.0.1:{up['etcd'][0].rsplit(':', 1)[1]}"]
    assert [(p["name"], p["role"]) for p in up["processes"]] == \
        [("etcd", "etcd"), ("host1", "peer"), ("host2", "peer")]
    pids = [p["pid"] for p in up["processes"]]
    assert pids[1:] == [p["pid"] for p in up["peers"]]
    assert all(running(pid) for pid in pids)
    assert os.path.exists(tmp_path / "state" / "up.json")
    assert os.path.exists(tmp_path / "state" / "etcd-data")

    # up returned only once every peer can take a VM: its placement provider,
    # which a peer registers after its hosts/ record, is there with inventory
    providers = local("--format", "json", "placement", "providers")
    assert providers.returncode == 0, providers.stderr
    assert [(p["name"], bool(p["inventories"])) for p in json.loads(providers.stdout)] == \
        [("host1", True), ("host2", True)]
    # the README's quick start: `up && boot ... && vmlist`, with nothing in between
    boot = local("--format", "json", "boot", "vm1", "--resources", "VCPU:1,MEMORY_MB:256,DISK_GB:1")
    assert boot.returncode == 0, (boot.stdout, boot.stderr)
    assert [vm["name"] for vm in json.loads(boot.stdout)["vms"]] == ["vm1"]
    listed = local("--format", "json", "vmlist")
    assert listed.returncode == 0, listed.stderr
    assert [(vm["name"], vm["state"]) for vm in json.loads(listed.stdout)] == [("vm1", "running")]
    # each peer serves the API on loopback; a token of the CLI opens it
    assert len(up["api"]) == 2 and all(url.startswith("http://127.0.0.1:") for url in up["api"])
    secret = json.loads(local("--format", "json", "token", "create", "--role", "viewer").stdout)[
        "secret"]
    for url in up["api"]:
        assert requests.get(url + "/v1/vms", timeout=10).status_code == 401
        answer = requests.get(url + "/v1/vms", headers={"Authorization": f"Bearer {secret}"},
                              timeout=10)
        assert [vm["name"] for vm in answer.json()] == ["vm1"]

    # in this directory the CLI finds the local cluster by itself
    hosts = json.loads(local("--format", "json", "hostlist").stdout)
    assert [(h["host"], h["alive"]) for h in hosts] == [("host1", True), ("host2", True)]
    ping = local("--format", "json", "ping")
    assert ping.returncode == 0, ping.stderr
    assert json.loads(ping.stdout)["state"] == "done"

    # again, with or without flags: reports what is up, starts nothing new
    for flags in (["--hosts", "2"], []):
        again = local("up", *flags)
        assert again.returncode == 0, again.stderr
        assert again.stdout.count("already running") == 3, again.stdout
        assert "host3" not in again.stdout
        assert f"export PEERCTL_ETCD={up['etcd'][0]} " in again.stdout
    # a cluster, libvirt or host count other than the recorded one is
    # refused, never ignored
    before = (tmp_path / "state" / "up.json").read_text()
    for flags, recorded in [(["--cluster", "other"], f"cluster '{cluster_name}'"),
                            (["--libvirt", "test:///other"], "--libvirt test:///default"),
                            (["--hosts", "3"], "with 2 hosts, not 3")]:
        refused = local("up", *flags)
        assert refused.returncode == 2, (flags, refused.stdout, refused.stderr)
        line = refused.stderr.strip()
        assert len(line.splitlines()) == 1 and refused.stdout == "", refused.stderr
        assert recorded in line and "down" in line and "remove state" in line, line
    assert (tmp_path / "state" / "up.json").read_text() == before
    assert all(running(pid) for pid in pids)
    same = local("--cluster", cluster_name, "up", "--hosts", "2", "--libvirt", "test:///default")
    assert same.returncode == 0 and same.stdout.count("already running") == 3, same.stderr

    down = local("--format", "json", "down")
    assert down.returncode == 0, down.stderr
    stopped = json.loads(down.stdout)
    # the test driver's hosts have no guard, no daemon: peers and etcd only
    assert [(s["name"], s["role"]) for s in stopped["stopped"]] == \
        [("host1", "peer"), ("host2", "peer"), ("etcd", "etcd")]
    assert all(s["what"] in ("stopped", "killed") for s in stopped["stopped"])
    assert stopped["kept"] == []
    assert not any(running(pid) for pid in pids)
    assert processes_naming(tmp_path / "state") == []
    assert local("down").stdout.count("not running") == 3

    # with nothing up, the default endpoint is the config's, unreachable here
    done = local("--etcd", "http://127.0.0.1:1", "vmlist")
    assert done.returncode == 3


def test_down_leaves_a_foreign_process_alone(local, tmp_path):
    """A recorded PID that now runs something else is not ours to kill."""
    state = tmp_path / "state"
    state.mkdir()
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        (state / "up.json").write_text(json.dumps({
            "cluster": "x", "peers": [],
            "etcd": {"pid": sleeper.pid, "cmd": ["/usr/bin/etcd", "--name", "peerctl"],
                     "url": "http://127.0.0.1:1", "log": str(state / "etcd.log")}}))
        done = local("down")
        assert done.returncode == 0
        assert "not running" in done.stdout
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_up_on_a_qemu_directory_refuses_another_hypervisor_or_host_count(local, tmp_path,
                                                                        cluster_name):
    """A directory set up with `--hosts 2 --libvirt qemu` (down now): asking
    for the test driver or a third host is refused in one line, before
    anything starts, and the directory is left as it was."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "up.json").write_text(json.dumps({
        "cluster": cluster_name, "config": {"hosts": 2, "libvirt": "qemu"}, "peers": [
            {"host": f"host{i}", "pid": 1, "cmd": ["never"], "libvirt": "qemu"}
            for i in (1, 2)]}))
    before = sorted(os.listdir(state)), (state / "up.json").read_text()
    for flags, said in [(["--libvirt", "test:///default"], "--libvirt qemu, not test:///default"),
                        (["--hosts", "3"], "with 2 hosts, not 3"),
                        (["--hosts", "3", "--libvirt", "qemu"], "with 2 hosts, not 3")]:
        refused = local("up", *flags)
        assert refused.returncode == 2, (flags, refused.stdout, refused.stderr)
        assert refused.stdout == "" and len(refused.stderr.strip().splitlines()) == 1, \
            refused.stderr
        assert said in refused.stderr, refused.stderr
    assert (sorted(os.listdir(state)), (state / "up.json").read_text()) == before
    assert processes_naming(state) == []


@pytest.mark.slow      # a long scenario (8 s or more here): the third tier
def test_up_with_tls_and_three_etcd_members(local, tmp_path, cluster_name):
    done = local("--format", "json", "up", "--hosts", "2", "--etcd-members", "3", "--tls")
    assert done.returncode == 0, done.stderr
    up = json.loads(done.stdout)
    assert len(up["etcd"]) == 3 and all(url.startswith("https://127.0.0.1:") for url in up["etcd"])
    assert [(p["name"], p["role"]) for p in up["processes"]] == \
        [("etcd-m1", "etcd"), ("etcd-m2", "etcd"), ("etcd-m3", "etcd"),
         ("host1", "peer"), ("host2", "peer")]
    assert all(running(p["pid"]) for p in up["processes"])
    tls = tmp_path / "state" / "tls"
    assert {"ca.pem", "operator.pem", "viewer.pem", "root.pem", "peer-host1.pem",
            "peer-host2.pem"} <= set(os.listdir(tls))
    # in this directory commands are the operator: they boot
    boot = local("--format", "json", "boot", "vm1", "--resources", "VCPU:1,MEMORY_MB:256,DISK_GB:1")
    assert boot.returncode == 0, boot.stderr
    # the viewer reads and may not boot; without a certificate nothing at all
    viewer = {"PEERCTL_CERT": str(tls / "viewer.pem"), "PEERCTL_KEY": str(tls / "viewer-key.pem")}
    assert local("vmlist", extra_env=viewer).returncode == 0
    refused = local("boot", "vm2", "--resources", "VCPU:1,MEMORY_MB:256,DISK_GB:1",
                    extra_env=viewer)
    assert refused.returncode == 4 and "viewer" in refused.stderr, refused.stderr
    # the API is HTTPS with the cluster's certificates: the viewer's reads
    https = requests.Session()
    https.trust_env, https.verify = False, str(tls / "ca.pem")
    https.cert = (str(tls / "viewer.pem"), str(tls / "viewer-key.pem"))
    assert all(url.startswith("https://127.0.0.1:") for url in up["api"])
    assert [vm["name"] for vm in https.get(up["api"][0] + "/v1/vms", timeout=10).json()] == ["vm1"]
    assert https.post(up["api"][1] + "/v1/vms", json={"names": ["vm3"], "resources": "VCPU:1"},
                      timeout=10).status_code == 403
    # the peers run as themselves: each with its own certificate
    recorded = json.loads((tmp_path / "state" / "up.json").read_text())
    for peer in recorded["peers"]:
        cert = peer["cmd"][peer["cmd"].index("--cert") + 1]
        assert cert == str(tls / f"peer-{peer['host']}.pem")
    # its shape is kept: another size or plain http is refused
    refused = local("up", "--etcd-members", "5")
    assert refused.returncode == 2 and "3 etcd members" in refused.stderr
    down = json.loads(local("--format", "json", "down").stdout)["stopped"]
    assert [s["name"] for s in down] == ["host1", "host2", "etcd-m1", "etcd-m2", "etcd-m3"]
    assert not any(running(p["pid"]) for p in up["processes"])


def test_a_peer_still_entering_its_machine_of_the_rack_is_the_one_up_started(tmp_path):
    """``up --libvirt qemu`` starts a host's peer as ``ip netns exec NETNS``
    + its command, which that execs a moment later under the same PID:
    meanwhile the process is still the peer up recorded, not a stranger."""
    from engine.supervisor import is_ours, live_peer
    cmd = [sys.executable, PEERCTL, "peer", "--host", "host1"]
    # A process showing what `ip` shows before it execs: Python run as "ip"
    # on a script named "netns" that waits.
    (tmp_path / "netns").write_text("import sys\nsys.stdin.read()\n")
    entering = subprocess.Popen(["ip", "netns", "exec", "peerctl-t-host1", *cmd],
                                executable=sys.executable, cwd=str(tmp_path),
                                stdin=subprocess.PIPE)
    try:
        record = {"host": "host1", "pid": entering.pid, "cmd": cmd}
        assert is_ours(record)
        assert live_peer("/nonexistent", record) == record
        assert not is_ours({**record, "cmd": [*cmd, "--ttl", "5"]})
    finally:
        entering.communicate(b"", timeout=30)
