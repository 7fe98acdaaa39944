"""Leases: whole hosts or slots of capacity, reserved over a time window.

The room sits on the engine core and placement (never on the hypervisor):
``model`` says what a lease is, ``times`` reads the times people write,
``calendar`` admits leases atomically against every other lease, ``store``
reads and writes lease records.  The lease's life (start, warning, end) is
the ``lease`` automation (``automations/leases.py``), whose steps are the
requests in ``requests/leases.py``.
"""
