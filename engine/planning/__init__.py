"""Planners: where VMs would go, computed from one snapshot of the cluster
before anything is claimed (``balance``, ``boot --dry-run``, ``evacuate
--dry-run``).  :mod:`.model` is the cluster as they see it,
:mod:`.snapshot` reads it from etcd, :mod:`.balance` plans moves that even
out hosts, :mod:`.placements` plans boots and evacuations; :mod:`.holds` keeps
balance's settings and the hold on each VM it moved, and :mod:`.auto` is the
``balancer`` singleton that starts a balance by itself."""
