"""Hosts running domains peerctl did not make, on libvirt's test driver.

``fake_host(path, memory_mb, cpus, foreign)`` writes a test-driver host file
(``test://<path>``) of that size, offering libvirt network ``default`` as
test:///default does, with ``foreign`` domains preloaded and running: no
peerctl metadata, as if defined by hand.  Each ``libvirt.open`` of the URI
(a peer, this process) gets its own copy of that state.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Foreign", "fake_host", "reserved_of", "NETWORK"]

NETWORK = ("<network><name>default</name><uuid>dd8fe884-6c02-601e-7551-cca97df1c5df</uuid>"
           "<forward mode='nat'/><bridge name='virbr0' stp='on' delay='0'/>"
           "<ip address='192.168.122.1' netmask='255.255.255.0'><dhcp>"
           "<range start='192.168.122.2' end='192.168.122.254'/></dhcp></ip></network>")


@dataclass(frozen=True)
class Foreign:
    """A running domain without peerctl metadata: its current memory is
    ``memory_mb`` (of twice that at most)."""
    name: str
    uuid: str
    vcpus: int
    memory_mb: int

    def xml(self) -> str:
        return (f"<domain type='test'><name>{self.name}</name><uuid>{self.uuid}</uuid>"
                f"<memory unit='MiB'>{2 * self.memory_mb}</memory>"
                f"<currentMemory unit='MiB'>{self.memory_mb}</currentMemory>"
                f"<vcpu>{self.vcpus}</vcpu><os><type arch='i686'>hvm</type></os></domain>")


def fake_host(path, memory_mb: int, cpus: int = 4, foreign=()) -> str:
    """Write the host file at ``path``; its URI."""
    path.write_text(f"<node><cpu><nodes>1</nodes><sockets>1</sockets><cores>{cpus}</cores>"
                    f"<threads>1</threads><active>{cpus}</active><mhz>2000</mhz>"
                    f"<model>i686</model></cpu><memory>{memory_mb << 10}</memory>"
                    + NETWORK + "".join(domain.xml() for domain in foreign) + "</node>")
    return f"test://{path}"


def reserved_of(provider: dict) -> dict:
    """``{RC: reserved}`` of a provider as ``placement providers`` shows it."""
    return {rc: inv["reserved"] for rc, inv in provider["inventories"].items()}
