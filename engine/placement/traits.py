"""Traits in the words a user knows: what a refusal says instead of a
trait peerctl made up itself.

A user asks for a network by its name (``boot --network lan``); peerctl
turns it into the trait ``CUSTOM_NET_LAN`` of the hosts offering it
(:func:`engine.hypervisor.domain.networks.network_trait`).  A refusal naming that
trait names something the user never typed: :func:`in_words` says
``network lan`` instead.  Every other trait is the user's own (``--required
CUSTOM_SSD``) or placement's standard one, and is said as it is.

Promises: pure, no I/O; a trait that is not peerctl's own comes back
unchanged, so a refusal stays greppable for what the user asked.
"""
from __future__ import annotations

__all__ = ["NETWORK_TRAIT_PREFIX", "in_words", "list_in_words"]

NETWORK_TRAIT_PREFIX = "CUSTOM_NET_"


def in_words(trait: str) -> str:
    """``CUSTOM_NET_DEFAULT`` -> ``network default``; ``!CUSTOM_NET_LAN`` ->
    ``no network lan``; any other trait as it is."""
    if trait.startswith("!"):
        said = in_words(trait[1:])
        return f"no {said}" if said != trait[1:] else trait
    if trait.startswith(NETWORK_TRAIT_PREFIX) and len(trait) > len(NETWORK_TRAIT_PREFIX):
        return "network " + trait[len(NETWORK_TRAIT_PREFIX):].lower()
    return trait


def list_in_words(traits) -> str:
    """A trait list (``CUSTOM_NET_DEFAULT,!CUSTOM_SLOW``, or a list of
    them) as one phrase: ``network default, !CUSTOM_SLOW``."""
    items = traits.split(",") if isinstance(traits, str) else list(traits or ())
    return ", ".join(in_words(item.strip()) for item in items if item and item.strip())
