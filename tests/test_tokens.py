"""API bearer tokens: minted, listed and deleted through the real command
line on a real etcd; :func:`engine.core.tokens.verify` takes a live token's
secret and nothing else; bad input writes nothing; a garbled record is
skipped with a warning; with etcd's roles on, only an operator mints."""
from __future__ import annotations

import calendar
import hashlib
import json
import re
import time

from engine.core import keys, tokens
from tests.support import wait_for
from tests.support.cluster import refused
from tests.support.raw import put_raw
from tests.support.secured_etcd import SecuredEtcd

ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
SECRET = re.compile(r"pct_([0-9a-f]{12})_[A-Za-z0-9_-]{43}")


def epoch(text: str) -> float:
    return calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ"))


def stored(store) -> dict:
    """Every token record in etcd, by id, as it is stored."""
    return {keys.suffix(kv.key, keys.token()): kv.value for kv in store.range(keys.token())[0]}


def test_an_operator_mints_lists_and_deletes_tokens(cluster, store):
    viewer = cluster.cli_json("token", "create", "--role", "viewer")
    operator = cluster.cli_json("token", "create", "--role", "operator", "--expires", "12h")

    assert set(viewer) == {"id", "role", "created", "expires", "secret"}
    assert SECRET.fullmatch(viewer["secret"]).group(1) == viewer["id"]
    assert viewer["role"] == "viewer" and viewer["expires"] is None
    assert ISO.fullmatch(operator["created"]) and ISO.fullmatch(operator["expires"])
    assert abs(epoch(operator["expires"]) - epoch(operator["created"]) - 12 * 3600) <= 1

    records = stored(store)
    assert records[viewer["id"]]["hash"] == hashlib.sha256(viewer["secret"].encode()).hexdigest()
    assert not any(doc["secret"] in repr(records) for doc in (viewer, operator))

    listed = cluster.cli_json("token", "list")
    assert listed == [{field: doc[field] for field in ("id", "role", "created", "expires")}
                      for doc in (viewer, operator)]
    table = cluster.cli("token", "list")
    assert table.returncode == 0 and viewer["id"] in table.stdout
    assert viewer["secret"] not in table.stdout

    assert cluster.cli_json("token", "delete", viewer["id"]) == {"deleted": [viewer["id"]]}
    assert [doc["id"] for doc in cluster.cli_json("token", "list")] == [operator["id"]]


def test_the_secret_is_printed_once_and_says_so(cluster, store):
    done = cluster.cli("token", "create", "--role", "viewer", "--expires", "30m")
    assert done.returncode == 0, done.stderr
    secret = SECRET.search(done.stdout).group(0)
    assert "shown only once" in done.stdout
    assert tokens.verify(store, secret)["role"] == "viewer"


def test_verify_takes_a_live_secret_and_refuses_every_other(cluster, store):
    doc = cluster.cli_json("token", "create", "--role", "operator")
    secret = doc["secret"]
    assert tokens.verify(store, secret) == {"id": doc["id"], "role": "operator",
                                            "expires": None}

    wrong_tail = secret[:-1] + ("A" if secret[-1] != "A" else "B")
    other_id = "0" * 12 if doc["id"] != "0" * 12 else "1" * 12
    unknown_id = f"pct_{other_id}_{secret[-43:]}"
    for bad in (wrong_tail, unknown_id, secret + "x", secret.upper(), "", "pct_", None, 42,
                b"pct_", f"Bearer {secret}"):
        assert tokens.verify(store, bad) is None, bad

    cluster.cli_json("token", "delete", doc["id"])
    assert tokens.verify(store, secret) is None


def test_an_expired_token_is_refused(cluster, store):
    doc = tokens.create(store, "viewer", expires_in=3600)
    key = keys.token(doc["id"])
    assert tokens.verify(store, doc["secret"])["role"] == "viewer"
    store.put(key, dict(store.get(key).value, expires=time.time() - 1))
    assert tokens.verify(store, doc["secret"]) is None

    fleeting = tokens.create(store, "viewer", expires_in=0.2)
    wait_for(lambda: tokens.verify(store, fleeting["secret"]) is None, timeout=10,
             what="the 0.2s token to expire")
    assert {t["id"] for t in tokens.list_tokens(store)} == {doc["id"], fleeting["id"]}


def test_bad_input_exits_2_in_one_line_and_writes_nothing(cluster, store):
    refused(cluster, ["token", "create", "--role", "root"], 2, "bad token role 'root'")
    refused(cluster, ["token", "create", "--role", "viewer", "--expires", "soon"], 2, "soon")
    refused(cluster, ["token", "create", "--role", "viewer", "--expires", "0"], 2,
            "bad token expiry")
    refused(cluster, ["token", "create", "--role", "viewer", "--expires", "999999d"], 2,
            "bad token expiry")
    refused(cluster, ["token", "create"], 2, "--role")
    refused(cluster, ["token", "delete"], 2, "ID")
    refused(cluster, ["token", "delete", "a/b"], 2, "bad token id")
    assert stored(store) == {}


def test_deleting_an_unknown_token_deletes_none(cluster, store):
    kept = cluster.cli_json("token", "create", "--role", "viewer")
    done = refused(cluster, ["--format", "json", "token", "delete", kept["id"], "0badc0ffee00"],
                   1, "no token 0badc0ffee00")
    assert json.loads(done.stdout) == {"deleted": []}
    assert list(stored(store)) == [kept["id"]]
    assert tokens.verify(store, kept["secret"]) is not None


def test_a_garbled_record_is_skipped_with_a_warning(cluster, store, etcd):
    good = cluster.cli_json("token", "create", "--role", "viewer")
    put_raw(etcd.url, f"/peerctl/{cluster.name}/{keys.token('x')}", b"\xc1 not msgpack")
    forged_id = "abcdef012345"
    forged = f"pct_{forged_id}_{'A' * 43}"
    store.put(keys.token(forged_id), {"id": forged_id, "role": "root", "created": time.time(),
                                      "expires": None,
                                      "hash": hashlib.sha256(forged.encode()).hexdigest()})

    done = cluster.cli("--format", "json", "token", "list")
    assert done.returncode == 0, done.stderr
    assert [doc["id"] for doc in json.loads(done.stdout)] == [good["id"]]
    warnings = done.stderr.strip().splitlines()
    assert len(warnings) == 2 and all(line.startswith("peerctl: warning:") for line in warnings)
    assert "tokens/x" in done.stderr and f"tokens/{forged_id}" in done.stderr
    assert tokens.verify(store, forged) is None        # a role no token may have

    assert cluster.cli_json("token", "delete", "x") == {"deleted": ["x"]}
    assert cluster.cli("token", "list").stderr.count("tokens/x") == 0


def one_line(done) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_with_etcd_roles_a_viewer_cannot_mint_a_token_and_an_operator_can(tmp_path):
    secured = SecuredEtcd(tmp_path)
    try:
        denied = secured.cli("viewer", "token", "create", "--role", "operator")
        assert denied.returncode == 4, (denied.stdout, denied.stderr)
        line = one_line(denied)
        assert "permission denied" in line and "viewer" in line, line
        assert stored(secured.root) == {}

        made = secured.cli("operator", "--format", "json", "token", "create", "--role", "viewer")
        assert made.returncode == 0, made.stderr
        doc = json.loads(made.stdout)
        listed = secured.cli("viewer", "--format", "json", "token", "list")
        assert [t["id"] for t in json.loads(listed.stdout)] == [doc["id"]]
        assert tokens.verify(secured.root, doc["secret"])["role"] == "viewer"

        assert secured.cli("viewer", "token", "delete", doc["id"]).returncode == 4
        gone = secured.cli("operator", "token", "delete", doc["id"])
        assert gone.returncode == 0, gone.stderr
        assert stored(secured.root) == {}
    finally:
        secured.close()
