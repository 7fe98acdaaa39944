"""Markers a real test guest writes into sectors of its own disk
(``/dev/vda``, past its boot filesystem) and reads back, typed on its
serial console (:meth:`tests.support.kvm.Kvm.shell`): a guest that shows a
marker has that data on its disk."""

__all__ = ["SECTOR_A", "SECTOR_B", "MiB", "write_marker", "read_marker"]

SECTOR_A, SECTOR_B = 1_000_000, 1_000_008       # ~488 MiB into the 1 GiB disk
MiB = 1 << 20


def write_marker(kvm, host, uuid, sector, text):
    kvm.shell(host, uuid, f"echo {text} | dd of=/dev/vda bs=512 seek={sector} "
                          "conv=notrunc 2>/dev/null; sync")


def read_marker(kvm, host, uuid, sector) -> str:
    """The text at ``sector`` of the guest's disk, as the guest reads it."""
    out = kvm.shell(host, uuid, f"echo READ-$((0)):$(dd if=/dev/vda bs=512 skip={sector} "
                                "count=1 2>/dev/null | head -n 1 | tr -cd 'A-Za-z0-9-')")
    for line in out.splitlines():
        if "READ-0:" in line:
            return line.split("READ-0:", 1)[1].strip()
    raise AssertionError(f"the guest printed no READ line: {out!r}")
