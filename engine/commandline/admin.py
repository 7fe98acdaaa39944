"""Keeping a cluster sound: scrub (keys nobody can read), tls (certificates
and etcd roles for an etcd of one's own, docs/security.md), etcd snapshot
(a backup of etcd, docs/deploy.md)."""
from __future__ import annotations

import os
import time

from engine.errors import UsageError
from engine.operations import admin as ops

from . import table, through
from .confirm import confirm
from .context import short_path
from .options import dry_run_option, yes_option

C = table.Column
SCRUB_COLUMNS = [C("key", "Key"), C("why", "Problem")]


def cmd_scrub(ctx) -> int:
    args = ctx.args
    if ctx.api is not None:
        found = rows = ctx.api.call("GET", "/v1/scrub")["keys"]
    else:
        found = ops.unreadable_keys(ctx)
        rows = [{"key": bad.key, "why": bad.why} for bad in found]
    deleting = args.delete and found and not args.dry_run
    if deleting and not args.yes:
        confirm("scrub --delete", [f"{row['key']}: {row['why']}" for row in rows],
                "unreadable keys", cancelled={"keys": rows, "deleted": []},
                question=f"Delete these {len(found)} unreadable "
                         f"key{'s' if len(found) != 1 else ''}?")
    deleted = []
    if deleting:
        deleted = through.write(ctx, lambda: ops.delete_keys(ctx, found), "DELETE", "/v1/scrub",
                                yes=True)
        deleted = deleted["deleted"] if ctx.api is not None else deleted
    text = table.render(rows, SCRUB_COLUMNS) if rows else ""
    summary = (f"{len(found)} unreadable key{'s' if len(found) != 1 else ''}" if found
               else "no unreadable keys")
    if deleting:
        summary += f", {len(deleted)} deleted"
        if len(deleted) < len(found):
            summary += " (the others changed meanwhile: run scrub again)"
    elif args.delete and found:
        summary += ", none deleted (--dry-run)"
    ctx.emit({"keys": rows, "deleted": deleted}, (text + "\n" if text else "") + summary)
    return 0


def cmd_tls(ctx) -> int:
    from engine.core import certs
    args = ctx.args
    users = ops.identities(args.peer, args.user)
    if args.tls_command == "certs":
        directory = os.path.abspath(args.dir)
        members = ops.etcd_members(args.member)
        libvirts = ops.libvirt_hosts(args.libvirt)
        try:
            certs.authority(directory, ctx.settings["cluster"])
            if members:
                issued = {f"etcd-{member}": certs.issue_server(directory, args.name or [],
                                                               member, address)
                          for member, address in members.items()}
            else:
                issued = {"etcd": certs.issue_server(directory, args.name or [])}
            issued.update({user: certs.issue(directory, user, role)
                           for user, role in users.items()})
            issued.update({f"libvirt-{host}": certs.issue_libvirt(directory, host, *addresses)
                           for host, addresses in libvirts.items()})
        except OSError as exc:
            raise UsageError(f"cannot write certificates in {directory}: "
                             f"{exc.strerror or exc}") from None
        found = {entry["file"]: entry for entry in certs.certificates(directory)}
        doc = {"dir": directory, "ca": os.path.join(directory, "ca.pem"),
               "certificates": [{"user": user, "role": users.get(user) or (
                                     "libvirt" if user.startswith("libvirt-") else "etcd server"),
                                 "cert": i.cert, "key": i.key, "status": i.status,
                                 **({"was": list(i.was)} if i.status == "reissued" else {}),
                                 "names": found.get(i.cert, {}).get("names", []),
                                 "expires": found.get(i.cert, {}).get("expires")}
                                for user, i in issued.items()],
               "files": list(found.values())}
        ctx.emit(doc, _certs_text(doc))
        return 0
    done = ops.setup_roles(ctx, users)
    ctx.emit(done, f"roles {', '.join(done['roles'])} on /peerctl/{ctx.settings['cluster']}/; "
                   f"users {', '.join(sorted(done['users']))}; authentication on")
    return 0


def cmd_etcd(ctx) -> int:
    from engine.operations.etcd_backup import save_snapshot
    taken = save_snapshot(ctx.store(), ctx.args.file)
    ctx.emit(taken, f"saved etcd's snapshot as {taken['file']}: {_size(taken['bytes'])}, "
                    f"revision {taken['revision']} or later, checksum verified "
                    f"(restore: docs/deploy.md)")
    return 0


def _size(count: int) -> str:
    for unit in ("bytes", "KiB", "MiB"):
        if count < 1024 or unit == "MiB":
            return f"{count} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} GiB"


CERT_COLUMNS = [C("file", "File"), C("subject", "Subject"), C("role", "Role"),
                C("names", "Names", lambda names: ",".join(names) or "-"),
                C("expires", "Expires", lambda when: time.strftime(
                    "%Y-%m-%d", time.gmtime(when)) if when else "-")]


def _certs_text(doc: dict) -> str:
    """Every certificate in the directory with its expiry, then what this
    run re-issued (etcd must be given it again) and made."""
    rows = [{**entry, "file": os.path.basename(entry["file"])} for entry in doc["files"]]
    lines = [table.render(rows, CERT_COLUMNS)]
    for made in doc["certificates"]:
        name = os.path.basename(made["cert"])
        libvirt = made["role"] == "libvirt"
        if made["status"] == "reissued":
            lines.append(f"re-issued {name} (same CA, new key): now names "
                         f"{', '.join(made['names'])} (named {', '.join(made['was'])}); "
                         + ("copy it to its host again and restart its libvirtd" if libvirt
                            else "restart etcd with it"))
        if libvirt:
            host = made["user"][len("libvirt-"):]
            lines.append(f"libvirt's files for {host}: {short_path(doc['dir'])}/libvirt/{host}/ "
                         f"(to /etc/pki on {host}: docs/deploy.md)")
    made = [os.path.basename(c["cert"]) for c in doc["certificates"] if c["status"] == "made"]
    if made:
        lines.append(f"made {', '.join(made)}")
    return "\n".join(lines)


def register(commands) -> None:
    sub = commands.add("scrub", "list the keys in etcd nobody can read (--delete: remove them)",
                       "python peerctl.py scrub\npython peerctl.py scrub --delete --yes",
                       cmd_scrub,
                       "List every key of the cluster whose value cannot be decoded or does "
                       "not have the shape its kind of key must have (every command skips "
                       "those with a warning). With --delete, delete them after asking (no "
                       "question when there are none); a key rewritten meanwhile is kept.")
    sub.add_argument("--delete", action="store_true", help="delete the keys listed")
    yes_option(sub, "do not ask before deleting (needed without a terminal)")
    dry_run_option(sub, "with --delete: only list the keys that would be deleted")

    sub = commands.add(
        "tls", "certificates and etcd roles for an etcd of your own",
        "python peerctl.py tls certs /etc/peerctl/tls --peer kvm1 --peer kvm2 "
        "--name etcd1.example\n"
        "python peerctl.py --etcd https://etcd1.example:2379 --cacert ca.pem "
        "--cert root.pem --key root-key.pem tls roles --peer kvm1 --peer kvm2",
        cmd_tls, "certs: make a CA (once) and certificates in DIR: etcd's (for "
        "127.0.0.1, localhost and every --name; one per --member NAME=ADDR, "
        "naming ADDR too), root, operator, viewer, one "
        "per --peer host (user peer-HOST) and per --user NAME:ROLE; files "
        "already there are kept, but an etcd certificate whose names differ from "
        "those asked is issued again (same CA, new key), and the output says so; "
        "it lists every certificate in DIR with its expiry. roles: as etcd's root, "
        "grant roles peer, operator and viewer on this cluster's keys, add those "
        "users, and turn "
        "etcd's authentication on (docs/security.md).")
    what = commands.verbs(sub, dest="tls_command", metavar="ACTION")
    _register_tls(what)

    sub = commands.add(
        "etcd", "etcd itself: a snapshot of it, to restore the cluster from",
        "python peerctl.py --cert tls/root.pem --key tls/root-key.pem "
        "etcd snapshot /var/backups/peerctl-etcd.db",
        cmd_etcd, "snapshot FILE: save etcd's whole backend (every cluster it holds) as "
        "FILE, as etcdctl snapshot save does, checked against the checksum etcd sends; "
        "it needs etcd's root identity. FILE appears only whole and is readable by its "
        "owner only; an existing file is never written over. docs/deploy.md says how to "
        "restore it.")
    what = commands.verbs(sub, dest="etcd_command", metavar="ACTION")
    part = what.add("snapshot", "save a snapshot of etcd as FILE",
                    "python peerctl.py etcd snapshot ./etcd-backup.db")
    part.add_argument("file", metavar="FILE", help="where the snapshot goes (a new file)")


def _register_tls(what) -> None:
    for action, summary, example in (
            ("certs", "make the CA and certificates",
             "python peerctl.py tls certs ./tls --peer host1 --peer host2"),
            ("roles", "set up etcd's roles and users, as root",
             "python peerctl.py --etcd https://127.0.0.1:2379 --cacert tls/ca.pem "
             "--cert tls/root.pem --key tls/root-key.pem tls roles --peer host1")):
        part = what.add(action, summary, example)
        if action == "certs":
            part.add_argument("dir", metavar="DIR", help="where the files go")
            part.add_argument("--name", action="append", metavar="HOST",
                              help="a name or address etcd is reached at (repeatable); "
                                   "a certificate naming others is issued again")
            part.add_argument("--member", action="append", metavar="NAME=ADDR",
                              help="an etcd member and the address it is reached at: "
                                   "a certificate and key of its own, etcd-NAME.pem "
                                   "(repeatable)")
            part.add_argument("--libvirt", action="append", metavar="HOST=ADDR[,ADDR2]",
                              help="a host's libvirt, reached at ADDR by the other hosts: "
                                   "libvirt-HOST.pem, and DIR/libvirt/HOST/ with libvirt's "
                                   "file names; ADDR2...: other addresses it names, such as "
                                   "its migration address (docs/deploy.md; repeatable)")
        part.add_argument("--peer", action="append", metavar="HOST",
                          help="a host whose peer gets an identity (repeatable)")
        part.add_argument("--user", action="append", metavar="NAME:ROLE",
                          help="another identity: ROLE is peer, operator or viewer")
