"""Key names, in one place (see docs/keyspace.md).

Every key peerctl writes is spelled here and nowhere else; a function with
no arguments gives the prefix of all its kind (``vm()`` -> ``vms/``)."""

TERMINAL_STATES = ("done", "failed", "aborted", "stuck")


def auto(automation_id: str = "", part: str = "") -> str:
    """``auto/<id>/<part>``; ``auto()`` is every automation's keys."""
    if not automation_id:
        return "auto/"
    return f"auto/{automation_id}/{part}"


def _step(automation_id: str, part: str, index: int | None) -> str:
    """``auto/<id>/<part>/<index>``; without ``index``, every step's prefix."""
    if index is None:
        return f"auto/{automation_id}/{part}/"
    return f"auto/{automation_id}/{part}/{index:08d}"


def log_entry(automation_id: str, index: int | None = None) -> str:
    return _step(automation_id, "log", index)


def claim(automation_id: str, index: int | None = None) -> str:
    return _step(automation_id, "claim", index)


def response(automation_id: str, index: int | None = None) -> str:
    return _step(automation_id, "resp", index)


def status(automation_id: str) -> str:
    return f"auto/{automation_id}/status"


def spec(automation_id: str) -> str:
    return f"auto/{automation_id}/spec"


def abort(automation_id: str) -> str:
    return f"auto/{automation_id}/abort"


def aborting(automation_id: str) -> str:
    """Where the initiator logs that the workers were told of an abort."""
    return f"auto/{automation_id}/aborting"


def wake(automation_id: str, name: str = "") -> str:
    """``auto/<id>/wake/<name>``: wake the automation's sleeping timers
    (``engine/core/api.py`` ``nudge``); the initiator deletes it as it wakes them."""
    return f"auto/{automation_id}/wake/{name}"


def progress(automation_id: str, index: int | None = None) -> str:
    """How far a long step got (``engine/core/steps.py``); a view, not history."""
    return _step(automation_id, "progress", index)


def lock(name: str = "") -> str:
    """``locks/<name>``: one automation at a time acts on ``name``
    (``engine/core/locks.py``)."""
    return f"locks/{name}"


def drained(host: str = "") -> str:
    """``drained/<host>``: the operator drained the host (no new placements)."""
    return f"drained/{host}"


def elect(automation_id: str) -> str:
    return f"auto/{automation_id}/elect/"


def task(automation_id: str = "") -> str:
    return f"tasks/{automation_id}"


def member(host: str = "", automation_id: str = "") -> str:
    if not host:
        return "member/"
    return f"member/{host}/{automation_id}"


def inbox(host: str = "", automation_id: str = "", index: int | None = None) -> str:
    """``inbox/<host>/<id>/<index>``: a step for ``host`` to run;
    ``inbox()`` is every host's inbox."""
    if not host:
        return "inbox/"
    if index is None:
        return f"inbox/{host}/{automation_id}" + ("/" if automation_id else "")
    return f"inbox/{host}/{automation_id}/{index:08d}"


def host(name: str = "") -> str:
    return f"hosts/{name}"


def verified(host: str = "") -> str:
    """A host's last ``cluster verify`` outcome: ``{time, problems, lines,
    automation}`` (engine/operations/verify.py), shown by hostlist."""
    return f"verified/{host}"


def split_step(key: str) -> tuple[str, int]:
    """``auto/<id>/resp/00000007`` -> ("resp", 7)."""
    parts = key.split("/")
    return parts[2], int(parts[3])


def removed(name: str = "") -> str:
    """``removed/<host>``: the host was taken out of the cluster (``host
    remove``): its peer must not serve (``engine/core/removed.py``)."""
    return f"removed/{name}"


def host_config(name: str = "") -> str:
    """The host record kept across restarts (not lease-bound)."""
    return f"hostcfg/{name}"


def vm(host: str = "", uuid: str = "") -> str:
    """``vms/<host>/<uuid>``; ``vm()`` is every VM, ``vm(host)`` one host's."""
    if not host:
        return "vms/"
    return f"vms/{host}/{uuid}"


def disowned(host: str = "", uuid: str = "") -> str:
    """``disowned/<host>/<uuid>``: ``host`` must drop its copy of the VM."""
    if not host:
        return "disowned/"
    return f"disowned/{host}/{uuid}"


def foreign(host: str = "", uuid: str = "") -> str:
    """``foreign/<host>/<uuid>``: a domain of ``host`` that peerctl did not
    make (no peerctl metadata), as its peer sees it; under the peer's lease."""
    if not host:
        return "foreign/"
    return f"foreign/{host}/{uuid}"


def own_volumes(host: str = "", uuid: str = "") -> str:
    """``ownvols/<host>/<uuid>``: volumes of VM ``uuid`` on ``host`` that are
    not named after it (an adopted VM's disks, where they were): ``destroy``
    deletes them with the VM."""
    if not host:
        return "ownvols/"
    return f"ownvols/{host}/{uuid}"


def vm_definition(uuid: str = "") -> str:
    """``vmdef/<uuid>``: what a VM was built from, so that it can be built
    again on another host (HA restart)."""
    return f"vmdef/{uuid}"


def group(name: str = "", uuid: str = "") -> str:
    """``groups/<name>/<uuid>``: VM ``uuid`` is a member of group ``name``;
    ``group()`` is every group, ``group(name)`` + ``/`` one group's members."""
    if not name:
        return "groups/"
    return f"groups/{name}/{uuid}" if uuid else f"groups/{name}"


def group_of(uuid: str = "") -> str:
    """``groupof/<uuid>``: the group VM ``uuid`` is in."""
    return f"groupof/{uuid}"


def balanced(uuid: str = "") -> str:
    """``balanced/<uuid>``: a ``balance`` moved this VM (its hold time runs)."""
    return f"balanced/{uuid}"


BALANCE_SETTINGS = "settings/balance"   # balance's cluster settings (engine/planning/holds.py)
BALANCER_STATUS = "balancer/status"     # the balancer singleton's last round (engine/planning/auto.py)
IMAGE_SETTINGS = "settings/images"      # where VM images may come from (engine/hypervisor/storage/image_sources.py)


def aside(host: str = "", uuid: str = "") -> str:
    """``aside/<host>/<uuid>``: the disks of a stale copy of a VM, kept aside
    on ``host`` after the VM was restarted elsewhere."""
    if not host:
        return "aside/"
    return f"aside/{host}/{uuid}"


def recovery(host: str = "") -> str:
    """``recovery/<host>``: the automation recovering ``host``'s HA VMs."""
    return f"recovery/{host}"


def restart(uuid: str = "") -> str:
    """``restart/<uuid>``: an HA VM found crashed or missing on a live host,
    waiting for (or being given) a restart."""
    return f"restart/{uuid}"


def backup(backup_id: str = "") -> str:
    """``backups/<id>``: a backup of a VM's disks, complete and verified on
    its target host (written only then)."""
    return f"backups/{backup_id}"


def backup_schedule(schedule_id: str = "") -> str:
    """``schedules/backup/<id>``: a schedule of backups (``backup schedule``)."""
    return f"schedules/backup/{schedule_id}"


def replica(uuid: str = "") -> str:
    """``replicas/<uuid>``: a VM's replication (``replicate``): its interval
    and, once one is complete, its replica (host, time) on another host."""
    return f"replicas/{uuid}"


def snapshot(uuid: str = "", name: str = "") -> str:
    """``snapshots/<uuid>/<name>``: a snapshot of a VM on its host
    (``snapshot create``), listed without a hypervisor call."""
    if not uuid:
        return "snapshots/"
    return f"snapshots/{uuid}/{name}"


def singleton(name: str = "") -> str:
    """Election prefix of a cluster singleton (janitor, reconciler);
    ``singleton()`` is every singleton's."""
    if not name:
        return "singleton/"
    return f"singleton/{name}/"


RECONCILE_REPORT = "reconcile/report"


def maintenance(part: str = "") -> str:
    """``maintenance/<part>``: what the store's upkeep last did
    (``engine/core/maintenance.py``: ``compaction``)."""
    return f"maintenance/{part}"


def lease(name: str = "") -> str:
    """``leases/<name>``: a lease's record (``engine/leases``)."""
    return f"leases/{name}"


def lease_calendar(bucket: int | None = None, name: str = "") -> str:
    """``leasecal/<week>/<name>``: the lease's entry in each week its window
    touches; admission reads only the weeks of the window it checks."""
    if bucket is None:
        return "leasecal/"
    return f"leasecal/{bucket:06d}/{name}"


def lease_active(name: str = "") -> str:
    """``leaseactive/<name>``: a capacity lease whose allocation is held in
    placement now (what admission must not count as ordinary usage)."""
    return f"leaseactive/{name}"


def reserved(host: str = "") -> str:
    """``reserved/<host>``: an active host lease holds the host (no VM that
    is not booted into the lease is placed there)."""
    return f"reserved/{host}"


def lease_vm(name: str = "", uuid: str = "") -> str:
    """``leasevm/<name>/<uuid>``: a VM booted into the lease."""
    if not name:
        return "leasevm/"
    return f"leasevm/{name}/{uuid}"


def token(token_id: str = "") -> str:
    """``tokens/<id>``: a bearer token of the HTTP API (``engine/core/tokens.py``):
    its role, its expiry and the sha256 of its secret, never the secret."""
    return f"tokens/{token_id}"


def join(token_id: str = "") -> str:
    """``joins/<id>``: a join token ``host add`` made and ``join`` has not
    redeemed (``engine/operations/join.py``): the host it admits, its expiry,
    the sha256 of its proof and the sealed bundle, never the secret."""
    return f"joins/{token_id}"


def session(token_id: str = "", digest: str = "") -> str:
    """``sessions/<token id>/<sha256 of the cookie>``: a login of the page
    (``engine/core/sessions.py``), under the token it came from, so that a
    token's sessions are one prefix; ``session()`` is every session."""
    if not token_id:
        return "sessions/"
    return f"sessions/{token_id}/{digest}"


def placement(part: str = "") -> str:
    """The placement store's keys (``engine/placement/etcd.py`` names the parts)."""
    return f"placement/{part}"


def suffix(key: str, prefix: str) -> str:
    """``suffix("hosts/h1", host())`` -> ``"h1"``."""
    return key[len(prefix):]


def release(version: str = "") -> str:
    """``code/releases/<version>``: a release of peerctl the cluster carries,
    its meta (``engine/releases/catalog.py``)."""
    return f"code/releases/{version}"


def release_chunk(version: str = "", index: int | None = None) -> str:
    """``code/chunks/<version>/<index>``: one piece of a release's archive;
    without ``index``, every piece of ``version``; without either, every
    release's pieces."""
    if not version:
        return "code/chunks/"
    if index is None:
        return f"code/chunks/{version}/"
    return f"code/chunks/{version}/{index:05d}"
