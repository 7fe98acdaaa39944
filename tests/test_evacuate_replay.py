"""``evacuate`` version 4, replayed: history in, requests out (no etcd, no peers).

Twenty test-driver VMs leave h1 for h2 and h3 in batched steps
(``automations/moves.py``, :func:`move_some`).  A fake of the cluster answers
each batched request as ``requests/moves.py`` does, one entry per VM, and a
test names only what goes wrong: one VM refused inside a batch, or one step
that fails as a whole.  Every scenario is replayed from its history, and the
replay must decide what the live run decided.
"""
from automations.moves import evacuate
from engine.core.replay import Response
from tests.support.history import History

SOURCE = "h1"
VMS = [{"name": f"web{n:02d}", "uuid": f"uuid-web{n:02d}", "host": SOURCE, "state": "running"}
       for n in range(1, 21)]
NAME_OF = {vm["uuid"]: vm["name"] for vm in VMS}
ALL = [vm["name"] for vm in VMS]
MAX_VMS = 16        # the most VMs a batched handler takes (requests/moves.py)

# The batched requests, and the field their arguments and replies list VMs in.
BATCHED = {"lock_vms": "vms", "move_describe_vms": "vms", "claim_moves": "moves",
           "move_redefine_vms": "vms", "destroy_vms": "vms", "confirm_moves": "moves",
           "unlock_vms": "vms"}
NEWEST_FIRST = lambda pending: pending[-1]      # noqa: E731  a delivery order of its own


def destination(name: str) -> str:
    """Where placement sends a VM: odd ones to h2, even ones to h3."""
    return "h2" if int(name[-2:]) % 2 else "h3"


def _value(request, item: dict) -> dict:
    """One VM's entry as the single request's handler answers it."""
    uuid = item["uuid"]
    return {"lock_vms": lambda: {"uuid": uuid, "owner": request.args.get("owner")},
            "move_describe_vms": lambda: {"uuid": uuid, "state": "running", "driver": "TEST",
                                          "required": {"VCPU": 1, "MEMORY_MB": 64}},
            "claim_moves": lambda: {"host": destination(NAME_OF[uuid]),
                                    "consumer": item["consumer"]},
            "move_redefine_vms": lambda: {"uuid": uuid, "state": item["state"]},
            "destroy_vms": lambda: {"uuid": uuid, "destroyed": True},
            "confirm_moves": lambda: {"consumer": item["consumer"], "confirmed": True},
            "unlock_vms": lambda: {"uuid": uuid, "released": True}}[request.name]()


class Cluster:
    """h1 evacuated onto h2 and h3, every request answered as it goes well,
    except ``refuse`` (``{(batched request, VM name): that VM's error}``) and
    ``fail`` (``request -> the whole step's error, or None``).  A redefinition
    refused leaves the VM running on h1 only, as ``vm_info`` then says."""

    def __init__(self, refuse=None, fail=None):
        self.refuse = refuse or {}
        self.fail = fail or (lambda request: None)

    def __call__(self, request) -> Response:
        broken = self.fail(request)
        if broken:
            return Response("error", error=broken)
        if request.name in BATCHED:
            field = BATCHED[request.name]
            return Response("ok", {field: [self._entry(request, item)
                                           for item in request.args[field]]})
        if request.name == "vm_info":
            here = request.target == SOURCE
            return Response("ok", {"uuid": request.args["uuid"], "host": request.target,
                                   "state": "running" if here else "absent"})
        return Response("ok", {"uuid": request.args.get("uuid")})

    def _entry(self, request, item: dict) -> dict:
        refused = self.refuse.get((request.name, NAME_OF[item["uuid"]]))
        if refused:
            return {"uuid": item["uuid"], "error": refused}
        return {"uuid": item["uuid"], "value": _value(request, item)}


def evacuation(parallel: int, cluster: Cluster, order=None) -> History:
    return History(evacuate, {"hosts": [SOURCE], "vms": VMS, "to": None,
                              "parallel": parallel}, answer=cluster, order=order)


def names_in(request) -> list[str]:
    """The VMs (names) a batched step was asked for."""
    return [NAME_OF[item["uuid"]] for item in request.args[BATCHED[request.name]]]


def batches_of(history: History, request: str) -> list[list[str]]:
    """The VMs (names) of each ``request`` step, in the order they were asked."""
    return [names_in(r) for r in history.requests if r.name == request]


def alone(history: History) -> set[str]:
    """The VMs that had a step of their own (no batched one)."""
    return {r.label for r in history.requests if r.name not in BATCHED}


def outcome(live) -> dict:
    """``{name: (host, state, error)}`` from the evacuation's result."""
    return {row["name"]: (row["host"], row["state"], row["error"])
            for row in live.result["vms"]}


def moved(names) -> dict:
    return {name: (destination(name), "running", None) for name in names}


# -- a healthy evacuation --------------------------------------------------------

def test_twenty_vms_move_in_batches_of_at_most_sixteen_each_where_its_claim_chose():
    history = evacuation(1, Cluster())
    live = history.run()

    assert {r.name for r in history.requests} == set(BATCHED)
    assert not alone(history), "a VM of the test driver had a step of its own"
    assert [len(batch) for batch in batches_of(history, "lock_vms")] == [MAX_VMS, 20 - MAX_VMS]
    assert all(len(batch) <= MAX_VMS for request in BATCHED
               for batch in batches_of(history, request))
    destroyed = [name for batch in batches_of(history, "destroy_vms") for name in batch]
    assert sorted(destroyed) == ALL, "a VM destroyed on h1 twice, or never"
    assert {r.target for r in history.requests if r.name == "move_redefine_vms"} == {"h2", "h3"}
    assert all(destination(name) == r.target for r in history.requests
               if r.name == "move_redefine_vms" for name in names_in(r))

    assert live.error is None
    assert outcome(live) == moved(ALL)
    assert history.replay().result == live.result, "a replay decides otherwise"


def test_any_delivery_order_moves_them_alike_and_replays_alike():
    history = evacuation(2, Cluster(), order=NEWEST_FIRST)
    live = history.run()

    assert [len(batch) for batch in batches_of(history, "lock_vms")] == [10, 10]
    assert all(len(batch) <= MAX_VMS for request in BATCHED
               for batch in batches_of(history, request))
    assert sorted(n for batch in batches_of(history, "destroy_vms") for n in batch) == ALL
    assert outcome(live) == moved(ALL)
    assert live.result == evacuation(2, Cluster()).run().result, "the order changed a result"
    assert history.replay().result == live.result, "a replay decides otherwise"
    for upto in range(len(history.responses)):      # a peer taking over at any point
        assert not history.replay(upto).take_new(), f"after {upto} responses: a step not logged"


# -- one VM refused inside a batch -----------------------------------------------

def test_a_vm_placement_refuses_stays_alone_on_h1_and_its_batch_moves_on():
    cluster = Cluster(refuse={("claim_moves", "web07"): "no host has room for 64 MiB"})
    history = evacuation(1, cluster, order=NEWEST_FIRST)
    live = history.run()

    assert outcome(live) == {**moved(ALL), "web07": (
        SOURCE, "running", "no destination: no host has room for 64 MiB")}
    assert "web07" not in [n for b in batches_of(history, "move_redefine_vms") for n in b]
    assert "web07" not in [n for b in batches_of(history, "destroy_vms") for n in b]
    assert ["web07"] in batches_of(history, "unlock_vms"), "its lock is not let go at once"
    assert live.error.startswith("1 of 20 VMs could not be moved: web07: no destination")
    assert history.replay().result == live.result, "a replay decides otherwise"


def test_a_vm_its_destination_refuses_is_decided_alone_and_reverted_to_h1():
    """h3 refuses web08's redefinition: both hypervisors are asked about web08
    alone (h1 runs it, h3 has none), and it stays where it was."""
    cluster = Cluster(refuse={("move_redefine_vms", "web08"): "disk pool full"})
    history = evacuation(1, cluster)
    live = history.run()

    assert outcome(live) == {**moved(ALL), "web08": (
        SOURCE, "running", "not moved: error: disk pool full")}
    asked_alone = [(r.name, r.target) for r in history.requests if r.label == "web08"]
    assert ("vm_info", SOURCE) in asked_alone and ("vm_info", "h3") in asked_alone
    assert ("destroy", "h3") in asked_alone and ("revert_move", None) in asked_alone
    assert "web08" not in [n for b in batches_of(history, "destroy_vms") for n in b], \
        "h1's copy destroyed while no other host has one"
    assert alone(history) == {"web08"}, "another VM left its batch"
    assert history.replay().result == live.result, "a replay decides otherwise"


# -- a batched step that fails as a whole -----------------------------------------

def test_a_destroy_vms_that_fails_whole_fails_each_vm_of_that_batch_alike_only():
    """h1's libvirt goes away while the second batch's copies there are
    destroyed: each VM of that batch is tried alone, fails alike and says
    so; the other batch's VMs move as if nothing happened."""
    first, second = ALL[:10], ALL[10:]

    def libvirt_gone(request):
        destroying = {"destroy_vms": names_in, "destroy": lambda r: [r.label]}.get(request.name)
        if destroying and set(destroying(request)) <= set(second):
            return "libvirt: connection reset"
        return None
    history = evacuation(2, Cluster(fail=libvirt_gone))
    live = history.run()

    assert [sorted(batch) for batch in batches_of(history, "destroy_vms")] == [first, second]
    assert sorted((r.label, r.target) for r in history.requests if r.name == "destroy") == \
        [(name, SOURCE) for name in second], "not each VM of the failed batch alone"
    assert outcome(live) == {**moved(first), **{
        name: (destination(name), "running", "cleaning h1: libvirt: connection reset")
        for name in second}}
    assert live.error.startswith("10 of 20 VMs could not be moved")
    assert history.replay().result == live.result, "a replay decides otherwise"
