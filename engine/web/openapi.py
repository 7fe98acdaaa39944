"""The OpenAPI 3.1 document of ``/v1``, made from the route table itself, so
it cannot drift from what the server does."""
from __future__ import annotations

import re

from .routes import ROUTES

__all__ = ["document"]

_TYPES = {"string": {"type": "string"}, "string[]": {"type": "array", "items": {"type": "string"}},
          "boolean": {"type": "boolean"}, "integer": {"type": "integer"},
          "number": {"type": "number"}}
_ERROR = {"description": "one line (a 409 asking for \"yes\" lists its targets too)",
          "content": {"application/json": {"schema": {
              "type": "object", "properties": {"error": {"type": "string"},
                                               "targets": {"type": "array"}},
              "required": ["error"]}}}}


def _operation(route) -> dict:
    parameters = [{"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                  for name in re.findall(r"{(\w+)}", route.path)]
    parameters += [{"name": name, "in": "query", "description": text,
                    "schema": _TYPES[kind], **({"explode": True} if kind.endswith("[]") else {})}
                   for name, kind, text in route.query]
    ok = "202" if route.automation else "201" if route.created else "200"
    operation = {
        "summary": route.summary,
        "description": (f"As `peerctl {route.command}` with `--format json`." if route.command
                        else "No command prints it: docs/api.md gives its shape."),
        "operationId": route.handler.__name__,
        "parameters": parameters,
        "responses": {ok: {"description": "the command's JSON"},
                      "400": _ERROR, "401": _ERROR, "404": _ERROR, "409": _ERROR,
                      "503": _ERROR, **({"403": _ERROR} if route.write else {})},
    }
    if route.automation:
        operation["responses"]["202"]["headers"] = {
            "Location": {"schema": {"type": "string"},
                         "description": "/v1/automations/ID"}}
    if route.created:
        operation["responses"]["200"] = {"description": "the same, already there: nothing "
                                                        "made"}
    if route.media:
        operation["requestBody"] = {"required": True, "content": {
            media: {"schema": {"type": "string", "contentMediaType": media}}
            for media in route.media}}
        operation["responses"]["413"] = operation["responses"]["415"] = _ERROR
    if route.body is not None:
        operation["requestBody"] = {"required": True, "content": {
            "application/json": {"schema": route.body}}}
    return operation


def _same_shape(path: str) -> str:
    return re.sub(r"{\w+}", "{}", path)


def document(version: str = "1") -> dict:
    """OpenAPI counts ``/v1/vms/{name}`` and ``/v1/vms/{action}`` as one
    path: such routes share one path item, named as the first one is, and
    a later route's parameters take the first one's names."""
    paths: dict = {}
    first_of: dict = {}
    for route in ROUTES:
        path = first_of.setdefault(_same_shape(route.path), route.path)
        operation = _operation(route)
        if path != route.path:
            for parameter, name in zip((p for p in operation["parameters"] if p["in"] == "path"),
                                       re.findall(r"{(\w+)}", path)):
                parameter["description"] = f"the {parameter['name']}"
                parameter["name"] = name
        paths.setdefault(path, {})[route.method.lower()] = operation
    paths["/v1/events"] = {"get": {
        "summary": "server-sent events of what changed; id = etcd revision",
        "parameters": [{"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"}},
                       {"name": "batch", "in": "query", "description": "milliseconds: the "
                        "revisions within them in one message, each change with its revision",
                        "schema": {"type": "integer", "minimum": 1, "maximum": 2000}},
                       {"name": "step_values", "in": "query", "description": "false: step "
                        "changes without their value",
                        "schema": {"type": "boolean", "default": True}}],
        "responses": {"200": {"description": "text/event-stream"}, "400": _ERROR,
                      "410": _ERROR}}}
    paths["/v1/vms/{name}/console"] = {"get": {
        "summary": "a VM's serial console, as a websocket (operator)",
        "parameters": [{"name": "name", "in": "path", "required": True,
                        "schema": {"type": "string"}}],
        "responses": {"101": {"description": "websocket: the console's bytes both ways"},
                      "401": _ERROR, "403": _ERROR}}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "peerctl", "version": version,
                 "description": "Every peer answers the same; see docs/api.md."},
        "components": {"securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer"},
            "certificate": {"type": "mutualTLS"}}},
        "security": [{"bearer": []}, {"certificate": []}],
        "paths": paths,
    }
