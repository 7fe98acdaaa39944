"""Images: ``images sources``, the cluster's list of where VM images may
come from (docs/vms.md, "Images")."""
from __future__ import annotations

from engine.operations import images as ops

from . import table, through

C = table.Column
COLUMNS = [C("source", "Source"), C("allows", "Allows")]


def cmd_sources(ctx) -> int:
    """Show the sources, or change them: ``--set``, ``--add``, ``--remove``."""
    args = ctx.args
    if args.set is None and not args.add and not args.remove:
        doc = through.read(ctx, lambda: ops.image_sources(ctx), "/v1/images/sources")
    else:
        body = {"set": args.set, "add": args.add, "remove": args.remove}
        doc = through.write(ctx, lambda: ops.set_image_sources(
            ctx, set_to=args.set, add=args.add or (), remove=args.remove or ()),
            "POST", "/v1/images/sources", {k: v for k, v in body.items() if v is not None})
    rows = doc["sources"]
    ctx.emit(doc, table.render(rows, COLUMNS) if rows else
             "no image sources: every boot with --image is refused")
    return 0


def register(commands) -> None:
    sub = commands.add(
        "images", "where VM images may come from: the image sources",
        "python peerctl.py images sources", None,
        "The cluster's image sources: the directories and URL prefixes boot --image may "
        "name (docs/vms.md).")
    what = commands.verbs(sub)
    p = what.add(
        "sources", "show or change the image sources",
        "python peerctl.py images sources\n"
        "python peerctl.py images sources --add https://cloud-images.ubuntu.com/releases/",
        cmd_sources,
        "Show the image sources, or change them for the whole cluster. A source is a "
        "directory on every host (/srv/images or file:///srv/images), a directory under "
        "each host's state directory (a relative one: images, the default), an http(s) "
        "URL prefix (https://mirror.example/cloud/), or a whole scheme (http:// or "
        "https://: any host but one whose name resolves to a loopback or link-local "
        "address or to the cluster's etcd, which needs a prefix of its own). A boot whose "
        "image is outside them is refused before anything starts (exit 2), and each host "
        "checks again before it reads a file (symlinks resolved) or follows a redirect. "
        "A bad source exits 2 with nothing written.")
    p.add_argument("--set", nargs="*", metavar="SOURCE",
                   help="replace the list with these (none: no image allowed at all)")
    p.add_argument("--add", action="append", metavar="SOURCE",
                   help="add a source (repeatable)")
    p.add_argument("--remove", action="append", metavar="SOURCE",
                   help="remove a source (repeatable)")
