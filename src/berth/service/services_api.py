"""The ``/os-services`` routes of the scheduler API: the compute services and an
operator's switches on them, as Nova's os-services API (microversion 2.53 and later).

Routes::

    GET /os-services            {"services": [service, ...]}, one per compute host
    GET /os-services/{host}     {"service": service}
    DELETE /os-services/{host}  204: the service is gone (below)
    PUT /os-services/{host}     {"status": "disabled", "disabled_reason": "new disks"}
                                {"status": "enabled"}
                                {"forced_down": true}   (or false; with a status or alone)
                                -> {"service": service}

A service, as Nova shows one::

    {"id": "c1-s01", "binary": "nova-compute", "host": "c1-s01", "zone": "az1",
     "status": "enabled" | "disabled", "state": "up" | "down", "updated_at": ISO time of
     the last heartbeat (null: never), "disabled_reason": null | str, "forced_down": bool,
     "nodes": ["c1-s01"]}

Berth names a service by its host (one compute service per host; Nova names it by a
uuid since 2.53); ``nodes`` are the host's compute nodes. ``state`` is the heartbeat's
verdict (``service_down_time``) and ``forced_down``; ``status`` is the switch.

The body follows Nova 2.53's rules, and a 400 names the field: only ``status``,
``disabled_reason`` and ``forced_down``; at least ``status`` or ``forced_down``;
``disabled_reason`` (1-255 characters) only with ``"status": "disabled"``; ``forced_down``
a boolean. 404 when no compute service runs on the host; 409 when the host's agent did
not answer (its ``berth compute`` is not running: nothing changed).

``DELETE`` (Nova's, for a host taken out of the cloud): refused with 409 while the host
runs instances or its resource providers hold allocations (nothing changes). Otherwise
the host's agents stop and are forgotten (a host still reporting is asked over the bus
first: 409 when it does not answer), its resource providers go from placement (nested
ones first), its compute records go, and every scheduler drops its rows. An agent that
starts again later registers the host anew, as a Nova compute does.

What a switch does is Nova's: a disabled service fails ComputeFilter and its nodes carry
the ``COMPUTE_STATUS_DISABLED`` trait (the placement pre-filter leaves them out); enabling
clears the reason; a forced-down service is down whatever its heartbeat (ComputeFilter
rejects it and its instances may be evacuated at once). The switches are set on the
host's agents — in process for ``berth serve``, over the bus for ``berth api`` — which
report at once, and they last across the agents' restarts (their stored records).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from berth.errors import InputError
from berth.model.image_props import show
from berth.service.conductor import ComputeDriver, ServiceUnreachable, UnknownService
from berth.service.policy import SERVICES_DELETE, SERVICES_LIST, SERVICES_UPDATE

if TYPE_CHECKING:
    from berth.placement.client import PlacementClient
    from berth.service.compute_rpc import AgentDirectory
    from berth.service.records import ComputeRecordStore

PREFIX = "/os-services"
#: Nova's limit on ``disabled_reason`` (the column's size).
MAX_REASON = 255


def iso_time(seconds: float) -> str:
    """An epoch time as Nova writes ``updated_at``: ``2026-11-28T10:02:03.000000``."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")


def services_from_hosts(hosts: list[Mapping[str, Any]],
                        switched: Mapping[str, Mapping[str, Any]] | None = None,
                        ) -> list[dict[str, Any]]:
    """The services of ``GET /hosts`` rows (one per node), one per host in host order;
    ``switched`` holds node states an agent has just answered (by node name), newer
    than a scheduler's view that has not had their report yet. A host's nodes normally
    agree; where they do not, it is disabled or forced down when one of them is,
    reporting when one of them is, and its heartbeat is the newest."""
    by_host: dict[str, dict[str, Any]] = {}
    for row in hosts:
        now = (switched or {}).get(str(row.get("nodename") or row["host"]))
        if now is not None:
            row = {**row, "disabled": now["disabled"], "forced_down": now["forced_down"],
                   "disabled_reason": now["disabled_reason"]}
        host = str(row["host"])
        service = by_host.get(host)
        if service is None:
            service = by_host[host] = {
                "id": host, "binary": "nova-compute", "host": host, "zone": row.get("zone"),
                "status": "enabled", "state": "down", "updated_at": None,
                "disabled_reason": None, "forced_down": False, "nodes": []}
        service["nodes"].append(row.get("nodename") or host)
        if row.get("disabled"):
            service["status"] = "disabled"
            service["disabled_reason"] = service["disabled_reason"] or row.get("disabled_reason")
        service["forced_down"] = service["forced_down"] or bool(row.get("forced_down"))
        if row.get("reporting"):
            service["state"] = "up"
        seen = row.get("last_seen_up")
        if seen is not None and (service["updated_at"] is None or seen > service["updated_at"]):
            service["updated_at"] = seen
    for service in by_host.values():
        if service["forced_down"]:
            service["state"] = "down"
    return [by_host[h] for h in sorted(by_host)]


def parse_update(body: Any) -> tuple[bool | None, str | None, bool | None]:
    """``(disabled, reason, forced_down)`` of a ``PUT`` body (None: unchanged), or
    :class:`~berth.errors.InputError` naming the field."""
    if not isinstance(body, Mapping):
        raise InputError("body: expected a JSON object")
    unknown = sorted(set(body) - {"status", "disabled_reason", "forced_down"})
    if unknown:
        raise InputError(f"body: unknown field(s) {', '.join(map(str, unknown))} (status, "
                         "disabled_reason and forced_down may be set)", field=unknown[0])
    if "status" not in body and "forced_down" not in body:
        raise InputError("body: nothing to update: give status, forced_down or both",
                         field="status")
    disabled = None
    if "status" in body:
        status = body["status"]
        if status not in ("enabled", "disabled"):
            raise InputError(f"status: expected 'enabled' or 'disabled', got {show(status)}",
                             field="status")
        disabled = status == "disabled"
    reason = None
    if "disabled_reason" in body:
        reason = body["disabled_reason"]
        if disabled is not True:
            raise InputError("disabled_reason: allowed only with \"status\": \"disabled\"",
                             field="disabled_reason")
        if not isinstance(reason, str) or not reason.strip() or len(reason) > MAX_REASON:
            raise InputError(f"disabled_reason: expected a non-blank string of at most "
                             f"{MAX_REASON} characters, got {show(reason)}",
                             field="disabled_reason")
    forced_down = None
    if "forced_down" in body:
        forced_down = body["forced_down"]
        if not isinstance(forced_down, bool):
            raise InputError(f"forced_down: expected true or false, got {show(forced_down)}",
                             field="forced_down")
    return disabled, reason, forced_down


def _not_found(host: str) -> tuple[int, dict[str, Any]]:
    return 404, {"error": {"code": "berth.input.service_not_found",
                           "message": f"no compute service on host {host!r}"}}


def _in_use(message: str) -> tuple[int, dict[str, Any]]:
    return 409, {"error": {"code": "berth.compute.service_in_use", "message": message}}


def _unreachable(exc: Exception) -> tuple[int, dict[str, Any]]:
    return 409, {"error": {"code": "berth.compute.unreachable", "message": str(exc)}}


@dataclass
class ServiceAdmin:
    """Where an ``/os-services`` change goes: the hosts' agents (``driver``), and for a
    deletion placement (their providers), the record store (their reports), the agent
    directory of a distributed deployment, and ``announce(uuids, when)``, which tells
    schedulers fed from the bus that the nodes are gone (those fed from the database
    learn it from the record store)."""

    driver: ComputeDriver
    placement: PlacementClient | None = None
    records: ComputeRecordStore | None = None
    directory: AgentDirectory | None = None
    announce: Callable[[list[str], float], None] | None = None
    clock: Callable[[], float] = field(default=time.time)
    #: Whether a deletion asks the agents of a host that no longer reports too: true
    #: in process (a silent agent would report again on the next switch); false over
    #: the bus, where an agent that stopped reporting is most likely gone and a call
    #: to it would wait for ``rpc_response_timeout``.
    ask_silent_agents: bool = True

    def delete(self, host: str, rows: list[Mapping[str, Any]]) -> tuple[int, dict[str, Any] | None]:
        """Delete ``host``'s compute service, whose nodes are the ``GET /hosts`` rows
        ``rows`` (see the module doc)."""
        from berth.placement.client import ConflictError, NotFoundError

        if self.placement is None or self.records is None:
            return 405, {"error": {"code": "berth.http.method",
                                   "message": "this server deletes no compute services"}}
        running = sum(int(r.get("num_instances") or 0) for r in rows)
        if running:
            return _in_use(f"the compute service on host {host!r} hosts {running} "
                           "instance(s): migrate or delete them first")
        uuids = [str(r["uuid"]) for r in rows if r.get("uuid")]
        trees = {uuid: self._tree(uuid) for uuid in uuids}
        for providers in trees.values():
            for provider in providers:
                try:
                    usages = self.placement.provider_usages(provider.uuid)
                except NotFoundError:
                    continue  # gone meanwhile
                held = ", ".join(f"{rc}={n}" for rc, n in sorted(usages.items()) if n)
                if held:
                    return _in_use(f"resource provider {provider.name} ({provider.uuid}) of "
                                   f"host {host!r} holds allocations ({held}): delete or "
                                   "move their consumers first")
        if self.ask_silent_agents or any(r.get("reporting") for r in rows):
            try:
                self.driver.retire_service(host)
            except UnknownService:
                pass  # no agent of it anywhere: nothing reports for it
            except ServiceUnreachable as exc:
                return _unreachable(exc)
        for providers in trees.values():
            for provider in providers:
                try:
                    self.placement.delete_provider(provider.uuid)
                except NotFoundError:
                    pass  # gone meanwhile
                except ConflictError as exc:  # an allocation came in since the check
                    return _in_use(f"resource provider {provider.name} ({provider.uuid}) of "
                                   f"host {host!r} could not be deleted ({exc}); its agents "
                                   "are stopped: delete the service again once its "
                                   "consumers are gone")
        self.records.delete_nodes(uuids)
        if self.directory is not None:
            self.directory.unregister(host)
        if self.announce is not None:
            self.announce(uuids, self.clock())
        return 204, None

    def _tree(self, root: str) -> list[Any]:
        """The providers of the tree rooted at ``root``, children before parents."""
        providers = self.placement.list_providers(in_tree=root) if self.placement else []
        depth: dict[str, int] = {}
        by_uuid = {p.uuid: p for p in providers}

        def level(uuid: str) -> int:
            if uuid not in depth:
                parent = by_uuid[uuid].parent_provider_uuid
                depth[uuid] = 0 if parent is None or parent not in by_uuid else level(parent) + 1
            return depth[uuid]

        return sorted(providers, key=lambda p: -level(p.uuid))


def handle_services(
    method: str, path: str, body: Any, *, hosts: Callable[[], Mapping[str, Any]],
    admin: ServiceAdmin, authorize: Callable[[str], None],
) -> tuple[int, dict[str, Any] | None]:
    """Answer one ``/os-services`` request: its status and JSON body (None: none).
    ``hosts`` is the ``GET /hosts`` view (the scheduler's), ``admin`` reaches the hosts'
    agents and what a deletion removes, and ``authorize(rule)`` raises unless the
    caller may."""
    host = path[len(PREFIX) + 1:] if path.startswith(PREFIX + "/") else None
    if host is not None and (not host or "/" in host):
        return _not_found(host)
    if method == "GET":
        authorize(SERVICES_LIST)
        services = services_from_hosts(list(hosts()["hosts"]))
        if host is None:
            return 200, {"services": services}
        found = [s for s in services if s["host"] == host]
        return (200, {"service": found[0]}) if found else _not_found(host)
    if host is None or method not in ("PUT", "DELETE"):
        allowed = "GET, PUT, DELETE" if host is not None else "GET"
        return 405, {"error": {"code": "berth.http.method", "message": f"use {allowed}"}}
    if method == "DELETE":
        authorize(SERVICES_DELETE)
        rows = [r for r in hosts()["hosts"] if r["host"] == host]
        return admin.delete(host, rows) if rows else _not_found(host)
    authorize(SERVICES_UPDATE)
    disabled, reason, forced_down = parse_update(body)
    try:
        nodes = admin.driver.set_service(host, disabled=disabled, reason=reason,
                                         forced_down=forced_down)
    except UnknownService:
        return _not_found(host)
    except ServiceUnreachable as exc:
        return _unreachable(exc)
    switched = {str(n.get("nodename") or host): n for n in nodes}
    rows = [r for r in hosts()["hosts"] if r["host"] == host]
    if not rows:  # a host registered so lately that the scheduler has no report of it
        rows = [{"host": host, "nodename": name} for name in switched]
    return 200, {"service": services_from_hosts(rows, switched)[0]}
