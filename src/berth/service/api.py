"""The scheduler HTTP API of ``berth serve``, beside the Placement API.

Routes (JSON in, JSON out)::

    POST /boot          schedule and build instances (below)
    GET  /hosts         every compute node with its usage as the scheduler sees it
    GET  /healthz       {"status": "ok"}
    *    /placement/... the Placement API (same database)

``POST /boot`` body::

    {"flavor": "m1.small" | {"vcpus": 2, "memory_mb": 2048, "root_gb": 20,
                             "ephemeral_gb": 0, "swap": 0, "extra_specs": {...}},
     "image": null | "cirros" | {"disk_format": "qcow2", "properties": {...}},
     "hints": {"key": "value" | ["v1", "v2"]},
     "num": 1, "project_id": "demo", "user_id": "demo", "availability_zone": null,
     "force_hosts": [], "ignore_hosts": [], "explain": false}

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

Errors: 400 ``berth.input.*`` (malformed body, naming the field), 409 for scheduling
failures (``berth.scheduling.no_valid_host``, ``...max_retries_exceeded``), as
``{"error": {"code": ..., "message": ...}}``.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from berth.errors import BerthError, InputError, NoValidHost, SchedulingError
from berth.explain import Diagnosis, FilterStep, InstanceDiagnosis
from berth.model.image_props import ImagePropertyError, show
from berth.model.request import Flavor, ImageMeta, ImageMetaProps, RequestSpec
from berth.service.conductor import Conductor
from berth.service.scheduler import SchedulerService, selection_dict

LOG = logging.getLogger(__name__)

PLACEMENT_PREFIX = "/placement"
MAX_BODY = 1 << 20

#: Flavors ``berth serve`` knows without a cloud file (Nova's classic defaults).
DEFAULT_FLAVORS: dict[str, Flavor] = {
    f.name: f for f in (
        Flavor(name="m1.tiny", vcpus=1, memory_mb=512, root_gb=1, id=1),
        Flavor(name="m1.small", vcpus=1, memory_mb=2048, root_gb=20, id=2),
        Flavor(name="m1.medium", vcpus=2, memory_mb=4096, root_gb=40, id=3),
        Flavor(name="m1.large", vcpus=4, memory_mb=8192, root_gb=80, id=4),
        Flavor(name="m1.xlarge", vcpus=8, memory_mb=16384, root_gb=160, id=5),
    )
}

StartResponse = Callable[..., Any]


def _int(body: Mapping[str, Any], key: str, where: str, default: int | None = None,
         minimum: int = 0) -> int:
    value = body.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"{where}{key}: expected an integer >= {minimum}, got {value!r}")
    return value


def _str_map(value: Any, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InputError(f"{where}: expected an object of strings, got {value!r}")
    return {str(k): str(v) for k, v in value.items()}


def parse_flavor(value: Any, flavors: Mapping[str, Flavor]) -> Flavor:
    """A flavor name known to the server, or an inline flavor object."""
    if isinstance(value, str):
        if value not in flavors:
            raise InputError(f"flavor: no flavor named {value!r}; known: {', '.join(sorted(flavors))}")
        return flavors[value]
    if not isinstance(value, Mapping):
        raise InputError(f"flavor: expected a flavor name or an object, got {value!r}")
    unknown = set(value) - {"name", "vcpus", "memory_mb", "root_gb", "ephemeral_gb", "swap",
                            "extra_specs", "id"}
    if unknown:
        raise InputError(f"flavor: unknown field(s) {', '.join(sorted(unknown))}")
    return Flavor(
        name=str(value.get("name", "custom")), vcpus=_int(value, "vcpus", "flavor.", minimum=1),
        memory_mb=_int(value, "memory_mb", "flavor.", minimum=1),
        root_gb=_int(value, "root_gb", "flavor.", 0), ephemeral_gb=_int(value, "ephemeral_gb", "flavor.", 0),
        swap=_int(value, "swap", "flavor.", 0), id=value.get("id"),
        extra_specs=_str_map(value.get("extra_specs"), "flavor.extra_specs"))


def parse_image(value: Any, images: Mapping[str, ImageMeta]) -> ImageMeta | None:
    """An image name known to the server, an inline image object, or None."""
    if value is None:
        return None
    if isinstance(value, str):
        if value not in images:
            raise InputError(f"image: no image named {value!r}")
        return images[value]
    if not isinstance(value, Mapping):
        raise InputError(f"image: expected an image name or an object, got {value!r}")
    props = value.get("properties") or {}
    if not isinstance(props, Mapping):
        raise InputError(f"image.properties: expected an object, got {props!r}")
    try:
        properties = ImageMetaProps(props)
    except ImagePropertyError as exc:
        raise InputError(f"image.properties.{exc.key}: {exc.problem}, got {show(exc.value)}",
                         field=f"image.properties.{exc.key}") from None
    return ImageMeta(id=value.get("id"), name=value.get("name"),
                     disk_format=value.get("disk_format"), properties=properties)


def _str_list(value: Any, where: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InputError(f"{where}: expected a list of strings, got {value!r}")
    return list(value) or None


def parse_boot(body: Any, flavors: Mapping[str, Flavor], images: Mapping[str, ImageMeta]) -> RequestSpec:
    """The request spec of a ``POST /boot`` body (errors name the field)."""
    if not isinstance(body, Mapping):
        raise InputError("body: expected a JSON object")
    unknown = set(body) - {"flavor", "image", "hints", "num", "project_id", "user_id",
                           "availability_zone", "force_hosts", "ignore_hosts", "explain"}
    if unknown:
        raise InputError(f"body: unknown field(s) {', '.join(sorted(unknown))}")
    if "flavor" not in body:
        raise InputError("flavor: required field is missing")
    hints = body.get("hints") or {}
    if not isinstance(hints, Mapping):
        raise InputError(f"hints: expected an object, got {hints!r}")
    return RequestSpec(
        flavor=parse_flavor(body["flavor"], flavors), image=parse_image(body.get("image"), images),
        scheduler_hints=dict(hints) or None, num_instances=_int(body, "num", "", 1, minimum=1),
        project_id=str(body.get("project_id", "demo")), user_id=str(body.get("user_id", "demo")),
        availability_zone=body.get("availability_zone"),
        force_hosts=_str_list(body.get("force_hosts"), "force_hosts"),
        ignore_hosts=_str_list(body.get("ignore_hosts"), "ignore_hosts"),
    )


class SchedulerApp:
    """WSGI app: the scheduler routes, with Placement mounted under ``/placement``."""

    def __init__(
        self,
        service: SchedulerService,
        conductor: Conductor,
        placement_app: Any,
        flavors: Mapping[str, Flavor] | None = None,
        images: Mapping[str, ImageMeta] | None = None,
    ) -> None:
        self.service = service
        self.conductor = conductor
        self.placement_app = placement_app
        self.flavors = dict(flavors or DEFAULT_FLAVORS)
        self.images = dict(images or {})

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "") or "/"
        if path == PLACEMENT_PREFIX or path.startswith(PLACEMENT_PREFIX + "/"):
            environ["SCRIPT_NAME"] = environ.get("SCRIPT_NAME", "") + PLACEMENT_PREFIX
            environ["PATH_INFO"] = path[len(PLACEMENT_PREFIX):]
            return self.placement_app(environ, start_response)  # type: ignore[no-any-return]
        method = environ.get("REQUEST_METHOD", "GET")
        try:
            if path == "/boot":
                if method != "POST":
                    return _reply(start_response, 405, {"error": {"code": "berth.http.method",
                                                                  "message": "use POST"}})
                return _reply(start_response, 200, self.boot(_read_json(environ)))
            if path == "/hosts" and method == "GET":
                return _reply(start_response, 200, self.hosts())
            if path == "/healthz" and method == "GET":
                return _reply(start_response, 200, {"status": "ok"})
            return _reply(start_response, 404, {"error": {"code": "berth.http.not_found",
                                                          "message": f"no route {method} {path}"}})
        except InputError as exc:
            return _reply(start_response, 400, _error(exc))
        except SchedulingError as exc:
            body = _error(exc)
            diagnosis = getattr(exc, "diagnosis", None)
            if diagnosis is not None:
                body["diagnosis"] = diagnosis.to_dict()
            return _reply(start_response, 409, body)
        except BerthError as exc:
            return _reply(start_response, 400, _error(exc))
        except Exception:  # a bug must not kill the server; it is logged with its trace
            LOG.exception("POST %s failed", path)
            return _reply(start_response, 500, {"error": {"code": "berth.internal",
                                                          "message": "internal error (logged)"}})

    def boot(self, body: Any) -> dict[str, Any]:
        """Schedule and build; the placements per instance."""
        spec = parse_boot(body, self.flavors, self.images)
        explain = bool(body.get("explain", False))
        # The API names the instances before it asks for hosts, as Nova's does.
        uuids = self.service.new_instance_uuids(spec.num_instances)
        try:
            decision = self.service.select_destinations(spec, uuids, explain=explain)
        except NoValidHost as exc:
            if explain and exc.diagnosis is None:
                exc.diagnosis = self._refusal_diagnosis()
            raise
        out = []
        for uuid, hosts in zip(decision.instance_uuids, decision.selections):
            result = self.conductor.build_one(uuid, hosts, spec)
            built = next((s for s in hosts if s.service_host == result.host), hosts[0])
            entry = {"instance_uuid": uuid, "tried": result.tried, **selection_dict(built)}
            entry["alternates"] = [selection_dict(s) for s in hosts[1:]]
            out.append(entry)
        answer: dict[str, Any] = {"instances": out}
        if decision.diagnosis is not None:
            answer["diagnosis"] = decision.diagnosis.to_dict()
        return answer

    def _refusal_diagnosis(self) -> Diagnosis:
        """The explanation of a NoValidHost raised before any filter ran (a request
        filter's refusal, an unknown forced host), shaped as the pipeline shapes its own:
        one instance, one step, no host through. Placement's empty answers are explained
        by the scheduler itself (each node's reason in the ``placement`` step).
        """
        snapshot = self.service.refresh()
        step = FilterStep("request filters", len(snapshot), 0)
        return Diagnosis([InstanceDiagnosis(0, None, hosts_considered=len(snapshot),
                                            steps=[step])])

    def hosts(self) -> dict[str, Any]:
        """Every node's capacity and usage from the scheduler's snapshot."""
        snap = self.service.refresh()
        rows = []
        # Rows change only under the service's lock, which a concurrent /boot may hold
        # meanwhile; a row read twice is at worst one report apart.
        for row in range(len(snap)):
            rows.append({
                "host": snap.obj("host")[row], "nodename": snap.obj("nodename")[row],
                "uuid": snap.obj("uuid")[row],
                "vcpus": _num(snap.num("vcpus_total")[row]),
                "vcpus_used": _num(snap.num("vcpus_used")[row]),
                "memory_mb": _num(snap.num("total_usable_ram_mb")[row]),
                "free_ram_mb": _num(snap.num("free_ram_mb")[row]),
                "free_disk_mb": _num(snap.num("free_disk_mb")[row]),
                "num_instances": _num(snap.num("num_instances")[row]),
                "disabled": bool(snap.num("service_disabled")[row]),
            })
        return {"hosts": rows}


def _num(value: float) -> int | None:
    return None if math.isnan(value) else int(value)


def _error(exc: BerthError) -> dict[str, Any]:
    return {"error": {"code": exc.code, "message": exc.message}}


def _read_json(environ: dict[str, Any]) -> Any:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        raise InputError("Content-Length: not an integer") from None
    if length > MAX_BODY:
        raise InputError(f"body: larger than {MAX_BODY} bytes")
    raw = environ["wsgi.input"].read(length) if length else b""
    try:
        return json.loads(raw or b"null")
    except ValueError as exc:
        raise InputError(f"body: not valid JSON: {exc}") from None


def _json_default(value: Any) -> Any:
    # A filter's rejection numbers may hold sets or other objects: never a 500 for those.
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    return str(value)


def _reply(start_response: StartResponse, status: int, body: Any) -> list[bytes]:
    data = json.dumps(body, default=_json_default).encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
              409: "Conflict", 500: "Internal Server Error"}[status]
    start_response(f"{status} {reason}", [("Content-Type", "application/json"),
                                          ("Content-Length", str(len(data)))])
    return [data]
