"""The API's tokens: mint one, list them, delete one or several.

Who may do what (docs/api.md, "Who may do what"; docs/security.md, "Tokens"):
- minting and deleting take an operator (a viewer is refused 403 before
  anything is read), and a token is never minted above the role of who
  asks: an operator mints viewers and operators, its own power at most;
- any token may delete itself (``DELETE /v1/tokens/{id}`` of the token the
  request carries, or of its session's): that is logging out, and it ends
  the token's sessions and event streams as every delete does;
- a viewer may list them: ids, roles and times, never a secret or a hash.

The secret is answered once, by the ``201`` of ``POST /v1/tokens``."""
from __future__ import annotations

from engine.operations import tokens

from .core import Answer, Call, listed, obj, Refusal, route, STRING

# the API's roles from the least to the most power: a token above its minter's is refused
RANKS = {"viewer": 0, "operator": 1}


def check_mintable(asker: str, role: str) -> None:
    """A token of ``role`` may be minted by a caller of role ``asker``
    only if ``role`` gives no more power than ``asker`` has."""
    if role in RANKS and RANKS[role] > RANKS.get(asker, -1):
        raise Refusal(403, f"permission denied for role {asker}: a {asker} may not mint "
                      f"a token of role {role}")


@route("GET", "/v1/tokens", "list tokens, oldest first (never their secrets)", "token list")
def list_tokens(ctx, call: Call) -> Answer:
    return Answer(listed(tokens.list_tokens(ctx), tokens.LISTED, tokens.ORDER))


CREATE = obj({"role": STRING, "expires": {"type": ["string", "number"]}}, ["role"])


@route("POST", "/v1/tokens", "mint a token and answer its secret, this once",
       "token create --role ROLE [--expires DURATION]", write=True, body=CREATE,
       created=True)
def create_token(ctx, call: Call) -> Answer:
    check_mintable(call.role, call.body["role"])
    return Answer(tokens.create_token(ctx, call.body["role"], call.body.get("expires")), 201)


@route("DELETE", "/v1/tokens/{id}", "delete a token: its secret stops working (any token "
       "may delete itself: log out)", "token delete ID", write=True, own="id")
def delete_token(ctx, call: Call) -> Answer:
    return Answer(tokens.delete_tokens(ctx, [call.path["id"]]))


@route("DELETE", "/v1/tokens", "delete tokens, all of them or, when one is unknown, none",
       "token delete ID...", write=True,
       query=(("id", "string[]", "a token's id, repeatable"),))
def delete_tokens(ctx, call: Call) -> Answer:
    return Answer(tokens.delete_tokens(ctx, call.query.get("id") or []))
