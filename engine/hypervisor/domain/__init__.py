"""What a VM is on libvirt, and how a request finds it: the domain XML
peerctl writes and reads back, the definition kept in etcd (``vmdef/``),
the ``vms/`` record's fields and shapes, networks and addresses, the
cloud-init seed, the HA rules listings share, the guest agent's freeze,
and :mod:`.lookup` / :mod:`.disks` that every other room uses to find a
domain and its disks.  Imports no other room of the hypervisor."""
