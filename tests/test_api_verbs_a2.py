"""Tokens, releases, the upgrade, the feature level and the balance settings
over HTTP answer what their commands print with ``--format json``: each
route called on a real peer serving ``--api`` and compared with the same
command; bad input is one line with nothing written, a release over the
limit is 413 with nothing stored, an upload whose peer is SIGKILLed
between chunks is finished by the next, and a viewer is refused every
write but the delete of its own token (logging out)."""
from __future__ import annotations

import base64
import os

import pytest
import requests

from engine.core import failpoints, keys
from engine.core.features import SUPPORTED, level_key
from engine.releases import catalog
from engine.web.routes.core import Refusal
from engine.web.routes.tokens import check_mintable
from tests.support import one_line as said_once
from tests.support import wait_for
from tests.support.api_client import ApiClient, answers, api_peer_args, free_port, serving_api
from tests.support.releases import build_release


@pytest.fixture
def served(cluster, store):
    """host1 serving the API; an operator's client and a viewer's of it."""
    operator = serving_api(cluster, store)
    viewer = ApiClient(operator.url, cluster.cli_json("token", "create", "--role",
                                                       "viewer")["secret"])
    return operator, viewer


def one_line(status, doc, expected_status) -> str:
    assert status == expected_status, doc
    assert isinstance(doc, dict) and "\n" not in doc["error"], doc
    assert "Traceback" not in doc["error"]
    return doc["error"]


def revisions(store, *prefixes) -> dict:
    """Each key under ``prefixes`` with its last write's revision: equal
    before and after, nothing there was written."""
    return {kv.key: kv.mod_revision for prefix in prefixes for kv in store.range(prefix)[0]}


def refused_by_command(cluster, *command) -> str:
    """The one line a refused command says, without its ``peerctl: ``."""
    done = cluster.cli(*command)
    assert done.returncode != 0, done.stdout
    return said_once(done).removeprefix("peerctl: ")


# -- tokens ---------------------------------------------------------------------------

def test_tokens_are_minted_listed_and_deleted_as_the_command_line_does(cluster, store,
                                                                        served):
    operator, viewer = served
    status, made, _ = operator.post("/v1/tokens", {"role": "viewer", "expires": "1h"})
    assert status == 201 and set(made) == {"id", "role", "created", "expires", "secret"}
    assert set(cluster.cli_json("token", "create", "--role", "viewer")) == set(made)
    assert ApiClient(operator.url, made["secret"]).get("/v1/hosts")[0] == 200
    assert operator.get("/v1/tokens")[1] == cluster.cli_json("token", "list")
    assert viewer.get("/v1/tokens")[1] == cluster.cli_json("token", "list")     # a read
    status, gone, _ = operator.delete(f"/v1/tokens/{made['id']}")
    assert status == 200 and gone == {"deleted": [made["id"]]}
    other = cluster.cli_json("token", "create", "--role", "viewer")["id"]
    assert cluster.cli_json("token", "delete", other) == {"deleted": [other]}
    assert made["id"] not in {t["id"] for t in cluster.cli_json("token", "list")}
    status, doc, _ = operator.delete(f"/v1/tokens/{made['id']}")
    assert one_line(status, doc, 404) == refused_by_command(cluster, "token", "delete",
                                                            made["id"])


def test_several_tokens_are_deleted_all_or_none(cluster, store, served):
    operator, viewer = served
    first, second = (cluster.cli_json("token", "create", "--role", "viewer")["id"]
                     for _ in range(2))
    before = revisions(store, keys.token())
    status, doc, _ = operator.delete(f"/v1/tokens?id={first}&id=0badc0ffee00")
    assert one_line(status, doc, 404) == refused_by_command(cluster, "token", "delete", first,
                                                            "0badc0ffee00")
    assert "by their ids" in one_line(*operator.delete("/v1/tokens")[:2], 400)
    assert one_line(*viewer.delete(f"/v1/tokens?id={first}")[:2], 403)
    assert revisions(store, keys.token()) == before
    status, doc, _ = operator.delete(f"/v1/tokens?id={first}&id={second}")
    assert status == 200 and doc == {"deleted": [first, second]}
    assert not {first, second} & {t["id"] for t in cluster.cli_json("token", "list")}


def test_a_bad_token_request_is_one_line_and_mints_nothing(cluster, store, served):
    operator, _ = served
    before = revisions(store, keys.token())
    for body, command in (({"role": "admin"}, ["--role", "admin"]),
                          ({"role": "viewer", "expires": "soon"},
                           ["--role", "viewer", "--expires", "soon"]),
                          ({"role": "viewer", "expires": 0},
                           ["--role", "viewer", "--expires", "0"])):
        status, doc, _ = operator.post("/v1/tokens", body)
        assert one_line(status, doc, 400) == refused_by_command(cluster, "token", "create",
                                                                *command), body
    for body in ({}, {"role": "viewer", "name": "x"}, {"role": 1}):
        assert operator.post("/v1/tokens", body)[0] == 400, body
    assert revisions(store, keys.token()) == before


def test_a_viewer_mints_nothing_deletes_no_other_token_and_may_log_itself_out(
        cluster, store, served):
    operator, viewer = served
    before = revisions(store, keys.token())
    mine = viewer.get("/v1/session")[1]["user"].removeprefix("token:")
    theirs = operator.get("/v1/session")[1]["user"].removeprefix("token:")
    status, doc, _ = viewer.post("/v1/tokens", {"role": "viewer"})
    assert "a viewer may read" in one_line(status, doc, 403)
    assert one_line(*viewer.delete(f"/v1/tokens/{theirs}")[:2], 403)
    assert revisions(store, keys.token()) == before
    status, doc, _ = viewer.delete(f"/v1/tokens/{mine}")
    assert status == 200 and doc == {"deleted": [mine]}
    assert viewer.get("/v1/hosts")[0] == 401            # logged out: its secret is dead
    assert operator.get("/v1/hosts")[0] == 200


def test_a_page_session_logs_its_viewer_token_out_only_with_the_csrf_token(cluster, store,
                                                                           served):
    operator, _ = served
    token = cluster.cli_json("token", "create", "--role", "viewer")
    browser = requests.Session()
    browser.get(operator.url + "/")
    csrf = {"X-CSRF-Token": browser.cookies.get("peerctl_csrf")}
    assert browser.post(operator.url + "/v1/session", json={"token": token["secret"]},
                        headers=csrf).status_code == 200
    mine = f"{operator.url}/v1/tokens/{token['id']}"
    refused = browser.delete(mine)
    assert refused.status_code == 403 and "CSRF" in refused.json()["error"]
    assert token["id"] in {t["id"] for t in cluster.cli_json("token", "list")}
    done = browser.delete(mine, headers=csrf)
    assert done.status_code == 200 and done.json() == {"deleted": [token["id"]]}
    assert browser.get(operator.url + "/v1/hosts").status_code == 401   # its session ended


def test_no_token_is_minted_above_its_minter_s_role():
    check_mintable("operator", "operator")
    check_mintable("operator", "viewer")
    check_mintable("viewer", "viewer")
    with pytest.raises(Refusal) as refused:
        check_mintable("viewer", "operator")
    assert refused.value.status == 403


# -- releases and the upgrade -----------------------------------------------------------

def test_a_release_is_added_listed_upgraded_to_and_deleted_over_http(cluster, store, served,
                                                                   tmp_path):
    operator, viewer = served
    path = build_release(tmp_path, "0.2.0")
    with open(path, "rb") as f:
        archive = f.read()
    gzip = {"Content-Type": "application/gzip"}
    assert one_line(*viewer.call("POST", "/v1/code", raw=archive, headers=gzip)[:2], 403)
    status, added, _ = operator.call("POST", "/v1/code?name=peerctl-0.2.0.tar.gz", raw=archive,
                                     headers=gzip)
    assert status == 201 and added["version"] == "0.2.0" and added["already"] is False
    assert cluster.cli_json("code", "add", path) == {**added, "already": True}
    status, again, _ = operator.call("POST", "/v1/code", raw=archive,
                                     headers={"Content-Type": "application/octet-stream"})
    assert status == 200 and again == {**added, "already": True}
    assert operator.get("/v1/code")[1] == cluster.cli_json("code", "list")
    assert viewer.get("/v1/version")[1] == cluster.cli_json("version")

    status, plan, _ = operator.post("/v1/upgrade", {"to": "0.2.0", "dry_run": True})
    assert status == 200 and plan == cluster.cli_json("upgrade", "--to", "0.2.0", "--dry-run")
    status, doc, _ = operator.post("/v1/upgrade", {"to": "0.2.0"})
    assert "host1: " in one_line(status, doc, 409) and doc["targets"] == plan["hosts"]
    assert one_line(*viewer.post("/v1/upgrade", {"to": "0.2.0", "yes": True})[:2], 403)
    for body, command, code in (
            ({"to": "9.9.9", "dry_run": True}, ["--to", "9.9.9", "--dry-run"], 404),
            ({"rollback": True, "dry_run": True}, ["--rollback", "--dry-run"], 409)):
        status, doc, _ = operator.post("/v1/upgrade", body)
        assert one_line(status, doc, code) == refused_by_command(cluster, "upgrade", *command)
    for body, said in (({}, '"to" or "rollback"'), ({"to": "0.2.0", "rollback": True}, "one"),
                       ({"to": "0.2.0", "parallel": 17}, '"parallel": 17'),
                       ({"to": "0.2.0", "parallel": 0}, "parallel"),
                       ({"to": "0.2.0", "hosts": "[", "dry_run": True}, "bad host pattern")):
        status, doc, _ = operator.post("/v1/upgrade", body)
        assert said in one_line(status, doc, 400), body
    assert store.range("tasks/")[0] == []              # nothing started

    assert one_line(*viewer.delete("/v1/code/0.2.0")[:2], 403)
    status, doc, _ = operator.delete("/v1/code/0.2.0")
    assert status == 200 and doc == {"version": "0.2.0", "deleted": True}
    assert operator.get("/v1/code")[1] == [] == cluster.cli_json("code", "list")
    status, doc, _ = operator.delete("/v1/code/0.2.0")
    assert one_line(status, doc, 404) == refused_by_command(cluster, "code", "delete", "0.2.0")


def test_what_is_no_release_is_refused_in_one_line_and_nothing_is_stored(cluster, store,
                                                                        served, tmp_path):
    operator, _ = served
    before = revisions(store, "code/")
    bad = tmp_path / "peerctl-0.3.0.tar.gz"
    bad.write_bytes(b"not an archive at all")
    status, doc, _ = operator.call("POST", "/v1/code", raw=bad.read_bytes(),
                                   headers={"Content-Type": "application/gzip"})
    said = one_line(status, doc, 400)
    assert said.startswith("request body: not a release: ")
    assert said.removeprefix("request body") == refused_by_command(
        cluster, "code", "add", str(bad)).removeprefix(str(bad))
    status, doc, _ = operator.call("POST", "/v1/code", raw=b"{}",
                                   headers={"Content-Type": "application/json"})
    assert "application/octet-stream" in one_line(status, doc, 415)
    status, doc, _ = operator.call("POST", "/v1/code?name=../x.tar.gz", raw=bad.read_bytes(),
                                   headers={"Content-Type": "application/gzip"})
    assert "bad archive name" in one_line(status, doc, 400)
    over = b"\0" * (16 * 1024 * 1024 + 1)
    status, doc, _ = operator.call("POST", "/v1/code", raw=over,
                                   headers={"Content-Type": "application/gzip"})
    assert one_line(status, doc, 413) == f"request body over {16 * 1024 * 1024} bytes"
    status, doc, _ = operator.post("/v1/tokens", {"role": "viewer", "pad": "x" * 1024 * 1024})
    assert one_line(status, doc, 413) == f"request body over {1024 * 1024} bytes"
    assert revisions(store, "code/") == before
    assert operator.get("/v1/hosts")[0] == 200         # the server goes on


@pytest.mark.slow      # seconds of peers (and a browser): the third tier
def test_an_upload_killed_between_chunks_is_finished_by_the_next_one(cluster, store,
                                                                     tmp_path):
    """host1's peer SIGKILLed while its API stores a release: the release is
    left ``uploading``, and the same upload to host2's API finishes it, the
    bytes stored once, whole."""
    armed = str(tmp_path / "failpoints")
    port = free_port()
    cluster.start_peer("host1", extra_args=api_peer_args(port),
                       env={failpoints.ENV: armed})
    other = serving_api(cluster, store, "host2")
    killed = ApiClient(f"http://127.0.0.1:{port}", cluster.cli_json(
        "token", "create", "--role", "operator")["secret"])
    wait_for(lambda: answers(killed), what="host1's API")
    path = build_release(tmp_path, "0.2.0", files={
        "bench/ballast.txt": base64.b64encode(os.urandom(900_000)).decode()})
    with open(path, "rb") as f:
        archive = f.read()
    gzip = {"Content-Type": "application/gzip"}
    failpoints.arm(armed, ["release_chunk_written"])
    with pytest.raises(requests.ConnectionError):
        killed.call("POST", "/v1/code", raw=archive, headers=gzip)
    assert [point for point, _, _ in failpoints.fired(armed)] == ["release_chunk_written"]
    assert cluster.peers["host1"].wait(10) == -9
    [row] = cluster.cli_json("code", "list")
    assert row["state"] == "uploading"
    status, doc, _ = other.call("POST", "/v1/code", raw=archive, headers=gzip)
    assert status == 201 and doc["state"] == "ready", doc
    assert catalog.fetch(store, "0.2.0") == archive
    assert other.get("/v1/code")[1] == cluster.cli_json("code", "list")


# -- the feature level and the balance settings ----------------------------------------------

def test_the_feature_level_reads_and_raises_as_the_command_line_does(cluster, store, served):
    operator, viewer = served
    shown = operator.get("/v1/cluster/feature-level")[1]
    assert shown == cluster.cli_json("cluster", "feature-level")
    assert viewer.get("/v1/cluster/feature-level")[1] == shown
    level = shown["level"]
    status, doc, _ = operator.post("/v1/cluster/feature-level", {"level": level})
    assert status == 200 and doc == cluster.cli_json("cluster", "feature-level", str(level))
    before = revisions(store, level_key())
    status, doc, _ = operator.post("/v1/cluster/feature-level", {"level": SUPPORTED + 1})
    assert one_line(status, doc, 409) == refused_by_command(
        cluster, "cluster", "feature-level", str(SUPPORTED + 1))
    for body in ({}, {"level": 0}, {"level": "2"}, {"level": 2.5}):
        assert one_line(*operator.post("/v1/cluster/feature-level", body)[:2], 400), body
    assert one_line(*viewer.post("/v1/cluster/feature-level", {"level": level})[:2], 403)
    assert revisions(store, level_key()) == before


def test_the_balance_settings_read_and_change_as_the_command_line_does(cluster, store, served):
    operator, viewer = served
    assert operator.get("/v1/balance/auto")[1] == cluster.cli_json("balance", "--auto", "show")
    status, doc, _ = operator.post("/v1/balance/auto", {"auto": "off", "threshold": 0.3,
                                                        "rounds": 2, "hold": "2h"})
    assert status == 200 and (doc["auto"], doc["threshold"], doc["rounds"], doc["hold"]) == (
        False, 0.3, 2, 7200.0)
    assert doc == cluster.cli_json("balance", "--auto", "off", "--threshold", "0.3",
                                   "--rounds", "2", "--hold", "2h")
    assert viewer.get("/v1/balance/auto")[1] == cluster.cli_json("balance", "--auto", "show")
    status, doc, _ = operator.post("/v1/balance/auto", {"auto": "off", "rounds": 4})
    assert (doc["threshold"], doc["rounds"]) == (0.3, 4)    # the others stay
    before = revisions(store, keys.BALANCE_SETTINGS)
    for body in ({"threshold": 0.2}, {"auto": "maybe"}, {"auto": "on", "threshold": 0},
                 {"auto": "on", "rounds": 0}, {"auto": "on", "hold": "soon"},
                 {"auto": "on", "hold": -1}, {"auto": "on", "hosts": "x"}):
        assert one_line(*operator.post("/v1/balance/auto", body)[:2], 400), body
    status, doc, _ = operator.post("/v1/balance/auto", {"auto": "on", "hold": "soon"})
    assert doc["error"] == refused_by_command(cluster, "balance", "--auto", "on", "--hold",
                                              "soon").replace("--hold", '"hold"')
    assert one_line(*viewer.post("/v1/balance/auto", {"auto": "on"})[:2], 403)
    assert revisions(store, keys.BALANCE_SETTINGS) == before
