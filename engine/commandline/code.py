"""Releases of peerctl the cluster carries: code add, code list, code
delete; and version, what this command's own code is (docs/upgrade.md,
"Releases").

``version`` reads files only: it answers with no etcd and no settings,
which is how a release's tree is checked before it is stored or installed."""
from __future__ import annotations

from engine.operations import code as ops

from . import table, through
from .context import say
from .listing import listing
from .options import listing_options

C = table.Column
COLUMNS = [C("version", "Version"), C("commit", "Commit", lambda c: c[:8]),
           C("feature_level", "Level", right=True), C("bytes", "Size", table.human_bytes, True),
           C("state", "State"), C("added", "Added"), C("running_on", "Running on"),
           C("sha256", "SHA256", lambda s: s[:12])]
DEFAULT = ["version", "commit", "feature_level", "bytes", "state", "added", "running_on"]
JSON_FIELDS = [c.field for c in COLUMNS]


def cmd_add(ctx) -> int:
    doc = ops.add_release(ctx, ctx.args.path) if ctx.api is None else _upload(ctx, ctx.args.path)
    disagrees = ops.name_disagrees(ctx.args.path, doc["version"])
    if disagrees:
        say(f"peerctl: warning: {disagrees}")
    said = "already stored" if doc["already"] else "stored"
    ctx.emit(doc, f"release {doc['version']} {said}: {table.human_bytes(doc['bytes'])}, "
                  f"feature level {doc['feature_level']}, sha256 {doc['sha256'][:12]}...")
    return 0


def _upload(ctx, path: str) -> dict:
    """``code add`` through the API: the archive, read here, as the body."""
    import os
    from engine.releases.archive import read_archive
    data = read_archive(path)
    name = os.path.basename(path)
    kind = ("application/zip" if name.endswith(".zip") else "application/gzip"
            if name.endswith((".tar.gz", ".tgz")) else "application/octet-stream")
    return ctx.api.call("POST", "/v1/code", query={"name": name}, raw=data, content_type=kind)


def cmd_list(ctx) -> int:
    return listing(ctx, lambda: through.read(ctx, lambda: ops.list_releases(ctx), "/v1/code"),
                   COLUMNS, DEFAULT, JSON_FIELDS, "version")


def cmd_delete(ctx) -> int:
    doc = through.write(ctx, lambda: ops.delete_release(ctx, ctx.args.version), "DELETE",
                        f"/v1/code/{through.segment(ctx.args.version)}")
    ctx.emit(doc, f"release {doc['version']} deleted")
    return 0


def cmd_version(ctx) -> int:
    from engine.releases.version import label, running
    described = running()
    doc = {field: described[field] for field in ("version", "commit", "feature_level")}
    if ctx.api is not None:         # the peer's, as the API answers it; and ours beside
        peer = ctx.api.call("GET", "/v1/version")
        ctx.emit(peer, f"peerctl {label(peer)}, feature level {peer['feature_level']} (the "
                       f"peer at {ctx.api.url}); this command line: {label(described)}")
        return 0
    ctx.emit(doc, f"peerctl {label(described)}, feature level {doc['feature_level']}")
    return 0


def register(commands) -> None:
    sub = commands.add(
        "code", "releases of peerctl the cluster carries: add, list, delete",
        "python peerctl.py code add peerctl-0.2.0.tar.gz\n"
        "python peerctl.py code list", None,
        "A release is a source archive of peerctl (git archive, or an sdist: .tar.gz or "
        ".zip) or the wheel python -m build makes of it. The cluster keeps it in etcd, "
        "in chunks, with its sha256, at most 5 of them; upgrade --to VERSION puts it on the hosts.")
    what = commands.verbs(sub)
    p = what.add("add", "check a release and store it in the cluster",
                 "python peerctl.py code add peerctl-0.2.0.tar.gz", cmd_add,
                 "Check the archive PATH (its layout, and that its own peerctl.py version "
                 "answers) and store it under its version, the one its setup.cfg says (a "
                 "file name implying another is warned about on stderr). The same release "
                 "again changes "
                 "nothing; another one with that version is refused. Not a release, or over "
                 "64 MiB: exit 2 with nothing written; a tree that does not start: exit 1.")
    p.add_argument("path", metavar="PATH")
    p = what.add("list", "list the stored releases and the hosts running each",
                 "python peerctl.py code list", cmd_list,
                 "List the stored releases by version: commit, feature level, size, state "
                 "(uploading: an add was interrupted, add it again), when each was added, "
                 "and the live hosts whose peer runs it.")
    listing_options(p, COLUMNS, "version")
    p = what.add("delete", "delete a stored release",
                 "python peerctl.py code delete 0.2.0", cmd_delete,
                 "Delete release VERSION and its chunks (an interrupted upload too). "
                 "Refused while a live host runs it; an unknown version exits 1.")
    p.add_argument("version", metavar="VERSION")
    commands.add("version", "this peerctl's version, commit and feature level",
                 "python peerctl.py version", cmd_version,
                 "Show the version, commit and highest cluster feature level of the code "
                 "this command runs. Reads files only: needs neither etcd nor settings.")
