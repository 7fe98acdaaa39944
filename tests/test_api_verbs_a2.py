"""Tokens, releases, the upgrade, the feature level and the balance settings
over HTTP answer what their commands print with ``--format json``: each
route called on a real peer serving ``--api`` and compared with the same
command; bad input is one line with nothing written, a release over the
limit is 413 with nothing stored, and a viewer is refused every write but
the delete of its own token (logging out)."""
from __future__ import annotations

import pytest

from engine.core import keys
from engine.web.routes.core import Refusal
from engine.web.routes.tokens import check_mintable
from tests.support import one_line as said_once
from tests.support.api_client import ApiClient, serving_api


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


def test_no_token_is_minted_above_its_minter_s_role():
    check_mintable("operator", "operator")
    check_mintable("operator", "viewer")
    check_mintable("viewer", "viewer")
    with pytest.raises(Refusal) as refused:
        check_mintable("viewer", "operator")
    assert refused.value.status == 403
