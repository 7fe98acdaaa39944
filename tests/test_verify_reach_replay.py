"""``verify_reach`` in the "history in, requests out" style: round 1 asks
every host at once, stamping each answer with the initiator's clock (a
local ping), round 2 only those that answered, each its own targets; a
host that did not answer is in the result, never a failure."""
from engine.core.replay import Response
from tests.support.history import History

from automations.verify import targets_of, verify_reach

HOSTS = ["h1", "h2", "h3"]
LISTEN = {"h1": ["10.0.0.11", 49152], "h2": None, "h3": ["10.0.0.13", 49152]}
ENDPOINTS = {"h1": [], "h2": [],
             "h3": [{"what": "libvirt", "address": "10.0.0.13", "port": 16514}]}
TARGETS = {"h1": [{"what": "libvirt", "address": "10.0.0.13", "port": 16514, "host": "h3"}],
           "h3": []}


def answer(request):
    if request.target == "h2":
        return Response("timeout", error="no answer from h2 within 5.0s")
    if request.name == "reach_listen":
        return Response("ok", {"clock": 1000.0, "listen_error": None})
    if request.name == "ping":          # the initiator's clock, a local step
        return Response("ok", {"time": 1000.5})
    return Response("ok", {"results": [dict(t, ok=True, error=None)
                                       for t in request.args["targets"]]})


def test_round_two_asks_only_the_hosts_that_answered_round_one_and_nothing_fails():
    history = History(verify_reach, {"hosts": HOSTS, "listen": LISTEN, "endpoints": ENDPOINTS},
                      answer=answer)
    live = history.run()
    asked = [(r.name, r.target, r.args) for r in history.requests]
    assert asked[:3] == [("reach_listen", h, {"address": (LISTEN[h] or [None])[0],
                                              "port": (LISTEN[h] or [None, None])[1],
                                              "hold": 15.0}) for h in HOSTS]
    assert sorted(asked[3:5]) == [("ping", None, {"round": 0})] * 2
    assert asked[5:] == [("reach", h, {"targets": TARGETS[h], "timeout": 1.0})
                         for h in ("h1", "h3")]
    found = live.result["hosts"]
    assert found["h2"] == {"status": "timeout", "error": "no answer from h2 within 5.0s",
                           "results": None}
    assert found["h1"]["results"] == [dict(TARGETS["h1"][0], ok=True, error=None)]
    assert found["h3"]["results"] == [] and found["h3"]["clock"] == 1000.0
    assert found["h3"]["received"] == 1000.5


def test_every_prefix_of_the_history_replays_to_the_same_requests():
    history = History(verify_reach, {"hosts": HOSTS, "listen": LISTEN, "endpoints": ENDPOINTS},
                      answer=answer)
    history.run()
    for upto in range(len(history.responses) + 1):
        assert not history.replay(upto).take_new()


def test_with_only_a_host_the_others_probe_that_host_alone_and_it_probes_every_other():
    endpoints = {h: [{"what": "libvirt", "address": h, "port": 1}] for h in HOSTS}
    assert [t["host"] for t in targets_of("h1", endpoints)] == ["h2", "h3"]
    assert [t["host"] for t in targets_of("h1", endpoints, only="h1")] == ["h2", "h3"]
    assert [t["host"] for t in targets_of("h2", endpoints, only="h1")] == ["h1"]
