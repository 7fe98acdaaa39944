"""This machine's peer started as a detached process, reading one config
file: what ``join`` does where systemd does not run the unit.

The peer takes everything from its config file: the settings join's own
environment may carry (``PEERCTL_ETCD``, ``PEERCTL_CERT``...) are not
passed on.  Its output goes to ``peer.log`` in the directory given; the
caller gets its PID and that path, and the process (to see it end)."""
from __future__ import annotations

import os
import subprocess
import sys

__all__ = ["start"]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERCTL = os.path.join(ROOT, "peerctl.py")
_SETTING_VARIABLES = ("PEERCTL_ETCD", "PEERCTL_CLUSTER", "PEERCTL_CACERT", "PEERCTL_CERT",
                      "PEERCTL_KEY", "PEERCTL_CONF", "PEERCTL_FORMAT")


def start(conf: str, log_dir: str, state_dir: str | None = None) -> dict:
    """``peerctl --conf CONF peer`` detached: ``{how: detached, pid, log,
    process}``.  ``state_dir`` is passed explicitly (one under /tmp is then
    taken, as the operator named it)."""
    os.makedirs(log_dir, exist_ok=True)
    log_path = os.path.join(log_dir, "peer.log")
    env = {name: value for name, value in os.environ.items()
           if name not in _SETTING_VARIABLES}
    command = [sys.executable, PEERCTL, "--conf", os.path.abspath(conf), "peer"]
    if state_dir:
        command += ["--state-dir", os.path.abspath(state_dir)]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, cwd=ROOT, env=env,
                                   start_new_session=True)
    return {"how": "detached", "pid": process.pid, "log": log_path, "process": process}
