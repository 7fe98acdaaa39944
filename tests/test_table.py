"""Listings as tables: natural order, alignment, and the fast paths that
must print and sort exactly what the plain rules say."""
from __future__ import annotations

import random

from engine.commandline import table
from engine.commandline.table import Column


def names(rows):
    return [row["name"] for row in rows]


def test_numbers_inside_names_sort_as_numbers_and_missing_values_sort_last():
    rows = [{"name": n} for n in ("host10", "host2", None, "host1", "2nd", "host02b")]
    assert names(table.sort_rows(rows, "name", ["name"])) == \
        ["2nd", "host1", "host2", "host02b", "host10", None]
    assert names(table.sort_rows(rows, "-name", ["name"]))[:2] == [None, "host10"]
    texts = [{"name": n} for n in ("web-1", "web1", "web")]     # all text: the fast path
    assert names(table.sort_rows(texts, "name", ["name"])) == ["web", "web1", "web-1"]


def test_the_string_fast_path_orders_like_natural_key():
    """Sorting two text fields goes through zero-padded strings; it must
    agree with the tuple keys of natural_key, ties kept in input order."""
    chance = random.Random(15)
    parts = ["host", "vm", "-", "db", "0", "7", "007", "10", "99", "a", "B"]
    rows = [{"host": "".join(chance.choices(parts, k=chance.randint(1, 4))),
             "name": "".join(chance.choices(parts, k=chance.randint(1, 4))), "n": i}
            for i in range(2000)]
    fast = table.sort_rows(rows, "host,-name", ["host", "name"])
    plain = sorted(rows, key=lambda r: table.natural_key(r["name"]), reverse=True)
    plain.sort(key=lambda r: table.natural_key(r["host"]))
    assert [(r["host"], r["name"]) for r in fast] == [(r["host"], r["name"]) for r in plain]


def test_columns_align_numbers_right_and_leave_the_last_column_unpadded():
    columns = [Column("name", "Name"), Column("mb", "Memory", table.human_mb, True),
               Column("n", "N", right=True), Column("ip", "IP")]
    rows = [{"name": "a", "mb": 512, "n": 3, "ip": "10.0.0.1"},
            {"name": "longer", "mb": 4096, "n": 12, "ip": None}]
    assert table.render(rows, columns).splitlines() == [
        "Name   Memory  N IP",
        "a        512M  3 10.0.0.1",
        "longer   4.0G 12 -"]
    assert table.render(rows, columns, headers=False, separator=",").splitlines() == [
        "a,512M,3,10.0.0.1", "longer,4.0G,12,-"]
    assert table.render([], columns, headers=False) == ""


def test_a_blank_last_cell_leaves_no_trailing_spaces():
    columns = [Column("name", "Name"), Column("note", "Note")]
    text = table.render([{"name": "a", "note": ""}, {"name": "bb", "note": "x"}], columns)
    assert text.splitlines() == ["Name Note", "a", "bb   x"]
