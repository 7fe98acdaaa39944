"""The records of copies of a VM's data, apart from any hypervisor: backups
(:mod:`.records`), what a schedule keeps (:mod:`.retention`), schedules
(:mod:`.schedules`), replicas (:mod:`.replicas`, ``replicas/``) and
snapshots (:mod:`.snapshots`, ``snapshots/``).  The hypervisor's data room
(:mod:`engine.hypervisor.data`) makes the copies these records describe."""
