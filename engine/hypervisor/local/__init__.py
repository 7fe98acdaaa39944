"""Libvirt daemons of this machine's own: a private libvirtd (one more KVM
host on one machine), the network namespace and bridge its guests share,
and taking them all down again.  Knows nothing of VMs or etcd; nothing
else in the hypervisor room is below it."""
