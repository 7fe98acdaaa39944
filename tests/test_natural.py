"""Natural order's fast path: sorting text fields through zero-padded
strings must give exactly natural_key's order, whatever the texts hold."""
from __future__ import annotations

import random

from engine.natural import natural_key, sort_rows


def natural_order(rows, descending=False):
    return sorted(rows, key=lambda row: natural_key(row["name"]), reverse=descending)


def random_names(seed: int, parts: list[str]) -> list[dict]:
    chance = random.Random(seed)
    return [{"name": "".join(chance.choices(parts, k=chance.randint(1, 4))), "n": n}
            for n in range(1000)]


def test_numbers_of_any_length_sort_as_numbers():
    """Numbers are padded to the column's longest, not to a fixed width:
    30 digits sort after 25, leading zeros compare equal (ties keep their
    input order)."""
    rows = random_names(34, ["vm", "-", "9" * 25, "1" + "0" * 29, "007", "7", "10", "a"])
    assert sort_rows(rows, "name", ["name"]) == natural_order(rows)


def test_texts_holding_a_line_break_sort_the_same():
    """The fast path joins a column's texts with line breaks; a text
    holding one takes the path that pads each text alone."""
    rows = random_names(35, ["vm", "\n", "2", "10", "x\n3", "0"])
    assert any("\n" in row["name"] for row in rows)
    assert sort_rows(rows, "-name", ["name"]) == natural_order(rows, descending=True)


def test_an_empty_column_sorts_to_nothing():
    assert sort_rows([], "name", ["name"]) == []
