"""Thin endpoint handlers of reference section 4; the route table lives in ``app``.

Each handler receives the request (microversion, context and policy already settled),
the store and the path variables, and returns a Response. Docstrings list the statuses.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from berth.placement import errors, schemas
from berth.placement.db import utcnow
from berth.placement.microversion import MAX_VERSION, MIN_VERSION
from berth.placement.query import parse_member_of, parse_required, parse_resources
from berth.placement.store import (
    INCOMPLETE_ID,
    UNSET,
    ConsumerWrite,
    InventoryRecord,
    PlacementStore,
    ProviderFilters,
    ProviderRecord,
    inventory_from_body,
)
from berth.placement.web import (
    Request,
    Response,
    add_cache_headers,
    empty_response,
    json_response,
    newest,
)

Handler = Callable[[Request, PlacementStore, Mapping[str, str]], Response]


@dataclass(frozen=True)
class Endpoint:
    """A handler with the checks that run before it (in this order).

    ``min_version`` (404, or ``below_min_status``), ``json_get`` (Accept must allow
    JSON, else 406), ``needs_body`` (Content-Type must be application/json, else 415),
    then ``policy``.
    """

    func: Handler
    policy: str | None
    min_version: tuple[int, int] = (1, 0)
    json_get: bool = False
    needs_body: Callable[[tuple[int, int]], bool] | None = None
    below_min_status: int = 404


def always(_v: tuple[int, int]) -> bool:
    """``needs_body`` for endpoints that take a JSON body at every microversion."""
    return True


def _not_found_rp(uuid: str, form: str = "plain") -> errors.NotFound:
    inner = f"No resource provider with uuid {uuid} found"  # Placement's NotFound text
    if form == "space":
        return errors.NotFound(f"No resource provider with uuid {uuid} found : {inner}")
    if form == "colon":
        return errors.NotFound(f"No resource provider with uuid {uuid} found: {inner}")
    if form == "quoted":
        return errors.NotFound(f"Resource provider '{uuid}' not found: {inner}")
    return errors.NotFound(f"No resource provider with uuid {uuid} found", outside_handler=True)


# ----------------------------------------------------------------------- root


def root(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """GET / : the version document (200)."""
    body = {
        "versions": [
            {
                "id": "v1.0",
                "max_version": str(MAX_VERSION),
                "min_version": str(MIN_VERSION),
                "status": "CURRENT",
                "links": [{"rel": "self", "href": ""}],
            }
        ]
    }
    resp = json_response(body)
    add_cache_headers(req, resp, utcnow())
    return resp


# ----------------------------------------------------------------------- providers


def provider_dict(req: Request, p: ProviderRecord) -> dict[str, Any]:
    """The RP representation at the request's microversion."""
    v = req.version
    base = f"/resource_providers/{p.uuid}"
    rels = ["inventories", "usages"]
    if v >= (1, 1):
        rels.append("aggregates")
    if v >= (1, 6):
        rels.append("traits")
    if v >= (1, 11):
        rels.append("allocations")
    links = [{"rel": "self", "href": req.link(base)}]
    links += [{"rel": rel, "href": req.link(f"{base}/{rel}")} for rel in rels]
    out: dict[str, Any] = {
        "uuid": p.uuid,
        "name": p.name,
        "generation": p.generation,
        "links": links,
    }
    if v >= (1, 14):
        out["parent_provider_uuid"] = p.parent_uuid
        out["root_provider_uuid"] = p.root_uuid
    return out


def list_providers(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """GET /resource_providers: 200; 400 on a bad query string."""
    v = req.version
    schemas.validate_query(schemas.list_providers_schema(v), req.query_last())
    multi = req.query_multi()
    last = req.query_last()
    filters = ProviderFilters()
    if "name" in last:
        filters.name = last["name"]
    if "uuid" in last:
        filters.uuid = schemas.normalize_uuid(last["uuid"]) or last["uuid"]
    if v >= (1, 3) and "member_of" in multi:
        filters.member_of = parse_member_of(multi["member_of"], v)
    if v >= (1, 4) and "resources" in last:
        filters.resources = parse_resources(last["resources"])
    if v >= (1, 14) and "in_tree" in last:
        filters.in_tree = schemas.normalize_uuid(last["in_tree"]) or last["in_tree"]
    if v >= (1, 18) and "required" in multi:
        filters.required = parse_required(multi["required"], v)
    providers = store.list_providers(filters)
    resp = json_response({"resource_providers": [provider_dict(req, p) for p in providers]})
    add_cache_headers(req, resp, newest(p.last_modified for p in providers) or utcnow())
    return resp


def create_provider(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """POST /resource_providers: 201 (< 1.20) or 200 with the body; 400; 409."""
    v = req.version
    data = req.json_body()
    schemas.validate_body(
        schemas.POST_PROVIDER_V1_14 if v >= (1, 14) else schemas.POST_PROVIDER_V1_0, data
    )
    uuid = schemas.normalize_uuid(data["uuid"]) if "uuid" in data else None
    parent = data.get("parent_provider_uuid")
    if parent is not None:
        parent = schemas.normalize_uuid(parent)
    prov = store.create_provider(data["name"], uuid, parent)
    location = req.location(f"/resource_providers/{prov.uuid}")
    if v < (1, 20):
        return empty_response(201, [("Location", location)])
    resp = json_response(provider_dict(req, prov), headers=[("Location", location)])
    add_cache_headers(req, resp, prov.last_modified)
    return resp


def show_provider(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """GET /resource_providers/{uuid}: 200; 404."""
    prov = store.get_provider(params["uuid"])
    if prov is None:
        raise _not_found_rp(params["uuid"])
    resp = json_response(provider_dict(req, prov))
    add_cache_headers(req, resp, prov.last_modified)
    return resp


def update_provider(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """PUT /resource_providers/{uuid}: 200; 400; 404; 409."""
    v = req.version
    _require_rp(store, params["uuid"])  # a missing provider answers 404 before a bad body
    data = req.json_body()
    schemas.validate_body(
        schemas.PUT_PROVIDER_V1_14 if v >= (1, 14) else schemas.PUT_PROVIDER_V1_0, data
    )
    set_parent = "parent_provider_uuid" in data
    parent = data.get("parent_provider_uuid")
    if parent is not None:
        parent = schemas.normalize_uuid(parent)
    prov = store.update_provider(
        params["uuid"],
        data["name"],
        set_parent=set_parent,
        parent_uuid=parent,
        allow_reparent=v >= (1, 37),
    )
    resp = json_response(provider_dict(req, prov))
    add_cache_headers(req, resp, prov.updated_at or prov.created_at)
    return resp


def delete_provider(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """DELETE /resource_providers/{uuid}: 204; 404; 409."""
    store.delete_provider(params["uuid"])
    return empty_response(204)


# ----------------------------------------------------------------------- inventories


def _require_rp(store: PlacementStore, uuid: str) -> ProviderRecord:
    prov = store.get_provider(uuid)
    if prov is None:
        raise _not_found_rp(uuid)
    return prov


def list_inventories(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """GET .../inventories: 200; 404."""
    found = store.get_inventories(params["uuid"])
    if found is None:
        raise _not_found_rp(params["uuid"], "space")
    prov, invs = found
    resp = json_response(
        {
            "resource_provider_generation": prov.generation,
            "inventories": {rc: inv.as_dict() for rc, inv in invs.items()},
        }
    )
    # Quirk: no inventory means cache-control but no last-modified.
    add_cache_headers(req, resp, newest(i.updated_at or i.created_at for i in invs.values()))
    return resp


def create_inventory(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """POST .../inventories: 201; 400; 404; 409."""
    uuid = params["uuid"]
    _require_rp(store, uuid)
    data = req.json_body()
    schemas.validate_body(schemas.POST_INVENTORY, data)
    inv = inventory_from_body(data["resource_class"], data)
    stored, generation = store.create_inventory(uuid, inv, req.version)
    body = stored.as_dict()
    body["resource_provider_generation"] = generation
    resp = json_response(
        body,
        status=201,
        headers=[
            (
                "Location",
                req.location(f"/resource_providers/{uuid}/inventories/{inv.resource_class}"),
            )
        ],
    )
    add_cache_headers(req, resp, stored.created_at)
    return resp


def set_inventories(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """PUT .../inventories: 200; 400; 404; 409."""
    uuid = params["uuid"]
    try:
        data = req.json_body()
        schemas.validate_body(schemas.PUT_INVENTORIES, data)
    except errors.PlacementError:
        _require_rp(store, uuid)  # a missing provider answers 404 before a bad body
        raise
    new = {rc: inventory_from_body(rc, rec) for rc, rec in data["inventories"].items()}
    # The store answers 404 for a missing provider itself (one read fewer).
    generation, invs = store.set_inventories(
        uuid, data["resource_provider_generation"], new, req.version
    )
    resp = json_response(
        {
            "resource_provider_generation": generation,
            "inventories": {rc: inv.as_dict() for rc, inv in invs.items()},
        }
    )
    # Placement takes last-modified from the inventories: none without any.
    add_cache_headers(
        req, resp,
        (newest(i.updated_at or i.created_at for i in invs.values()) or utcnow()) if invs
        else None,
    )
    return resp


def delete_inventories(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """DELETE .../inventories (>= 1.5; 405 below): 204; 404; 409."""
    _require_rp(store, params["uuid"])
    store.delete_inventories(params["uuid"])
    return empty_response(204)


def _inventory_body(inv: InventoryRecord, generation: int) -> dict[str, Any]:
    body = inv.as_dict()
    if generation:
        body["resource_provider_generation"] = generation
    return body


def show_inventory(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """GET .../inventories/{rc}: 200; 404."""
    uuid, rc = params["uuid"], params["resource_class"]
    found = store.get_inventories(uuid)
    if found is None:
        raise _not_found_rp(uuid)
    prov, invs = found
    inv = invs.get(rc)
    if inv is None:
        raise errors.NotFound(f"No inventory of class {rc} for {uuid}")
    resp = json_response(_inventory_body(inv, prov.generation))
    add_cache_headers(req, resp, inv.updated_at or inv.created_at)
    return resp


def update_inventory(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """PUT .../inventories/{rc}: 200; 400; 404; 409."""
    uuid, rc = params["uuid"], params["resource_class"]
    _require_rp(store, uuid)
    data = req.json_body()
    schemas.validate_body(schemas.PUT_INVENTORY, data)
    inv = inventory_from_body(rc, data)
    stored, generation = store.update_inventory(
        uuid, data["resource_provider_generation"], inv, req.version
    )
    resp = json_response(_inventory_body(stored, generation))
    add_cache_headers(req, resp, stored.updated_at or stored.created_at)
    return resp


def delete_inventory(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """DELETE .../inventories/{rc}: 204; 404; 409."""
    _require_rp(store, params["uuid"])
    store.delete_inventory(params["uuid"], params["resource_class"])
    return empty_response(204)


# ----------------------------------------------------------------------- aggregates


def _aggregates_body(req: Request, generation: int, aggs: list[str]) -> dict[str, Any]:
    body: dict[str, Any] = {"aggregates": aggs}
    if req.version >= (1, 19):
        body["resource_provider_generation"] = generation
    return body


def list_aggregates(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """GET .../aggregates (>= 1.1): 200; 404."""
    found = store.find_aggregates(params["uuid"])
    if found is None:
        raise _not_found_rp(params["uuid"])
    prov, aggs = found
    resp = json_response(_aggregates_body(req, prov.generation, aggs))
    add_cache_headers(req, resp, utcnow())
    return resp


def set_aggregates(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """PUT .../aggregates (>= 1.1): 200; 400; 404; 409 (>= 1.19 generation)."""
    _require_rp(store, params["uuid"])
    data = req.json_body()
    if req.version >= (1, 19):
        schemas.validate_body(schemas.PUT_AGGREGATES_V1_19, data)
        aggs, generation = data["aggregates"], data["resource_provider_generation"]
    else:
        schemas.validate_body(schemas.PUT_AGGREGATES_V1_1, data)
        aggs, generation = data, None
    new_gen, stored = store.set_aggregates(params["uuid"], aggs, generation)
    resp = json_response(_aggregates_body(req, new_gen, stored))
    add_cache_headers(req, resp, utcnow())
    return resp


# ----------------------------------------------------------------------- provider traits


def list_provider_traits(
    req: Request, store: PlacementStore, params: Mapping[str, str]
) -> Response:
    """GET .../traits (>= 1.6): 200; 404."""
    found = store.get_provider_traits(params["uuid"])
    if found is None:
        raise _not_found_rp(params["uuid"], "colon")
    prov, names = found
    resp = json_response({"traits": names, "resource_provider_generation": prov.generation})
    add_cache_headers(req, resp, prov.last_modified or utcnow())
    return resp


def set_provider_traits(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """PUT .../traits (>= 1.6): 200; 400; 404; 409."""
    data = req.json_body()
    schemas.validate_body(schemas.PUT_PROVIDER_TRAITS, data)
    result = store.set_provider_traits(
        params["uuid"], data["traits"], data["resource_provider_generation"]
    )
    if result is None:  # Placement's NotFound leaves the handler as it is
        raise _not_found_rp(params["uuid"])
    generation, names = result
    resp = json_response({"traits": names, "resource_provider_generation": generation})
    add_cache_headers(req, resp, utcnow())
    return resp


def delete_provider_traits(
    req: Request, store: PlacementStore, params: Mapping[str, str]
) -> Response:
    """DELETE .../traits (>= 1.6): 204; 404; 409."""
    if not store.delete_provider_traits(params["uuid"]):
        raise _not_found_rp(params["uuid"])  # as Placement's, from outside the handler
    return empty_response(204)


# ----------------------------------------------------------------------- usages


def provider_usages(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """GET .../usages: 200; 404."""
    found = store.provider_usages(params["uuid"])
    if found is None:
        raise _not_found_rp(params["uuid"], "colon")
    prov, usages = found
    resp = json_response({"resource_provider_generation": prov.generation, "usages": usages})
    add_cache_headers(req, resp, utcnow())
    return resp


def project_usages(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """GET /usages (>= 1.9): 200; 400."""
    v = req.version
    last = req.query_last()
    schemas.validate_query(
        schemas.GET_USAGES_V1_38 if v >= (1, 38) else schemas.GET_USAGES_V1_9, last
    )
    usages = store.project_usages(
        last["project_id"], last.get("user_id"), last.get("consumer_type"), grouped=v >= (1, 38)
    )
    resp = json_response({"usages": usages})
    add_cache_headers(req, resp, utcnow())
    return resp


# ----------------------------------------------------------------------- allocations


def provider_allocations(
    req: Request, store: PlacementStore, params: Mapping[str, str]
) -> Response:
    """GET .../allocations: 200; 404."""
    found = store.provider_allocations(params["uuid"])
    if found is None:
        raise _not_found_rp(params["uuid"], "quoted")
    prov, allocs, gens, last = found
    body: dict[str, Any] = {}
    for consumer, resources in allocs.items():
        entry: dict[str, Any] = {"resources": resources}
        if req.version >= (1, 28):
            entry["consumer_generation"] = gens.get(consumer, 0)
        body[consumer] = entry
    resp = json_response({"allocations": body, "resource_provider_generation": prov.generation})
    add_cache_headers(req, resp, last or utcnow())
    return resp


def show_allocations(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """GET /allocations/{consumer}: always 200."""
    v = req.version
    data = store.consumer_allocations(params["consumer_uuid"])
    allocs = {
        rp: {"resources": resources, "generation": data.generations[rp]}
        for rp, resources in data.allocations.items()
    }
    body: dict[str, Any] = {"allocations": allocs}
    if allocs:
        if v >= (1, 12):
            body["project_id"] = data.project_id
            body["user_id"] = data.user_id
        if v >= (1, 28):
            body["consumer_generation"] = data.consumer_generation
        if v >= (1, 38):
            body["consumer_type"] = data.consumer_type or "unknown"
    resp = json_response(body)
    add_cache_headers(req, resp, data.last_modified or utcnow())
    return resp


def _rp_key(value: str) -> str:
    return schemas.normalize_uuid(value) or value.lower()


def _consumer_write(
    consumer_uuid: str, data: Mapping[str, Any], version: tuple[int, int]
) -> ConsumerWrite:
    """Turn one consumer's allocation body (any version's shape) into a ConsumerWrite."""
    items: list[tuple[str, str, int]] = []
    raw = data["allocations"]
    if isinstance(raw, list):
        for entry in raw:
            rp = _rp_key(entry["resource_provider"]["uuid"])
            items.extend((rp, rc, used) for rc, used in entry["resources"].items())
    else:
        for rp, entry in raw.items():
            items.extend((_rp_key(rp), rc, used) for rc, used in entry["resources"].items())
    return ConsumerWrite(
        consumer_uuid=consumer_uuid,
        project_id=data.get("project_id", INCOMPLETE_ID),
        user_id=data.get("user_id", INCOMPLETE_ID),
        allocations=items,
        consumer_type=data.get("consumer_type") if version >= (1, 38) else None,
        generation=data["consumer_generation"] if version >= (1, 28) else UNSET,
    )


def set_allocations(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """PUT /allocations/{consumer}: 204; 400; 409."""
    raw = params["consumer_uuid"]
    consumer = schemas.normalize_uuid(raw)
    if consumer is None:
        raise errors.BadRequest(f"Malformed consumer_uuid: {raw}")
    data = req.json_body()
    schemas.validate_body(schemas.put_allocations_schema(req.version), data)
    store.write_allocations([_consumer_write(consumer, data, req.version)], post=False)
    return empty_response(204)


def post_allocations(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """POST /allocations (>= 1.13): 204; 400; 409."""
    data = req.json_body()
    schemas.validate_body(schemas.post_allocations_schema(req.version), data)
    writes = [
        _consumer_write(_rp_key(consumer), body, req.version) for consumer, body in data.items()
    ]
    store.write_allocations(writes, post=True)
    return empty_response(204)


def delete_allocations(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """DELETE /allocations/{consumer}: 204; 404."""
    consumer = schemas.normalize_uuid(params["consumer_uuid"]) or params["consumer_uuid"]
    store.delete_consumer_allocations(consumer)
    return empty_response(204)


# ----------------------------------------------------------------------- resource classes


def _rc_dict(req: Request, name: str) -> dict[str, Any]:
    return {"name": name, "links": [{"rel": "self", "href": req.link(f"/resource_classes/{name}")}]}


def list_resource_classes(
    req: Request, store: PlacementStore, params: Mapping[str, str]
) -> Response:
    """GET /resource_classes (>= 1.2): 200."""
    rows = store.list_resource_classes()
    resp = json_response({"resource_classes": [_rc_dict(req, n) for n, _ in rows]})
    add_cache_headers(req, resp, newest(t for _, t in rows) or utcnow())
    return resp


def create_resource_class(
    req: Request, store: PlacementStore, params: Mapping[str, str]
) -> Response:
    """POST /resource_classes (>= 1.2): 201; 400; 409."""
    data = req.json_body()
    schemas.validate_body(schemas.RESOURCE_CLASS, data)
    store.create_resource_class(data["name"])
    return empty_response(201, [("Location", req.location(f"/resource_classes/{data['name']}"))])


def show_resource_class(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """GET /resource_classes/{name} (>= 1.2): 200; 404."""
    stamp = store.get_resource_class(params["name"])
    resp = json_response(_rc_dict(req, params["name"]))
    add_cache_headers(req, resp, stamp or utcnow())
    return resp


def update_resource_class(
    req: Request, store: PlacementStore, params: Mapping[str, str]
) -> Response:
    """PUT /resource_classes/{name}: 1.2-1.6 rename (200); >= 1.7 create-or-check (201/204)."""
    name = params["name"]
    if req.version < (1, 7):
        data = req.json_body()
        schemas.validate_body(schemas.RESOURCE_CLASS, data)
        store.rename_resource_class(name, data["name"])
        return json_response(_rc_dict(req, data["name"]))
    schemas.validate_body(schemas.RESOURCE_CLASS, {"name": name})
    created = store.create_resource_class(name, exists_ok=True)
    location = req.location(f"/resource_classes/{name}")
    return empty_response(201 if created else 204, [("Location", location)])


def delete_resource_class(
    req: Request, store: PlacementStore, params: Mapping[str, str]
) -> Response:
    """DELETE /resource_classes/{name} (>= 1.2): 204; 400; 404; 409."""
    store.delete_resource_class(params["name"])
    return empty_response(204)


# ----------------------------------------------------------------------- traits

_TRAIT_INVALID = (
    "The trait is invalid. A valid trait must be no longer than 255 characters, start with the "
    'prefix "CUSTOM_" and use following characters: "A"-"Z", "0"-"9" and "_"'
)


def list_traits(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """GET /traits (>= 1.6): 200; 400."""
    last = req.query_last()
    schemas.validate_query(schemas.LIST_TRAITS, last)
    names_in: list[str] | None = None
    prefix: str | None = None
    if "name" in last:
        value = last["name"]
        if ":" not in value:
            raise errors.BadRequest(
                "Badly formatted name parameter. Expected name query string parameter in "
                f'form: ?name=[in|startswith]:[name1,name2|prefix]. Got: "{value}"'
            )
        op, arg = value.split(":", 1)
        if op == "in":
            names_in = [n for n in arg.split(",")]
        elif op == "startswith":
            prefix = arg
        # Quirk: any other operator is silently ignored.
    associated: bool | None = None
    if "associated" in last:
        text = last["associated"].lower()
        if text not in ("true", "false"):
            raise errors.BadRequest(
                'The query parameter "associated" only accepts "true" or "false"'
            )
        associated = text == "true"
    rows = store.list_traits(names_in=names_in, prefix=prefix, associated=associated)
    resp = json_response({"traits": [n for n, _ in rows]})
    add_cache_headers(req, resp, newest(t for _, t in rows) or utcnow())
    return resp


def show_trait(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """GET /traits/{name} (>= 1.6): 204; 404."""
    stamp = store.get_trait(params["name"])
    resp = empty_response(204)
    add_cache_headers(req, resp, stamp)
    return resp


def put_trait(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """PUT /traits/{name} (>= 1.6): 201 created, 204 existing; 400."""
    name = params["name"]
    if schemas.first_error(schemas.CUSTOM_TRAIT, name) is not None:
        raise errors.BadRequest(_TRAIT_INVALID)
    created, stamp = store.ensure_trait(name)
    resp = empty_response(201 if created else 204, [("Location", req.location(f"/traits/{name}"))])
    add_cache_headers(req, resp, stamp)
    return resp


def delete_trait(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """DELETE /traits/{name} (>= 1.6): 204; 400; 404; 409."""
    store.delete_trait(params["name"])
    return empty_response(204)


# ----------------------------------------------------------------------- candidates, reshaper


def allocation_candidates(
    req: Request, store: PlacementStore, params: Mapping[str, str]
) -> Response:
    """GET /allocation_candidates (>= 1.10): 200; 400 (texts from the engine)."""
    from berth.placement import candidates

    body = candidates.allocation_candidates_json(
        store.provider_graph(), req.query_multi(), (req.version.major, req.version.minor)
    )
    resp = Response(status=200, headers=[("Content-Type", "application/json")], body=body)
    add_cache_headers(req, resp, utcnow())
    return resp


def reshape(req: Request, store: PlacementStore, params: Mapping[str, str]) -> Response:
    """POST /reshaper (>= 1.30): 204; 400; 409."""
    v = req.version
    data = req.json_body()
    schemas.validate_body(schemas.reshaper_schema(v), data)
    new_inventories: dict[str, tuple[int, dict[str, InventoryRecord]]] = {}
    for rp_uuid, body in data["inventories"].items():
        new_inventories[_rp_key(rp_uuid)] = (
            body["resource_provider_generation"],
            {rc: inventory_from_body(rc, rec) for rc, rec in body["inventories"].items()},
        )
    writes = [
        _consumer_write(_rp_key(consumer), body, v)
        for consumer, body in data["allocations"].items()
    ]
    store.reshape(new_inventories, writes)
    return empty_response(204)
