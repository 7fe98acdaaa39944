"""The API's balance settings: ``balance --auto show`` and ``balance --auto
on|off`` with ``--threshold``, ``--rounds``, ``--hold``; the balancer
starts a balance by itself when the score stays above the threshold."""
from __future__ import annotations

from engine.core.validate import parse_duration
from engine.operations import balance
from engine.wording import option

from .core import Answer, Call, obj, POSITIVE, route

AUTO = obj({"auto": {"enum": ["on", "off"]},
            "threshold": {"type": "number", "exclusiveMinimum": 0},
            "rounds": POSITIVE, "hold": {"type": ["string", "number"]}}, ["auto"])


@route("GET", "/v1/balance/auto", "the balance settings and the balancer's last round",
       "balance --auto show")
def balance_settings(ctx, call: Call) -> Answer:
    return Answer(balance.balance_settings(ctx))


@route("POST", "/v1/balance/auto", "balance by itself when the score stays high, or not: "
       "the fields given change, the others stay",
       "balance --auto on|off [--threshold SCORE] [--rounds N] [--hold DURATION]",
       write=True, body=AUTO)
def set_balance_settings(ctx, call: Call) -> Answer:
    body = call.body
    hold = parse_duration(body["hold"], option("hold")) if "hold" in body else None
    return Answer(balance.set_balance_settings(
        ctx, auto=body["auto"] == "on", threshold=body.get("threshold"),
        rounds=body.get("rounds"), hold=hold, by=call.user))
