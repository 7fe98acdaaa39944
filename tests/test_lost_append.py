"""An append whose reply is lost (found by the soak: an etcd member
restarted just as an initiator appended a step it runs itself).  The step
and its claim are in etcd, bound to the initiator's own session, but the
initiator never heard so and never ran it; nobody else would (the claim
lives as long as that session), so the automation waited for the step's
deadline.  Leading again, the initiator runs its own claimed steps; real
etcd, a real peer, the real command line."""
from engine.core import api, failpoints
from tests.support import wait_for, wait_until
from tests.support.cluster import finished

SMALL = "VCPU:1,MEMORY_MB:64,DISK_GB:1"


def test_a_step_the_initiator_claimed_in_an_append_whose_reply_was_lost_runs(
        cluster, store, tmp_path):
    armed = tmp_path / "failpoints"
    armed.write_text("")
    failpoints.arm(str(armed), ["lose appended claim_vms"])
    ready_hosts_with(cluster, store, ["h1"], {failpoints.ENV: str(armed)})

    started = cluster.cli_json("boot", "web1", "--resources", SMALL, "--network", "none",
                               "--detach")
    task = finished(store, started["automation"], timeout=60)
    assert [p for p, *_ in failpoints.fired(str(armed))] == ["lose appended claim_vms"]
    assert task["state"] == "done", task
    claim = wait_until(lambda: cluster.cli_json("task", started["automation"]),
                       lambda t: t["log"], what="the task's log")["log"][0]
    assert (claim["request"], claim["status"]) == ("claim_vms", "ok"), claim
    assert [vm["name"] for vm in cluster.cli_json("vmlist")] == ["web1"]
    assert "own_claim_run_again" in cluster.log("h1")


def ready_hosts_with(cluster, store, names, env):
    """Peers ``names`` with ``env``, alive and with their placement providers."""
    for name in names:
        cluster.start_peer(name, env=env)
    wait_for(lambda: set(names) <= set(api.live_hosts(store)), what=f"{names} alive")
    wait_for(lambda: set(names) <= {p["name"] for p in cluster.cli_json(
        "placement", "providers")}, what=f"providers of {', '.join(names)}")
