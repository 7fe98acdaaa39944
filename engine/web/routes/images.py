"""The API's images: the cluster's image sources, shown and changed
(docs/vms.md, "Images")."""
from __future__ import annotations

from engine.errors import UsageError

from .core import Answer, Call, obj, route, STRINGS

SOURCES = obj({"set": STRINGS, "add": STRINGS, "remove": STRINGS})


@route("GET", "/v1/images/sources", "where VM images may come from", "images sources")
def sources(ctx, call: Call) -> Answer:
    from engine.operations import images
    return Answer(images.image_sources(ctx))


@route("POST", "/v1/images/sources", "change the image sources of the whole cluster",
       "images sources [--set SOURCE...] [--add SOURCE] [--remove SOURCE]", write=True,
       body=SOURCES)
def change_sources(ctx, call: Call) -> Answer:
    from engine.operations import images
    b = call.body
    if not b:
        raise UsageError('say what changes: "set", "add" or "remove"')
    return Answer(images.set_image_sources(ctx, set_to=b.get("set"), add=b.get("add") or (),
                                           remove=b.get("remove") or (), by=call.user))
