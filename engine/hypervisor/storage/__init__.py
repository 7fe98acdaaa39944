"""A host's storage: its libvirt pool, base images and their sources
(``settings/images``), qcow2 files, volume copies between libvirts through
libvirt's streams, and checksums that holes cannot fool.  Stands on
:mod:`engine.hypervisor.domain` only."""
