"""The replicated-automation machinery: the store door to etcd, sessions,
elections and fencing, the log and its replay, the initiator and executor,
duties, the API.  Generic: nothing here knows of VMs, libvirt, placement or
``requests/`` (``tests/test_layout.py`` walks the imports to keep it so)."""
