"""API tokens: token create, token list, token delete (docs/security.md,
"Tokens").

``token create`` prints the secret once (the cluster keeps only its hash);
nothing prints it again."""
from __future__ import annotations

from engine.operations import tokens as ops

from . import table, through
from .listing import listing
from .options import listing_options

C = table.Column
COLUMNS = [C("id", "Id"), C("role", "Role"), C("created", "Created"),
           C("expires", "Expires")]
FIELDS = [c.field for c in COLUMNS]


def cmd_create(ctx) -> int:
    body = {"role": ctx.args.role, "expires": ctx.args.expires}
    doc = through.write(ctx, lambda: ops.create_token(ctx, ctx.args.role, ctx.args.expires),
                        "POST", "/v1/tokens", {k: v for k, v in body.items() if v is not None})
    ctx.emit(doc, f"token {doc['id']} created: role {doc['role']}, expires "
             f"{doc['expires'] or 'never'}\n"
             f"secret (shown only once, keep it now: the cluster keeps only its hash):\n"
             f"{doc['secret']}")
    return 0


def cmd_list(ctx) -> int:
    return listing(ctx, lambda: through.read(ctx, lambda: ops.list_tokens(ctx), "/v1/tokens"),
                   COLUMNS, FIELDS, FIELDS, "created")


def cmd_delete(ctx) -> int:
    doc = through.write(ctx, lambda: ops.delete_tokens(ctx, ctx.args.ids), "DELETE",
                        "/v1/tokens", id=ctx.args.ids)
    gone = doc["deleted"]
    ctx.emit(doc, f"deleted token{'s' if len(gone) != 1 else ''} {', '.join(gone)}")
    return 0


def register(commands) -> None:
    sub = commands.add(
        "token", "bearer tokens of the HTTP API: create, list, delete",
        "python peerctl.py token create --role viewer --expires 90d\n"
        "python peerctl.py token list", None,
        "A token gives whoever holds its secret one role on the HTTP API (peer --api): "
        "viewer (reads) or operator (what commands do). The secret is printed once, by "
        "token create; the cluster keeps only its sha256. Making and deleting tokens "
        "takes the operator role.")
    what = commands.verbs(sub)
    p = what.add("create", "mint a token and print its secret, this once",
                 "python peerctl.py token create --role operator --expires 12h", cmd_create,
                 "Mint a token of ROLE and print its secret (pct_<id>_...), which is never "
                 "shown again. Without --expires it lasts until token delete. A bad role "
                 "or duration exits 2 with nothing written.")
    p.add_argument("--role", required=True, metavar="viewer|operator",
                   help="what the token's holder may do")
    p.add_argument("--expires", metavar="DURATION",
                   help="how long it lasts: seconds, or 30m, 12h, 90d (default: never)")
    p = what.add("list", "list tokens, oldest first (never their secrets)",
                 "python peerctl.py token list", cmd_list,
                 "List the tokens: id, role, when each was made and when it expires ('-': "
                 "never). An unreadable record is skipped with one warning line.")
    listing_options(p, COLUMNS, "created")
    p = what.add("delete", "delete tokens: their secrets stop working",
                 "python peerctl.py token delete 3f9a1c0b7d2e", cmd_delete,
                 "Delete the tokens ID... (as token list shows them), all of them or, when "
                 "one is unknown, none (exit 1 naming it).")
    p.add_argument("ids", nargs="+", metavar="ID")
