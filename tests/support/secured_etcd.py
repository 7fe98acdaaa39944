"""A TLS etcd of a test's own (one member, or ``members`` of them) with
etcd's RBAC on for one cluster, and a client certificate for ``root``,
``operator``, ``viewer`` and a ``peer-<host>`` per host of ``peers``: the
command line run as each of them, and a store opened as each.  No peers run
until the test starts them."""
from __future__ import annotations

import uuid

from engine.core import auth, certs
from engine.core.credentials import Credentials
from engine.core.etcd_server import EtcdCluster, EtcdServer
from engine.core.store import Store
from tests.support.cluster import Cluster

__all__ = ["SecuredEtcd"]

USERS = {"root": "root", "operator": "operator", "viewer": "viewer"}


class SecuredEtcd:
    def __init__(self, base, members: int = 1, peers=()):
        self.tls = str(base / "tls")
        certs.authority(self.tls)
        issued = certs.issue_server(self.tls)
        self.server = (EtcdServer(str(base / "etcd-data"), tls=issued) if members == 1
                       else EtcdCluster(str(base / "etcd"), members, tls=issued)).start()
        self.name = "s" + uuid.uuid4().hex[:10]
        users = {**USERS, **{f"peer-{host}": "peer" for host in peers}}
        for user, role in users.items():
            certs.issue(self.tls, user, role)
        self.root = self.store("root")
        auth.setup(self.root, users)
        self.cluster = Cluster(self.server.url, self.name, base)

    def files(self, user: str) -> dict:
        return {"cacert": f"{self.tls}/ca.pem", "cert": f"{self.tls}/{user}.pem",
                "key": f"{self.tls}/{user}-key.pem"}

    def env(self, user: str) -> dict:
        return {f"PEERCTL_{name.upper()}": path for name, path in self.files(user).items()}

    def store(self, user: str) -> Store:
        return Store(self.server.url, self.name, credentials=Credentials(**self.files(user)))

    def cli(self, user: str, *args, **kwargs):
        """The real command line, as ``user``."""
        return self.cluster.cli(*args, env=self.env(user), **kwargs)

    def close(self) -> None:
        self.cluster.close()
        self.root.close()
        self.server.stop()
