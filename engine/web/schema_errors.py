"""A JSON Schema error of a request's body, in the request's own terms: the
field by its JSON name (``"names"[0]``) and the values as JSON (``null``,
``{"VCPU": 1}``), where jsonschema's own message shows Python's reprs
(``None``, ``{'VCPU': 1}``).  One line, cut short for a large value."""
from __future__ import annotations

import json

__all__ = ["schema_error"]


def _json(value, most: int = 60) -> str:
    """``value`` as JSON, cut to ``most`` characters."""
    try:
        text = json.dumps(value)
    except (RecursionError, ValueError):
        text = "..."
    return text if len(text) <= most else text[:most - 3] + "..."


def _field(path) -> str:
    """A place in the body, as JSON names it: ``"names"[0]``."""
    return "".join(_json(part) if i == 0 and isinstance(part, str) else f"[{_json(part)}]"
                   for i, part in enumerate(path))


def schema_error(error) -> str:
    """The one line for jsonschema's ``error`` (its ``best_match``)."""
    kind, want, got = error.validator, error.validator_value, error.instance
    where = _field(error.absolute_path)
    head = f"bad {where}" if where else "bad body"
    if kind == "type":
        types = want if isinstance(want, list) else [want]
        said = f"{_json(got)} is not of type {' or '.join(map(_json, types))}"
    elif kind == "enum":
        said = f"{_json(got)} is not one of {', '.join(map(_json, want))}"
    elif kind == "required":
        missing = [name for name in want if isinstance(got, dict) and name not in got]
        said = f"{_json(missing[0] if missing else want[0])} is a required field"
    elif kind == "additionalProperties":
        known = error.schema.get("properties") or {}
        extra = sorted(name for name in got if name not in known) if isinstance(got, dict) else []
        said = (f"unknown field {_json(extra[0]) if extra else ''}"
                + (f" (fields: {', '.join(known)})" if known else " (it takes none)"))
    elif kind in ("minimum", "maximum"):
        than = "less" if kind == "minimum" else "greater"
        said = f"{_json(got)} is {than} than the {kind} {want}"
    elif kind == "minItems":
        said = f"{_json(got)} has fewer than {want} item{'s' if want != 1 else ''}"
    else:
        said = error.message
    return f"{head}: {said}"

