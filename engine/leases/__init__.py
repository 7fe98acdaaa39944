"""Leases: whole hosts or slots of capacity, reserved over a time window.

The room sits on the engine core and placement (never on the hypervisor):

- ``model``: what a lease is (record, names, states, its names in placement)
  and the shapes of its keys;
- ``times``: the times and durations people write;
- ``admission``: a lease is granted, extended or given a new host only if
  it fits over its whole window, checked and written in one transaction;
- ``records``: lease records in etcd, and what holding or freeing a lease
  writes;
- ``events``: the steps of a lease's life (start, heal, warn, end, release,
  a VM's claim), each idempotent, served as the requests of
  ``requests/leases.py``;
- ``guard``: the singleton that nudges a host lease when one of its hosts
  dies;
- ``commands``: what the ``lease`` commands and ``boot --reservation`` do
  below the command line.

What those commands show (JSON documents, the ``lease calendar``
timeline) is built above this room, in ``engine/operations`` and the
command line.

The lease's life itself is the ``lease`` automation
(``automations/leases.py``), which decides from the answers of ``events``.
"""
