"""`console NAME` through a peer's API (the websocket of engine/web/console.py),
on the test driver: which way `--via auto` takes, and every way the API's
session ends becoming the line and exit code the direct path gives; the
operator token the command mints for itself is gone when the console ends,
and a killed command's lives at most a minute.  (Typing into a real guest
through the API is tests/test_console_qemu.py.)"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid

import pytest

from engine.core import api as engine_api
from engine.core import keys, tokens
from engine.operations.consoles import TOKEN_TTL
from tests.support import PEERCTL, ROOT, only_line, wait_for
from tests.support.api_client import api_peer_args, free_port
from tests.support.api_server import served_api
from tests.support.secured_etcd import SecuredEtcd
from tests.support.silent_libvirt import silent_console_api
from tests.support.workstation import NOWHERE, token_file

RUNNING = "11111111-2222-3333-4444-000000000001"
SHUTOFF = "11111111-2222-3333-4444-000000000002"
DOMAIN = ("<domain type='test'><name>{}</name><uuid>{}</uuid><memory>65536</memory>"
          "<vcpu>1</vcpu><os><type>hvm</type></os>{}</domain>")


def no_tokens_left(store) -> bool:
    return tokens.list_tokens(store) == []


def console_via_api(cluster, *argv):
    """`console ARGV --no-tty` through the API, stdin empty."""
    return cluster.cli("console", *argv, "--no-tty", "--via", "api", input="", timeout=60)


@pytest.fixture
def hfile_api(tmp_path, store, etcd, cluster_name):
    """The API of a cluster whose host ``hfile`` is a test-driver file the
    API's process reads: VM ``run1`` running, ``off1`` shut off."""
    path = tmp_path / "host.xml"
    path.write_text("<node xmlns:test='http://libvirt.org/schemas/domain/test/1.0'>"
                    + DOMAIN.format("run1", RUNNING, "")
                    + DOMAIN.format("off1", SHUTOFF, "<test:runstate>5</test:runstate>")
                    + "</node>")
    uri = f"test://{path}"
    store.put(keys.host("hfile"), {"host": "hfile", "libvirt_uri": uri}, store.grant(600))
    for name, uid, state in (("run1", RUNNING, "running"), ("off1", SHUTOFF, "shutoff")):
        store.put(keys.vm("hfile", uid), {"host": "hfile", "name": name, "uuid": uid,
                                          "state": state})
    with served_api(etcd.url, cluster_name) as server:
        server.libvirt_uri = uri
        yield server


# -- the messages: the direct path's -----------------------------------------------------------

def test_a_vm_that_is_not_running_is_the_direct_paths_line(cluster, store, hfile_api):
    done = console_via_api(cluster, "off1", "--api", hfile_api.url)
    assert done.returncode == 1
    assert only_line(done) == "peerctl: VM off1 is shutoff on hfile: start it first"
    assert no_tokens_left(store)            # the one it minted went with the console


def test_a_hypervisor_without_consoles_is_the_direct_paths_line(cluster, store, hfile_api):
    done = console_via_api(cluster, "run1", "--api", hfile_api.url)
    assert done.returncode == 1
    assert only_line(done) == (f"peerctl: the hypervisor of hfile ({hfile_api.libvirt_uri}) "
                               "does not offer a console")
    assert no_tokens_left(store)


def test_an_unknown_vm_with_a_token_file_is_the_direct_paths_line(cluster, store, hfile_api,
                                                                   tmp_path):
    secret = token_file(tmp_path, tokens.create(store, "operator")["secret"])
    done = console_via_api(cluster, "nope", "--api", hfile_api.url, "--token-file", secret)
    assert done.returncode == 1
    assert only_line(done) == "peerctl: no VM matches 'nope'"


def test_a_viewers_token_is_refused_with_exit_4(cluster, store, hfile_api, tmp_path):
    secret = token_file(tmp_path, tokens.create(store, "viewer")["secret"])
    done = console_via_api(cluster, "run1", "--api", hfile_api.url, "--token-file", secret)
    assert done.returncode == 4
    assert only_line(done) == ("peerctl: permission denied for role viewer: a viewer may "
                               "read, not open a console")


def test_a_workstation_with_only_a_token_reaches_the_console_through_the_api(
        cluster, store, hfile_api, tmp_path):
    """--api and --token-file before the command (a remote): no etcd here."""
    secret = token_file(tmp_path, tokens.create(store, "operator")["secret"])
    remote = {"PEERCTL_ETCD": NOWHERE}
    done = cluster.cli("--api", hfile_api.url, "--token-file", secret, "console", "off1",
                       "--no-tty", input="", env=remote, timeout=60)
    assert done.returncode == 1
    assert only_line(done) == "peerctl: VM off1 is shutoff on hfile: start it first"
    loose = tmp_path / "loose.token"
    loose.write_text(tokens.create(store, "operator")["secret"])
    loose.chmod(0o644)
    done = cluster.cli("--api", hfile_api.url, "--token-file", str(loose), "console", "off1",
                       "--no-tty", input="", env=remote)
    assert done.returncode == 2 and "is readable by others (mode 0644)" in only_line(done)


def test_an_api_that_does_not_answer_is_exit_3_naming_it(cluster, store):
    url = f"http://127.0.0.1:{free_port()}"
    done = console_via_api(cluster, "run1", "--api", url)
    assert done.returncode == 3
    assert only_line(done).startswith(f"peerctl: cannot reach the API at {url}: ")
    assert no_tokens_left(store)


@pytest.mark.parametrize("argv, named", [
    (["--token-file", "/nonexistent/token"], "cannot read --token-file /nonexistent/token"),
    (["--api", "ftp://h1"], "bad API URL 'ftp://h1'"),
    (["--api", "http://127.0.0.1:1", "--via", "libvirt"], "--api names an API"),
])
def test_bad_input_is_a_usage_error_before_anything_is_opened(cluster, store, argv, named):
    done = cluster.cli("console", "run1", "--no-tty", *argv, input="")
    assert done.returncode == 2
    assert named in only_line(done)
    assert no_tokens_left(store)


# -- which way auto goes -------------------------------------------------------------------------

def test_auto_goes_through_the_published_api_for_a_host_on_another_machine(cluster, store,
                                                                           hfile_api):
    """Host ``far`` is another machine's (its machine id, a URI naming a
    machine): auto takes the API its record publishes, and the API's
    answer that it cannot reach far's libvirt is the direct path's exit 3."""
    uid = str(uuid.uuid4())
    remote = f"qemu+tcp://127.0.0.2:{free_port()}/system"      # loopback, but "a machine"
    store.put(keys.host("far"), {"host": "far", "libvirt_uri": "qemu:///system",
                                 "libvirt_remote": remote, "machine": "another-machine",
                                 "api": hfile_api.url}, store.grant(600))
    store.put(keys.vm("far", uid), {"host": "far", "name": "web9", "uuid": uid,
                                    "state": "running"})
    done = cluster.cli("console", "web9", "--no-tty", input="", timeout=60)
    assert done.returncode == 3
    assert only_line(done).startswith(f"peerctl: cannot reach far's libvirt at {remote}: ")
    assert no_tokens_left(store)


def test_auto_opens_this_machines_libvirt_itself(cluster, store, hfile_api):
    """hfile's test-driver file is on this machine: libvirt directly, even
    with an API published (the line names the URI, not the API)."""
    record = store.get(keys.host("hfile"))
    store.put(keys.host("hfile"), dict(record.value, api=hfile_api.url), record.lease)
    done = cluster.cli("console", "off1", "--no-tty", input="")
    assert done.returncode == 1
    assert only_line(done) == "peerctl: VM off1 is shutoff on hfile: start it first"


def test_a_peer_publishes_its_api_in_its_host_record(cluster, store):
    port = free_port()
    cluster.start_peer("host1", extra_args=api_peer_args(port))
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: (engine_api.live_hosts(store).get("host1") or {}).get("api") == url,
             what="host1's record publishing its API")
    listed = cluster.cli("hostlist", "-o", "host,api", "--no-headers")
    assert listed.stdout.split() == ["host1", url]


# -- the token it mints ---------------------------------------------------------------------------

@pytest.fixture
def silent_api(store, etcd, cluster_name):
    """The API of a cluster whose VM ``run1`` has a console that stays open, attaching."""
    with silent_console_api(store, etcd.url, cluster_name) as server:
        yield server


def console_process(cluster, url) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, PEERCTL, "console", "run1", "--no-tty",
                             "--via", "api", "--api", url],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cluster.env, cwd=ROOT)


def minted(store) -> list[dict]:
    return wait_for(lambda: tokens.list_tokens(store), what="the console's token")


def test_deleting_its_token_mid_session_ends_the_console_with_exit_4(cluster, store,
                                                                     silent_api):
    console = console_process(cluster, silent_api.url)
    try:
        (token,) = minted(store)
        assert token["role"] == "operator"
        assert cluster.cli("token", "delete", token["id"]).returncode == 0
        assert console.wait(30) == 4
        stderr = console.stderr.read()
        assert "Traceback" not in stderr
        assert stderr.strip() == "peerctl: console closed: the token was deleted"
    finally:
        if console.poll() is None:
            console.kill()
            console.wait()


def test_a_killed_consoles_token_expires_with_its_lease(cluster, store, silent_api):
    """SIGKILL leaves no one to delete the token: it is bound to an etcd
    lease of TOKEN_TTL that only the command renewed, and says it expires
    then; etcd deletes it when the lease ends (here: the lease ended early)."""
    console = console_process(cluster, silent_api.url)
    try:
        (token,) = minted(store)
        console.send_signal(signal.SIGKILL)
        console.wait(30)
        kv = store.get(keys.token(token["id"]))
        assert kv.lease != 0
        assert kv.value["expires"] <= time.time() + TOKEN_TTL
        assert 0 < store.lease_ttl(kv.lease) <= TOKEN_TTL
        store.revoke(kv.lease)              # the minute passes
        assert no_tokens_left(store)
    finally:
        if console.poll() is None:
            console.kill()
            console.wait()


# -- HTTPS, on a cluster whose etcd checks roles ------------------------------------------------

@pytest.fixture
def https_api(tmp_path):
    """An API over HTTPS (a certificate of the cluster's CA) on a cluster
    whose etcd checks roles, host ``hfile`` running ``run1`` as above."""
    from engine.web.app import Api
    from engine.web.server import ApiServer
    secured = SecuredEtcd(tmp_path)
    path = tmp_path / "host.xml"
    path.write_text("<node>" + DOMAIN.format("run1", RUNNING, "") + "</node>")
    root = secured.root
    root.put(keys.host("hfile"), {"host": "hfile", "libvirt_uri": f"test://{path}"},
             root.grant(600))
    root.put(keys.vm("hfile", RUNNING), {"host": "hfile", "name": "run1", "uuid": RUNNING,
                                         "state": "running"})
    files = secured.files("root")
    api = Api(secured.server.url, secured.name, root.credentials, {"backend": "etcd"}, tls=True)
    server = ApiServer(api, "127.0.0.1:0", tls={"cert": f"{secured.tls}/etcd.pem",
                                                "key": f"{secured.tls}/etcd-key.pem",
                                                "cacert": files["cacert"]}).start()
    server.libvirt_uri = f"test://{path}"
    yield secured, server
    server.stop()
    secured.close()


def test_an_operator_reaches_an_https_api_verified_by_the_clusters_ca(https_api):
    """The operator role may mint, renew and revoke the console's token; the
    API's certificate is checked against --cacert."""
    secured, server = https_api
    done = secured.cli("operator", "console", "run1", "--no-tty", "--via", "api", "--api",
                       server.url, input="")
    assert done.returncode == 1
    assert only_line(done) == (f"peerctl: the hypervisor of hfile ({server.libvirt_uri}) "
                               "does not offer a console")
    assert tokens.list_tokens(secured.root) == []


def test_an_api_whose_certificate_another_ca_signed_is_exit_3(https_api, tmp_path):
    from engine.core import certs
    secured, server = https_api
    certs.authority(str(tmp_path / "other"))
    secret = token_file(tmp_path, tokens.create(secured.root, "operator")["secret"])
    done = secured.cluster.cli("--cacert", str(tmp_path / "other" / "ca.pem"), "console",
                               "run1", "--no-tty", "--via", "api", "--api", server.url,
                               "--token-file", secret, env=secured.env("operator"),
                               input="")
    assert done.returncode == 3
    assert only_line(done).startswith(f"peerctl: cannot reach the API at {server.url}: its "
                                      "certificate does not verify")


@pytest.mark.slow      # a scenario of several seconds: the third tier
def test_ctrl_c_while_it_attaches_leaves_and_deletes_its_token(cluster, store, silent_api):
    console = console_process(cluster, silent_api.url)
    try:
        minted(store)
        console.send_signal(signal.SIGINT)
        assert console.wait(30) == 130
        assert "Traceback" not in console.stderr.read()
        assert no_tokens_left(store)
    finally:
        if console.poll() is None:
            console.kill()
            console.wait()


def test_a_renewal_moves_the_expiry_on_and_never_brings_a_deleted_token_back(store):
    lease = store.grant(TOKEN_TTL)
    made = tokens.create(store, "operator", 5, lease=lease)
    before = store.get(keys.token(made["id"])).value["expires"]
    assert tokens.renew(store, made["id"], TOKEN_TTL)
    after = store.get(keys.token(made["id"]))
    assert after.value["expires"] >= before + TOKEN_TTL - 5 - 1
    assert after.lease == lease
    tokens.delete(store, [made["id"]])
    assert not tokens.renew(store, made["id"], TOKEN_TTL)
    assert store.get(keys.token(made["id"])) is None
    store.revoke(lease)
