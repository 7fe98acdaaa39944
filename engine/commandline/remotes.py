"""remote: named clusters reached through a peer's API (remote add, list,
use, delete), kept in the user's configuration directory
(:mod:`.remote_config`); a command then runs through the remote in use, or
``--remote NAME``, with no etcd access."""
from __future__ import annotations

import os

from engine.errors import NoSuch, UsageError

from . import table
from .remote_config import (api_urls, check_name, read_remotes, read_token, remotes_path,
                            write_remotes)

C = table.Column
COLUMNS = [C("name", "Name"), C("current", "Current", lambda c: "*" if c else ""),
           C("urls", "URLs", lambda urls: ",".join(urls)), C("token_file", "Token file"),
           C("cacert", "CA", lambda c: c or "-")]


def _rows(doc: dict) -> list[dict]:
    return [{"name": name, "current": name == doc["current"], "urls": entry["urls"],
             "token_file": entry["token_file"], "cacert": entry.get("cacert")}
            for name, entry in sorted(doc["remotes"].items())]


def cmd_add(ctx) -> int:
    args = ctx.args
    name = check_name(args.name)
    urls = api_urls(args.urls, "URL")
    token_file = os.path.abspath(args.token_file)
    read_token(token_file)              # refused now, not at its first use
    cacert = os.path.abspath(args.ca) if args.ca else None
    if cacert and not os.access(cacert, os.R_OK):
        raise UsageError(f"cannot read --ca {cacert}")
    doc = read_remotes()
    if name in doc["remotes"] and not args.replace:
        raise UsageError(f"remote {name!r} exists (--replace changes it)")
    doc["remotes"][name] = {"urls": urls, "token_file": token_file, "cacert": cacert}
    if args.use:
        doc["current"] = name
    write_remotes(doc)
    ctx.emit({"remote": name, "urls": urls, "token_file": token_file, "cacert": cacert,
              "current": doc["current"] == name},
             f"remote {name} added: {','.join(urls)}"
             + ("; in use" if doc["current"] == name else f" (use it: remote use {name})"))
    return 0


def cmd_list(ctx) -> int:
    rows = _rows(read_remotes())
    ctx.emit(rows, table.render(rows, COLUMNS) if rows else
             f"no remotes (remote add NAME URL --token-file FILE; kept in {remotes_path()})")
    return 0


def cmd_use(ctx) -> int:
    args = ctx.args
    doc = read_remotes()
    if args.none:
        if args.name:
            raise UsageError("remote use takes NAME or --none, not both")
        doc["current"] = None
    else:
        if not args.name:
            raise UsageError("remote use needs NAME (or --none: commands read etcd again)")
        if args.name not in doc["remotes"]:
            raise NoSuch(f"no remote {args.name!r} (remote list shows them)")
        doc["current"] = args.name
    write_remotes(doc)
    ctx.emit({"current": doc["current"]},
             f"commands now run through remote {doc['current']}" if doc["current"]
             else "commands now read etcd directly")
    return 0


def cmd_delete(ctx) -> int:
    doc = read_remotes()
    name = ctx.args.name
    if name not in doc["remotes"]:
        raise NoSuch(f"no remote {name!r} (remote list shows them)")
    del doc["remotes"][name]
    if doc["current"] == name:
        doc["current"] = None
    write_remotes(doc)
    ctx.emit({"remote": name, "state": "deleted"}, f"remote {name} deleted (its token file "
             "stays: token delete on the cluster revokes the token)")
    return 0


def register(commands) -> None:
    sub = commands.add(
        "remote", "clusters reached through a peer's API: add, list, use, delete",
        "python peerctl.py remote add prod https://kvm1:8443,https://kvm2:8443 "
        "--token-file ~/.config/peerctl/prod.token --ca prod-ca.pem --use\n"
        "python peerctl.py remote list", None,
        "A remote is a cluster's API URLs (any peers; the next is tried when one does "
        "not answer) and a token file (token create --role operator, or viewer), which "
        "only its owner may read. With a remote in use (or --remote NAME, or --api URL "
        "--token-file FILE), every command but the local ones (peer, up, down, serve, "
        "tls, join, host add, etcd, remote) runs through the API: this machine needs no "
        "etcd or libvirt access. Kept in $XDG_CONFIG_HOME/peerctl/remotes.json.")
    what = commands.verbs(sub)
    p = what.add("add", "name a cluster's API and the token to use it with",
                 "python peerctl.py remote add lab http://127.0.0.1:8081 --token-file lab.token",
                 cmd_add)
    p.add_argument("name", metavar="NAME")
    p.add_argument("urls", metavar="URL[,URL...]")
    p.add_argument("--token-file", required=True, metavar="FILE",
                   help="the token's secret; only its owner may read it (chmod 600)")
    p.add_argument("--ca", metavar="FILE", help="the CA of the peers' HTTPS certificates "
                                                "(default: the system's)")
    p.add_argument("--use", action="store_true", help="and use it from now on")
    p.add_argument("--replace", action="store_true", help="change a remote of that name")
    what.add("list", "the remotes, and the one in use", "python peerctl.py remote list",
             cmd_list)
    p = what.add("use", "run commands through this remote from now on (--none: etcd)",
                 "python peerctl.py remote use lab", cmd_use)
    p.add_argument("name", metavar="NAME", nargs="?")
    p.add_argument("--none", action="store_true", help="no remote: commands read etcd again")
    p = what.add("delete", "forget a remote", "python peerctl.py remote delete lab",
                 cmd_delete)
    p.add_argument("name", metavar="NAME")
