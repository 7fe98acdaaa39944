"""API tokens: mint one for a role, list them, delete them
(:mod:`engine.core.tokens` keeps them; docs/security.md, "Tokens").

The role and the expiry are checked before etcd is opened: bad input is a
``UsageError`` with nothing written."""
from __future__ import annotations

from engine.core import tokens
from engine.core.validate import parse_duration
from engine.errors import Failed

__all__ = ["create_token", "list_tokens", "delete_tokens", "LISTED", "ORDER"]

LISTED = ["id", "role", "created", "expires"]       # token list's JSON, oldest first
ORDER = "created"


def create_token(ctx, role: str, expires=None) -> dict:
    """A new token of ``role`` (``viewer`` or ``operator``) expiring after
    ``expires`` (seconds, or ``30m``, ``12h``, ``90d``; None: never):
    ``{id, role, created, expires, secret}``, the secret shown this once."""
    tokens.check_role(role)
    expires_in = None if expires is None else tokens.check_expiry(
        parse_duration(expires, "token expiry"))
    return tokens.create(ctx.store(), role, expires_in)


def list_tokens(ctx) -> list[dict]:
    """Every token, oldest first: ``[{id, role, created, expires}]`` (an
    unreadable record is reported and skipped)."""
    return tokens.list_tokens(ctx.store())


def delete_tokens(ctx, ids: list[str]) -> dict:
    """Delete the tokens ``ids``, all or none: ``{deleted: [id, ...]}``; an
    unknown id is ``NoSuch`` naming it."""
    try:
        return {"deleted": tokens.delete(ctx.store(), ids)}
    except Failed as exc:
        exc.result = {"deleted": []}
        raise
