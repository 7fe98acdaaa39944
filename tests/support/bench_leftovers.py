"""What a QEMU benchmark's smoke run may leave behind: its work
directories under /var/tmp, and any process running in one (its daemons,
peers, guards, etcd, guests). A smoke test compares the set before and
after the run."""
import os

__all__ = ["leftovers"]


def leftovers(work: str) -> set[str]:
    """The work directories named ``work*`` under /var/tmp, and the
    processes (pid and command line) that run in one."""
    found = {f"/var/tmp/{name}" for name in os.listdir("/var/tmp") if name.startswith(work)}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if f"/var/tmp/{work}" in command:
            found.add(f"{pid}: {command[:200]}")
    return found
