"""The ``/servers`` routes of the scheduler API: instances and their move operations.

Routes::

    GET  /servers                          every instance the service knows
    GET  /servers/{uuid}                   one instance: host, status, flavor, image,
                                           its migrations and its allocations
    DELETE /servers/{uuid}                 delete it: its allocations (and those of a
                                           resize awaiting confirmation) go, its host
                                           forgets it, it leaves its server groups
    POST /servers/{uuid}/migrate           {"host": null | "c1-s02", "allow_cross_cell": false,
                                            "explain": false}
    POST /servers/{uuid}/resize            {"flavor": "m1.large" | {...}, "allow_cross_cell":
                                            false, "explain": false}
    POST /servers/{uuid}/evacuate          {"host": null | "c1-s02", "explain": false}
    POST /servers/{uuid}/rebuild           {"image": "ubuntu" | {...}, "explain": false}
    POST /servers/{uuid}/live-migrate      {"host": null | "c1-s02", "explain": false}
    POST /servers/{uuid}/confirm-resize    {} (or no body)
    POST /servers/{uuid}/revert-resize     {} (or no body)

Every body field is checked first and a 400 names it (an unknown field, a host that is
not a string or names no compute host, a flavor or image the server does not know, a
flag that is not a boolean). ``allow_cross_cell`` stands for Nova's policy rule
``compute:servers:resize:cross_cell`` (default: nobody): without it a migration stays in
the instance's cell.

A move answers 200 with where the instance went::

    {"instance_uuid", "operation", "migration_uuid", "status": "VERIFY_RESIZE" | "ACTIVE",
     "source": {"host", "nodename"}, "host", "nodename", "compute_node_uuid", ...,
     "tried": [hosts built on, in order], "alternates": [...], "scheduled": true,
     "allocations": {"instance": {rp: {RC: n}}, "migration": {rp: {RC: n}}},
     "providers": {rp: "host/node"},
     "skipped": [{"host", "reason"}] (live-migrate: hosts the conductor's checks turned down),
     "diagnosis": {...} (with "explain": true)}

A live migration ends ``ACTIVE`` on its destination with nothing to confirm: the
migration consumer's (source) allocation is deleted. Its ``host`` is a hint the filters
still judge (Nova's ``os-migrateLive`` without ``force``).

Errors: 400 (a live migration of an instance with accelerators, encrypted memory, or a
vTPM whose secret the host does not hold); 404 ``berth.input.instance_not_found``; 409
``berth.scheduling.no_valid_host`` (with the diagnosis when asked; for a live migration
the hosts its checks skipped), ``...max_retries_exceeded``, ``...move_refused`` (a
resize waiting for confirmation, an evacuation from a host that is up, a live migration
from a host that is down, nothing to confirm or revert), ``...allocation_move_failed``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from berth.errors import InputError
from berth.model.image_props import show
from berth.model.request import Flavor, ImageMeta
from berth.moves import EVACUATE, LIVE_MIGRATE, MIGRATE, REBUILD, RESIZE, MoveRequest
from berth.service.boot_body import parse_flavor, parse_image
from berth.service.moves import MoveService
from berth.service.policy import MOVE_RULES, SERVERS_DELETE, SERVERS_LIST, SERVERS_SHOW

#: ``authorize(rule, project)`` raises unless the caller may apply ``rule`` to an
#: instance of ``project``.
Authorize = Callable[[str, str | None], None]


def _allow_all(rule: str, project: str | None) -> None:
    """No policy (library use)."""

#: The fields each move action takes.
MOVE_FIELDS: dict[str, frozenset[str]] = {
    MIGRATE: frozenset({"host", "allow_cross_cell", "explain"}),
    RESIZE: frozenset({"flavor", "allow_cross_cell", "explain"}),
    EVACUATE: frozenset({"host", "explain"}),
    REBUILD: frozenset({"image", "explain"}),
    LIVE_MIGRATE: frozenset({"host", "explain"}),
}
#: Actions that take no body fields.
PLAIN_ACTIONS = ("confirm-resize", "revert-resize")


def _bool(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise InputError(f"{key}: expected true or false, got {show(value)}", field=key)
    return value


def parse_move(action: str, body: Any, flavors: Mapping[str, Flavor],
               images: Mapping[str, ImageMeta]) -> tuple[MoveRequest, bool]:
    """The move request and the ``explain`` flag of a ``POST /servers/{uuid}/{action}``
    body (errors name the field)."""
    if body is None:
        body = {}
    if not isinstance(body, Mapping):
        raise InputError("body: expected a JSON object")
    allowed = MOVE_FIELDS[action]
    unknown = set(body) - allowed
    if unknown:
        raise InputError(f"body: unknown field(s) {', '.join(sorted(map(str, unknown)))} for "
                         f"{action} (it takes {', '.join(sorted(allowed))})")
    host = body.get("host")
    if host is not None and (not isinstance(host, str) or not host):
        raise InputError(f"host: expected a host name, got {show(host)}", field="host")
    request = MoveRequest(action, host=host, allow_cross_cell=_bool(body, "allow_cross_cell"))
    if action == RESIZE:
        if body.get("flavor") is None:
            raise InputError("flavor: required field is missing", field="flavor")
        request.flavor = parse_flavor(body["flavor"], flavors)
    if action == REBUILD:
        if body.get("image") is None:
            raise InputError("image: required field is missing", field="image")
        request.image = parse_image(body["image"], images)
    return request, _bool(body, "explain")


def handle_servers(moves: MoveService | None, method: str, path: str, body: Any,
                   flavors: Mapping[str, Flavor],
                   images: Mapping[str, ImageMeta],
                   authorize: Authorize = _allow_all) -> tuple[int, Any]:
    """Answer one ``/servers`` request: ``(status, body)``. ``body`` is the parsed JSON
    (read only for POST). ``authorize`` applies the route's policy rule
    (:mod:`berth.service.policy`) with the instance's project as the target."""
    parts = [p for p in path.split("/") if p]
    if moves is None:
        return 404, {"error": {"code": "berth.http.not_found",
                               "message": "this server keeps no instances"}}
    if len(parts) == 1:
        if method != "GET":
            return _method("GET")
        authorize(SERVERS_LIST, None)
        return 200, {"servers": [
            {"instance_uuid": r.uuid, "host": r.host, "nodename": r.nodename,
             "status": r.status, "flavor": r.spec["flavor"]["name"]}
            for r in moves.instances.all()]}
    uuid = parts[1]
    record = moves.instances.get(uuid)
    owner = record.spec.get("project_id") if record is not None else None
    if len(parts) == 2:
        if method == "DELETE":
            authorize(SERVERS_DELETE, owner)
            return 200, moves.delete(uuid)
        if method != "GET":
            return _method("GET or DELETE")
        authorize(SERVERS_SHOW, owner)
        return 200, moves.show(uuid)
    if len(parts) != 3:
        return 404, {"error": {"code": "berth.http.not_found", "message": f"no route {path}"}}
    action = parts[2]
    if action not in MOVE_FIELDS and action not in PLAIN_ACTIONS:
        known = ", ".join(list(MOVE_FIELDS) + list(PLAIN_ACTIONS))
        return 404, {"error": {"code": "berth.http.not_found",
                               "message": f"no action {action!r} (known: {known})"}}
    if method != "POST":
        return _method("POST")
    if not moves.moves_here:
        return 404, {"error": {"code": "berth.http.not_found", "message": (
            f"{action}: moves are served by berth serve, whose scheduler runs in process; "
            "this API process lists, shows and deletes instances")}}
    authorize(MOVE_RULES[action], owner)
    if action in PLAIN_ACTIONS:
        if body not in (None, {}):
            raise InputError(f"body: {action} takes no fields, got {show(body)}")
        if action == "confirm-resize":
            return 200, moves.confirm(uuid)
        return 200, moves.revert(uuid)
    request, explain = parse_move(action, body, flavors, images)
    return 200, moves.move(uuid, request, explain=explain)


def _method(allowed: str) -> tuple[int, Any]:
    return 405, {"error": {"code": "berth.http.method", "message": f"use {allowed}"}}
