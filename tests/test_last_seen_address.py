"""A running guest whose address nobody sees now keeps the last one seen
(engine.hypervisor.domain.records.merged): on a host with no address on the
guest's network (where no ARP entry forms: a live move within a rack), or
once its ARP entry aged out.  What is seen now always wins, and a guest
that stopped has none."""
from engine.hypervisor.domain.records import merged

SEEN = [{"interface": "vnet0", "mac": "52:54:00:aa:bb:cc", "addr": "10.213.0.42",
         "prefix": 24}]


def record(host, state="running", addresses=()):
    addresses = list(addresses)
    return {"host": host, "name": "web", "uuid": "u1", "state": state,
            "networks": ["default"], "addresses": addresses,
            "ip": addresses[0]["addr"] if addresses else None}


def test_a_guest_moved_live_keeps_the_address_it_had_until_one_is_seen_here():
    moved = merged(record("host2"), record("host1", addresses=SEEN))
    assert (moved["host"], moved["ip"], moved["addresses"]) == ("host2", "10.213.0.42", SEEN)


def test_an_address_seen_now_wins_over_the_last_one():
    now = [dict(SEEN[0], addr="10.213.0.77")]
    assert merged(record("host1", addresses=now), record("host1", addresses=SEEN))["ip"] == \
        "10.213.0.77"


def test_a_stopped_guest_has_no_address_and_does_not_get_one_back():
    stopped = merged(record("host1", state="shutoff"), record("host1", addresses=SEEN))
    assert stopped["addresses"] == [] and stopped["ip"] is None
    started = merged(record("host1"), stopped)
    assert started["addresses"] == [] and started["ip"] is None
