"""``host add`` and ``join``: a new machine becomes a host with one token.

On a TLS etcd with roles: ``host add h4`` (as root, with the CA directory)
prints a token; ``join TOKEN`` redeems it once at a peer's HTTPS API
(pinned by the CA's fingerprint), writes the config and TLS files, starts
a peer that registers as h4, drained until the checks pass, and h4 then
takes VMs.  A used, expired, forged, garbled or another cluster's token is
one line, and writes nothing on either side; a join killed after the
redeem leaves a used token and no config file, from which ``host add``
again recovers."""
from __future__ import annotations

import base64
import json
import os
import signal
import socket
import time

import pytest

from engine.core import api, certs, failpoints, join_tokens, keys
from engine.web.app import Api
from engine.web.server import ApiServer
from tests.support import wait_for
from tests.support.cluster import stop_guard
from tests.support.secured_etcd import SecuredEtcd

# the new machine has no identity yet: nothing of the administrator's reaches it
NEW_MACHINE = {"PEERCTL_CACERT": "", "PEERCTL_CERT": "", "PEERCTL_KEY": ""}


@pytest.fixture
def secured(tmp_path):
    secured = SecuredEtcd(tmp_path, peers=("h1",))
    yield secured
    secured.close()


@pytest.fixture
def https_api(secured):
    """A peer's API over HTTPS, served in the test's process as root's."""
    tls = secured.files("root")
    server = ApiServer(Api(secured.server.url, secured.name, secured.store("root").credentials,
                           {"backend": "etcd"}, tls=True),
                       "127.0.0.1:0", tls={"cert": f"{secured.tls}/etcd.pem",
                                           "key": f"{secured.tls}/etcd-key.pem",
                                           "cacert": tls["cacert"]}).start()
    yield server
    server.stop()


def host_add(secured, host: str, *more) -> dict:
    done = secured.cli("root", "--format", "json", "host", "add", host, *more)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def join(secured, token: str, where, *more, env=None):
    return secured.cluster.cli("--format", "json", "join", token, "--conf",
                               str(where / "peerctl.conf"), "--state-dir",
                               str(where / "state"), "--libvirt", "test:///default", *more,
                               env={**NEW_MACHINE, **(env or {})})


def one_line(done, rc: int, said: str) -> None:
    assert done.returncode == rc, (done.returncode, done.stdout, done.stderr)
    errors = [line for line in done.stderr.splitlines() if line.startswith("peerctl:")]
    assert len(errors) == 1 and said in errors[0], done.stderr


def nothing_written(secured, where, revision: int) -> None:
    assert not where.exists() or not any(where.iterdir()), list(where.iterdir())
    assert secured.root.revision() == revision


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def h1_serving(secured):
    """Peer h1 running, its API over HTTPS with the cluster's CA: its URL."""
    port = free_port()
    secured.cluster.start_peer("h1", env=secured.env("peer-h1"), extra_args=[
        "--api", f"127.0.0.1:{port}", "--api-cert", f"{secured.tls}/etcd.pem",
        "--api-key", f"{secured.tls}/etcd-key.pem"])
    wait_for(lambda: "h1" in api.live_hosts(secured.root), timeout=30, what="h1 alive")
    return f"https://127.0.0.1:{port}"


def stop_joined(doc: dict, where) -> None:
    """Stop the peer join started, by its PID, and its guard."""
    pid = ((doc or {}).get("peer") or {}).get("pid")
    if pid:
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not os.path.exists(f"/proc/{pid}") or
                 open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z",
                 what="the joined peer to end")
    stop_guard(where / "state")


def test_a_joined_machine_registers_is_undrained_after_the_checks_and_takes_a_vm(
        secured, h1_serving, tmp_path):
    added = host_add(secured, "h4", "--api", h1_serving)
    assert added["token"].startswith("pcj1_") and added["host"] == "h4"
    record = secured.root.range(keys.join())[0][0].value
    assert added["token"] not in json.dumps(record) and "BEGIN" not in record["sealed"]
    where = tmp_path / "h4"
    done = join(secured, added["token"], where, "--wait", "60")
    doc = json.loads(done.stdout) if done.stdout else {}
    try:
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert doc["state"] == "serving" and doc["problems"] == [] and "hosts" in doc["verified"]
        assert doc["host"] == "h4" and doc["cluster"] == secured.name
        assert oct(os.stat(where / "tls" / "peer-h4-key.pem").st_mode & 0o777) == "0o600"
        assert "host = h4" in (where / "peerctl.conf").read_text()
        listed = {h["host"]: h for h in json.loads(secured.cli(
            "operator", "--format", "json", "hostlist").stdout)}
        assert listed["h4"]["alive"] and not listed["h4"]["drained"]
        booted = json.loads(secured.cli("operator", "--format", "json", "boot", "j1",
                                        "--resources", "VCPU:1,MEMORY_MB:64,DISK_GB:1",
                                        "--on", "h4").stdout)
        assert booted["state"] == "done" and booted["vms"][0]["host"] == "h4"
        assert secured.root.range(keys.join())[0] == []         # used up
    finally:
        stop_joined(doc, where)


def test_a_joined_host_whose_checks_fail_stays_drained_and_says_why(secured, h1_serving,
                                                                   tmp_path):
    token = host_add(secured, "h4", "--api", h1_serving)["token"]
    where = tmp_path / "h4"
    done = join(secured, token, where, "--wait", "60", env={"PEERCTL_NETWORKS": ""})
    doc = json.loads(done.stdout) if done.stdout else {}
    try:
        assert done.returncode == 1, (done.stdout, done.stderr)
        assert doc["state"] == "drained"
        assert any("h4 does not offer network default" in line for line in doc["problems"])
        listed = {h["host"]: h for h in json.loads(secured.cli(
            "operator", "--format", "json", "hostlist").stdout)}
        assert listed["h4"]["alive"] and listed["h4"]["drained"]
    finally:
        stop_joined(doc, where)


def test_a_used_token_is_refused_and_writes_nothing(secured, https_api, tmp_path):
    token = host_add(secured, "h4", "--api", https_api.url)["token"]
    done = join(secured, token, tmp_path / "first", "--no-start")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["state"] == "drained"
    revision = secured.root.revision()
    one_line(join(secured, token, tmp_path / "second", "--no-start"), 1,
             "unknown or already used join token")
    nothing_written(secured, tmp_path / "second", revision)


def test_an_expired_token_is_refused_and_writes_nothing(secured, https_api, tmp_path):
    added = host_add(secured, "h4", "--api", https_api.url, "--expires", "1s")
    wait_for(lambda: time.time() > added["expires"], what="the token to expire")
    revision = secured.root.revision()
    one_line(join(secured, added["token"], tmp_path / "late", "--no-start"), 1,
             "join token for h4 expired")
    nothing_written(secured, tmp_path / "late", revision)
    assert len(secured.root.range(keys.join())[0]) == 1      # kept, to say "expired"


def _altered(token: str, **changes) -> str:
    body = json.loads(base64.urlsafe_b64decode(token[5:] + "=" * (-len(token[5:]) % 4)))
    body.update(changes)
    return "pcj1_" + base64.urlsafe_b64encode(json.dumps(body).encode()).rstrip(b"=").decode()


def test_a_forged_token_is_refused_and_writes_nothing(secured, https_api, tmp_path):
    token = host_add(secured, "h4", "--api", https_api.url)["token"]
    forged = _altered(token, s=base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode())
    revision = secured.root.revision()
    one_line(join(secured, forged, tmp_path / "forged", "--no-start"), 1,
             "its secret does not match")
    nothing_written(secured, tmp_path / "forged", revision)
    assert join(secured, token, tmp_path / "real", "--no-start").returncode == 0   # unharmed


@pytest.mark.parametrize("cut", ["truncated", "garbled", "not a token"])
def test_a_truncated_or_garbled_token_is_one_line_before_anything(secured, https_api,
                                                                   tmp_path, cut):
    token = host_add(secured, "h4", "--api", https_api.url)["token"]
    bad = {"truncated": token[:len(token) // 2],
           "garbled": token[:40] + ("A" if token[40] != "A" else "B") * 8 + token[48:],
           "not a token": "hello"}[cut]
    revision = secured.root.revision()
    done = join(secured, bad, tmp_path / "bad", "--no-start")
    one_line(done, 2, "bad join token")
    nothing_written(secured, tmp_path / "bad", revision)


def test_another_clusters_token_is_refused_before_the_secret_leaves(secured, https_api,
                                                                    tmp_path):
    token = host_add(secured, "h4", "--api", https_api.url)["token"]
    other = certs.authority(str(tmp_path / "other-ca"), "other")
    with open(other, "rb") as f:
        elsewhere = _altered(token, f=join_tokens.fingerprint(f.read()), c="other")
    revision = secured.root.revision()
    one_line(join(secured, elsewhere, tmp_path / "other", "--no-start"), 1,
             "is not cluster other's: its CA's fingerprint")
    nothing_written(secured, tmp_path / "other", revision)
    assert len(secured.root.range(keys.join())[0]) == 1      # still redeemable


@pytest.mark.parametrize("args, said", [
    (["h 4"], "bad host name"),
    (["h4", "--address", "10.0.0.1/24"], "bad --address"),
    (["h4", "--expires", "soon"], "bad --expires"),
    (["h1"], "host h1 is already in the cluster")])
def test_host_add_refuses_bad_input_in_one_line_and_writes_nothing(secured, https_api, args,
                                                                   said):
    secured.root.put(keys.host_config("h1"), {"host": "h1"})
    revision = secured.root.revision()
    before = sorted(os.listdir(secured.tls))
    done = secured.cli("root", "host", "add", *args, "--api", https_api.url)
    one_line(done, 2, said)
    assert secured.root.revision() == revision and sorted(os.listdir(secured.tls)) == before


def test_a_join_killed_after_redeeming_is_recovered_by_host_add_again(secured, https_api,
                                                                      tmp_path):
    token = host_add(secured, "h4", "--api", https_api.url)["token"]
    armed = tmp_path / "failpoints"
    failpoints.arm(str(armed), ["join redeemed"])
    killed = join(secured, token, tmp_path / "h4", "--no-start",
                  env={failpoints.ENV: str(armed)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # the state it leaves: the token used up, nothing on the machine, h4 unknown
    assert not (tmp_path / "h4").exists()
    assert secured.root.range(keys.join())[0] == []
    assert secured.root.get(keys.host_config("h4")) is None
    one_line(join(secured, token, tmp_path / "h4", "--no-start"), 1, "already used")
    again = host_add(secured, "h4", "--api", https_api.url)["token"]
    done = join(secured, again, tmp_path / "h4", "--no-start")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "h4" / "peerctl.conf").exists()
    assert (tmp_path / "h4" / "tls" / "peer-h4.pem").read_bytes() == \
        open(f"{secured.tls}/peer-h4.pem", "rb").read()


def test_a_second_host_add_replaces_the_first_token(secured, https_api, tmp_path):
    first = host_add(secured, "h4", "--api", https_api.url)["token"]
    second = host_add(secured, "h4", "--api", https_api.url)["token"]
    one_line(join(secured, first, tmp_path / "first", "--no-start"), 1, "already used")
    assert join(secured, second, tmp_path / "second", "--no-start").returncode == 0


def test_host_add_as_an_operator_is_refused_and_writes_nothing(secured, https_api):
    revision, before = secured.root.revision(), sorted(os.listdir(secured.tls))
    one_line(secured.cli("operator", "host", "add", "h4", "--api", https_api.url), 4,
             "permission denied for role operator")
    assert secured.root.revision() == revision and sorted(os.listdir(secured.tls)) == before


def test_the_join_route_wants_its_fields_and_https(secured, https_api):
    import requests
    from tests.support.api_server import served_api
    session = requests.Session()
    session.trust_env = False
    session.verify = secured.files("root")["cacert"]
    assert session.get(https_api.url + "/v1/join").json()["ca"].startswith("-----BEGIN")
    answer = session.post(https_api.url + "/v1/join", json={"id": "x"})
    assert answer.status_code == 400 and "proof" in answer.json()["error"]
    answer = session.post(https_api.url + "/v1/join", json={"id": "x", "proof": "y"})
    assert answer.status_code == 404 and "unknown or already used" in answer.json()["error"]
    with served_api(secured.server.url, secured.name) as plain:
        assert requests.get(plain.url + "/v1/join").status_code == 404


def test_a_token_reads_back_and_seals_for_itself_only():
    token = join_tokens.new("prod", "https://10.0.0.11:2379", ["https://10.0.0.11:8443"],
                            "ab" * 32)
    assert join_tokens.parse(token.text()) == token
    other = join_tokens.new("prod", token.etcd, list(token.via), token.ca)
    sealed = join_tokens.seal(token, {"host": "h4"})
    assert join_tokens.unseal(token, sealed) == {"host": "h4"}
    with pytest.raises(join_tokens.Unsealable):
        join_tokens.unseal(other, sealed)
    assert join_tokens.proof_matches(join_tokens.proof_of(token),
                                     join_tokens.check_of(join_tokens.proof_of(token)))
    assert not join_tokens.proof_matches(join_tokens.proof_of(other),
                                         join_tokens.check_of(join_tokens.proof_of(token)))


def test_a_server_showing_the_clusters_ca_without_its_certificate_never_sees_the_proof(
        secured, https_api, tmp_path):
    """A machine in the way may copy the cluster's CA (it is public), not
    hold a certificate the CA signed: the proof never reaches it."""
    other = str(tmp_path / "impostor")
    certs.authority(other, "impostor")
    issued = certs.issue_server(other)
    impostor = ApiServer(Api(secured.server.url, secured.name, None, {"backend": "etcd"},
                             tls=True), "127.0.0.1:0",
                         tls={"cert": issued.cert, "key": issued.key,
                              "cacert": secured.files("root")["cacert"]}).start()
    try:
        token = host_add(secured, "h4", "--api", https_api.url)["token"]
        revision = secured.root.revision()
        one_line(join(secured, _altered(token, v=[impostor.url]), tmp_path / "h4",
                      "--no-start"), 1, "certificate verify failed")
        nothing_written(secured, tmp_path / "h4", revision)
    finally:
        impostor.stop()
    assert join(secured, token, tmp_path / "h4", "--no-start").returncode == 0


def test_removing_a_host_takes_its_unused_token_and_the_name_may_join_again(
        secured, https_api, tmp_path):
    """``host remove`` of a host added but never joined deletes its token
    (nothing of it may admit a machine later); ``host add`` of that name
    again clears its tombstone, and the new token joins."""
    stale = host_add(secured, "h4", "--api", https_api.url)["token"]
    root = secured.store("root")
    assert len(root.range(keys.join())[0]) == 1
    done = secured.cli("root", "--format", "json", "host", "remove", "h4", "--yes")
    assert done.returncode == 0, done.stderr
    assert root.range(keys.join())[0] == []
    one_line(join(secured, stale, tmp_path / "stale", "--no-start"), 1, "already used")
    fresh = host_add(secured, "h4", "--api", https_api.url)["token"]
    assert root.get(keys.removed("h4")) is None
    assert join(secured, fresh, tmp_path / "fresh", "--no-start").returncode == 0
