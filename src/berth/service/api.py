"""The scheduler HTTP API of ``berth serve``, beside the Placement API.

Routes (JSON in, JSON out)::

    POST /boot          schedule and build instances (below)
    GET  /hosts         every compute node with its usage (the reserved amounts
                        included, ``vcpus_reserved``, ``memory_mb_reserved`` say how much)
                        and liveness as the scheduler sees it (``up``, ``forced_down``,
                        ``heartbeat_age_s``: why ComputeFilter passes or rejects it;
                        ``reporting``: the heartbeat alone; ``last_seen_up``; its
                        availability ``zone``)
    GET  /healthz       {"status": "ok"}
    GET  /openapi.json  this API described in OpenAPI 3.1 (:mod:`berth.service.openapi`)
    GET  /os-services[/{host}], PUT|DELETE /os-services/{host}: the compute services, an
         operator's switches (disable, enable, force down) and the deletion of one
         (:mod:`berth.service.services_api`)
    GET  /servers[/{uuid}], POST /servers/{uuid}/{migrate,resize,evacuate,rebuild,
         live-migrate,confirm-resize,revert-resize}: instances and their moves
         (:mod:`berth.service.move_api`)
    GET  /compute-nodes every stored compute-node report in full (capabilities, stats,
                        NUMA, PCI, metrics, instances, service row) plus ``reporting``
                        (its heartbeat is fresh)
    GET  /aggregates    the host aggregates: id, uuid, name, hosts, metadata
    GET  /cells         the cell mappings the cloud file named: uuid, name, disabled
    GET  /flavors       the flavors the server knows (``POST /boot``'s ``flavor`` names)
    GET  /images        the images it knows: id, name, disk_format, properties as given
    GET  /server-groups the server groups: uuid, name, policy, rules, members, project
    POST /server-groups create one: {"name", "policy", "rules": {"max_server_per_host": N}}
                        (the project defaults to the token's); answers it with its uuid
    *    /placement/... the Placement API (same database)

The ``GET`` routes besides ``/boot`` are what ``berth cloud export`` reads (with the
Placement API) to write the running system back as a cloud file.

``POST /boot`` body::

    {"flavor": "m1.small" | {"vcpus": 2, "memory_mb": 2048, "root_gb": 20,
                             "ephemeral_gb": 0, "swap": 0, "extra_specs": {...}},
     "image": null | "cirros" | {"disk_format": "qcow2", "properties": {...}},
     "hints": {"key": "value" | ["v1", "v2"]},
     "num": 1, "project_id": "demo", "user_id": "demo", "availability_zone": null,
     "force_hosts": [], "ignore_hosts": [], "explain": false}

Every field is checked before anything is scheduled, and a 400 names the field:
``num`` is 1 to :data:`MAX_INSTANCES_PER_REQUEST` (Nova's API has no fixed cap, only
quotas; Berth has no quotas, so one request is bounded instead); ``explain`` is a
boolean; ``project_id``, ``user_id`` and ``availability_zone`` are strings (or null);
an image object has only ``id``, ``name``, ``disk_format`` (strings) and
``properties`` (an object); every hint value is a string or a list of strings, and
``same_host``/``different_host`` hold instance uuids, as Nova's API schema requires.
``hints.group`` names a server group by uuid (as in Nova) or by name (Berth's
convenience; an ambiguous name is a 400 asking for the uuid): the request gets the
group as ``instance_group`` with the hosts its members are claimed on now (in the
shared database, so across every API and scheduler process). The instances join
its members before they are scheduled (as in Nova, so a concurrent boot's late group
check counts them once they run), and those not built leave it again. An unknown group
is a 400 naming ``hints.group``.

With ``"explain": true`` the answer (and every NoValidHost error body, also when placement
or a request filter refused before any filter ran) carries ``"diagnosis"``: per instance,
each filter's hosts in/out with the rejection reasons and the weighing of the best hosts —
``berth.explain.Diagnosis.to_dict()``, from which ``berth boot --explain`` rebuilds and
prints the same explanation as ``berth schedule --explain``.

Answer 200::

    {"instances": [{"instance_uuid": ..., "host": ..., "nodename": ...,
                    "compute_node_uuid": ..., "tried": [hosts built on, in order],
                    "alternates": [{"host", "nodename", "compute_node_uuid",
                                    "allocation_request", ...}],
                    "allocation_request": {...}, "allocation_request_version": "1.36"}]}

Each instance is built on its own (seed 004): one that fails on its host and every
alternate does not stop the others. When any instance was not built the answer is 409
with what was built and what was not, and no claim is left for an instance that was not
built::

    {"error": {"code": <the first failure's code>,
               "message": "1 of 3 instances not built (2 built): <the first failure's>"},
     "instances": [<built, as above>],
     "failed": [{"instance_uuid": ..., "tried": [hosts],
                 "error": {"code": "berth.scheduling.max_retries_exceeded", ...}}]}

Errors: 400 ``berth.input.*`` (malformed body, naming the field; ``Malformed JSON``
for a body that does not parse or nests too deeply), 409 for scheduling failures
(``berth.scheduling.no_valid_host``, ``...unsupported_policy``,
``...max_retries_exceeded``), 503 ``berth.unavailable`` with ``Retry-After`` when the
database is unreachable or locked past its timeout (reads such as ``GET /hosts`` are
retried first; a boot is not repeated, and one whose every failed instance failed for
that reason is a 503 listing what was built), or when a scheduler or compute agent
behind the message bus did not answer (``berth.unavailable.bus*``: the boot left no
claim behind and may be retried), as ``{"error": {"code": ..., "message": ...}}``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as SATimeoutError

from berth.errors import (
    BerthError,
    InputError,
    InstanceNotFound,
    NoValidHost,
    SchedulingError,
    ServiceUnavailable,
    error_dict,
)
from berth.explain import Diagnosis, FilterStep, InstanceDiagnosis
from berth.filters.availability_zone import host_zones
from berth.filters.compute import effective_service_down_time, services_up
from berth.hardware.numa import prepare_request
from berth.model.request import (
    DEFAULT_FLAVORS,
    Flavor,
    ImageMeta,
    RequestSpec,
    is_default_flavor,
)
from berth.model.selection import selection_dict
from berth.placement.dbfaults import as_unavailable, call_with_retry, describe, unavailable
from berth.service.boot_body import parse_boot, parse_server_group
from berth.service.conductor import BuildOutcome, Conductor, SchedulerAPI
from berth.service.groups import ServerGroupStore
from berth.service.httpjson import StartResponse
from berth.service.httpjson import read_json as _read_json
from berth.service.httpjson import reply as _reply
from berth.service.instances import spec_from_dict
from berth.service.move_api import handle_servers
from berth.service.moves import MoveService
from berth.service.policy import (
    BOOT,
    CATALOG,
    HOSTS,
    HOSTS_DRAIN,
    SERVER_GROUPS,
    SERVER_GROUPS_CREATE,
    scheduler_rules,
)
from berth.service.scheduler import SchedulerService
from berth.service.services_api import PREFIX as SERVICES_PREFIX
from berth.service.services_api import ServiceAdmin, handle_services, iso_time
from berth.service.webview import CapacityRuns, RecentDecisions, ViewRoutes
from berth.webauth.identity import Caller, NoAuth2
from berth.webauth.rules import Forbidden, PolicyEnforcer
from berth.webauth.settings import Security

LOG = logging.getLogger(__name__)

PLACEMENT_PREFIX = "/placement"

#: Routes answered without a token (``GET /metrics`` is answered before the app).
PUBLIC_ROUTES = frozenset({"/healthz", "/openapi.json", "/ui"})
#: The web view's routes (:mod:`berth.service.webview`).
VIEW_ROUTES = frozenset({"/ui", "/decisions", "/what-if", "/capacity"})
#: The methods each route answers: another is a 405 with this ``Allow`` header.
ROUTE_METHODS: dict[str, tuple[str, ...]] = {
    "/boot": ("POST",), "/hosts": ("GET",), "/healthz": ("GET",), "/openapi.json": ("GET",),
    "/compute-nodes": ("GET",), "/aggregates": ("GET",), "/cells": ("GET",), "/flavors": ("GET",),
    "/images": ("GET",), "/server-groups": ("GET", "POST"), "/ui": ("GET",),
    "/decisions": ("GET",), "/decisions/{id}": ("GET",), "/what-if": ("POST",),
    "/capacity": ("GET", "POST"),
    "/os-services": ("GET",), "/os-services/{host}": ("GET", "PUT", "DELETE"),
    "/servers": ("GET",), "/servers/{uuid}": ("GET", "DELETE"),
    "/servers/{uuid}/{action}": ("POST",), "/hosts/{host}/drain": ("POST",),
}


#: The parameter of each ``/{collection}/{parameter}`` route.
PATH_PARAMETERS = {"os-services": "host", "servers": "uuid", "decisions": "id"}


def allowed_methods(path: str) -> tuple[str, ...] | None:
    """The methods ``path``'s route answers (:data:`ROUTE_METHODS`, and HEAD wherever
    GET: RFC 9110 asks it of every server); None: no route."""
    parts = path.split("/")
    if len(parts) == 3 and parts[1] in ("os-services", "servers", "decisions") and parts[2]:
        template = f"/{parts[1]}/{{{PATH_PARAMETERS[parts[1]]}}}"
    elif len(parts) == 4 and parts[1] == "servers" and parts[2] and parts[3]:
        template = "/servers/{uuid}/{action}"
    elif drained_host(path) is not None:
        template = "/hosts/{host}/drain"
    else:
        template = path
    methods = ROUTE_METHODS.get(template)
    return (*methods, "HEAD") if methods is not None and "GET" in methods else methods
#: The rule guarding each read-only state route.
STATE_RULES = {"/compute-nodes": HOSTS, "/aggregates": HOSTS, "/cells": HOSTS, "/flavors": CATALOG,
               "/images": CATALOG, "/server-groups": SERVER_GROUPS}


def default_security() -> Security:
    """noauth2 (client role headers ignored) with the legacy rules: for tests and
    in-process use; servers build theirs from their options."""
    return Security(identity=NoAuth2(), policy=PolicyEnforcer(scheduler_rules(),
                                                              mode="legacy"))


def _allowing(start_response: StartResponse, allowed: tuple[str, ...]) -> StartResponse:
    """``start_response`` that gives a 405 the ``Allow`` header RFC 9110 asks of it."""

    def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        if status.startswith("405") and not any(k.lower() == "allow" for k, _ in headers):
            headers = [*headers, ("Allow", ", ".join(allowed))]
        return start_response(status, headers, exc_info) if exc_info else \
            start_response(status, headers)

    return start



class StateNotServed(BerthError):
    """A state route asked of a process that does not hold that state (404)."""

    code = "berth.http.not_found"


class SchedulerApp(ViewRoutes):
    """WSGI app: the scheduler routes, with Placement mounted under ``/placement``.

    ``groups`` resolves ``hints.group``; without it a request naming a group is a 400.
    ``moves`` serves ``/servers`` (:mod:`berth.service.move_api`); without it those
    routes answer 404.
    The conductor records the boot's instances as the group's members (its own
    ``groups``, the same store when both come from one stack).
    """

    def __init__(
        self,
        service: SchedulerService | SchedulerAPI,
        conductor: Conductor,
        placement_app: Any,
        flavors: Mapping[str, Flavor] | None = None,
        images: Mapping[str, ImageMeta] | None = None,
        groups: ServerGroupStore | None = None,
        moves: MoveService | None = None,
        hosts_view: Callable[[], dict[str, Any]] | None = None,
        security: Security | None = None,
        services: ServiceAdmin | None = None,
    ) -> None:
        self.service = service
        #: Who may call what (:mod:`berth.service.policy`); the server wraps the app in
        #: ``security.identity.wrap`` once, outside.
        self.security = security or default_security()
        self.moves = moves
        #: What ``GET /hosts`` answers: the scheduler's view (in process, or asked of a
        #: scheduler process over the bus).
        if hosts_view is None:
            if not isinstance(service, SchedulerService):
                raise ValueError("a scheduler API over a remote scheduler needs hosts_view")
            local = service

            def hosts_view() -> dict[str, Any]:
                return hosts_answer(local)

        self.hosts_view = hosts_view
        #: What ``/os-services`` changes (without one: the switches only, through the
        #: conductor's driver; no deletion).
        if services is None and conductor is not None:
            services = ServiceAdmin(driver=conductor.driver)
        self.services = services
        self.conductor = conductor
        self.placement_app = placement_app
        self.flavors = dict(flavors or DEFAULT_FLAVORS)
        self.images = dict(images or {})
        self.groups = groups
        #: The latest boots and their funnels, for the web view.
        self.recent = RecentDecisions()
        #: The whole app as served (identity middleware included), which the web view's
        #: capacity report reads the cloud through; ``berth serve`` sets it.
        self.served_app: Any = None
        self.capacity_runs = CapacityRuns()

    #: The read-only state routes and the method answering each.
    STATE_ROUTES = {"/compute-nodes": "compute_nodes", "/aggregates": "aggregates",
                    "/cells": "cell_list",
                    "/flavors": "flavor_list", "/images": "image_list",
                    "/server-groups": "server_groups"}

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "") or "/"
        if path == PLACEMENT_PREFIX or path.startswith(PLACEMENT_PREFIX + "/"):
            environ["SCRIPT_NAME"] = environ.get("SCRIPT_NAME", "") + PLACEMENT_PREFIX
            environ["PATH_INFO"] = path[len(PLACEMENT_PREFIX):]
            return self.placement_app(environ, start_response)  # type: ignore[no-any-return]
        path = _utf8(path)  # a host or instance named in the path, as sent
        method = environ.get("REQUEST_METHOD", "GET")
        if method == "HEAD":
            method = "GET"  # answered as GET; the server sends the head alone
        allowed = allowed_methods(path)
        if allowed is not None:
            start_response = _allowing(start_response, allowed)
        caller = self.security.identity.caller(environ)
        if caller is None and path not in PUBLIC_ROUTES:
            return _reply(start_response, 401, {"error": {
                "code": "berth.auth.unauthenticated",
                "message": "this route needs a valid X-Auth-Token"}},
                [("WWW-Authenticate", challenge)] if (
                    challenge := self.security.identity.challenge) else [])
        try:
            if path == "/boot":
                if method != "POST":
                    return _reply(start_response, 405, {"error": {"code": "berth.http.method",
                                                                  "message": "use POST"}})
                assert caller is not None
                body = self._for_caller(_read_json(environ), caller)
                answer = self.boot(body)
                return _reply(start_response, _boot_status(answer), answer,
                              _retry_after(answer))
            if path in VIEW_ROUTES or path.startswith("/decisions/"):
                return self._view(path, method, environ, caller, start_response)
            if path == "/server-groups" and method == "POST":
                assert caller is not None
                body = self._for_caller(_read_json(environ), caller, SERVER_GROUPS_CREATE)
                return _reply(start_response, 200, self.create_server_group(body))
            if path == "/hosts" and method == "GET":
                self._enforce(HOSTS, caller, None)
                return _reply(start_response, 200,
                              call_with_retry(self.hosts, safe=True, what="GET /hosts"))
            if path == "/healthz" and method == "GET":
                return _reply(start_response, 200, {"status": "ok"})
            if path == "/openapi.json" and method == "GET":
                from berth.service.openapi import document

                return _reply(start_response, 200, document())
            if self.services is not None and (
                    path == SERVICES_PREFIX or path.startswith(SERVICES_PREFIX + "/")):
                body = _read_json(environ) if method == "PUT" else None
                status, served = handle_services(
                    method, path, body, admin=self.services,
                    hosts=lambda: call_with_retry(self.hosts, safe=True,
                                                  what=f"{method} {SERVICES_PREFIX}"),
                    authorize=lambda rule: self._enforce(rule, caller, None))
                if served is None:
                    start_response("204 No Content", [])
                    return [b""]
                return _reply(start_response, status, served)
            host = drained_host(path)
            if host is not None and method == "POST":
                return self._drain(host, environ, caller, start_response)
            if path == "/servers" or path.startswith("/servers/"):
                body = _read_json(environ) if method == "POST" else None
                started = time.perf_counter()
                try:
                    status, answer = handle_servers(
                        self.moves, method, path, body, self.flavors, self.images,
                        authorize=lambda rule, project: self._enforce(rule, caller, project))
                except SchedulingError as exc:
                    self._record_move(path, None, exc, time.perf_counter() - started)
                    raise
                if status == 200 and method == "POST" and isinstance(answer, Mapping) \
                        and "operation" in answer:
                    self._record_move(path, answer, None, time.perf_counter() - started)
                return _reply(start_response, status, answer)
            if method == "GET" and path in self.STATE_ROUTES:
                self._enforce(STATE_RULES[path], caller, None)
                read = getattr(self, self.STATE_ROUTES[path])
                try:
                    return _reply(start_response, 200,
                                  call_with_retry(read, safe=True, what=f"GET {path}"))
                except StateNotServed as exc:
                    return _reply(start_response, 404, _error(exc))
            if allowed is not None and method not in allowed:
                return _reply(start_response, 405, {"error": {
                    "code": "berth.http.method", "message": f"use {' or '.join(allowed)}"}})
            return _reply(start_response, 404, {"error": {"code": "berth.http.not_found",
                                                          "message": f"no route {method} {path}"}})
        except Forbidden as exc:
            return _reply(start_response, 403, {"error": {"code": "berth.auth.forbidden",
                                                          "message": str(exc)}})
        except InstanceNotFound as exc:
            return _reply(start_response, 404, _error(exc))
        except InputError as exc:
            return _reply(start_response, 400, _error(exc))
        except ServiceUnavailable as exc:
            return _reply(start_response, 503, _error(exc),
                          [("Retry-After", str(exc.retry_after))])
        except (DBAPIError, SATimeoutError) as exc:
            if not unavailable(exc):
                LOG.exception("%s %s failed", method, path)
                return _reply(start_response, 500, {"error": {
                    "code": "berth.internal", "message": "internal error (logged)"}})
            LOG.warning("%s %s: %s", method, path, describe(exc))
            down = as_unavailable(exc)
            return _reply(start_response, 503, _error(down),
                          [("Retry-After", str(down.retry_after))])
        except SchedulingError as exc:
            body = _error(exc)
            diagnosis = getattr(exc, "diagnosis", None)
            if diagnosis is not None:
                body["diagnosis"] = diagnosis.to_dict()
            return _reply(start_response, 409, body)
        except BerthError as exc:
            return _reply(start_response, 400, _error(exc))
        except Exception:  # a bug must not kill the server; it is logged with its trace
            LOG.exception("%s %s failed", method, path)
            return _reply(start_response, 500, {"error": {"code": "berth.internal",
                                                          "message": "internal error (logged)"}})

    def _enforce(self, rule: str, caller: Caller | None, project: str | None) -> None:
        assert caller is not None
        self.security.policy.enforce(rule, caller, {"project_id": project})

    def _for_caller(self, body: Any, caller: Caller, rule: str = BOOT) -> Any:
        """The boot (or server group) body with the caller's project and user where it
        names none, once the caller may act for that project under ``rule`` (only an
        admin or a service may act for another project)."""
        if not isinstance(body, Mapping):
            return body  # parse_boot names the problem
        body = dict(body)
        if body.get("project_id") is None:
            body["project_id"] = caller.project_id
        if body.get("user_id") is None:
            body["user_id"] = caller.user_id or None
        project = body["project_id"]
        self._enforce(rule, caller, project if isinstance(project, str) else None)
        return body

    def boot(self, body: Any) -> dict[str, Any]:
        """Schedule and build; the placements per instance, and the instances that
        failed (under ``"failed"``, with an ``"error"``) when some did."""
        spec = self.boot_spec(body)
        explain = bool(body.get("explain", False))
        # The API names the instances before it asks for hosts, as Nova's does; they
        # are group members from then on (those not built leave the group again).
        uuids = self.service.new_instance_uuids(spec.num_instances)
        started = time.perf_counter()
        try:
            decision, outcome = self.conductor.schedule_and_build(spec, uuids, explain=explain)
        except SchedulingError as exc:
            if (explain and isinstance(exc, NoValidHost) and exc.diagnosis is None
                    and isinstance(self.service, SchedulerService)):
                exc.diagnosis = refusal_diagnosis(self.service)
            self.recent.refused(spec, exc, time.perf_counter() - started)
            raise
        answer = _boot_answer(decision.selections, decision.instance_uuids, outcome)
        if decision.diagnosis is not None:
            answer["diagnosis"] = decision.diagnosis.to_dict()
        self.recent.placed(spec, decision, answer, time.perf_counter() - started)
        return answer

    def _drain(self, host: str, environ: dict[str, Any], caller: Any,
               start_response: StartResponse) -> Iterable[bytes]:
        """``POST /hosts/{host}/drain`` (:mod:`berth.service.drain`)."""
        from berth.service.drain import drain_host, drain_status, parse_drain

        self._enforce(HOSTS_DRAIN, caller, None)
        operation = parse_drain(_read_json(environ))
        if self.moves is None or not self.moves.moves_here:
            return _reply(start_response, 404, {"error": {
                "code": "berth.http.not_found", "message": "drain: moves are served by "
                "berth serve, whose scheduler runs in process"}})

        def observe(uuid: str, went: Mapping[str, Any] | None, error: Any,
                    seconds: float) -> None:
            refusal = error if isinstance(error, SchedulingError) else None
            if went is not None or refusal is not None:
                self._record_move(f"/servers/{uuid}/{operation}", went, refusal, seconds)

        answer = drain_host(self.moves, host, operation, observe=observe)
        return _reply(start_response, drain_status(answer), answer)

    def _record_move(self, path: str, answer: Mapping[str, Any] | None,
                     refusal: SchedulingError | None, seconds: float) -> None:
        """A move's decision for the web view: where the instance went, or why not."""
        parts = path.split("/")
        if self.moves is None or len(parts) != 4:
            return
        try:  # after the move: its answer must not turn into an error here
            record = self.moves.instances.get(parts[2])
            if record is None:
                return
            spec = spec_from_dict(record.spec)  # the flavor it has now (a resize's new one)
            if refusal is not None:
                self.recent.refused(spec, refusal, seconds, operation=parts[3])
            elif answer is not None:
                self.recent.moved(spec, answer, seconds)
        except Exception:  # the web view's list only
            LOG.warning("could not list the decision of %s", path, exc_info=True)

    def boot_spec(self, body: Any) -> RequestSpec:
        """A boot body as the request it asks for, with the server group ``hints.group``
        names (its members' hosts as claimed now)."""
        spec = parse_boot(body, self.flavors, self.images)
        # The guest's NUMA topology and PCI requests from the flavor and image, as Nova's
        # API derives them before the request reaches the scheduler (bad extra specs: 400).
        prepare_request(spec, self.service.config)
        group_ref = spec.get_scheduler_hint("group")
        if group_ref is not None:
            spec.instance_group = self._group(group_ref)
        return spec

    def create_server_group(self, body: Any) -> dict[str, Any]:
        """``POST /server-groups``: a new group (a new uuid; names need not be unique,
        as in Nova) with its policy and rules (``max_server_per_host`` with
        anti-affinity only, as Nova's API 2.64 allows)."""
        if self.groups is None:
            raise InputError("this server keeps no server groups", field="body")
        group = parse_server_group(body)
        self.groups.put(group)
        return {"server_group": {"uuid": group.uuid, "name": group.name,
                                 "policy": group.policy, "rules": dict(group.rules),
                                 "members": [], "project_id": group.project_id,
                                 "user_id": group.user_id}}

    def _group(self, ref: str) -> Any:
        """The server group ``hints.group`` names, with the hosts its members are
        claimed on now."""
        if self.groups is None:
            raise InputError(f"hints.group: this server keeps no server groups, so "
                             f"{ref!r} names none", field="hints.group")
        return self.groups.resolve(ref)

    def hosts(self) -> dict[str, Any]:
        """``GET /hosts``."""
        return self.hosts_view()

    def compute_nodes(self) -> dict[str, Any]:
        """Every stored compute-node report as the agents published it, each with
        ``reporting``: its heartbeat is no older than the effective
        ``service_down_time`` now (whether disabled or forced down, which the report's
        service row says itself)."""
        import numpy as np

        service = self._local_service("/compute-nodes")
        snap = service.refresh()
        config = service.config
        down_time = effective_service_down_time(config.service_down_time, config.report_interval)
        off = np.zeros(len(snap), dtype=bool)
        fresh = services_up(off, off, snap.num("service_heartbeat"), service.clock(), down_time)
        verdicts = {snap.obj("uuid")[row]: bool(fresh[row]) for row in range(len(snap))}
        return {"compute_nodes": [{**r, "reporting": verdicts.get(r.get("uuid"), False)}
                                  for r in service.feed.store.reports()]}

    def aggregates(self) -> dict[str, Any]:
        """The host aggregates the scheduler sees."""
        snap = self._local_service("/aggregates").refresh()
        return {"aggregates": [{"id": a.id, "uuid": a.uuid, "name": a.name,
                                "hosts": list(a.hosts), "metadata": dict(a.metadata)}
                               for a in sorted(snap.aggregates, key=lambda a: a.id)]}

    def cell_list(self) -> dict[str, Any]:
        """The cell mappings stored with the aggregates (a cloud file's ``cells``):
        the scheduler leaves a disabled cell's hosts out unless a request keeps to it."""
        store = self._local_service("/cells").feed.store
        return {"cells": [{"uuid": c.uuid, "name": c.name, "disabled": c.disabled}
                          for c in store.cell_mappings()]}

    def flavor_list(self) -> dict[str, Any]:
        """The flavors ``POST /boot`` accepts by name (the cloud file's and the defaults;
        ``berth_default`` tells them apart)."""
        return {"flavors": [{"name": name, "id": f.id, "flavorid": f.flavorid,
                             "vcpus": f.vcpus, "memory_mb": f.memory_mb, "root_gb": f.root_gb,
                             "ephemeral_gb": f.ephemeral_gb, "swap": f.swap,
                             "extra_specs": dict(f.extra_specs),
                             "berth_default": is_default_flavor(name, f)}
                            for name, f in self.flavors.items()]}

    def image_list(self) -> dict[str, Any]:
        """The images ``POST /boot`` accepts by name, properties as they were given."""
        return {"images": [{"id": i.id, "name": i.name, "disk_format": i.disk_format,
                            "properties": dict(i.properties.raw)}
                           for i in self.images.values()]}

    def server_groups(self) -> dict[str, Any]:
        """The stored server groups with their members."""
        groups = self.groups.all() if self.groups is not None else []
        return {"server_groups": [{"uuid": g.uuid, "name": g.name, "policy": g.policy,
                                   "rules": dict(g.rules), "members": list(g.members),
                                   "project_id": g.project_id, "user_id": g.user_id}
                                  for g in groups]}

    def _local_service(self, route: str) -> SchedulerService:
        """The scheduler service of this process; the state routes read its records."""
        if not isinstance(self.service, SchedulerService):
            raise StateNotServed(f"GET {route}: served by berth serve (a scheduler in the "
                                 "same process), not by an API process of the distributed form")
        return self.service



def refusal_diagnosis(service: SchedulerService) -> Diagnosis:
    """The explanation of a NoValidHost raised before any filter ran (a request
    filter's refusal, an unknown forced host), shaped as the pipeline shapes its own:
    one instance, one step, no host through. Placement's empty answers are explained
    by the scheduler itself (each node's reason in the ``placement`` step).
    """
    snapshot = service.refresh()
    step = FilterStep("request filters", len(snapshot), 0)
    return Diagnosis([InstanceDiagnosis(0, None, hosts_considered=len(snapshot),
                                        steps=[step])])


def hosts_answer(service: SchedulerService) -> dict[str, Any]:
    """Every node's capacity, usage and liveness from the scheduler's snapshot.

    ``up`` is ComputeFilter's verdict on the service alone: not disabled, not forced
    down, and a heartbeat no older than the effective ``service_down_time``
    (``heartbeat_age_s`` is null for a node that never reported one).
    """
    snap = service.refresh()
    config = service.config
    down_time = effective_service_down_time(config.service_down_time, config.report_interval)
    now = service.clock()
    up = services_up(snap.num("service_disabled"), snap.num("service_forced_down"),
                     snap.num("service_heartbeat"), now, down_time)
    # The heartbeat's verdict alone (Nova's service ``state`` adds forced_down).
    none = np.zeros(len(snap), dtype=bool)
    reporting = services_up(none, none, snap.num("service_heartbeat"), now, down_time)
    zones: dict[int, str] = {}
    codes = snap.codes("aggregates")
    default_zone = config.default_availability_zone
    rows = []
    # Rows change only under the service's lock, which a concurrent /boot may hold
    # meanwhile; a row read twice is at worst one report apart.
    for row in range(len(snap)):
        code = int(codes[row])
        zone = zones.get(code)
        if zone is None:
            zone = zones[code] = ",".join(sorted(host_zones(
                snap.aggregates_of_signature(code), default_zone)))
        rows.append({
            "host": snap.obj("host")[row], "nodename": snap.obj("nodename")[row],
            "uuid": snap.obj("uuid")[row], "cell": snap.interned_value("cell_uuid", row),
            "vcpus": _num(snap.num("vcpus_total")[row]),
            "vcpus_used": _num(snap.num("vcpus_used")[row]),
            "memory_mb": _num(snap.num("total_usable_ram_mb")[row]),
            "free_ram_mb": _num(snap.num("free_ram_mb")[row]),
            "free_disk_mb": _num(snap.num("free_disk_mb")[row]),
            "num_instances": _num(snap.num("num_instances")[row]),
            # What placement keeps back of each (this process's nova.conf, as an
            # agent's reserved amounts come from its own).
            "vcpus_reserved": _reserved(config.reserved_host_cpus, snap.num("vcpus_total")[row]),
            "memory_mb_reserved": _reserved(config.reserved_host_memory_mb,
                                            snap.num("total_usable_ram_mb")[row]),
            "cpu_allocation_ratio": _ratio(snap.num("cpu_allocation_ratio")[row]),
            "ram_allocation_ratio": _ratio(snap.num("ram_allocation_ratio")[row]),
            "zone": zone,
            **_liveness(snap, row, now, bool(up[row])),
            "reporting": bool(reporting[row]),
        })
    return {"hosts": rows}



def _liveness(snap: Any, row: int, now: float, up: bool) -> dict[str, Any]:
    """A node's service state, with ComputeFilter's verdict ``up``."""
    disabled = bool(snap.num("service_disabled")[row])
    beat = float(snap.num("service_heartbeat")[row])
    service = snap.obj("service")[row]
    return {"disabled": disabled,
            "disabled_reason": getattr(service, "disabled_reason", None) if disabled else None,
            "forced_down": bool(snap.num("service_forced_down")[row]),
            "heartbeat_age_s": None if math.isnan(beat) else round(abs(now - beat), 1),
            "last_seen_up": None if math.isnan(beat) else iso_time(beat),
            "up": up}


def _boot_answer(selections: Any, uuids: Any, outcome: BuildOutcome) -> dict[str, Any]:
    """The answer of ``POST /boot``: each built instance with its host list, and (with
    an overall ``error``) those that were not built."""
    hosts_of = dict(zip(uuids, selections))
    out = []
    for result in outcome.built:
        hosts = result.host_list or hosts_of[result.instance_uuid]
        built = next((s for s in hosts if s.service_host == result.host), hosts[0])
        entry = {"instance_uuid": result.instance_uuid, "tried": result.tried,
                 **selection_dict(built)}
        entry["alternates"] = [selection_dict(s) for s in hosts[1:]]
        out.append(entry)
    answer: dict[str, Any] = {"instances": out}
    if outcome.failed:
        first = outcome.failed[0].error
        answer["error"] = {"code": first.code, "message": (
            f"{len(outcome.failed)} of {len(uuids)} instances not built "
            f"({len(outcome.built)} built): {first.message}")}
        answer["failed"] = [{"instance_uuid": f.instance_uuid, "tried": f.tried,
                             "error": {"code": f.error.code, "message": f.error.message}}
                            for f in outcome.failed]
    return answer


def drained_host(path: str) -> str | None:
    """The host of a ``/hosts/{host}/drain`` path (exactly that: nothing more), or None."""
    parts = path.split("/")
    if len(parts) == 4 and parts[1] == "hosts" and parts[2] and parts[3] == "drain":
        return parts[2]
    return None


def _utf8(path: str) -> str:
    """PATH_INFO as the client wrote it: WSGI hands it over decoded as latin-1, so
    ``/hosts/h%C3%B4te1/drain`` would name 'hÃ´te1'; kept as it is when not UTF-8."""
    try:
        return path.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return path


def _boot_status(answer: Mapping[str, Any]) -> int:
    """200 when every instance was built; 503 when none of the failures was anything
    but the database being unavailable; else 409."""
    failed = answer.get("failed")
    if not failed:
        return 200
    if all(f["error"]["code"] == ServiceUnavailable.code for f in failed):
        return 503
    return 409


def _retry_after(answer: Mapping[str, Any]) -> list[tuple[str, str]]:
    if _boot_status(answer) == 503:
        return [("Retry-After", str(ServiceUnavailable.retry_after))]
    return []


def _reserved(amount: int, total: float) -> int | None:
    """``amount`` as an agent reserves it of ``total`` (never more than the total)."""
    return None if math.isnan(total) else min(int(amount), int(total))


def _ratio(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def _num(value: float) -> int | None:
    return None if math.isnan(value) else int(value)


def _error(exc: BerthError) -> dict[str, Any]:
    return {"error": error_dict(exc)}


