"""A workstation: the command line on a machine that holds an API token
and nothing else (its etcd setting points where nothing listens), beside
the same command run straight on etcd, for comparing the two."""
from __future__ import annotations

import json
import os
import re

__all__ = ["Workstation", "token_file", "same_shape"]

NOWHERE = "http://127.0.0.1:9"      # no etcd here: a command that tried it would fail


def token_file(tmp_path, secret: str, name: str = "api.token") -> str:
    path = tmp_path / name
    path.write_text(secret + "\n")
    os.chmod(path, 0o600)
    return str(path)


class Workstation:
    """``cli`` runs peerctl through ``urls`` with ``token``'s file."""

    def __init__(self, cluster, urls: list[str], token: str, tmp_path):
        self.cluster = cluster
        self.urls = urls
        self.token_file = token_file(tmp_path, token, f"ws-{len(urls)}-{token[:6]}.token")
        self.config = tmp_path / "workstation-config"

    @property
    def env(self) -> dict:
        return {"PEERCTL_ETCD": NOWHERE, "PEERCTL_API": ",".join(self.urls),
                "PEERCTL_TOKEN_FILE": self.token_file, "XDG_CONFIG_HOME": str(self.config)}

    def cli(self, *args, **kwargs):
        return self.cluster.cli(*args, env={**self.env, **kwargs.pop("env", {})}, **kwargs)

    def cli_json(self, *args, expect_rc=0, **kwargs):
        done = self.cli("--format", "json", *args, **kwargs)
        assert done.returncode == expect_rc, (done.returncode, done.stdout, done.stderr)
        return json.loads(done.stdout)


_IDS = re.compile(r"\b\d{8}-\d{6}-[0-9a-f]{6}\b")


def same_shape(text: str) -> str:
    """``text`` with automation ids made alike (two runs start two automations)."""
    return _IDS.sub("AUTOMATION", text)
