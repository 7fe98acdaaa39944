"""`up` and `down`: the embedded default, a local etcd and N peers on this
machine, started detached and stopped by PID."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

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
    env.update(PEERCTL_CLUSTER=cluster_name, PEERCTL_CONF=str(tmp_path / "none.conf"),
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


def test_up_again_and_down(local, tmp_path, cluster_name):
    slow = tmp_path / "slow-registration"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(SITECUSTOMIZE)
    done = local("--format", "json", "up", "--hosts", "2", extra_env={"PYTHONPATH": str(slow)})
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

    # in this directory the CLI finds the local cluster by itself
    hosts = json.loads(local("--format", "json", "hostlist").stdout)
    assert [(h["host"], h["alive"]) for h in hosts] == [("host1", True), ("host2", True)]
    ping = local("--format", "json", "ping")
    assert ping.returncode == 0, ping.stderr
    assert json.loads(ping.stdout)["state"] == "done"

    # again: reports what is up, starts nothing new
    again = local("up", "--hosts", "2")
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("already running") == 3
    assert f"export PEERCTL_ETCD={up['etcd'][0]} " in again.stdout
    # a cluster or libvirt other than the recorded one is refused, never ignored
    before = (tmp_path / "state" / "up.json").read_text()
    for flags, recorded in [(["--cluster", "other"], f"cluster '{cluster_name}'"),
                            (["--libvirt", "test:///other"], "--libvirt test:///default")]:
        refused = local("up", "--hosts", "2", *flags)
        assert refused.returncode == 2, (flags, refused.stdout, refused.stderr)
        line = refused.stderr.strip()
        assert len(line.splitlines()) == 1 and refused.stdout == "", refused.stderr
        assert recorded in line and "down" in line and "remove state" in line, line
    assert (tmp_path / "state" / "up.json").read_text() == before
    assert all(running(pid) for pid in pids)
    same = local("--cluster", cluster_name, "up", "--hosts", "2", "--libvirt", "test:///default")
    assert same.returncode == 0 and same.stdout.count("already running") == 3, same.stderr
    # more hosts: only the new one starts
    more = json.loads(local("--format", "json", "up", "--hosts", "3").stdout)
    assert [(p["host"], p["started"]) for p in more["peers"]] == \
        [("host1", False), ("host2", False), ("host3", True)]
    pids.append(more["peers"][2]["pid"])

    down = local("--format", "json", "down")
    assert down.returncode == 0, down.stderr
    stopped = json.loads(down.stdout)["stopped"]
    assert [s["name"] for s in stopped] == ["host1", "host2", "host3", "etcd"]
    assert all(s["what"] in ("stopped", "killed") for s in stopped)
    assert not any(running(pid) for pid in pids)
    assert local("down").stdout.count("not running") == 4

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
