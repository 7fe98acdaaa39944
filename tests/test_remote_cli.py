"""The command line from a workstation: the same commands through a peer's
API with a token file and no etcd, printing what they print on etcd, with
the same exit codes."""
from __future__ import annotations

import pytest

from engine.core import api as engine_api
from tests.support import wait_for
from tests.support.api_client import ApiClient, answers, api_peer_args, free_port, serving_pair
from tests.support.cluster import SMALL_VM, boot_vms
from tests.support.workstation import NOWHERE, Workstation, same_shape, token_file


@pytest.fixture
def apis(cluster, store):
    """host1 and host2 serving the API: their URLs, once both answer."""
    _, ports = serving_pair(cluster, store)
    urls = [f"http://127.0.0.1:{ports[h]}" for h in ("host1", "host2")]
    wait_for(lambda: answers(ApiClient(urls[1]), 401), what="host2's API")
    return urls


def _gated_pings(cluster, store, hooks: str) -> str:
    """host1 (serving the API) and host2, their pings held at a gate in
    ``hooks``: host1's API URL, once it answers."""
    port = free_port()
    cluster.start_peer("host1", extra_args=["--hooks", hooks, *api_peer_args(port)])
    cluster.start_peer("host2", extra_args=["--hooks", hooks])
    wait_for(lambda: {"host1", "host2"} <= set(engine_api.live_hosts(store)),
             what="peers alive")
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: answers(ApiClient(url), 401), what="host1's API")
    return url


def _token(cluster, role: str) -> str:
    return cluster.cli_json("token", "create", "--role", role)["secret"]


@pytest.fixture
def operator(cluster, apis, tmp_path):
    return Workstation(cluster, apis, _token(cluster, "operator"), tmp_path)


def both(cluster, workstation, *args, shaped=True):
    """Run ``args`` straight on etcd, then through the API: the two results."""
    direct = cluster.cli(*args)
    remote = workstation.cli(*args)
    fix = same_shape if shaped else (lambda text: text)
    return ((direct.returncode, fix(direct.stdout), fix(direct.stderr)),
            (remote.returncode, fix(remote.stdout), fix(remote.stderr)))


def test_listings_print_the_same_through_the_api(cluster, operator):
    boot_vms(cluster, "web1", "web2", on="host1")
    boot_vms(cluster, "db1", on="host2")
    cluster.cli_json("lease", "create", "l1", "--start", "+1h", "--end", "+2h", "--hosts", "1")
    for command in (["vmlist"], ["vmlist", "host1/*"], ["vmlist", "-o", "name,uuid,host"],
                    ["--format", "json", "vmlist"], ["vmlist", "--all"],
                    ["vmlist", "web*", "nosuch*"], ["tasks", "--all"],
                    ["lease", "list"], ["lease", "show", "l1"], ["backup", "list"],
                    ["placement", "providers"], ["placement", "allocations"],
                    ["group", "list"], ["hostlist", "-o", "host,alive,vms", "--no-headers"],
                    ["--format", "json", "placement", "candidates", SMALL_VM]):
        direct, remote = both(cluster, operator, *command)
        assert remote == direct, command
    assert both(cluster, operator, "vmlist", "nosuch")[1][0] == 1


def test_actions_confirm_start_and_follow_as_on_etcd(cluster, store, operator):
    boot_vms(cluster, "a1", "a2", on="host1")
    # several VMs: a dry run, then a refusal to act without --yes on a pipe
    direct, remote = both(cluster, operator, "stop", "a*", "--dry-run")
    assert remote == direct
    refused = operator.cli("stop", "a*", input="n\n")
    assert refused.returncode != 0
    assert {vm["state"] for vm in cluster.cli_json("vmlist")} == {"running"}
    done = operator.cli("--format", "json", "stop", "a*", "--yes")
    assert done.returncode == 0, done.stderr
    assert {vm["state"] for vm in cluster.cli_json("vmlist")} == {"shutoff"}
    started = operator.cli("start", "a1")
    assert started.returncode == 0, started.stderr
    assert "a1" in started.stdout and "done" in started.stdout
    boot = operator.cli_json("boot", "r1", "--resources", SMALL_VM, "--on", "host2")
    assert boot["state"] == "done" and boot["vms"][0]["host"] == "host2"
    detached = operator.cli_json("boot", "r2", "--resources", SMALL_VM, "--detach")
    waited = operator.cli_json("wait", detached["automation"])
    assert waited["state"] == "done" and waited == cluster.cli_json("task",
                                                                     detached["automation"])


def test_bad_input_and_unknown_things_exit_as_on_etcd(cluster, operator):
    for command in (["boot", "x", "--resources", "VCPU:zero"], ["lease", "show", "nope"],
                    ["task", "20990101-000000-abcdef"], ["stop", "nosuch"],
                    ["placement", "candidates", "VCPU:1", "--limit", "0"]):
        direct, remote = both(cluster, operator, *command)
        assert remote[0] == direct[0] != 0, (command, direct, remote)
        assert remote[2].strip().splitlines()[-1] == direct[2].strip().splitlines()[-1], command


def test_a_viewer_token_reads_and_its_writes_exit_4(cluster, apis, tmp_path):
    viewer = Workstation(cluster, apis, _token(cluster, "viewer"), tmp_path)
    assert viewer.cli("vmlist").returncode == 0
    done = viewer.cli("boot", "v1", "--resources", SMALL_VM)
    assert done.returncode == 4, done.stderr
    assert done.stderr.strip().startswith("peerctl: permission denied for role viewer")
    assert cluster.cli_json("vmlist") == []


def test_the_next_peer_answers_when_one_is_down_and_none_is_exit_3(cluster, apis, tmp_path):
    secret = _token(cluster, "operator")
    dead = f"http://127.0.0.1:{free_port()}"
    through_dead_first = Workstation(cluster, [dead, apis[1]], secret, tmp_path)
    assert through_dead_first.cli_json("hostlist")[0]["host"] == "host1"
    nobody = Workstation(cluster, [dead], secret, tmp_path)
    done = nobody.cli("vmlist")
    assert done.returncode == 3 and done.stderr.startswith("peerctl: no peer answered: ")
    assert dead in done.stderr


@pytest.mark.slow      # seconds of peers (and a browser): the third tier
def test_a_token_file_others_can_read_is_refused(cluster, apis, tmp_path):
    workstation = Workstation(cluster, apis, _token(cluster, "operator"), tmp_path)
    import os
    os.chmod(workstation.token_file, 0o644)
    done = workstation.cli("vmlist")
    assert done.returncode == 2 and "readable by others" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_named_remotes_are_kept_and_used(cluster, apis, tmp_path):
    secret_file = token_file(tmp_path, _token(cluster, "operator"), "lab.token")
    env = {"PEERCTL_ETCD": NOWHERE, "XDG_CONFIG_HOME": str(tmp_path / "cfg")}
    added = cluster.cli("remote", "add", "lab", ",".join(apis), "--token-file", secret_file,
                        "--use", env=env)
    assert added.returncode == 0, added.stderr
    assert (tmp_path / "cfg" / "peerctl" / "remotes.json").stat().st_mode & 0o077 == 0
    listed = cluster.cli("--format", "json", "hostlist", env=env)
    assert listed.returncode == 0, listed.stderr
    assert [h["host"] for h in __import__("json").loads(listed.stdout)] == ["host1", "host2"]
    assert cluster.cli("remote", "use", "--none", env=env).returncode == 0
    assert cluster.cli("hostlist", env=env).returncode == 3     # etcd again: nothing there
    assert cluster.cli("--remote", "lab", "hostlist", env=env).returncode == 0
    assert cluster.cli("--remote", "nope", "hostlist", env=env).returncode == 2


def test_tokens_code_upgrades_and_settings_through_the_api(cluster, operator, tmp_path):
    from tests.support.releases import build_release
    made = operator.cli_json("token", "create", "--role", "viewer", "--expires", "1d")
    assert made["role"] == "viewer" and made["secret"]
    direct, remote = both(cluster, operator, "token", "list")
    assert remote == direct and made["id"] in remote[1]
    gone = operator.cli_json("token", "delete", made["id"])
    assert gone == {"deleted": [made["id"]]}
    path = build_release(tmp_path, "0.2.0")
    added = operator.cli_json("code", "add", str(path))
    assert added["version"] == "0.2.0" and added["already"] is False
    direct, remote = both(cluster, operator, "code", "list")
    assert remote == direct and "0.2.0" in remote[1]
    direct, remote = both(cluster, operator, "upgrade", "--to", "0.2.0", "--dry-run")
    assert remote == direct and remote[0] == 0
    refused = operator.cli("upgrade", "--to", "0.2.0", input="n\n")
    assert refused.returncode != 0
    assert operator.cli_json("code", "delete", "0.2.0") == {"version": "0.2.0", "deleted": True}
    direct, remote = both(cluster, operator, "cluster", "feature-level")
    assert remote == direct
    direct, remote = both(cluster, operator, "balance", "--auto", "show")
    assert remote == direct
    on = operator.cli_json("balance", "--auto", "on", "--threshold", "0.3")
    assert on["auto"] is True and on["threshold"] == 0.3
    assert cluster.cli_json("balance", "--auto", "show")["auto"] is True
    version = operator.cli("version")
    assert version.returncode == 0 and "(the peer at http://127.0.0.1:" in version.stdout


def test_a_host_is_evacuated_and_removed_through_the_api(cluster, store, operator):
    from tests.support.cluster import ready_hosts
    ready_hosts(cluster, store, ["host3"])
    boot_vms(cluster, "mover", on="host3")
    direct, remote = both(cluster, operator, "host", "remove", "host3", "--yes")
    assert remote[0] == direct[0] == 1
    assert remote[2].strip().splitlines()[-1] == direct[2].strip().splitlines()[-1]
    done = operator.cli("--format", "json", "host", "remove", "host3", "--evacuate", "--yes",
                        timeout=180)
    assert done.returncode == 0, done.stderr
    doc = __import__("json").loads(done.stdout)
    assert doc["host"] == "host3" and [row["name"] for row in doc["moved"]] == ["mover"]
    assert "host3" not in {h["host"] for h in cluster.cli_json("hostlist")}
    assert {vm["name"]: vm["host"] for vm in cluster.cli_json("vmlist")}["mover"] != "host3"


def test_moves_backups_restores_and_leases_through_the_api(cluster, operator):
    boot_vms(cluster, "m1", "m2", on="host1")
    direct, remote = both(cluster, operator, "migrate", "m*", "--to", "host2", "--dry-run")
    assert remote == direct and remote[0] == 0
    moved = operator.cli_json("migrate", "m1", "--to", "host2")
    assert moved["state"] == "done"
    assert {vm["name"]: vm["host"] for vm in cluster.cli_json("vmlist")}["m1"] == "host2"
    direct, remote = both(cluster, operator, "evacuate", "host1", "--dry-run")
    assert remote == direct
    evacuated = operator.cli_json("evacuate", "host1", "--yes")
    assert evacuated["state"] == "done"
    assert {vm["host"] for vm in cluster.cli_json("vmlist")} == {"host2"}
    assert operator.cli_json("undrain", "host1")["hosts"] == [{"host": "host1",
                                                                "drained": False}]
    backed = operator.cli_json("backup", "m1")
    assert backed["state"] == "done" and backed["vms"][0]["host"] == "host2"
    backup_id = backed["vms"][0]["backup"]
    direct, remote = both(cluster, operator, "backup", "list", "m1", "-o", "id,vm,host,target,kind")
    assert remote == direct
    direct, remote = both(cluster, operator, "restore", backup_id, "--as", "m1copy", "--dry-run")
    assert remote == direct
    restored = operator.cli_json("restore", backup_id, "--as", "m1copy")
    assert restored["state"] == "done"
    lease = operator.cli_json("lease", "create", "l2", "--start", "+1h", "--end", "+2h",
                              "--hosts", "1")
    assert lease["lease"] == "l2"
    assert operator.cli_json("lease", "extend", "l2", "--end", "+3h")["lease"] == "l2"
    direct, remote = both(cluster, operator, "lease", "delete", "l2", "--dry-run")
    assert remote == direct
    assert operator.cli("lease", "delete", "l2", "--yes").returncode == 0
    assert cluster.cli_json("lease", "list") == []


@pytest.mark.slow      # seconds of peers (and a browser): the third tier
def test_progress_and_ctrl_c_through_the_api_as_on_etcd(cluster, store, tmp_path):
    """The live view of a ping whose steps wait at a gate, drawn from
    /v1/events on a terminal; Ctrl-C detaches (exit 130) and the automation
    goes on: wait, through the API too, sees it end."""
    import re
    import sys
    from tests.support import PEERCTL
    from tests.support.hooks import gated_hook
    from tests.support.terminal import Terminal
    hooks = str(tmp_path / "hooks")
    gate = gated_hook(hooks, request="ping")
    try:
        url = _gated_pings(cluster, store, hooks)
        workstation = Workstation(cluster, [url], _token(cluster, "operator"), tmp_path)
        terminal = Terminal([sys.executable, PEERCTL, "ping", "--rounds", "2"],
                            {**cluster.env, **workstation.env})
        terminal.wait_for_text(r"\[[#-]+\] \d+/\d+ steps")
        automation = re.search(r"steps\s+\d+ targets?\s+\w+\s+[\d.]+s\s+(\S+)",
                               terminal.text()).group(1)
        terminal.type(b"\x03")
        code = terminal.finish()
        text = terminal.text()
        assert code == 130 and "Traceback" not in text, text
        assert f"Re-attach with: python peerctl.py wait {automation}" in text
        assert cluster.cli_json("task", automation)["state"] == "running"
    finally:
        gate.open()
    waited = workstation.cli_json("wait", automation, timeout=120)
    assert waited["state"] == "done" and len(waited["result"]["replies"]) == 4


def test_snapshots_replicas_aside_scrub_and_the_rest_through_the_api(cluster, operator):
    boot_vms(cluster, "s1", on="host1")
    direct, remote = both(cluster, operator, "snapshot", "create", "s1", "--name", "one",
                          "--dry-run")
    assert remote == direct and remote[0] == 0
    assert operator.cli_json("snapshot", "create", "s1", "--name", "one")["state"] == "done"
    assert operator.cli_json("snapshot", "create", "s1", "--name", "two")["state"] == "done"
    direct, remote = both(cluster, operator, "snapshot", "list", "-o", "vm,host,name,memory")
    assert remote == direct and "one" in remote[1]
    def ageless(doc):
        return [dict(vm, snapshots=[{k: v for k, v in snap.items() if k != "age_s"}
                                    for snap in vm["snapshots"]]) for vm in doc]
    assert ageless(operator.cli_json("snapshot", "list")) == ageless(
        cluster.cli_json("snapshot", "list"))
    assert operator.cli("snapshot", "revert", "s1", "one", input="n\n").returncode != 0
    assert operator.cli_json("snapshot", "revert", "s1", "one", "--yes")["state"] == "done"
    assert operator.cli("snapshot", "delete", "s1", "one", "two", input="n\n").returncode != 0
    gone = operator.cli_json("snapshot", "delete", "s1", "one", "two", "--yes")
    assert gone["state"] == "done"
    assert cluster.cli_json("snapshot", "list") == []
    direct, remote = both(cluster, operator, "replicate", "s1", "--every", "1h", "--dry-run")
    assert remote == direct and remote[0] == 0
    replicated = operator.cli_json("replicate", "s1", "--every", "1h")
    assert [row["name"] for row in replicated["vms"]] == ["s1"]
    stopped = operator.cli_json("replicate", "s1", "--stop")
    assert [row["state"] for row in stopped["vms"]] == ["stopping"]
    for command in (["aside", "list"], ["scrub"], ["images", "sources"],
                    ["lease", "calendar", "--days", "2"], ["cluster", "verify"]):
        direct, remote = both(cluster, operator, *command)
        assert remote[0] == direct[0], (command, direct, remote)
        if command[0] != "cluster":         # verify probes: its timings differ
            assert remote == direct, command


def test_backups_are_protected_deleted_and_scheduled_through_the_api(cluster, operator):
    boot_vms(cluster, "b1", on="host1")
    first = operator.cli_json("backup", "b1", "--full")["vms"][0]["backup"]
    second = operator.cli_json("backup", "b1")["vms"][0]["backup"]
    protected = operator.cli_json("backup", "protect", first, second)
    assert {row["id"] for row in protected["backups"]} == {first, second}
    direct, remote = both(cluster, operator, "backup", "delete", first, "--yes")
    assert remote[0] == direct[0] == 1 and remote[2] == direct[2]
    operator.cli_json("backup", "unprotect", first, second)
    direct, remote = both(cluster, operator, "backup", "delete", first, second, "--dry-run")
    assert remote == direct
    assert operator.cli("backup", "delete", first, second, input="n\n").returncode != 0
    gone = operator.cli_json("backup", "delete", first, second, "--yes")
    assert gone["state"] == "done" and {row["id"] for row in gone["backups"]} == {first, second}
    assert cluster.cli_json("backup", "list") == []
    made = operator.cli_json("backup", "schedule", "b*", "--every", "1d", "--keep-last", "2")
    direct, remote = both(cluster, operator, "backup", "schedule", "list", "-o",
                          "schedule,pattern,every,keep")
    assert remote == direct and "b*" in remote[1]
    deleted = operator.cli_json("backup", "schedule", "delete", made["schedule"])
    assert [row["pattern"] for row in deleted["schedules"]] == ["b*"]
    assert cluster.cli_json("backup", "schedule", "list") == []


def test_a_boot_with_a_seed_through_the_api_seeds_as_on_etcd(cluster, store, operator, tmp_path):
    from engine.core import keys
    from tests.support.api_client import public_key
    key = public_key("me@desk")
    (tmp_path / "user-data").write_text("#cloud-config\npackages: [nginx]\n")
    (tmp_path / "key.pub").write_text(f"# mine\n{key}\n")
    seeded = ["--resources", SMALL_VM, "--user-data", str(tmp_path / "user-data"),
              "--ssh-key", str(tmp_path / "key.pub"), "--hostname", "web-1", "--detach"]
    direct = cluster.cli_json("boot", "here1", *seeded)
    remote = operator.cli_json("boot", "there1", *seeded)

    def seed_of(automation):
        (vm,) = store.get(keys.spec(automation)).value["args"]["vms"]
        return vm["seed"]
    assert seed_of(remote["automation"]) == seed_of(direct["automation"])
    (tmp_path / "bad-key.pub").write_text("not a key\n")
    direct, remote = both(cluster, operator, "boot", "x", "--resources", SMALL_VM,
                          "--ssh-key", str(tmp_path / "bad-key.pub"))
    assert remote == direct and remote[0] == 2


@pytest.mark.slow      # seconds of peers (and a browser): the third tier
def test_following_goes_on_through_the_next_peer_when_its_api_stops(cluster, store, tmp_path):
    """A ping whose steps wait at a gate, followed through a `serve --api`
    that is then killed: the command line resumes the event stream on the
    next URL and reports the automation's end, exit 0."""
    import signal
    import subprocess
    import sys
    from tests.support import PEERCTL, ROOT
    from tests.support.hooks import gated_hook
    hooks = str(tmp_path / "hooks")
    gate = gated_hook(hooks, request="ping")
    served = follower = None
    try:
        url = _gated_pings(cluster, store, hooks)
        first = free_port()
        served = subprocess.Popen([sys.executable, PEERCTL, "serve", "--api",
                                   f"127.0.0.1:{first}"], env=cluster.env, cwd=ROOT,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        urls = [f"http://127.0.0.1:{first}", url]
        wait_for(lambda: answers(ApiClient(urls[0]), 401), what="serve's API")
        workstation = Workstation(cluster, urls, _token(cluster, "operator"), tmp_path)
        follower = subprocess.Popen([sys.executable, PEERCTL, "ping"], cwd=ROOT, text=True,
                                    env={**cluster.env, **workstation.env},
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        [automation] = wait_for(lambda: [t["id"] for t in cluster.cli_json("tasks")],
                                what="the ping started")
        wait_for(lambda: any(e["status"] == "running"
                             for e in cluster.cli_json("task", automation)["log"]),
                 what="a ping step running")
        served.send_signal(signal.SIGKILL)
        served.wait(10)
        gate.open()
        out, err = follower.communicate(timeout=120)
        assert follower.returncode == 0, (out, err)
        assert out.rstrip().endswith(f"automation {automation} done"), out
    finally:
        gate.open()
        for process in (served, follower):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait(10)


@pytest.mark.slow      # seconds of peers (and a browser): the third tier
def test_bad_remotes_are_one_line_and_write_nothing(cluster, tmp_path):
    config = tmp_path / "cfg"
    env = {"PEERCTL_ETCD": NOWHERE, "XDG_CONFIG_HOME": str(config)}
    loose = tmp_path / "loose.token"
    loose.write_text("secret\n")
    loose.chmod(0o640)
    for command, said in (
            (["remote", "add", "lab", "http://127.0.0.1:1", "--token-file", str(loose)],
             "is readable by others"),
            (["remote", "add", "lab", "ftp://x", "--token-file", str(loose)], "bad API URL"),
            (["remote", "add", "bad name", "http://127.0.0.1:1", "--token-file", str(loose)],
             "bad remote name"),
            (["remote", "use", "nope"], "no remote 'nope'"),
            (["--api", "http://127.0.0.1:1", "--token-file", str(loose), "up"],
             "up runs on this machine"),
            (["--api", "http://127.0.0.1:1", "vmlist"], "needs a token")):
        done = cluster.cli(*command, env=env)
        lines = done.stderr.strip().splitlines()
        assert done.returncode in (1, 2) and len(lines) == 1 and said in lines[0], (command,
                                                                                     done)
    assert not (config / "peerctl" / "remotes.json").exists()
    (config / "peerctl").mkdir(parents=True)
    (config / "peerctl" / "remotes.json").write_text("{not json")
    done = cluster.cli("vmlist", env=env)
    assert done.returncode == 2 and done.stderr.startswith("peerctl: cannot read ")
    assert len(done.stderr.strip().splitlines()) == 1
