"""The OpenAPI 3.1 description of the scheduler API, served by it at ``GET /openapi.json``
(no token needed). The request schemas say what :mod:`berth.service.api` and
:mod:`berth.service.move_api` accept; everything else is answered 400 naming the field,
which the schemathesis run in the suite checks together with "never a 5xx"."""

from __future__ import annotations

from typing import Any

from berth.model.request import MAX_INSTANCES_PER_REQUEST
from berth.service.move_api import MOVE_FIELDS, PLAIN_ACTIONS

_STR = {"type": "string"}
_STRINGS = {"type": "array", "items": _STR}
_NULLABLE_STR = {"type": ["string", "null"]}

FLAVOR = {
    "oneOf": [
        {"type": "string", "description": "a flavor the server knows (GET /flavors)"},
        {"type": "object", "additionalProperties": False, "required": ["vcpus", "memory_mb"],
         "properties": {
             "name": _STR, "id": {"type": ["string", "integer", "null"]},
             "vcpus": {"type": "integer", "minimum": 1},
             "memory_mb": {"type": "integer", "minimum": 1},
             "root_gb": {"type": "integer", "minimum": 0},
             "ephemeral_gb": {"type": "integer", "minimum": 0},
             "swap": {"type": "integer", "minimum": 0},
             "extra_specs": {"type": "object", "additionalProperties": _STR}}},
    ]}
IMAGE = {
    "oneOf": [
        {"type": "null"},
        {"type": "string", "description": "an image the server knows (GET /images)"},
        {"type": "object", "additionalProperties": False, "properties": {
            "id": _NULLABLE_STR, "name": _NULLABLE_STR, "disk_format": _NULLABLE_STR,
            "properties": {"type": ["object", "null"],
                           "description": "Glance image properties (hw_*, img_*, os_*)"}}},
    ]}
HINTS = {
    "type": ["object", "null"],
    "description": "scheduler hints; same_host/different_host hold instance uuids, group "
                   "one server group (uuid or name)",
    "additionalProperties": {"oneOf": [_STR, _STRINGS]},
}
BOOT = {
    "type": "object", "additionalProperties": False, "required": ["flavor"],
    "properties": {
        "flavor": FLAVOR, "image": IMAGE, "hints": HINTS,
        "num": {"type": "integer", "minimum": 1, "maximum": MAX_INSTANCES_PER_REQUEST},
        "project_id": _NULLABLE_STR, "user_id": _NULLABLE_STR,
        "availability_zone": _NULLABLE_STR,
        "force_hosts": {"type": ["array", "null"], "items": _STR},
        "ignore_hosts": {"type": ["array", "null"], "items": _STR},
        "explain": {"type": "boolean"},
    },
}
SERVER_GROUP = {
    "type": "object", "additionalProperties": False, "required": ["name", "policy"],
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 255},
        "policy": {"enum": ["affinity", "anti-affinity", "soft-affinity",
                            "soft-anti-affinity"]},
        "rules": {"type": "object", "additionalProperties": False,
                  "properties": {"max_server_per_host": {"type": "integer", "minimum": 1}}},
        "project_id": _NULLABLE_STR, "user_id": _NULLABLE_STR,
    },
}
CAPACITY = {
    "type": ["object", "null"], "additionalProperties": False,
    "properties": {"flavors": {"type": "array", "items": _STR},
                   "limit": {"type": "integer", "minimum": 1, "maximum": 100_000}},
}
SERVICE_UPDATE = {
    "type": "object", "additionalProperties": False, "minProperties": 1,
    "properties": {"status": {"enum": ["enabled", "disabled"]},
                   "disabled_reason": {"type": "string", "minLength": 1, "maxLength": 255},
                   "forced_down": {"type": "boolean"}},
}
ERROR = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["code", "message"],
                             "properties": {"code": _STR, "message": _STR}},
                   "diagnosis": {"type": "object"}},
}
_MOVE_PROPS: dict[str, Any] = {"host": _NULLABLE_STR, "allow_cross_cell": {"type": "boolean"},
                               "explain": {"type": "boolean"}, "flavor": FLAVOR,
                               "image": IMAGE}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _answers(ok: str, *errors: int) -> dict[str, Any]:
    out: dict[str, Any] = {"200": {"description": ok, **_json({"type": "object"})},
                           "401": {"description": "no valid token", **_json(ERROR)},
                           "403": {"description": "the policy refuses the call", **_json(ERROR)}}
    reasons = {400: "a malformed body or parameter (the message names the field)",
               404: "no such instance, service or route", 405: "another method",
               409: "no valid host, a refused move, or a compute agent that did not answer",
               503: "database or bus unavailable"}
    for status in errors:
        out[str(status)] = {"description": reasons[status], **_json(ERROR)}
    return out


def _get(summary: str, *errors: int) -> dict[str, Any]:
    return {"get": {"summary": summary, "responses": _answers(summary, *errors)}}


def document() -> dict[str, Any]:
    """The whole OpenAPI document."""
    uuid_param = {"name": "uuid", "in": "path", "required": True, "schema": _STR}
    paths: dict[str, Any] = {
        "/boot": {"post": {
            "summary": "Schedule and build instances (the project defaults to the token's)",
            "requestBody": {"required": True, **_json(BOOT)},
            "responses": _answers("where each instance was built", 400, 409, 503)}},
        "/hosts": _get("Every compute node with its usage and liveness", 503),
        "/healthz": {"get": {"summary": "Liveness", "security": [],
                             "responses": {"200": {"description": "up"}}}},
        "/openapi.json": {"get": {"summary": "This description", "security": [],
                                  "responses": {"200": {"description": "OpenAPI 3.1"}}}},
        "/compute-nodes": _get("Every stored compute-node report", 404, 503),
        "/aggregates": _get("The host aggregates", 404, 503),
        "/cells": _get("The cell mappings (uuid, name, disabled)", 404, 503),
        "/flavors": _get("The flavors the server knows", 404, 503),
        "/images": _get("The images the server knows", 404, 503),
        "/server-groups": {**_get("The server groups", 404, 503), "post": {
            "summary": "Create a server group (the project defaults to the token's)",
            "requestBody": {"required": True, **_json(SERVER_GROUP)},
            "responses": _answers("the group with its uuid", 400, 503)}},
        "/servers": _get("Every instance", 404, 503),
        "/os-services": _get("The compute services: zone, status, state, forced down", 503),
        "/os-services/{host}": {
            "parameters": [{"name": "host", "in": "path", "required": True, "schema": _STR}],
            **_get("One compute service", 404, 503),
            "put": {"summary": "Disable, enable or force down a compute service (Nova's "
                               "os-services update, 2.53)",
                    "requestBody": {"required": True, **_json(SERVICE_UPDATE)},
                    "responses": _answers("the service afterwards", 400, 404, 409, 503)},
            "delete": {"summary": "Delete a compute service that runs no instance: its "
                                  "agents stop, its providers and records go",
                       "responses": {**_answers("never (204)", 404, 409, 503),
                                     "204": {"description": "deleted"}}}},
        "/ui": {"get": {"summary": "The web view (HTML)", "security": [],
                        "responses": {"200": {"description": "the page",
                                              "content": {"text/html": {}}}}}},
        "/decisions": _get("The latest decisions (boots and moves) with their funnels; "
                           "without explanations", 503),
        "/decisions/{id}": {"parameters": [{"name": "id", "in": "path", "required": True,
                                            "schema": {"type": "integer", "minimum": 1}}],
                            **_get("One of the latest decisions with its explanation "
                                   "(bounded: the first and last instances, each step's "
                                   "first rejections)", 404, 503)},
        "/what-if": {"post": {
            "summary": "The explained decision a boot would get now; nothing is claimed",
            "requestBody": {"required": True, **_json(BOOT)},
            "responses": _answers("the decision and its explanation", 400, 409, 503)}},
        "/capacity": {**_get("The state of the capacity report", 503), "post": {
            "summary": "Start a capacity report of the running cloud",
            "requestBody": {"required": False, **_json(CAPACITY)},
            "responses": {**_answers("never (202)", 400, 503),
                          "202": {"description": "started (or already running)",
                                  **_json({"type": "object"})}}}},
        "/servers/{uuid}": {"parameters": [uuid_param],
                            **_get("An instance, its migrations and allocations", 404, 503),
                            "delete": {"summary": "Delete an instance: its allocations go",
                                       "responses": _answers("what was freed", 404, 409,
                                                             503)}},
    }
    for action in [*MOVE_FIELDS, *PLAIN_ACTIONS]:
        fields = MOVE_FIELDS.get(action, frozenset())
        body = {"type": "object", "additionalProperties": False,
                "properties": {f: _MOVE_PROPS[f] for f in sorted(fields)},
                "required": [f for f in ("flavor", "image") if f in fields]}
        paths[f"/servers/{{uuid}}/{action}"] = {"parameters": [uuid_param], "post": {
            "summary": f"{action} an instance",
            "requestBody": {"required": False, **_json(body)},
            "responses": _answers("where the instance is now", 400, 404, 409, 503)}}
    paths["/hosts/{host}/drain"] = {
        "parameters": [{"name": "host", "in": "path", "required": True,
                        "schema": {"type": "string"}}],
        "post": {"summary": "Move every instance off a compute host, one after another "
                            "(409: some could not move; each says why)",
                 "requestBody": {"required": False, **_json({
                     "type": "object", "additionalProperties": False, "properties": {
                         "operation": {"enum": ["live-migrate", "migrate"]}}})},
                 "responses": _answers("where each instance went", 400, 404, 409, 503)}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Berth scheduler API", "version": "1.0",
                 "description": "Boot, inspect and move instances through Berth's scheduler; "
                                "the Placement API is mounted under /placement."},
        "components": {"securitySchemes": {"token": {
            "type": "apiKey", "in": "header", "name": "X-Auth-Token",
            "description": "a Keystone token (noauth2: user[:project])"}}},
        "security": [{"token": []}],
        "paths": paths,
    }
