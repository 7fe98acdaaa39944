"""High availability: the guard, a process per host that stops its HA VMs
before its peer's lease can expire (:mod:`.guard`), and the cluster's
``recoverer`` singleton that restarts a dead host's HA VMs elsewhere
(:mod:`.recoverer`).  Stands on :mod:`~engine.hypervisor.domain` and
:mod:`~engine.hypervisor.local`."""
