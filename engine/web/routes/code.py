"""The API's releases: add one (its archive as the body), list, delete, and
the serving peer's own version.

``POST /v1/code`` takes the archive's bytes as sent (``Content-Type:
application/octet-stream``, or ``application/gzip``, ``application/zip``),
at most :data:`MAX_ARCHIVE` of them, refused 413 past it before more is
read; the archive is checked as ``code add`` checks a file (not a
release: 400, nothing stored; a tree that does not start: 409)."""
from __future__ import annotations

from engine.operations import code

from .core import Answer, Call, listed, MiB, route

MAX_ARCHIVE = 16 * MiB          # engine.releases.archive.MAX_BYTES: the largest release
ARCHIVES = ("application/octet-stream", "application/gzip", "application/x-gzip",
            "application/zip")


@route("GET", "/v1/code", "list the stored releases and the hosts running each",
       "code list")
def list_releases(ctx, call: Call) -> Answer:
    return Answer(listed(code.list_releases(ctx), code.LISTED, code.ORDER))


@route("POST", "/v1/code", "check a release (the body: its archive) and store it",
       "code add PATH", write=True, media=ARCHIVES, max_body=MAX_ARCHIVE, created=True,
       waits=True, query=(("name", "string", "the archive's file name "
                                             "(peerctl-0.2.0.tar.gz): names it in messages "
                                             "and its record; .whl: a wheel"),))
def add_release(ctx, call: Call) -> Answer:
    doc = code.add_uploaded(ctx, call.data, call.one("name"))
    return Answer(doc, 200 if doc["already"] else 201)


@route("DELETE", "/v1/code/{version}", "delete a stored release (refused while a live host "
       "runs it)", "code delete VERSION", write=True)
def delete_release(ctx, call: Call) -> Answer:
    return Answer(code.delete_release(ctx, call.path["version"]))


@route("GET", "/v1/version", "the serving peer's own version, commit and feature level",
       "version")
def version(ctx, call: Call) -> Answer:
    from engine.releases.version import running
    described = running()
    return Answer({field: described[field] for field in ("version", "commit",
                                                          "feature_level")})
