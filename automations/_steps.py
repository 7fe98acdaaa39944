"""Pieces the VM automations share (not an automation: the loader skips
files whose name starts with ``_``)."""
from engine.errors import Failed

TIMEOUT_PER_GIB = 240.0         # seconds of disk copy per GiB, host to host


def resend(request, tries=4):
    """Send ``request`` again (as a new step) while its outcome is unknown.

    The engine never re-runs a step whose executor died; it reports it
    ``lost``.  For requests that are idempotent by design (claim, release,
    destroy, the move steps), the worker may ask again, and the second run
    finds the first one's work."""
    for _ in range(tries):
        reply = yield request
        if reply.status not in ("lost", "timeout"):
            return reply
    return reply


def finish(results, verb):
    """The automation's result ``{vms}``; it fails, keeping that result, when
    any VM ended in error."""
    failed = [r for r in results if r["state"] == "error" or r.get("error")]
    if failed:
        raise Failed(f"{len(failed)} of {len(results)} VMs could not be {verb}: "
                     + "; ".join(f"{r['name']}: {r['error']}" for r in failed[:5]),
                     {"vms": results})
    return {"vms": results}


def first_willing(candidates, ask):
    """``(value, None)`` from the first of ``candidates`` whose request
    ``ask(candidate)`` succeeds (each re-sent while lost), or ``(None,
    why)`` naming each refusal."""
    refused = []
    for candidate in candidates:
        reply = yield from resend(ask(candidate))
        if reply.ok:
            return reply.value, None
        refused.append(f"{candidate}: {reply.error or reply.status}")
    return None, "; ".join(refused)


def needed(request, what: str):
    """Send ``request`` (again while lost) and give its value; its failure
    fails the automation, as ``what: request: why``."""
    reply = yield from resend(request)
    if not reply.ok:
        raise Failed(f"{what}: {request.name}: {reply.error or reply.status}")
    return reply.value


def disk_copy_deadline(disks) -> float:
    """How long copying ``disks`` (``[{capacity}]``) between hosts may take."""
    gib = sum(d.get("capacity", 0) for d in disks or ()) / (1 << 30)
    return max(600.0, TIMEOUT_PER_GIB * gib + 120.0)
