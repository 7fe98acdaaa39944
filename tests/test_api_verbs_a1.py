"""Every verb over HTTP (issue 52), part one: snapshots, replicas, disks
kept aside, the lease calendar, scrub, image sources, cluster verify, boot's
cloud-init seed and address wait, and backup delete's whole shape.  Each
route is called on real peers serving ``--api`` and its JSON compared with
what the same command prints with ``--format json``; bad input is ``400``
in one line with nothing written, and a viewer's write is ``403``."""
from __future__ import annotations

import time

import pytest

from engine.core import keys
from engine.leases.times import iso
from tests.support.api_client import ApiClient, public_key, serving_pair
from tests.support.cluster import SMALL_VM, boot_vms, finished, task_ids
from tests.support.raw import put_raw
from tests.support.aside import keep_aside


@pytest.fixture
def served(cluster, store):
    """host1 and host2 serving the API: an operator's client, and a viewer's."""
    client, ports = serving_pair(cluster, store)
    viewer = ApiClient(client.url, cluster.cli_json("token", "create", "--role",
                                                    "viewer")["secret"])
    return client, viewer


def written(store, prefix: str) -> dict:
    """``{key: mod revision}`` under ``prefix``: what a refusal must not touch."""
    return {kv.key: kv.mod_revision for kv in store.range(prefix)[0]}


def one_line_400(answer) -> str:
    status, doc, _ = answer
    assert status == 400 and set(doc) == {"error"} and "\n" not in doc["error"], answer
    return doc["error"]


def cli_error(cluster, *args) -> str:
    """The one line the command line refuses ``args`` with, without its
    ``peerctl: ``."""
    done = cluster.cli(*args, input="")
    assert done.returncode != 0 and done.stdout == "", done
    (line,) = done.stderr.strip().splitlines()
    return line.removeprefix("peerctl: ")


def forbidden(answer) -> None:
    status, doc, _ = answer
    assert status == 403 and "permission denied for role viewer" in doc["error"], answer


def without(row: dict, *fields: str) -> dict:
    """``row`` without ``fields``: what moves between two reads (an age, a
    time from now, a replica the first update makes meanwhile)."""
    return {k: v for k, v in row.items() if k not in fields}


def unaged(entries: list[dict]) -> list[dict]:
    """snapshot list's entries without each snapshot's ``age_s``."""
    return [dict(e, snapshots=[without(s, "age_s") for s in e["snapshots"]]) for e in entries]


def aged_off(doc: dict) -> dict:
    """backup protect's answer without each row's ``age_s``."""
    return dict(doc, backups=[without(row, "age_s") for row in doc["backups"]])


def done(client, answer) -> dict:
    status, doc, headers = answer
    assert status == 202 and headers["Location"] == f"/v1/automations/{doc['automation']}", answer
    task = client.get(headers["Location"] + "/wait?timeout=60")[1]
    assert task["state"] == "done", task
    return task


# -- snapshots --------------------------------------------------------------------

@pytest.mark.slow      # seconds of peers (and a browser): the third tier
def test_snapshots_are_created_listed_reverted_and_deleted_as_on_the_command_line(
        cluster, store, served):
    client, viewer = served
    boot_vms(cluster, "web1", "web2")
    body = {"patterns": ["web*"], "name": "s1"}
    status, plan, _ = client.post("/v1/snapshots", {**body, "dry_run": True})
    assert status == 200 and plan == cluster.cli_json("snapshot", "create", "web*", "--name",
                                                      "s1", "--dry-run")
    done(client, client.post("/v1/snapshots", body))
    cluster.cli_json("snapshot", "create", "web1", "--name", "s2")
    for path, command in (("/v1/snapshots", ["snapshot", "list"]),
                          ("/v1/snapshots?pattern=web1", ["snapshot", "list", "web1"])):
        status, doc, _ = client.get(path)
        assert status == 200 and unaged(doc) == unaged(cluster.cli_json(*command)), path
    assert [s["name"] for s in client.get("/v1/snapshots?pattern=web1")[1][0]["snapshots"]] \
        == ["s1", "s2"]

    # a revert always asks, as the command does
    revert = "/v1/vms/web1/snapshots/s1/revert"
    status, doc, _ = client.post(revert, {})
    assert status == 409 and "host1/web1 to s1" in doc["error"] and '"yes": true' in doc["error"]
    status, plan, _ = client.post(revert, {"dry_run": True})
    assert status == 200 and plan == cluster.cli_json("snapshot", "revert", "web1", "s1",
                                                      "--dry-run")
    done(client, client.post(revert, {"yes": True}))

    # a delete of several asks; of one, not
    several = "/v1/vms/web1/snapshots?snapshot=s1&snapshot=s2"
    status, doc, _ = client.delete(several)
    assert status == 409 and "?yes=true" in doc["error"] and "host1/web1 s2" in doc["error"]
    status, plan, _ = client.delete(several + "&dry_run=true")
    assert status == 200 and plan == cluster.cli_json("snapshot", "delete", "web1", "s1", "s2",
                                                      "--dry-run")
    done(client, client.delete(several + "&yes=true"))
    done(client, client.delete("/v1/vms/web2/snapshots?snapshot=s1"))
    assert client.get("/v1/snapshots")[1] == [] == cluster.cli_json("snapshot", "list")

    before, tasks = written(store, keys.snapshot()), task_ids(cluster)
    said = one_line_400(client.post("/v1/snapshots", {"patterns": ["web1"], "name": "no way"}))
    assert said == cli_error(cluster, "snapshot", "create", "web1", "--name", "no way")
    one_line_400(client.delete("/v1/vms/web1/snapshots"))
    one_line_400(client.get("/v1/snapshots?pattern=a/b/c"))
    one_line_400(client.post(revert, {"yes": "please"}))
    forbidden(viewer.post("/v1/snapshots", body))
    forbidden(viewer.post(revert, {"yes": True}))
    forbidden(viewer.delete(several + "&yes=true"))
    assert written(store, keys.snapshot()) == before and task_ids(cluster) == tasks


# -- replicas ---------------------------------------------------------------------

def test_replication_starts_and_stops_as_on_the_command_line(cluster, store, served):
    client, viewer = served
    boot_vms(cluster, "db1", "db2")
    status, plan, _ = client.post("/v1/replicas", {"patterns": ["db*"], "every": "30s",
                                                   "to": "host2", "dry_run": True})
    assert status == 200 and plan == cluster.cli_json("replicate", "db*", "--every", "30s",
                                                      "--to", "host2", "--dry-run")
    assert written(store, keys.replica()) == {}
    status, doc, _ = client.post("/v1/replicas", {"patterns": ["db1"], "every": 30,
                                                  "from_image_if_no_replica": True})
    printed = cluster.cli_json("replicate", "db2", "--every", "30s",
                               "--from-image-if-no-replica")
    assert status == 200 and [set(row) for row in doc["vms"]] == [set(printed["vms"][0])]
    assert without(doc["vms"][0], "name", "uuid") == without(printed["vms"][0], "name", "uuid")

    status, doc, _ = client.post("/v1/replicas/stop", {"patterns": ["db*"]})
    assert status == 409 and "host1/db1, host1/db2" in doc["error"]
    status, plan, _ = client.post("/v1/replicas/stop", {"patterns": ["db*"], "dry_run": True})
    printed = cluster.cli_json("replicate", "db*", "--stop", "--dry-run")
    assert status == 200 and [without(row, "replica_host") for row in plan["vms"]] == \
        [without(row, "replica_host") for row in printed["vms"]]
    assert without(plan, "vms") == without(printed, "vms")

    before = written(store, keys.replica())
    said = one_line_400(client.post("/v1/replicas", {"patterns": ["db1"], "every": "1s"}))
    assert said == '"every" 1s is too short: a replica is updated at most every 10s'
    one_line_400(client.post("/v1/replicas", {"patterns": ["db1"], "every": "soon"}))
    one_line_400(client.post("/v1/replicas", {"patterns": ["db1"]}))
    one_line_400(client.post("/v1/replicas/stop", {"patterns": ["db*"], "every": "1m"}))
    forbidden(viewer.post("/v1/replicas", {"patterns": ["db1"], "every": "1m"}))
    forbidden(viewer.post("/v1/replicas/stop", {"patterns": ["db*"], "yes": True}))
    assert written(store, keys.replica()) == before

    status, doc, _ = client.post("/v1/replicas/stop", {"patterns": ["db*"], "yes": True})
    assert status == 200 and doc["state"] == "done"
    assert {(row["name"], row["state"]) for row in doc["vms"]} == {("db1", "stopping"),
                                                                 ("db2", "stopping")}


# -- disks kept aside, scrub -------------------------------------------------------


def test_disks_kept_aside_and_unreadable_keys_as_on_the_command_line(cluster, store, etcd,
                                                                    served):
    client, viewer = served
    keep_aside(store, "host1", "db1")
    keep_aside(store, "host2", "db2")
    for path, command in (("/v1/aside", ["aside", "list"]),
                          ("/v1/aside?pattern=host2", ["aside", "list", "host2"])):
        status, doc, _ = client.get(path)
        assert status == 200 and doc == cluster.cli_json(*command), path
    status, doc, _ = client.post("/v1/aside/delete", {"patterns": ["db*"]})
    assert status == 409 and "2 disk sets (host1/db1, host2/db2)" in doc["error"]
    status, plan, _ = client.post("/v1/aside/delete", {"patterns": ["db*"], "dry_run": True})
    assert status == 200 and plan == cluster.cli_json("aside", "delete", "db*", "--dry-run")
    forbidden(viewer.post("/v1/aside/delete", {"patterns": ["db*"], "yes": True}))
    one_line_400(client.post("/v1/aside/delete", {"patterns": []}))
    one_line_400(client.get("/v1/aside?host=host1"))
    assert len(written(store, keys.aside())) == 2
    status, doc, headers = client.post("/v1/aside/delete", {"patterns": ["db*"], "yes": True})
    assert status == 202 and finished(store, doc["automation"])["kind"] == "aside_delete"

    garbage = f"/peerctl/{store.cluster}/{keys.backup('20260101-000000-abcdef')}"
    put_raw(etcd.url, garbage, b"\xc1 not msgpack")
    status, doc, _ = client.get("/v1/scrub")
    assert status == 200 and doc == cluster.cli_json("scrub")
    assert [row["key"] for row in doc["keys"]] == [keys.backup("20260101-000000-abcdef")]
    status, doc, _ = client.delete("/v1/scrub")
    assert status == 409 and "1 unreadable key (" in doc["error"] and "?yes=true" in doc["error"]
    status, doc, _ = client.delete("/v1/scrub?dry_run=true")
    assert status == 200 and doc == cluster.cli_json("scrub", "--delete", "--dry-run")
    forbidden(viewer.delete("/v1/scrub?yes=true"))
    one_line_400(client.delete("/v1/scrub?yes=maybe"))
    one_line_400(client.get("/v1/scrub?delete=true"))
    status, doc, _ = client.delete("/v1/scrub?yes=true")
    assert status == 200 and doc["deleted"] == [keys.backup("20260101-000000-abcdef")]
    assert client.get("/v1/scrub")[1] == {"keys": [], "deleted": []} == cluster.cli_json("scrub")


# -- leases, image sources, cluster verify ------------------------------------------

def test_the_calendar_image_sources_and_verify_answer_as_the_command_line(cluster, store,
                                                                         served):
    client, viewer = served
    cluster.cli_json("lease", "create", "maint", "--start", "+1h", "--end", "+2h",
                     "--hosts", "1")
    since = iso(time.time())
    status, doc, _ = client.get(f"/v1/leases/calendar?from={since}&days=2")
    assert status == 200 and doc == cluster.cli_json("lease", "calendar", "--from", since,
                                                     "--days", "2")
    assert [e["lease"] for held in doc["hosts"].values() for e in held] == ["maint"]
    status, doc, _ = client.get(f"/v1/leases/calendar?pattern=host2&from={since}&days=12h")
    assert status == 200 and doc == cluster.cli_json("lease", "calendar", "host2", "--from",
                                                     since, "--days", "12h")
    one_line_400(client.get("/v1/leases/calendar?days=soon"))
    # "calendar" is the calendar's, never a lease's
    before = written(store, keys.lease())
    said = one_line_400(client.post("/v1/leases", {"name": "calendar", "start": "+1h",
                                                   "end": "+2h", "hosts": 1}))
    assert said == cli_error(cluster, "lease", "create", "calendar", "--start", "+1h", "--end",
                             "+2h", "--hosts", "1")
    one_line_400(client.delete("/v1/leases/maint?timeout=never"))
    forbidden(viewer.delete("/v1/leases/maint?timeout=30"))
    assert written(store, keys.lease()) == before
    status, doc, _ = client.delete("/v1/leases/maint?timeout=30")
    assert status == 200 and doc["lease"] == "maint"

    status, doc, _ = client.get("/v1/images/sources")
    assert status == 200 and doc == cluster.cli_json("images", "sources")
    source = "https://cloud-images.example/releases/"
    status, doc, _ = client.post("/v1/images/sources", {"add": [source]})
    assert status == 200 and source in [s["source"] for s in doc["sources"]]
    assert doc == cluster.cli_json("images", "sources")
    said = one_line_400(client.post("/v1/images/sources", {"add": ["ftp://x/"]}))
    assert said == cli_error(cluster, "images", "sources", "--add", "ftp://x/")
    one_line_400(client.post("/v1/images/sources", {}))
    one_line_400(client.get("/v1/images/sources?all=true"))
    forbidden(viewer.post("/v1/images/sources", {"remove": [source]}))
    assert client.get("/v1/images/sources")[1] == doc

    # problems found are listed in a 200 (the command exits 1)
    status, found, _ = client.post("/v1/cluster/verify", {})
    printed = cluster.cli_json("cluster", "verify", expect_rc=1)
    assert status == 200 and set(found) == set(printed)
    assert found["problems"] and found["problems"] == printed["problems"]
    assert (found["checked"], found["hosts"]) == (printed["checked"], printed["hosts"])
    forbidden(viewer.post("/v1/cluster/verify", {}))
    one_line_400(client.post("/v1/cluster/verify", {"deep": True}))


# -- boot's seed and addresses ------------------------------------------------------

def seed_of(store, automation: str) -> dict:
    (vm,) = store.get(keys.spec(automation)).value["args"]["vms"]
    return vm["seed"]


def test_a_boot_takes_the_seed_and_waits_for_addresses_as_the_command_line(
        cluster, store, served, tmp_path):
    client, viewer = served
    key = public_key("me@desk")
    user_data = "#cloud-config\npackages: [nginx]\n"
    (tmp_path / "user-data").write_text(user_data)
    (tmp_path / "key.pub").write_text(f"# mine\n{key}\n")
    status, doc, _ = client.post("/v1/vms", {"names": ["seeded"], "resources": SMALL_VM,
                                             "user_data": user_data, "ssh_keys": [key],
                                             "hostname": "web-1"})
    assert status == 202 and set(doc) == {"automation"}
    printed = cluster.cli_json("boot", "typed", "--resources", SMALL_VM, "--user-data",
                               str(tmp_path / "user-data"), "--ssh-key",
                               str(tmp_path / "key.pub"), "--hostname", "web-1", "--detach")
    assert seed_of(store, doc["automation"]) == seed_of(store, printed["automation"]) == {
        "hostname": "web-1", "user_data": user_data.encode(), "ssh_keys": [key]}
    assert finished(store, doc["automation"])["state"] == "done"

    # the same limits, the same lines
    tasks = task_ids(cluster)
    big = "x" * (64 * 1024 + 1)
    (tmp_path / "big").write_text(big)
    said = one_line_400(client.post("/v1/vms", {"names": ["b1"], "resources": SMALL_VM,
                                                "user_data": big}))
    assert said == '"user_data" is 65537 bytes; at most 65536'
    keys_file = tmp_path / "many.pub"
    many = [public_key() for _ in range(33)]
    keys_file.write_text("\n".join(many[:32]) + "\n")
    (tmp_path / "more.pub").write_text(many[32] + "\n")
    said = one_line_400(client.post("/v1/vms", {"names": ["b1"], "resources": SMALL_VM,
                                                "ssh_keys": many}))
    assert said == cli_error(cluster, "boot", "b1", "--resources", SMALL_VM, "--ssh-key",
                             str(keys_file), "--ssh-key", str(tmp_path / "more.pub"))
    said = one_line_400(client.post("/v1/vms", {"names": ["b1"], "resources": SMALL_VM,
                                                "ssh_keys": ["command=x " + key]}))
    assert said.startswith('"ssh_keys"[0]: not an OpenSSH public key (')
    said = one_line_400(client.post("/v1/vms", {"names": ["b1"], "resources": SMALL_VM,
                                                "hostname": "web_1"}))
    assert said == cli_error(cluster, "boot", "b1", "--resources", SMALL_VM, "--hostname",
                             "web_1")
    one_line_400(client.post("/v1/vms", {"names": ["b1"], "resources": SMALL_VM,
                                         "wait_ip": True, "ip_timeout": 0}))
    forbidden(viewer.post("/v1/vms", {"names": ["b1"], "resources": SMALL_VM,
                                      "hostname": "b1"}))
    assert task_ids(cluster) == tasks

    status, doc, _ = client.post("/v1/vms", {"names": ["ip1"], "resources": SMALL_VM,
                                             "wait_ip": True, "ip_timeout": 60})
    assert status == 202
    assert doc["addresses"] == f"/v1/automations/{doc['automation']}/addresses?timeout=60"
    status, addressed, _ = client.get(doc["addresses"])
    printed = cluster.cli_json("boot", "ip2", "--resources", SMALL_VM, "--wait-ip",
                               "--ip-timeout", "60")
    assert status == 200 and set(addressed) == set(printed) and addressed["state"] == "done"
    ((mine,), (theirs,)) = addressed["vms"], printed["vms"]
    assert set(mine) == set(theirs) and mine["ip"] and theirs["ip"]
    assert mine["ip"] == {vm["name"]: vm for vm in cluster.cli_json("vmlist")}["ip1"]["ip"]
    status, doc, _ = client.get(f"/v1/automations/{printed['automation']}/addresses")
    assert status == 200 and doc["vms"][0]["ip"] == theirs["ip"]
    one_line_400(client.get(f"/v1/automations/{printed['automation']}/addresses?timeout=9999"))
    assert client.get("/v1/automations/20990101-000000-abcdef/addresses")[0] == 404


# -- backups ------------------------------------------------------------------------

def test_backup_delete_takes_several_ids_a_dry_run_and_a_confirmation(cluster, store,
                                                                     served):
    client, viewer = served
    boot_vms(cluster, "web1", "web2")
    task = done(client, client.post("/v1/backups", {"patterns": ["web*"], "yes": True}))
    first, second = sorted(row["backup"] for row in task["result"]["vms"])

    status, plan, _ = client.post("/v1/restores", {"backup": first, "as": "copy",
                                                   "dry_run": True})
    assert status == 200 and plan == cluster.cli_json("restore", first, "--as", "copy",
                                                      "--dry-run")
    status, doc, _ = client.post("/v1/backups/protect", {"ids": [first, second]})
    assert status == 200 and aged_off(doc) == aged_off(
        cluster.cli_json("backup", "protect", first, second))
    status, doc, _ = client.post("/v1/backups/unprotect", {"ids": [first, second]})
    assert status == 200 and aged_off(doc) == aged_off(
        cluster.cli_json("backup", "unprotect", first, second))

    both = f"/v1/backups?id={first}&id={second}"
    before, tasks = written(store, keys.backup()), task_ids(cluster)
    status, doc, _ = client.delete(both)
    assert status == 409 and first in doc["error"] and second in doc["error"]
    status, plan, _ = client.delete(both + "&dry_run=true")
    assert status == 200 and plan == cluster.cli_json("backup", "delete", first, second,
                                                      "--dry-run")
    status, plan, _ = client.delete(f"/v1/backups/{first}?dry_run=true")
    assert status == 200 and plan == cluster.cli_json("backup", "delete", first, "--dry-run")
    one_line_400(client.delete("/v1/backups"))
    assert one_line_400(client.delete("/v1/backups?id=a/b&yes=true")) == "bad backup id 'a/b'"
    assert client.delete("/v1/backups?id=nope&yes=true")[0] == 404
    forbidden(viewer.delete(both + "&yes=true"))
    forbidden(viewer.post("/v1/backups/protect", {"ids": [first]}))
    one_line_400(client.post("/v1/backups/unprotect", {"ids": []}))
    one_line_400(client.post("/v1/restores", {"backup": first, "dry_run": "yes"}))
    assert written(store, keys.backup()) == before and task_ids(cluster) == tasks
    deleted = done(client, client.delete(both + "&yes=true"))
    assert sorted(row["id"] for row in deleted["result"]["backups"]) == [first, second]
    assert client.get("/v1/backups")[1] == [] == cluster.cli_json("backup", "list")

    status, plan, _ = client.post("/v1/backups/schedules", {"pattern": "web*", "every": "1h",
                                                            "dry_run": True})
    printed = cluster.cli_json("backup", "schedule", "web*", "--every", "1h", "--dry-run")
    assert status == 200 and without(plan, "next") == without(printed, "next")
    assert written(store, keys.backup_schedule()) == {}
    cluster.cli_json("backup", "schedule", "web1", "--every", "1h")
    cluster.cli_json("backup", "schedule", "web2", "--every", "2h")
    one_line_400(client.delete("/v1/backups/schedules"))
    status, doc, _ = client.delete("/v1/backups/schedules?which=web1&which=web2")
    assert status == 409 and "?yes=true" in doc["error"]
    forbidden(viewer.delete("/v1/backups/schedules?which=web1&which=web2&yes=true"))
    status, doc, _ = client.delete("/v1/backups/schedules?which=web1&which=web2&yes=true")
    assert status == 200 and [s["pattern"] for s in doc["schedules"]] == ["web1", "web2"]
    assert cluster.cli_json("backup", "schedule", "list") == []


def test_backups_lost_with_their_host_lose_their_records_at_once(cluster, store, served):
    client, viewer = served
    boot_vms(cluster, "web1")
    (taken,) = cluster.cli_json("backup", "web1")["vms"]
    key = keys.backup(taken["backup"])
    store.put(key, dict(store.get(key).value, lost={"host": "host2", "time": time.time()}))
    path = f"/v1/backups?id={taken['backup']}"
    status, plan, _ = client.delete(path + "&dry_run=true")
    assert status == 200 and plan == cluster.cli_json("backup", "delete", taken["backup"],
                                                      "--dry-run")
    forbidden(viewer.delete(path + "&yes=true"))
    assert store.get(key) is not None
    status, doc, _ = client.delete(path)         # one backup: nothing to confirm
    assert status == 200 and doc == {"automation": None, "state": "done", "backups": [
        {"id": taken["backup"], "vm": "web1", "target": "host2", "state": "deleted",
         "error": None}]}
    assert store.get(key) is None and cluster.cli_json("backup", "list") == []


def test_the_api_s_seed_inputs_are_checked_as_the_files_of_the_command_line(tmp_path):
    from engine.errors import UsageError
    from engine.hypervisor.domain import seed
    key = public_key()
    (tmp_path / "key.pub").write_text(f"  {key}   me@desk  \n")
    assert seed.given_ssh_keys([f"  {key}   me@desk  "], '"ssh_keys"') == \
        seed.read_ssh_keys(str(tmp_path / "key.pub")) == [f"{key} me@desk"]
    long = [f"{public_key()} {'c' * 2100}" for _ in range(seed.MAX_SSH_KEYS)]
    with pytest.raises(UsageError, match=r'^"ssh_keys" are more than 65536 bytes together'):
        seed.given_ssh_keys(long, '"ssh_keys"')
    with pytest.raises(UsageError, match=r'^"ssh_keys"\[0\]: not an OpenSSH public key'):
        seed.given_ssh_keys([""], '"ssh_keys"')
    with pytest.raises(UsageError, match=r'^"user_data": not valid Unicode$'):
        seed.given_user_data("\ud800", '"user_data"')
    assert seed.given_user_data("é", '"user_data"') == "é".encode()
