"""Two automations started in the same second may draw the same id (the
second and three random bytes): the second is given another, never an
error and never the first one's (engine.core.api.start_automation)."""
from engine.core import api, keys


def test_an_id_taken_by_another_automation_is_drawn_again(store, monkeypatch):
    store.put(keys.host("h1"), {"host": "h1"}, store.grant(600))
    drawn = iter(["20261129-101010-aaaaaa", "20261129-101010-aaaaaa",
                  "20261129-101010-bbbbbb"])
    monkeypatch.setattr(api, "new_id", lambda: next(drawn))
    first = api.start_automation(store, "ping", {"hosts": ["h1"], "rounds": 1})
    second = api.start_automation(store, "ping", {"hosts": ["h1"], "rounds": 1})
    assert (first, second) == ("20261129-101010-aaaaaa", "20261129-101010-bbbbbb")
    assert store.get(keys.spec(first)) is not None and store.get(keys.spec(second)) is not None
