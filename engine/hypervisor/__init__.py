"""Everything peerctl knows about VMs and the hypervisor, and the only
place that imports libvirt.  Seven rooms, each importing only the rooms
below it (``tests/test_layout.py`` checks the arrows, docs/engine.md draws
them):

- :mod:`.local`: libvirt daemons of this machine's own (a private
  libvirtd, the guests' network namespace, taking them down);
- :mod:`.domain`: what a VM is on libvirt: its XML, definition, records,
  networks, seed, and how a request finds it;
- :mod:`.storage`: the host's pool, images, qcow2, volume copies, checksums;
- :mod:`.host`: the host agent: the lifecycle, the publisher of ``vms/``,
  the reconciler, host facts, foreign domains and adoption;
- :mod:`.data`: copies of a VM's data: backups, restores, replicas, snapshots;
- :mod:`.moves`: a VM carried to another host (live migration, hand-offs);
- :mod:`.ha`: the guard on each host and the cluster's recoverer.

Built on ``engine.core`` and ``engine.placement``; neither imports from here."""
