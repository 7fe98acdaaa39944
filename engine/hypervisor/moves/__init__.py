"""A VM carried to another host: each side's steps of a move
(:mod:`.steps`), the copy of disks and memory by libvirt's live migration
(:mod:`.migration`), and the hand-off to the host that keeps the VM's
replica (:mod:`.handoff`).  The top room of the hypervisor: it may use
every other but :mod:`~engine.hypervisor.ha`."""
