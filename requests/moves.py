"""The requests of a VM move (see ``automations/moves.py``): ``move_describe``,
``move_prepare``, ``move_adopt`` and ``move_locate`` from
:mod:`engine.hypervisor.moves`, and ``move_migrate``, the copy itself, from
:mod:`engine.hypervisor.migration` (QEMU/KVM)."""
from engine.core.handlers import handler
from engine.hypervisor import moves

handler("move_describe")(moves.describe)
handler("move_prepare")(moves.prepare)
handler("move_adopt")(moves.adopt)
handler("move_locate")(moves.locate)


@handler("move_migrate")
def move_migrate(host, args: dict) -> dict:
    from engine.hypervisor import migration     # libvirt's migration API: QEMU hosts only
    return migration.migrate(host, args)
