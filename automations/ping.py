"""``ping``: each round asks every named host for a reply and waits for all.

It doubles as the cluster health check: a host that died shows up as a
``lost`` or ``timeout`` reply instead of a latency.
"""
from engine.core.registry import automation
from engine.core.replay import Request
from engine.errors import Failed


@automation("ping", version=1)
def ping(ctx, hosts, rounds=1, deadline=10.0):
    replies = []
    for round_ in range(rounds):
        answers = yield ctx.all([Request("ping", {"round": round_}, target=host,
                                         deadline=deadline, label=host)
                                 for host in hosts])
        for host, answer in zip(hosts, answers):
            reply = {"host": host, "round": round_, "status": answer.status}
            if answer.ok:
                reply["latency_ms"] = round((answer.time - answer.requested) * 1000, 3)
            else:
                reply["latency_ms"] = None
                reply["error"] = answer.error
            replies.append(reply)
    failed = sorted({r["host"] for r in replies if r["status"] != "ok"})
    if failed:
        raise Failed(f"no reply from {', '.join(failed)}", {"replies": replies})
    return {"replies": replies}
