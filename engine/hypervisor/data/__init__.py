"""Copies of a VM's data: backups (taken live, verified, recorded),
restores from a backup chain, replicas kept whole on another host, qcow2
snapshots, and the sweep of what an interrupted backup left.  Stands on
:mod:`~engine.hypervisor.domain` and :mod:`~engine.hypervisor.storage`;
never on the host agent, so that no copy depends on the lifecycle."""
