"""Errors through the real command line: exit codes 1, 2 and 3, one line on
stderr naming the bad part, never a traceback unless --debug."""
from __future__ import annotations

import os
import re
import signal
import threading
import subprocess
import sys
import urllib.request
import uuid

import pytest

from engine.core import keys
from engine.core.etcd_server import free_port
from engine.core.store import Store
from tests.support import PEERCTL, ROOT, one_line, wait_for
from tests.support.cluster import Cluster


@pytest.fixture
def closed_url():
    return f"http://127.0.0.1:{free_port()}"


@pytest.mark.parametrize("command", [
    ["vmlist"], ["hostlist"], ["hoststats", "host*"], ["tasks"], ["task", "x1"],
    ["wait", "x1"], ["abort", "x1"], ["ping"], ["destroy", "vm1", "--yes"],
    ["stop", "host1/*"], ["boot", "vm1", "--resources", "VCPU:1,MEMORY_MB:256"],
    ["placement", "providers"], ["placement", "allocations"],
])
def test_etcd_unreachable_exits_3_with_one_line(cluster, closed_url, command):
    done = cluster.cli("--etcd", closed_url, *command, input="")
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert one_line(done) == f"peerctl: etcd unreachable at {closed_url}"
    assert done.stdout == ""


def test_etcd_unreachable_from_the_environment(cluster, closed_url):
    done = cluster.cli("--format", "json", "vmlist", env={"PEERCTL_ETCD": closed_url})
    assert done.returncode == 3
    assert closed_url in one_line(done)


def test_an_etcd_that_takes_no_answer_says_how_long_it_was_given(cluster, own_etcd):
    """A stopped etcd accepts the connection and never answers: the one
    line says how long it had (a new connection's 3 s), apart from one
    that is not there at all."""
    os.kill(own_etcd.process.pid, signal.SIGSTOP)
    try:
        done = cluster.cli("--etcd", own_etcd.url, "vmlist", input="")
    finally:
        os.kill(own_etcd.process.pid, signal.SIGCONT)
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert one_line(done) == f"peerctl: etcd unreachable at {own_etcd.url} (no answer in 3 s)"


def test_an_etcd_silent_for_a_second_is_waited_for(cluster, own_etcd):
    """A busy machine's etcd may take a moment to answer a new connection:
    a command waits for it instead of calling it unreachable."""
    os.kill(own_etcd.process.pid, signal.SIGSTOP)
    wakes = threading.Timer(1.0, os.kill, (own_etcd.process.pid, signal.SIGCONT))
    wakes.start()
    try:
        done = cluster.cli("--etcd", own_etcd.url, "--format", "json", "vmlist", input="")
    finally:
        wakes.join()
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "[]", "")


def test_debug_shows_the_traceback(cluster, closed_url):
    done = cluster.cli("--debug", "--etcd", closed_url, "vmlist")
    assert done.returncode == 3
    assert "Traceback" in done.stderr
    assert done.stderr.rstrip().endswith(f"peerctl: etcd unreachable at {closed_url}")


@pytest.mark.parametrize("command, named", [
    (["vmlist", "a/b/c"], "'a/b/c'"),
    (["vmlist", "host1/"], "'host1/'"),
    (["vmlist", "web[1"], "'web[1'"),
    (["hostlist", "host/x"], "'host/x'"),
    (["destroy", "a/b/c", "--yes"], "'a/b/c'"),
    (["ping", "h[", "--rounds", "2"], "'h['"),
    (["boot", "vm1", "--resources", "VCPU:x"], "VCPU:x"),
    (["boot", "vm1", "--resources", "VCPU:1,BOGUS"], "BOGUS"),
    (["boot", "vm1", "--resources", "resources=VCPU:1&bogus=1"], "bogus"),
    (["boot", "vm1", "--resources", "VCPU:1", "--required", "not a trait"], "not a trait"),
    (["boot", "vm*", "--resources", "VCPU:1"], "'vm*'"),
    (["boot", "a", "b", "a", "c", "b", "--resources", "VCPU:1"],
     "VM name given more than once: a, b"),
    (["boot", "vm1", "--resources", "VCPU:1", "--required", "!!FOO"], "bad trait '!!FOO'"),
    (["boot", "vm1", "--resources", "VCPU:1", "--required", "NOT_A_KNOWN_TRAIT"],
     "bad --required 'NOT_A_KNOWN_TRAIT'"),
    (["placement", "candidates", "VCPU:1", "--required", "!!FOO"], "bad trait '!!FOO'"),
    (["boot", "vm1"], "--resources"),
    (["placement", "candidates", "VCPU:-1"], "VCPU"),
    (["ping", "--rounds", "0"], "--rounds"),
    (["vmlist", "--bogus"], "--bogus"),
    (["vmlist", "-o", "name,bogus"], "'bogus'"),
    (["vmlist", "--sort", "-bogus"], "'bogus'"),
    (["--format", "yaml", "vmlist"], "yaml"),
    (["nosuchcommand"], "nosuchcommand"),
    (["wait", "x1", "--timeout", "soon"], "soon"),
    (["wait", "x1", "--timeout", "nan"], "finite number of seconds: 'nan'"),
    (["wait", "x1", "--timeout", "inf"], "finite number of seconds: 'inf'"),
    (["--conf", "/nonexistent/peerctl.conf", "vmlist"],
     "cannot read config file '/nonexistent/peerctl.conf' from --conf"),
    (["ping", "--rounds", "10001"], "--rounds: at most 10000: '10001'"),
    # an empty or odd global is an error, never a silent fall back to the default
    (["--etcd", "", "vmlist"], "no etcd endpoint given ('' from --etcd)"),
    (["--etcd", " , ", "hostlist"], "no etcd endpoint given"),
    (["--cluster", "", "vmlist"], "bad cluster name '' from --cluster"),
    (["--cluster", "a/b", "vmlist"], "bad cluster name 'a/b'"),
    (["vmlist", "--cluster", "a b"], "bad cluster name 'a b'"),
    (["--etcd", "http://[::1", "vmlist"], "bad etcd endpoint 'http://[::1': Invalid IPv6"),
    (["--etcd", "http://127.0.0.1:99999", "hostlist"],
     "bad etcd endpoint 'http://127.0.0.1:99999': Port out of range"),
    (["--etcd", "http://127.0.0.1:0", "tasks"], "bad etcd endpoint 'http://127.0.0.1:0'"),
    (["--etcd", "http://h:abc", "ping"], "bad etcd endpoint 'http://h:abc'"),
    (["--cluster", "a/b", "up", "--state-dir", "/proc/peerctl-never-made"], "'a/b'"),
])
def test_usage_errors_exit_2_naming_the_bad_part(cluster, command, named):
    done = cluster.cli(*command, input="")
    assert done.returncode == 2, (done.stdout, done.stderr)
    line = one_line(done)
    assert line.startswith("peerctl: ") and named in line, line
    assert done.stdout == ""


def test_usage_errors_come_before_etcd(cluster, closed_url):
    done = cluster.cli("--etcd", closed_url, "boot", "vm1", "--resources", "VCPU:0")
    assert done.returncode == 2, done.stderr
    done = cluster.cli("--etcd", "ftp://nowhere", "vmlist")
    assert done.returncode == 2 and "ftp://nowhere" in one_line(done)
    done = cluster.cli("vmlist", env={"PEERCTL_ETCD": f"{closed_url},http://[::1"})
    assert done.returncode == 2 and "bad etcd endpoint 'http://[::1'" in one_line(done)
    # a bad -o / --sort field is checked before etcd is read (and before matching)
    for command, named in [(["vmlist", "-o", "bogus"], "'bogus'"),
                           (["vmlist", "nomatch", "-o", "bogus"], "'bogus'"),
                           (["vmlist", "--sort", "-bogus"], "'bogus'"),
                           (["hostlist", "--sort", "bogus"], "'bogus'"),
                           (["hoststats", "-o", "+bogus"], "'bogus'"),
                           (["tasks", "-o", "bogus"], "'bogus'"),
                           (["tasks", "--sort", "bogus"], "'bogus'")]:
        done = cluster.cli("--etcd", closed_url, *command)
        assert done.returncode == 2, (command, done.stderr)
        assert named in one_line(done) and done.stdout == ""


def test_unknown_task_exits_1(cluster):
    for command in (["task", "nosuch"], ["wait", "nosuch"], ["abort", "nosuch"]):
        done = cluster.cli(*command)
        assert done.returncode == 1, (command, done.stderr)
        assert "nosuch" in one_line(done)


def test_action_on_nothing_exits_1(cluster, store):
    done = cluster.cli("destroy", "*webfront*", "--yes")
    assert done.returncode == 1
    assert one_line(done) == "peerctl: no VM matches '*webfront*'"
    doc = cluster.cli_json("stop", "host17/*sql*", expect_rc=1)
    assert doc["automation"] is None and doc["vms"] == []
    assert cluster.cli_json("ping", expect_rc=1)["replies"] == []


def test_no_peer_up_still_gives_the_command_shape(cluster, store):
    """No live peer: the automation cannot start (exit 1), and the JSON is the
    command's contract shape with its list empty."""
    doc = cluster.cli_json("boot", "vm1", "--resources", "VCPU:1,MEMORY_MB:256",
                           expect_rc=1)
    assert doc == {"automation": None, "state": "failed", "vms": []}
    _vm(store, "host1", "orphan1")      # listed, but nobody is up to act on it
    doc = cluster.cli_json("stop", "orphan1", expect_rc=1)
    assert doc == {"automation": None, "state": "failed", "vms": []}
    done = cluster.cli("start", "orphan1")      # its host is down: refused before starting
    assert done.returncode == 1 and "on host1, which is down" in one_line(done)
    done = cluster.cli("destroy", "orphan1")
    assert done.returncode == 1 and "no live peers" in one_line(done)


def _vm(store, host, name):
    vm_uuid = str(uuid.uuid4())
    store.put(f"vms/{host}/{vm_uuid}", {"host": host, "name": name, "uuid": vm_uuid,
                                        "state": "running", "vcpus": 1, "memory_mb": 256,
                                        "disk_gb": 1})
    return vm_uuid


def test_destructive_action_on_several_vms_needs_yes_without_a_terminal(cluster, store):
    _vm(store, "host1", "webfront1")
    _vm(store, "host2", "webfront2")
    done = cluster.cli("destroy", "*webfront*", input="")
    assert done.returncode == 2
    assert "host1/webfront1" in done.stderr and "host2/webfront2" in done.stderr
    assert "--yes" in done.stderr.splitlines()[-1]
    assert "Traceback" not in done.stderr
    assert cluster.cli_json("tasks", "--all") == []       # nothing started


def test_dry_run_only_lists(cluster, store):
    first = _vm(store, "host1", "webfront1")
    _vm(store, "host2", "webfront2")
    _vm(store, "host2", "db1")
    store.put(keys.host("host2"), {"host": "host2"}, store.grant(600))    # host2 is up
    doc = cluster.cli_json("destroy", "*webfront*", "--dry-run")
    assert doc["automation"] is None and doc["state"] == "dry-run"
    assert [(vm["host"], vm["name"]) for vm in doc["vms"]] == [("host1", "webfront1"),
                                                               ("host2", "webfront2")]
    assert doc["vms"][0]["uuid"] == first
    done = cluster.cli("stop", "host2/*", "--dry-run")
    assert done.returncode == 0
    assert "stop would act on 2 VMs" in done.stdout
    assert cluster.cli_json("tasks", "--all") == []
    assert len(cluster.cli_json("vmlist")) == 3


def watchers(url: str) -> int:
    """How many watches etcd serves (each follow holds one)."""
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    return int(float(re.search(r"^etcd_debugging_mvcc_watcher_total (\S+)$", text, re.M)[1]))


def test_etcd_dying_while_following_exits_3_naming_the_endpoint(own_etcd, tmp_path):
    """boot/ping and wait follow an automation over a watch; when etcd dies
    they must not hang but exit 3 with one line naming the endpoint."""
    cluster = Cluster(own_etcd.url, "t" + uuid.uuid4().hex[:10], tmp_path)
    store = Store(own_etcd.url, cluster.name)
    store.put("hosts/ghost", {"host": "ghost"}, store.grant(600))     # a member that never answers
    store.close()
    automation = cluster.cli_json("ping", "--rounds", "2", "--detach")["automation"]

    def command(*args):
        return subprocess.Popen([sys.executable, PEERCTL, *args], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=cluster.env, cwd=ROOT)
    pinging = command("ping")
    waiting = command("--format", "json", "wait", automation)
    wait_for(lambda: watchers(own_etcd.url) >= 2, what="both commands following (watching)")
    own_etcd.kill()
    for process in (pinging, waiting):
        out, err = process.communicate(timeout=30)      # a hung follow fails here
        assert process.returncode == 3, (out, err)
        assert out == "" and "Traceback" not in err
        last = err.splitlines()[-1]
        assert last.startswith(f"peerctl: etcd unreachable at {own_etcd.url} "), err
        assert re.search(r"re-attach with: python peerctl.py wait \S+$", last), last
    assert len(err.splitlines()) == 1       # --format json: that one line only
    assert last.endswith(f"wait {automation}")


@pytest.mark.parametrize("line, named", [
    ("ttl = 5s", "bad ttl '5s'"), ("ttl = 0", "bad ttl '0'"),
    ("workers = many", "bad workers 'many'"), ("workers = -2", "bad workers '-2'"),
    ("hosts = 2.5", "bad hosts '2.5'"),
    ("retention = bogus", "bad retention 'bogus'"), ("retention = -1d", "bad retention '-1d'"),
])
def test_bad_number_in_the_config_file_exits_2(cluster, tmp_path, line, named):
    conf = tmp_path / "peerctl.conf"
    conf.write_text(f"[peerctl]\n{line}\n")
    for command in (["peer", "--host", "h1", "--libvirt", "test:///default"], ["vmlist"]):
        done = cluster.cli(*command, env={"PEERCTL_CONF": str(conf)}, timeout=30)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        text = one_line(done)
        assert text.startswith(f"peerctl: {named} in {conf} "), text
        assert done.stdout == ""


def test_no_command_gives_usage_and_exits_2(cluster):
    done = cluster.cli(input="")
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines[0].startswith("usage: python peerctl.py [--etcd URLS]")
    assert "vmlist" in lines[1].split() and "wait" in lines[1].split()
    assert lines[-1] == "peerctl: no command given (see python peerctl.py --help)"
    assert len(lines) == 3 and "Traceback" not in done.stderr
