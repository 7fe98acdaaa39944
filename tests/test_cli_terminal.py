"""The progress view on a real terminal (a pty that is the command's
controlling terminal), and Ctrl-C, typed as ^C on that terminal, detaching
from an automation without stopping it."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.support import PEERCTL, ROOT, wait_for
from tests.support.cluster import held_requests
from tests.support.terminal import Terminal


@pytest.fixture
def held_pings(cluster, tmp_path):
    """Three peers whose pings wait (a ping.pre hook) until the test opens the
    gate this returns: the automation runs for as long as the test needs."""
    with held_requests(cluster, str(tmp_path / "hooks"), "ping") as gate:
        yield gate


def test_ctrl_c_detaches_without_stopping_the_automation(cluster, held_pings):
    rounds = 3
    terminal = Terminal([sys.executable, PEERCTL, "ping", "--rounds", str(rounds)], cluster.env)
    terminal.wait_for_text(r"\[[#-]+\] \d+/\d+ steps")
    automation = re.search(r"steps\s+\d+ targets?\s+\w+\s+[\d.]+s\s+(\S+)",
                           terminal.text()).group(1)
    terminal.type(b"\x03")       # Ctrl-C on the terminal: SIGINT to the command
    code = terminal.finish()
    text = terminal.text()
    assert code == 130, text
    assert "Traceback" not in text
    assert f"Re-attach with: python peerctl.py wait {automation}" in text
    held_pings.open()       # the automation went on without us: wait picks it up again
    task = json.loads(subprocess.run(
        [sys.executable, PEERCTL, "--format", "json", "wait", automation],
        capture_output=True, text=True, env=cluster.env, cwd=ROOT, timeout=120).stdout)
    assert task["state"] == "done"
    assert len(task["result"]["replies"]) == 3 * rounds


def test_wait_on_a_terminal_shows_the_view_to_the_end(cluster, peers):
    doc = cluster.cli_json("ping", "--rounds", "3", "--detach")
    terminal = Terminal([sys.executable, PEERCTL, "wait", doc["automation"]], cluster.env)
    code = terminal.finish(60)
    text = terminal.text()
    assert code == 0, text
    assert re.search(r"\[#+\] 9/9 steps\s+3 targets\s+done", text), text
    for host in peers:
        assert re.search(rf"{host}\s+ping\s+ok", text)


def test_destructive_action_asks_on_a_terminal(cluster, peers):
    booted = cluster.cli_json("boot", "web1", "web2", "--resources",
                              "VCPU:1,MEMORY_MB:128,DISK_GB:1")
    assert booted["state"] == "done", booted
    wait_for(lambda: len(cluster.cli_json("vmlist")) == 2, what="two VMs listed")
    hosts = {vm["name"]: vm["host"] for vm in booted["vms"]}

    terminal = Terminal([sys.executable, PEERCTL, "destroy", "web*"], cluster.env)
    terminal.wait_for_text(r"Destroy these 2 VMs\? \[y/N\]")
    for name in ("web1", "web2"):
        assert f"{hosts[name]}/{name}" in terminal.text()
    terminal.type(b"n\r")
    assert terminal.finish() == 1
    assert "nothing done" in terminal.text()
    assert [t["kind"] for t in cluster.cli_json("tasks", "--all")] == ["boot"]
    assert len(cluster.cli_json("vmlist")) == 2

    terminal = Terminal([sys.executable, PEERCTL, "destroy", "web*"], cluster.env)
    terminal.wait_for_text(r"Destroy these 2 VMs\? \[y/N\]")
    terminal.type(b"y\r")
    code = terminal.finish(60)
    text = terminal.text()
    assert code == 0, text
    assert re.search(r"automation \S+ done", text), text
    kinds = [t["kind"] for t in cluster.cli_json("tasks", "--all")]
    assert sorted(kinds) == ["boot", "destroy"]
    wait_for(lambda: cluster.cli_json("vmlist") == [], what="both VMs gone")
