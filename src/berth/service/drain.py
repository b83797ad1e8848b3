"""Drain a compute host: move every instance off it, one after another (what
``nova host-evacuate-live`` and ``nova host-servers-migrate`` do from the client side).

Each instance on the host is moved through :meth:`MoveService.move` as a single move
request would move it, so each one sees where the ones before it went: a live migration
(the default), or a cold migration confirmed at once (the host is left either way). An
instance that cannot move (no host left for it, a refusal, a failed build) stays where
it is with its reason, and the drain goes on with the next; the host is not disabled
(``berth service set HOST --disable`` first keeps new boots away). A cloud file's
instance without a flavor is not known to the service (its resources are not), so it is
not moved; it is counted among those that stay. The same function serves ``POST
/hosts/{host}/drain`` (``berth drain HOST``) and ``berth schedule CLOUD --drain HOST``
(offline, on the cloud file's scratch store): one path.

The answer::

    {"host", "operation", "moved": [{"instance_uuid", "flavor", "host", "nodename",
     "migration_uuid", "skipped"?}], "failed": [{"instance_uuid", "flavor", "error":
     {"code", "message"}}], "left": [uuids that were busy (moving, a resize to confirm)
     and are still on the host], "awaiting_confirmation": [{"instance_uuid",
     "migration_uuid"}: moves from the host not confirmed yet, whose source allocation
     stays], "unknown_instances": n (what the host reports beyond the instances Berth
     knows, such as a cloud file's without a flavor),
     "error": {"code": "berth.scheduling.drain_incomplete", "message"} (when any stays)}
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from berth.errors import BerthError, InputError, ServiceUnavailable, error_dict
from berth.model.image_props import show
from berth.moves import LIVE_MIGRATE, MIGRATE, MoveRequest
from berth.service.instances import ACTIVE
from berth.service.moves import MoveService

#: The moves a drain may make.
DRAIN_OPERATIONS = (LIVE_MIGRATE, MIGRATE)
#: The error code of a drain that left instances on the host (HTTP 409).
DRAIN_INCOMPLETE = "berth.scheduling.drain_incomplete"


def parse_drain(body: Any) -> str:
    """The operation of a ``POST /hosts/{host}/drain`` body (``{"operation":
    "live-migrate" | "migrate"}``, or none); errors name the field."""
    if body is None:
        body = {}
    if not isinstance(body, Mapping):
        raise InputError("body: expected a JSON object")
    unknown = set(body) - {"operation"}
    if unknown:
        raise InputError(f"body: unknown field(s) {', '.join(sorted(map(str, unknown)))} for "
                         "drain (it takes operation)")
    return _checked(body.get("operation", LIVE_MIGRATE))


def _checked(operation: Any) -> str:
    """``operation`` if a drain may make it; InputError naming the field otherwise."""
    if operation not in DRAIN_OPERATIONS:
        raise InputError(f"operation: expected one of {', '.join(DRAIN_OPERATIONS)}, got "
                         f"{show(operation)}", field="operation")
    return str(operation)


#: ``observe(instance_uuid, move answer or None, error or None, seconds)``: told of each
#: move a drain makes (the web view lists them as single moves are listed).
Observer = Callable[[str, "Mapping[str, Any] | None", "BerthError | None", float], None]


def drain_host(moves: MoveService, host: str, operation: str = LIVE_MIGRATE, *,
               observe: Observer | None = None) -> dict[str, Any]:
    """Move every ACTIVE instance off ``host`` (see the module's docstring). An unknown
    host is an InputError; the database going away mid-drain (ServiceUnavailable) ends
    it, with what moved so far kept."""
    operation = _checked(operation)
    moves.scheduler  # noqa: B018 - MovesElsewhere before anything changes
    snapshot = moves.scheduler.refresh()
    rows = np.flatnonzero(snapshot.obj("host") == host)  # the host's nodes
    if not len(rows):
        raise InputError(f"host: compute host {host!r} could not be found", field="host")
    on_host = [r for r in moves.instances.all() if r.host == host]
    # What the host reports beyond the instances Berth knows there: a cloud file's
    # instances without a flavor (their resources unknown, so not movable).
    reported = int(np.nansum(snapshot.num("num_instances")[rows]))
    unknown = max(0, reported - len(on_host))
    moved: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for record in on_host:
        if record.status != ACTIVE:
            continue
        flavor = record.spec["flavor"]["name"]
        started = time.perf_counter()
        try:
            went = moves.move(record.uuid, MoveRequest(operation))
            if operation == MIGRATE:
                moves.confirm(record.uuid)
        except ServiceUnavailable:
            raise
        except BerthError as exc:
            failed.append({"instance_uuid": record.uuid, "flavor": flavor,
                           "error": error_dict(exc)})
            if observe is not None:
                observe(record.uuid, None, exc, time.perf_counter() - started)
            continue
        if observe is not None:
            observe(record.uuid, went, None, time.perf_counter() - started)
        entry = {"instance_uuid": record.uuid, "flavor": flavor, "host": went["host"],
                 "nodename": went["nodename"], "migration_uuid": went["migration_uuid"]}
        if went.get("skipped"):
            entry["skipped"] = went["skipped"]
        moved.append(entry)
    # Those that were busy (moving, or a resize to confirm) and are still here now.
    left = [r.uuid for r in on_host if r.status != ACTIVE
            and (now := moves.instances.get(r.uuid)) is not None and now.host == host]
    # Moves from this host awaiting confirmation: the source allocation stays here, and
    # a revert would bring the instance back.
    awaiting = sorted(({"instance_uuid": m.instance_uuid, "migration_uuid": m.uuid}
                       for m in moves.instances.migrations(status="finished")
                       if m.source_host == host), key=lambda m: m["instance_uuid"])
    answer: dict[str, Any] = {"host": host, "operation": operation, "moved": moved,
                              "failed": failed, "left": left, "awaiting_confirmation": awaiting,
                              "unknown_instances": unknown}
    stay = len(failed) + len(left) + unknown
    if stay or awaiting:
        parts = [f"{stay} of {len(on_host) + unknown} instances could not be moved off {host}"]
        if unknown:
            parts.append(f"{unknown} of them unknown to Berth (no flavor), not movable")
        if awaiting:
            parts.append(f"{len(awaiting)} move(s) from it await confirmation")
        answer["error"] = {"code": DRAIN_INCOMPLETE, "message": "; ".join(parts)}
    return answer


def drain_status(answer: Mapping[str, Any]) -> int:
    """200 when nothing is left on the host; 409 otherwise."""
    return 409 if "error" in answer else 200


def drain_lines(answer: Mapping[str, Any]) -> list[str]:
    """The answer for people: a line per instance, then the outcome."""
    lines = [f"drain of {answer['host']} by {answer['operation']}:"]
    for entry in answer.get("moved") or []:
        lines.append(f"  {entry['instance_uuid']}  {entry['flavor']:<12} -> {entry['host']} "
                     f"({entry['nodename']})")
        for skip in entry.get("skipped") or []:
            lines.append(f"      skipped {skip['host']}: {skip['reason']}")
    for entry in answer.get("failed") or []:
        lines.append(f"  {entry['instance_uuid']}  {entry['flavor']:<12} stays: "
                     f"{entry['error']['message']}")
    for uuid in answer.get("left") or []:
        lines.append(f"  {uuid}  not ACTIVE (moving, or a resize to confirm): stays")
    unknown = int(answer.get("unknown_instances") or 0)
    if unknown:
        lines.append(f"  {unknown} instance(s) Berth does not know (no flavor): stay")
    for entry in answer.get("awaiting_confirmation") or []:
        lines.append(f"  {entry['instance_uuid']}  moved off, but its move awaits "
                     f"confirmation (migration {entry['migration_uuid']}): the source "
                     "allocation stays until confirm-resize")
    moved = len(answer.get("moved") or [])
    stay = len(answer.get("failed") or []) + len(answer.get("left") or []) + unknown
    lines.append(f"{moved} moved, {stay} left on {answer['host']}")
    return lines
