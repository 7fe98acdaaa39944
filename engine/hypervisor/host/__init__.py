"""The host agent: what a peer does on its own host.  The VM lifecycle
(build, start, stop, destroy...), the publisher that keeps ``vms/<host>/``
in line with libvirt, the reconciler and its ghost sweep, host facts and
accounting, foreign domains and adoption, disks kept aside, the console,
domain statistics, and the test driver's stand-in for a libvirtd that
outlives its peer.  Stands on :mod:`~engine.hypervisor.domain` and
:mod:`~engine.hypervisor.storage`."""
