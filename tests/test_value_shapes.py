"""A shape's verdict on a value read from etcd (engine/core/values.py).

Every read of every room goes through ``Shape.problem``, and a fast path
judges the common value in one pass; these cases pin the verdicts, so that
the fast path can never pass what the full check refuses.
"""
import pytest

from engine.core.values import Garbled, shape

RECORD = shape("test record", name=str, size=(int, float), extra=None)


class Text(str):
    """A str that is not exactly a str (msgpack never makes one)."""


@pytest.mark.parametrize("value", [
    {"name": "a", "size": 1, "extra": None},
    {"name": "a", "size": 1.5, "extra": [1], "newer": "field"},
    {"name": Text("a"), "size": 2, "extra": 0},
])
def test_a_value_with_every_field_of_its_type_is_readable(value):
    assert RECORD.problem(value) is None


@pytest.mark.parametrize("value, why", [
    ({"size": 1, "extra": None}, "no 'name'"),
    ({"name": "a", "size": 1}, "no 'extra'"),
    ({"name": "a", "size": True, "extra": None}, "'size' is a bool"),
    ({"name": "a", "size": "1", "extra": None}, "'size' is a str"),
    ({"name": None, "size": 1, "extra": None}, "'name' is a NoneType"),
    (["name"], "a list, want a mapping"),
    (Garbled(b"\xc1", "not msgpack (x)"), "not msgpack (x)"),
])
def test_a_value_missing_a_field_or_of_another_type_is_refused_saying_why(value, why):
    assert why in RECORD.problem(value)


def test_a_check_runs_after_the_fields():
    even = shape("even record", lambda v: None if v["n"] % 2 == 0 else "odd n", n=int)
    assert even.problem({"n": 2}) is None
    assert even.problem({"n": 3}) == "not a even record: odd n"
    assert even.problem({"n": "3"}) == "not a even record: 'n' is a str"


def test_a_plain_shape_takes_only_its_type():
    count = shape("count", None, int)
    assert count.problem(3) is None
    assert "want a int" in count.problem({"n": 3})
