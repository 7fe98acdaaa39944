"""Releases of peerctl itself: what code a peer runs, the releases the
cluster carries in etcd, their installation on a host, and the hand-over of
a host's peer to another release (``code``, ``upgrade``; docs/upgrade.md)."""
