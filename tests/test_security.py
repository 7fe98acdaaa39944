"""TLS and roles against a real etcd serving TLS with client certificates and
its RBAC on: who may read, who may write, and that a refused command writes
nothing and says so in one line (exit 4, naming the role)."""
from __future__ import annotations

import json
import uuid

import pytest

from engine.core import auth, certs, keys
from engine.core.credentials import Credentials
from engine.core.etcd_server import EtcdServer
from engine.core.store import Store
from engine.errors import PermissionDenied, UsageError
from tests.support import wait_for
from tests.support.cluster import Cluster

SPEC = "VCPU:1,MEMORY_MB:256,DISK_GB:1"


class Secured:
    """A TLS etcd with roles on, the certificates of every identity, and a
    cluster of two peers each using its own peer certificate."""

    def __init__(self, base):
        self.tls = str(base / "tls")
        certs.authority(self.tls)
        self.server = EtcdServer(str(base / "etcd-data"), tls=certs.issue_server(self.tls)).start()
        self.name = "s" + uuid.uuid4().hex[:10]
        users = {"root": "root", "operator": "operator", "viewer": "viewer",
                 "peer-host1": "peer", "peer-host2": "peer"}
        for user, role in users.items():
            certs.issue(self.tls, user, role)
        self.root = self.store("root")
        auth.setup(self.root, users)
        self.cluster = Cluster(self.server.url, self.name, base)

    def files(self, user: str) -> dict:
        return {"cacert": f"{self.tls}/ca.pem", "cert": f"{self.tls}/{user}.pem",
                "key": f"{self.tls}/{user}-key.pem"}

    def env(self, user: str | None) -> dict:
        files = self.files(user) if user else {"cacert": f"{self.tls}/ca.pem"}
        return {f"PEERCTL_{name.upper()}": path for name, path in files.items()}

    def store(self, user: str) -> Store:
        return Store(self.server.url, self.name, credentials=Credentials(**self.files(user)))

    def cli(self, user: str | None, *args, **kwargs):
        return self.cluster.cli(*args, env=self.env(user), **kwargs)

    def keys_now(self) -> set[str]:
        """Every key of the cluster but the live records peers refresh."""
        kvs, _ = self.root.range("", keys_only=True)
        return {kv.key for kv in kvs if not kv.key.startswith((keys.host(), keys.vm()))}

    def close(self):
        self.cluster.close()
        self.root.close()
        self.server.stop()


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    secured = Secured(tmp_path_factory.mktemp("secured"))
    for host in ("host1", "host2"):
        secured.cluster.start_peer(host, env=secured.env(f"peer-{host}"))
    viewer = secured.store("viewer")
    wait_for(lambda: {"host1", "host2"} <= {kv.key.split("/")[1]
                                             for kv in viewer.range(keys.host())[0]},
             timeout=30, what="both peers registered with their own certificates")
    viewer.close()
    yield secured
    secured.close()


def one_line(done) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_operator_boots_on_peers_that_run_with_peer_certificates(secured):
    done = secured.cli("operator", "--format", "json", "boot", "op1", "--resources", SPEC)
    assert done.returncode == 0, done.stderr
    vms = json.loads(done.stdout)["vms"]
    assert [(vm["name"], vm["state"]) for vm in vms] == [("op1", "running")]


def test_viewer_lists_and_cannot_boot_and_nothing_is_written(secured):
    secured.cli("operator", "boot", "seen", "--resources", SPEC)
    listed = secured.cli("viewer", "--format", "json", "vmlist")
    assert listed.returncode == 0, listed.stderr
    assert "seen" in [vm["name"] for vm in json.loads(listed.stdout)]
    assert secured.cli("viewer", "hostlist").returncode == 0

    before = secured.keys_now()
    for refused in (secured.cli("viewer", "boot", "nope", "--resources", SPEC),
                    secured.cli("viewer", "drain", "host2"),
                    secured.cli("viewer", "lease", "create", "l1", "--start", "now",
                                "--end", "+1h", "--hosts", "1")):
        assert refused.returncode == 4, (refused.stdout, refused.stderr)
        line = one_line(refused)
        assert "permission denied" in line and "viewer" in line, line
    assert secured.keys_now() == before
    names = [vm["name"] for vm in json.loads(secured.cli("viewer", "--format", "json",
                                                         "vmlist").stdout)]
    assert "nope" not in names


def test_operator_cannot_forge_what_only_hosts_write(secured):
    operator = secured.store("operator")
    try:
        with pytest.raises(PermissionDenied) as refused:
            operator.put(keys.host("host9"), {"host": "host9"})
        assert refused.value.role == "operator" and "operator" in str(refused.value)
        with pytest.raises(PermissionDenied):
            operator.put(keys.inbox("host1", "x", 0), {"request": "destroy"})
        assert operator.get(keys.host("host9")) is None
        operator.put(keys.drained("host9"), {"host": "host9"})     # drains are an operator's
        operator.delete(keys.drained("host9"))
    finally:
        operator.close()


def test_no_certificate_is_refused_in_one_line(secured):
    done = secured.cli(None, "vmlist")
    assert done.returncode in (3, 4), (done.stdout, done.stderr)
    line = one_line(done)
    assert "client certificate" in line and done.stdout == ""


def test_a_certificate_of_another_authority_is_refused(secured, tmp_path):
    stranger = str(tmp_path / "stranger")
    certs.authority(stranger)
    issued = certs.issue(stranger, "operator", "operator")
    done = secured.cluster.cli("vmlist", env={**secured.env("operator"),
                                              "PEERCTL_CERT": issued.cert,
                                              "PEERCTL_KEY": issued.key})
    assert done.returncode == 4, (done.stdout, done.stderr)
    assert "TLS handshake" in one_line(done)


def test_bad_certificate_settings_name_the_file(secured, tmp_path):
    missing = str(tmp_path / "gone.pem")
    done = secured.cluster.cli("vmlist", env={**secured.env("viewer"), "PEERCTL_CERT": missing})
    assert done.returncode == 2
    line = one_line(done)
    assert missing in line and "$PEERCTL_CERT" in line, line

    not_pem = tmp_path / "key.txt"
    not_pem.write_text("hello\n")
    done = secured.cli("viewer", "--key", str(not_pem), "vmlist")
    assert done.returncode == 2 and str(not_pem) in one_line(done) and "--key" in done.stderr

    conf = tmp_path / "peerctl.conf"          # relative to the config file
    conf.write_text(f"[peerctl]\ncacert = {secured.tls}/ca.pem\ncert = viewer.pem\n"
                    f"key = viewer-key.pem\n")
    done = secured.cluster.cli("vmlist", env={"PEERCTL_CONF": str(conf),
                                              "PEERCTL_CACERT": "", "PEERCTL_CERT": "",
                                              "PEERCTL_KEY": ""})
    assert done.returncode == 2
    assert f"{tmp_path}/viewer.pem" in one_line(done) and str(conf) in done.stderr


def test_certificates_name_their_user_and_role(tmp_path):
    certs.authority(str(tmp_path))
    issued = certs.issue(str(tmp_path), "peer-host7", "peer")
    assert Credentials(issued.cacert, issued.cert, issued.key).identity() == ("peer-host7", "peer")
    assert oct(__import__("os").stat(issued.key).st_mode & 0o777) == "0o600"
    again = certs.issue(str(tmp_path), "peer-host7", "peer")       # kept, not remade
    assert open(again.cert).read() == open(issued.cert).read()
    with pytest.raises(UsageError, match="without a client key"):
        Credentials(issued.cacert, issued.cert, None).read()


def test_roles_cover_the_cluster_prefix_only():
    assert auth.ranges("c1", "viewer") == [("READ", b"/peerctl/c1/", b"/peerctl/c10")]
    assert auth.ranges("c1", "peer") == [("READWRITE", b"/peerctl/c1/", b"/peerctl/c10")]
    operator = auth.ranges("c1", "operator")
    assert operator[0] == ("READ", b"/peerctl/c1/", b"/peerctl/c10")
    written = {key for _, key, _ in operator[1:]}
    assert b"/peerctl/c1/auto/" in written and b"/peerctl/c1/hosts/" not in written
    assert all(key.startswith(b"/peerctl/c1/") for _, key, _ in operator)


def test_an_etcd_of_ones_own_is_secured_with_tls_certs_and_tls_roles(tmp_path, cluster_name):
    """The documented way: `tls certs`, start etcd with them, `tls roles` as root."""
    directory = tmp_path / "tls"
    cluster = Cluster("https://127.0.0.1:1", cluster_name, tmp_path)
    made = cluster.cli_json("tls", "certs", str(directory), "--peer", "kvm1",
                            "--user", "alice:viewer")
    users = {c["user"]: c["role"] for c in made["certificates"]}
    assert users == {"etcd": "etcd server", "root": "root", "operator": "operator",
                     "viewer": "viewer", "peer-kvm1": "peer", "alice": "viewer"}
    server = EtcdServer(str(tmp_path / "etcd"), tls=certs.Issued(
        str(directory / "etcd.pem"), str(directory / "etcd-key.pem"),
        str(directory / "ca.pem"))).start()
    cluster.etcd_url = server.url
    try:
        def as_(user):
            return {"PEERCTL_CACERT": str(directory / "ca.pem"),
                    "PEERCTL_CERT": str(directory / f"{user}.pem"),
                    "PEERCTL_KEY": str(directory / f"{user}-key.pem")}
        done = cluster.cli_json("tls", "roles", "--peer", "kvm1", "--user", "alice:viewer",
                                env=as_("root"))
        assert done["enabled"] and done["users"]["alice"] == "viewer"
        cluster.start_peer("kvm1", env=as_("peer-kvm1"))
        wait_for(lambda: cluster.cli("hostlist", env=as_("alice")).stdout.count("kvm1") == 1,
                 timeout=30, what="kvm1 up, as alice sees it")
        refused = cluster.cli("boot", "vm1", "--resources", SPEC, env=as_("alice"))
        assert refused.returncode == 4 and "viewer" in one_line(refused)
        booted = cluster.cli("boot", "vm1", "--resources", SPEC, env=as_("operator"))
        assert booted.returncode == 0, booted.stderr
    finally:
        cluster.close()
        server.stop()


def test_a_peer_refuses_to_run_as_a_host_its_certificate_does_not_name(secured, tmp_path):
    """host1's certificate cannot start a peer for h9: one line, exit 4, and
    etcd never hears of h9."""
    done = secured.cli("peer-host1", "peer", "--host", "h9", "--libvirt", "test:///default",
                       "--state-dir", str(tmp_path / "state-h9"), timeout=60)
    assert done.returncode == 4, (done.returncode, done.stdout, done.stderr[-2000:])
    line = one_line(done)
    assert "peer-host1" in line and "peer-h9" in line, line
    assert secured.root.get(keys.host("h9")) is None
    assert secured.root.get(keys.host_config("h9")) is None
    assert "h9" not in secured.cli("viewer", "hostlist").stdout


def names_in(path) -> set[str]:
    from cryptography import x509
    cert = x509.load_pem_x509_certificate(open(path, "rb").read())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(entry.value) for entry in sans}


def test_tls_certs_again_with_a_new_name_issues_etcds_certificate_again_and_says_so(
        tmp_path, cluster_name):
    directory = tmp_path / "tls"
    cluster = Cluster("https://127.0.0.1:1", cluster_name, tmp_path)
    first = cluster.cli_json("tls", "certs", str(directory), "--name", "etcd1.example")
    assert {c["user"]: c["status"] for c in first["certificates"]}["etcd"] == "made"
    ca, etcd_key = (directory / "ca.pem").read_bytes(), (directory / "etcd-key.pem").read_bytes()
    assert names_in(directory / "etcd.pem") == {"127.0.0.1", "localhost", "etcd1.example"}

    again = cluster.cli("tls", "certs", str(directory), "--name", "etcd1.example",
                        "--name", "10.0.0.14")
    assert again.returncode == 0, again.stderr
    said = [line for line in again.stdout.splitlines() if "re-issued" in line]
    assert len(said) == 1 and "etcd.pem" in said[0] and "10.0.0.14" in said[0], again.stdout
    assert names_in(directory / "etcd.pem") == {"127.0.0.1", "localhost", "etcd1.example",
                                                "10.0.0.14"}
    assert (directory / "ca.pem").read_bytes() == ca                 # the CA is kept
    assert (directory / "etcd-key.pem").read_bytes() != etcd_key

    same = cluster.cli_json("tls", "certs", str(directory), "--name", "10.0.0.14",
                            "--name", "etcd1.example")
    assert {c["user"]: c["status"] for c in same["certificates"]}["etcd"] == "kept"
    kept = cluster.cli("tls", "certs", str(directory), "--peer", "kvm1")   # no --name: kept
    assert "re-issued" not in kept.stdout and "made peer-kvm1.pem" in kept.stdout
    assert "10.0.0.14" in names_in(directory / "etcd.pem")


def test_tls_certs_gives_each_etcd_member_a_certificate_and_key_of_its_own(
        tmp_path, cluster_name):
    directory = tmp_path / "tls"
    cluster = Cluster("https://127.0.0.1:1", cluster_name, tmp_path)
    bad = cluster.cli("tls", "certs", str(directory), "--member", "m1=10.0.0.11",
                      "--member", "m2")
    assert bad.returncode == 2 and "--member 'm2'" in one_line(bad)
    assert not directory.exists()                                    # nothing written

    made = cluster.cli_json("tls", "certs", str(directory), "--member", "m1=10.0.0.11",
                            "--member", "m2=10.0.0.12", "--member", "m3=etcd3.example")
    files = {c["user"]: c for c in made["certificates"]}
    assert {"etcd-m1", "etcd-m2", "etcd-m3"} <= set(files) and "etcd" not in files
    addresses = {"m1": "10.0.0.11", "m2": "10.0.0.12", "m3": "etcd3.example"}
    for member, address in addresses.items():
        named = names_in(directory / f"etcd-{member}.pem")
        assert named == {"127.0.0.1", "localhost", address}, (member, named)
    keys_ = {(directory / f"etcd-{member}-key.pem").read_bytes() for member in addresses}
    assert len(keys_) == 3                                           # one key per member

    # a fourth member later: its own certificate, the others kept
    later = cluster.cli_json("tls", "certs", str(directory), *[
        arg for member, address in {**addresses, "m4": "10.0.0.14"}.items()
        for arg in ("--member", f"{member}={address}")])
    statuses = {c["user"]: c["status"] for c in later["certificates"]}
    assert [statuses[f"etcd-m{i}"] for i in range(1, 5)] == ["kept", "kept", "kept", "made"]
    assert "10.0.0.14" in names_in(directory / "etcd-m4.pem")


def test_tls_certs_lists_every_certificate_with_its_expiry(tmp_path, cluster_name):
    import datetime
    directory = tmp_path / "tls"
    cluster = Cluster("https://127.0.0.1:1", cluster_name, tmp_path)
    cluster.cli_json("tls", "certs", str(directory), "--peer", "kvm1")
    listed = cluster.cli("tls", "certs", str(directory), "--name", "etcd1.example")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["File", "Subject", "Role", "Names", "Expires"]
    rows = {line.split()[0]: line for line in lines[1:] if line.split()[0].endswith(".pem")}
    assert set(rows) == {"ca.pem", "etcd.pem", "root.pem", "operator.pem", "viewer.pem",
                         "peer-kvm1.pem"}
    expires = (datetime.datetime.now(datetime.timezone.utc)
               + datetime.timedelta(days=3650)).date()
    near = {str(expires + datetime.timedelta(days=d)) for d in (-1, 0, 1)}
    for name, row in rows.items():
        assert near & set(row.split()), row
    assert "etcd1.example" in rows["etcd.pem"] and " peer " in rows["peer-kvm1.pem"]
    doc = cluster.cli_json("tls", "certs", str(directory))
    assert {entry["role"] for entry in doc["files"]} >= {"CA", "etcd server", "peer"}
    assert all(isinstance(entry["expires"], int) for entry in doc["files"])
