"""Logs (issue 50): ``log_format = console|json`` and ``log_level``, read
for the peer and every command; everything on stderr (the journal under
systemd), one JSON object per line with ``log_format = json``, each with a
level, an event and a timestamp, and the automation's id under
``automation`` so that one automation can be followed across hosts."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from tests.support import ROOT, wait_until
from tests.support.cluster import refused

LEVELS = {"debug", "info", "warning", "error", "critical"}
STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")


def conf(tmp_path, name, **values):
    path = tmp_path / f"{name}.conf"
    path.write_text("[peerctl]\n" + "".join(f"{k} = {v}\n" for k, v in values.items()))
    return str(path)


def json_lines(text: str) -> list[dict]:
    """Every line of ``text`` as a JSON log event (asserting each is one)."""
    events = []
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            pytest.fail(f"not a JSON line: {line!r}")
        assert isinstance(event, dict), line
        assert event.get("level") in LEVELS and isinstance(event.get("event"), str), line
        assert STAMP.fullmatch(event.get("timestamp", "")), line
        events.append(event)
    return events


def test_a_peer_with_log_format_json_writes_only_json_lines_naming_the_automation(
        cluster, store, tmp_path):
    json_conf = conf(tmp_path, "json", log_format="json")
    for host in ("j1", "j2"):
        cluster.start_peer(host, env={"PEERCTL_CONF": json_conf})
    wait_until(lambda: cluster.cli_json("hostlist"), lambda hosts: {
        h["host"] for h in hosts if h["alive"]} >= {"j1", "j2"}, timeout=60, what="j1, j2 up")
    done = cluster.cli("--format", "json", "ping", "j*", env={"PEERCTL_CONF": json_conf})
    assert done.returncode == 0, done.stderr
    automation = json.loads(done.stdout)["automation"]
    for host in ("j1", "j2"):
        cluster.kill(host, signal.SIGTERM)     # its last lines written
    events = {host: json_lines(cluster.log(host)) for host in ("j1", "j2")}
    assert all(events.values()), events
    started = [e for host in events for e in events[host] if e["event"] == "session_started"]
    assert {e.get("host") for e in started} == {"j1", "j2"}, events
    assert any(e.get("automation") == automation for host in events for e in events[host]), \
        f"no line names automation {automation}: {events}"


def test_a_guard_started_by_a_json_peer_writes_json_too():
    """The guard is started by the peer with its environment: with
    log_format json ($PEERCTL_LOG_FORMAT, which the peer's logging sets),
    its lines are JSON events as the peer's, so a journal holds one format."""
    script = ("from engine.commandline.context import configure_logging\n"
              "configure_logging('INFO', {'log_format': 'json'})\n"
              "import subprocess, sys\n"
              "subprocess.run([sys.executable, '-c', 'from engine.hypervisor.ha.guard "
              "import _say; _say(\"vm_fenced\", vm=\"db\", host=\"h1\")'], check=True)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PEERCTL_")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    (event,) = json_lines(done.stdout)
    assert (event["logger"], event["event"], event["vm"], event["host"]) == \
        ("guard", "vm_fenced", "db", "h1")


def test_log_level_warning_leaves_out_the_info_lines(cluster, store, tmp_path):
    cluster.start_peer("w1", env={"PEERCTL_CONF": conf(tmp_path, "warn", log_format="json",
                                                       log_level="warning")})
    cluster.start_peer("i1", env={"PEERCTL_LOG_FORMAT": "json"})
    wait_until(lambda: cluster.cli_json("hostlist"), lambda hosts: {
        h["host"] for h in hosts if h["alive"]} >= {"w1", "i1"}, timeout=60, what="peers up")
    assert cluster.cli("ping", "*").returncode == 0
    for host in ("w1", "i1"):
        cluster.kill(host, signal.SIGTERM)
    assert any(e["level"] == "info" for e in json_lines(cluster.log("i1")))
    assert all(e["level"] in ("warning", "error", "critical")
               for e in json_lines(cluster.log("w1"))), cluster.log("w1")


def test_the_console_format_stays_the_default(cluster, store):
    cluster.start_peer("c1")
    wait_until(lambda: cluster.log("c1"), lambda text: "session_started" in text, timeout=60,
               what="c1's first lines")
    line = next(line for line in cluster.log("c1").splitlines() if "session_started" in line)
    assert re.match(r"\S+Z \[info +\] session_started +", line), line


@pytest.mark.parametrize("command", [["peer", "--host", "h1", "--libvirt", "test:///default"],
                                     ["vmlist"]])
def test_bad_log_settings_are_one_line_for_the_peer_and_every_command(cluster, store, tmp_path,
                                                                      command):
    bad = conf(tmp_path, "bad", log_format="xml")
    done = refused(cluster, ["--conf", bad, *command], 2,
                   f"bad log_format 'xml' in {bad} (want console or json)")
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1
    done = cluster.cli(*command, env={"PEERCTL_LOG_LEVEL": "loud"}, timeout=60)
    assert done.returncode == 2 and done.stderr == (
        "peerctl: bad log_level 'loud' from $PEERCTL_LOG_LEVEL "
        "(want debug, info, warning or error)\n"), done.stderr
    assert store.range("")[0] == []
