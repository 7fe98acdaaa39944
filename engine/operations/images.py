"""Images: the cluster's ``image_sources`` setting, shown and changed, and
the check a boot's image gets when the boot is planned
(:mod:`engine.hypervisor.storage.image_sources`, docs/vms.md)."""
from __future__ import annotations

from engine.hypervisor.storage import image_sources as sources_of
from engine.errors import UsageError

__all__ = ["check_image", "image_sources", "set_image_sources"]


def _state_dirs(store) -> list[str]:
    """The state directories the live hosts publish in their records."""
    from engine.core.hosts import live_hosts
    return sorted({record["state_dir"] for record in live_hosts(store).values()
                   if isinstance(record.get("state_dir"), str)})


def check_image(ctx, image: str | None) -> None:
    """A ``UsageError`` (exit 2, HTTP 400; nothing written), one line naming
    ``image`` once, unless the cluster's image sources allow it: a URL of
    a supported scheme, inside a listed directory (one of a host's state
    directory for a relative source) or URL prefix; under a whole scheme,
    not on a loopback or link-local address nor on the cluster's etcd."""
    if image is None:
        return
    store = ctx.store()
    why = sources_of.refusal(image, sources_of.read_sources(store), _state_dirs(store),
                             sources_of.addresses_of_urls(ctx.etcd))
    if why:
        raise UsageError(why)


def image_sources(ctx) -> dict:
    """``{sources: [{source, allows}], default}``: the cluster's image
    sources (the default where none were set), each with what it allows."""
    sources = sources_of.read_sources(ctx.store())
    return {"sources": [{"source": s, "allows": sources_of.describe(s)} for s in sources],
            "default": list(sources_of.DEFAULT)}


def set_image_sources(ctx, *, set_to: list[str] | None = None, add=(), remove=(),
                      by: str | None = None) -> dict:
    """Replace the sources with ``set_to`` (``[]``: none at all), or add and
    remove some; each source is checked before anything is written.  The
    sources now, as :func:`image_sources`."""
    if set_to is not None and (add or remove):
        raise UsageError("--set replaces the list: give it without --add or --remove")
    sources_of.parse_sources(set_to if set_to is not None else [*add, *remove])
    if by is None:
        from .moves import operator
        by = operator()
    store = ctx.store()
    if set_to is not None:
        sources_of.write_sources(store, set_to, by)
    else:
        sources_of.change_sources(store, by, add=add, remove=remove)
    return image_sources(ctx)
