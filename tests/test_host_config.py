"""A host's files where an administrator looks for them (issue 50): the
peer runs from /etc/peerctl/peerctl.conf alone, keeps its state in
/var/lib/peerctl/<cluster>, refuses /tmp unless told, and says how to carry
state over from the old default under /tmp.

The real paths are used, never writing this machine's /etc or /var/lib:
each peer runs in a mount namespace of its own where /etc and /var/lib are
overlays whose upper layers live in the test's directory (what the peer
writes there lands in them; the machine's own stay untouched), and, where
the machine's host name matters, a UTS namespace with a host name of the
test's choosing."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys

import pytest

from engine.core import keys
from tests.support import PEERCTL, ROOT, wait_until

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                reason="mount namespaces need root and unshare(1)")

SYSTEM_CONF = "/etc/peerctl/peerctl.conf"


class OwnRoot:
    """/etc and /var/lib of the test's own, for commands run through it."""

    def __init__(self, tmp_path, cluster):
        self.dir = tmp_path / "root"
        self.cluster = cluster
        for name in ("etc", "var-lib"):
            (self.dir / name / "upper").mkdir(parents=True)
            (self.dir / name / "work").mkdir()
        self.processes: list[subprocess.Popen] = []

    @property
    def etc(self):
        """What the command sees in /etc on top of the machine's."""
        return self.dir / "etc" / "upper"

    @property
    def var_lib(self):
        """What the command wrote to /var/lib."""
        return self.dir / "var-lib" / "upper"

    def write_conf(self, **values) -> None:
        (self.etc / "peerctl").mkdir(exist_ok=True)
        lines = ["[peerctl]"] + [f"{key} = {value}" for key, value in values.items()]
        (self.etc / "peerctl" / "peerctl.conf").write_text("\n".join(lines) + "\n")

    def command(self, args, hostname=None, read_only=(), before="") -> list[str]:
        script = ["set -e"]
        for target, name in (("/etc", "etc"), ("/var/lib", "var-lib")):
            layer = self.dir / name
            script.append(f"mount -t overlay overlay -o lowerdir={target},"
                          f"upperdir={layer / 'upper'},workdir={layer / 'work'} {target}")
        for path in read_only:
            script.append(f"mount --bind {path} {path} && mount -o remount,bind,ro {path}")
        if hostname:
            script.append(f"hostname {shlex.quote(hostname)}")
        if before:
            script.append(before)
        script.append('exec "$@"')
        return ["unshare", "-m", "-u", "--propagation", "private", "sh", "-c",
                "\n".join(script), "sh", sys.executable, PEERCTL, *args]

    def env(self, **extra) -> dict:
        """The environment of an installed host: no PEERCTL_* of the tests'."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PEERCTL_")}
        env.update(PYTHONUNBUFFERED="1", **extra)
        return env

    def run(self, *args, hostname=None, read_only=(), env=None, timeout=60):
        return subprocess.run(self.command(args, hostname, read_only), capture_output=True,
                              text=True, env=self.env(**(env or {})), cwd=self.dir,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def start(self, *args, hostname=None, env=None, before="", log="peer.log"):
        """A peer, its stderr in ``log`` under the test's root directory."""
        with open(self.dir / log, "ab") as out:
            process = subprocess.Popen(self.command(args, hostname, before=before),
                                       stdout=out, stderr=out, env=self.env(**(env or {})),
                                       cwd=self.dir, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
        self.processes.append(process)
        return process

    def stop(self, process) -> None:
        """SIGTERM: the peer leaves the cluster gracefully; its namespace goes with it."""
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(30)

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait(30)


@pytest.fixture
def own_root(tmp_path, cluster):
    root = OwnRoot(tmp_path, cluster)
    yield root
    root.close()


def host_record(store, host) -> dict:
    """``host``'s record in etcd, once its peer wrote it."""
    return wait_until(lambda: store.get(keys.host(host)), lambda kv: kv is not None,
                      timeout=60, what=f"{host}'s record").value


def the_line(done) -> str:
    assert done.stdout == "" and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


# -- the peer from the config file alone --------------------------------------

def test_a_peer_runs_from_etc_peerctl_conf_alone_with_its_state_in_var_lib(own_root, cluster,
                                                                            store):
    own_root.write_conf(etcd=cluster.etcd_url, cluster=cluster.name, host="rack-a1",
                        libvirt="test:///default", ttl=2)
    peer = own_root.start("peer")
    record = host_record(store, "rack-a1")
    assert record["state_dir"] == f"/var/lib/peerctl/{cluster.name}"
    assert record["libvirt_uri"] == "test:///default"
    # what the peer keeps lands in the overlay's /var/lib, nowhere under /tmp
    state = own_root.var_lib / "peerctl" / cluster.name
    wait_until(lambda: (state / "peer.json").exists(), lambda ok: ok, timeout=30,
               what="peer.json in /var/lib/peerctl/CLUSTER")
    assert json.loads((state / "peer.json").read_text())["pid"] == peer.pid
    assert not os.path.exists(f"/tmp/peerctl/{cluster.name}/rack-a1")
    own_root.stop(peer)
    assert peer.returncode == 0, (own_root.dir / "peer.log").read_text()


def test_with_no_host_named_the_peer_is_the_machines_short_host_name(own_root, cluster, store):
    own_root.write_conf(etcd=cluster.etcd_url, cluster=cluster.name, libvirt="test:///default",
                        ttl=2)
    peer = own_root.start("peer", hostname="node7.rack3.example.org")
    assert host_record(store, "node7")["host"] == "node7"
    own_root.stop(peer)


def test_flags_and_the_environment_still_override_the_config_file(own_root, cluster, store):
    """--host over PEERCTL_HOST over host; PEERCTL_STATE_DIR over state_dir."""
    own_root.write_conf(etcd=cluster.etcd_url, cluster=cluster.name, host="from-conf",
                        libvirt="test:///bogus-from-conf", ttl=2, state_dir="/var/lib/x")
    state = own_root.dir / "explicit-state"
    peer = own_root.start("peer", "--host", "from-flag", "--libvirt", "test:///default",
                          env={"PEERCTL_HOST": "from-env", "PEERCTL_STATE_DIR": str(state)})
    record = host_record(store, "from-flag")
    assert record["state_dir"] == str(state) and record["libvirt_uri"] == "test:///default"
    assert store.get(keys.host("from-env")) is None and store.get(keys.host("from-conf")) is None
    own_root.stop(peer)


# -- refusals: one line, exit 2, nothing made or started ----------------------

def test_a_config_naming_no_host_on_a_machine_called_localhost_is_refused(own_root, cluster,
                                                                          store):
    own_root.write_conf(etcd=cluster.etcd_url, cluster=cluster.name, libvirt="test:///default")
    done = own_root.run("peer", hostname="localhost")
    assert done.returncode == 2
    assert the_line(done) == (
        f"peerctl: no host name: none in {SYSTEM_CONF}, and this machine's ('localhost') "
        "names no one host: set host = NAME there, or give --host NAME")
    assert store.range("")[0] == [] and not (own_root.var_lib / "peerctl").exists()


def test_a_bad_host_name_in_the_config_file_is_refused_naming_it(own_root, cluster, store):
    own_root.write_conf(etcd=cluster.etcd_url, cluster=cluster.name, host="rack a1")
    done = own_root.run("peer")
    assert done.returncode == 2
    assert the_line(done).startswith(f"peerctl: bad host name 'rack a1' host in {SYSTEM_CONF} ")
    assert store.range("")[0] == []


def test_an_unreadable_etc_peerctl_conf_is_one_line_for_every_command(own_root):
    (own_root.etc / "peerctl" / "peerctl.conf").mkdir(parents=True)    # unreadable, even by root
    for command in (["peer"], ["vmlist"]):
        done = own_root.run(*command)
        assert done.returncode == 2, (command, done.stderr)
        assert the_line(done) == f"peerctl: cannot read config file {SYSTEM_CONF}: Is a directory"
    assert not (own_root.var_lib / "peerctl").exists()


def test_etc_peerctl_conf_comes_after_peerctl_conf_and_before_the_trees(own_root, tmp_path):
    own_root.write_conf(ttl=0)
    done = own_root.run("vmlist")
    assert done.returncode == 2
    assert the_line(done).startswith(f"peerctl: bad ttl '0' in {SYSTEM_CONF} ")
    mine = tmp_path / "mine.conf"
    mine.write_text("[peerctl]\nttl = 7s\n")
    done = own_root.run("vmlist", env={"PEERCTL_CONF": str(mine)})
    assert the_line(done).startswith(f"peerctl: bad ttl '7s' in {mine} ")


def test_a_state_dir_under_tmp_from_the_config_file_is_refused(own_root, cluster, store,
                                                              tmp_path):
    state = tmp_path / "state-in-tmp"
    assert str(state).startswith("/tmp/")
    own_root.write_conf(etcd=cluster.etcd_url, cluster=cluster.name, host="h1",
                        libvirt="test:///default", state_dir=state)
    done = own_root.run("peer")
    assert done.returncode == 2
    assert the_line(done) == (
        f"peerctl: refusing state directory {state} (state_dir in {SYSTEM_CONF}): /tmp is "
        "emptied at boot, and the VMs' disks with it; name another in state_dir, or this "
        "one explicitly with --state-dir")
    assert not state.exists() and store.range("")[0] == []


def test_a_state_dir_that_cannot_be_written_is_refused(own_root, cluster, store, tmp_path):
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    own_root.write_conf(etcd=cluster.etcd_url, cluster=cluster.name, host="h1",
                        libvirt="test:///default")
    for where in (read_only, read_only / "state"):
        done = own_root.run("peer", "--state-dir", str(where), read_only=[read_only])
        assert done.returncode == 2
        what = "is" if where == read_only else f"cannot be made: {read_only} is"
        assert the_line(done) == (f"peerctl: state directory {where} (from --state-dir) "
                                  f"{what} not writable")
    assert list(read_only.iterdir()) == [] and store.range("")[0] == []


# -- the old default under /tmp -------------------------------------------------

@pytest.fixture
def old_state(cluster):
    """This host's state under the old default, /tmp/peerctl/CLUSTER/old1."""
    old = f"/tmp/peerctl/{cluster.name}/old1"
    os.makedirs(os.path.join(old, "images"))
    with open(os.path.join(old, "images", "cached.qcow2"), "w") as f:
        f.write("an image the host cached\n")
    yield old
    shutil.rmtree(f"/tmp/peerctl/{cluster.name}", ignore_errors=True)


def test_state_under_the_old_default_is_moved_with_the_command_the_peer_gives(
        own_root, cluster, store, old_state):
    own_root.write_conf(etcd=cluster.etcd_url, cluster=cluster.name, host="old1",
                        libvirt="test:///default", ttl=2)
    new = f"/var/lib/peerctl/{cluster.name}"
    done = own_root.run("peer")
    assert done.returncode == 2
    line = the_line(done)
    assert line.startswith(f"peerctl: this host's state is still in {old_state}, the old "
                           "default"), line
    assert line.endswith(f"--state-dir {old_state}"), line
    move = line.split("move it with '")[1].split("'")[0]
    assert move == f"mkdir -p /var/lib/peerctl && mv -T {old_state} {new}"
    assert store.range("")[0] == [] and not (own_root.var_lib / "peerctl").exists()

    # the administrator runs that command, then starts the peer
    peer = own_root.start("peer", before=move)
    assert host_record(store, "old1")["state_dir"] == new
    moved = own_root.var_lib / "peerctl" / cluster.name / "images" / "cached.qcow2"
    assert moved.read_text() == "an image the host cached\n"
    assert not os.path.exists(old_state)
    own_root.stop(peer)

    # state in both places: the peer starts, with one warning line naming the old one
    os.makedirs(os.path.join(old_state, "images"))
    peer = own_root.start("peer", log="again.log")
    wait_until(lambda: store.get(keys.host("old1")), lambda kv: kv and kv.value["pid"] == peer.pid,
               timeout=60, what="old1 served again")
    own_root.stop(peer)
    log = (own_root.dir / "again.log").read_text()
    warned = [line for line in log.splitlines() if "old_state_dir" in line]
    assert len(warned) == 1 and old_state in warned[0] and "[warning" in warned[0], log


def test_a_moved_state_directory_still_names_the_release_its_host_runs(tmp_path):
    """current.json names releases by absolute path: once the directory is
    moved out of /tmp, the release it holds is read at its new place (else
    the peer would silently run the package's code instead)."""
    from engine.releases.current import read_current, write_current
    old, new = tmp_path / "old", tmp_path / "new"
    (old / "releases" / "1.4.0").mkdir(parents=True)
    (old / "releases" / "1.3.0").mkdir()
    write_current(str(old), {"release": "1.4.0", "path": str(old / "releases" / "1.4.0"),
                             "previous": {"release": "1.3.0",
                                          "path": str(old / "releases" / "1.3.0")}})
    old.rename(new)
    chosen = read_current(str(new))
    assert chosen["path"] == str(new / "releases" / "1.4.0")
    assert chosen["previous"]["path"] == str(new / "releases" / "1.3.0")


def test_the_packages_host_config_is_read_without_complaint():
    """packaging/peerctl.conf, the .deb's /etc/peerctl/peerctl.conf: every
    value in it passes the settings' checks (a bad one would be exit 2),
    and it drives the real hypervisor."""
    from engine.commandline.settings import read_conf
    path = os.path.join(ROOT, "packaging", "peerctl.conf")
    assert read_conf(path)["libvirt"] == "qemu:///system"
    done = subprocess.run([sys.executable, PEERCTL, "--conf", path,
                           "--etcd", "http://127.0.0.1:1", "vmlist"],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == \
        (3, "peerctl: etcd unreachable at http://127.0.0.1:1\n")
