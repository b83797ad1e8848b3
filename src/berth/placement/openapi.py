"""An OpenAPI 3.1 description of the Placement API at its newest microversion, built from
the route table and the very JSON Schemas the handlers validate with, so the description
cannot drift from what is enforced.

Placement itself publishes no OpenAPI document and serves none, so neither does Berth's
Placement API (a route it does not have would be a difference); the description is for
tools, such as the schemathesis run in the suite (``never a 5xx``), and for readers.
"""

from __future__ import annotations

import copy
from typing import Any

from berth.placement import schemas
from berth.placement.app import ROUTES
from berth.placement.candidates_query import query_schema
from berth.placement.microversion import MAX_VERSION

_V = (MAX_VERSION.major, MAX_VERSION.minor)


def _bodies() -> dict[tuple[str, str], dict[str, Any]]:
    return {
        ("POST", "/resource_providers"): schemas.POST_PROVIDER_V1_14,
        ("PUT", "/resource_providers/{uuid}"): schemas.PUT_PROVIDER_V1_14,
        ("POST", "/resource_providers/{uuid}/inventories"): schemas.POST_INVENTORY,
        ("PUT", "/resource_providers/{uuid}/inventories"): schemas.PUT_INVENTORIES,
        ("PUT", "/resource_providers/{uuid}/inventories/{resource_class}"):
            schemas.PUT_INVENTORY,
        ("PUT", "/resource_providers/{uuid}/aggregates"): schemas.PUT_AGGREGATES_V1_19,
        ("PUT", "/resource_providers/{uuid}/traits"): schemas.PUT_PROVIDER_TRAITS,
        ("POST", "/resource_classes"): schemas.RESOURCE_CLASS,
        ("PUT", "/allocations/{consumer_uuid}"): schemas.put_allocations_schema(_V),
        ("POST", "/allocations"): schemas.post_allocations_schema(_V),
        ("POST", "/reshaper"): schemas.reshaper_schema(_V),
    }


def _queries() -> dict[tuple[str, str], dict[str, Any]]:
    candidates = copy.deepcopy(query_schema(_V))
    # Name a few suffixed groups: OpenAPI parameters have names, not patterns.
    for pattern, prop in candidates.pop("patternProperties", {}).items():
        prefix = pattern.lstrip("^").split("(")[0]
        for suffix in ("", "1", "_NIC"):
            candidates["properties"][prefix + suffix] = prop
    return {
        ("GET", "/resource_providers"): schemas.list_providers_schema(_V),
        ("GET", "/traits"): schemas.LIST_TRAITS,
        ("GET", "/usages"): schemas.GET_USAGES_V1_38,
        ("GET", "/allocation_candidates"): candidates,
    }


def _plain(schema: dict[str, Any]) -> dict[str, Any]:
    """A JSON Schema as OpenAPI 3.1 takes it (no ``$schema`` keyword)."""
    out = {k: v for k, v in schema.items() if k != "$schema"}
    return copy.deepcopy(out)


def document() -> dict[str, Any]:
    """The OpenAPI document of the Placement API (paths relative to its root)."""
    bodies, queries = _bodies(), _queries()
    error = {"type": "object", "properties": {"errors": {"type": "array"}}}
    paths: dict[str, Any] = {}
    for template, methods in ROUTES.items():
        if template == "":
            continue
        item: dict[str, Any] = {}
        names = [part[1:-1] for part in template.split("/") if part.startswith("{")]
        if names:
            item["parameters"] = [{"name": n, "in": "path", "required": True,
                                   "schema": {"type": "string"}} for n in names]
        for method, endpoint in methods.items():
            operation: dict[str, Any] = {
                "summary": (endpoint.func.__doc__ or "").strip().splitlines()[0],
                "responses": {"default": {"description": "the answer, or an error",
                                          "content": {"application/json": {
                                              "schema": error}}}},
            }
            if endpoint.policy is None:
                operation["security"] = []
            else:
                operation["x-policy"] = endpoint.policy
            body = bodies.get((method, template))
            if body is not None:
                operation["requestBody"] = {"required": True, "content": {
                    "application/json": {"schema": _plain(body)}}}
            query = queries.get((method, template))
            if query is not None:
                required = set(query.get("required", ()))
                operation["parameters"] = [
                    {"name": name, "in": "query", "required": name in required,
                     "schema": {"type": "string"}}
                    for name in sorted(query["properties"])]
            item[method.lower()] = operation
        paths[template] = item
    return {
        "openapi": "3.1.0",
        "info": {"title": "Placement API (Berth)", "version": str(MAX_VERSION),
                 "description": "Send OpenStack-API-Version: placement "
                                f"{MAX_VERSION} for this description."},
        "components": {"securitySchemes": {"token": {
            "type": "apiKey", "in": "header", "name": "X-Auth-Token"}}},
        "security": [{"token": []}],
        "paths": paths,
    }
