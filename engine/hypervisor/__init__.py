"""Everything peerctl knows about VMs and the hypervisor, in one room: the
lifecycle on libvirt, domain XML, images, host facts, the ``vms/`` records
and their publisher, and the reconciler with its ghost sweep.  Built on
``engine.core`` and ``engine.placement``; neither imports from here."""
