"""Listings, written once: ``-o`` and ``--sort`` checked against the
listing's fields before etcd is read (exit 2), rows as a table with a
totals line or as JSON, and a pattern that matched nothing exiting 1 after
the rows the others matched are printed."""
from __future__ import annotations

from engine.natural import fields_of
from engine.operations.select import NoMatch

from . import table

__all__ = ["check_fields", "shown_fields", "show_listing", "listing"]


def check_fields(args, columns, default) -> list:
    """The ``-o`` columns, with ``-o`` and ``--sort`` checked against the
    listing's fields: a usage error (exit 2) before etcd is read."""
    chosen = table.select(columns, args.output, default)
    table.sort_rows([], args.sort, [c.field for c in columns])
    return chosen


def shown_fields(ctx, columns, default, json_fields) -> set[str]:
    """The fields a listing will show (its columns, or its JSON fields)
    and sort by: what its rows must carry.  A field read beside the rows
    (a join) need not be read when it is not among them."""
    args = ctx.args
    shown = [c.field for c in check_fields(args, columns, default)]
    if ctx.json and not args.output:
        shown = json_fields
    return {*shown, *(field.lstrip("-") for field in fields_of(args.sort or ""))}


def show_listing(ctx, rows: list[dict], columns, default, json_fields,
                 default_sort: str, totals=None) -> None:
    args = ctx.args
    chosen = check_fields(args, columns, default)
    rows = table.sort_rows(rows, args.sort or default_sort, [c.field for c in columns])
    if ctx.json:
        fields = [c.field for c in chosen] if args.output else json_fields
        ctx.emit([{f: row.get(f) for f in fields} for row in rows])
        return
    text = table.render(rows, chosen, headers=not args.no_headers, separator=args.separator)
    if totals and not args.no_headers and args.separator is None:
        text = (text + "\n" if text else "") + totals(rows)
    ctx.emit(None, text)


def listing(ctx, read, columns, default, json_fields, default_sort: str, totals=None) -> int:
    """Check the fields, ``read()`` the rows and show them; when a pattern
    matched nothing, show what the others matched, then exit 1 naming it."""
    check_fields(ctx.args, columns, default)
    try:
        rows = read()
    except NoMatch as exc:
        show_listing(ctx, exc.matched, columns, default, json_fields, default_sort)
        exc.result = None       # printed already
        raise
    show_listing(ctx, rows, columns, default, json_fields, default_sort, totals)
    return 0
