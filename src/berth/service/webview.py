"""The web view of ``berth serve``: one page (``GET /ui``) and the routes it reads.

    GET  /ui          the page (no token: it asks for one and sends it with every call)
    GET  /decisions   the latest boots (newest first): flavor, number, project, the hosts
                      chosen or why not, how long it took, the hosts each filter removed,
                      and the explanation funnel of boots that asked for one
    POST /what-if     a boot body (as ``POST /boot``): the explained decision it would
                      get now; nothing is claimed or built
                      (:meth:`~berth.service.scheduler.SchedulerService.what_if`)
    POST /capacity    start a capacity report of the running cloud
                      ({"flavors": [...], "limit": N}; ``berth capacity --url`` in the
                      server, in the background); 202
    GET  /capacity    its state: idle, running, ready (with the report) or failed

The page shows the compute nodes grouped by cell and availability zone (or by host
aggregate), each colored by its utilization, the latest decisions with their funnels,
the what-if form, and the capacity by flavor. It is one self-contained HTML file
(``webview.html``): no script, style or font is fetched from anywhere else.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any

from berth.errors import BerthError, InputError, NoValidHost, SchedulingError, error_dict
from berth.service.httpjson import StartResponse, read_json, reply, reply_bytes
from berth.service.policy import HOSTS, WHAT_IF

#: Decisions kept for the view.
RECENT = 50


class RecentDecisions:
    """The latest boots, newest last (thread-safe: a bounded deque)."""

    def __init__(self, size: int = RECENT) -> None:
        self.entries: deque[dict[str, Any]] = deque(maxlen=size)

    def _base(self, spec: Any, seconds: float) -> dict[str, Any]:
        return {"time": time.time(), "flavor": spec.flavor.name, "num": spec.num_instances,
                "project_id": spec.project_id, "ms": round(seconds * 1000.0, 2),
                "availability_zone": spec.availability_zone}

    def placed(self, spec: Any, decision: Any, answer: Mapping[str, Any], seconds: float) -> None:
        """A boot that found hosts (some builds may still have failed)."""
        entry = self._base(spec, seconds)
        entry.update(outcome="placed" if not answer.get("failed") else "partly built",
                     instances=[{"instance_uuid": i["instance_uuid"], "host": i["host"],
                                 "nodename": i.get("nodename")}
                                for i in answer.get("instances", [])],
                     funnel=dict(decision.rejections))
        if decision.diagnosis is not None:
            entry["diagnosis"] = decision.diagnosis.to_dict()
        self.entries.append(entry)

    def refused(self, spec: Any, exc: NoValidHost, seconds: float) -> None:
        """A boot refused with NoValidHost."""
        entry = self._base(spec, seconds)
        entry.update(outcome="refused", cause=exc.cause, message=exc.message,
                     funnel=dict(exc.rejections), instances=[])
        if exc.fitted is not None:
            entry["instances_fit"] = exc.fitted
        if exc.diagnosis is not None:
            entry["diagnosis"] = exc.diagnosis.to_dict()
        self.entries.append(entry)

    def latest(self, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` entries, newest first."""
        return list(reversed(list(self.entries)))[:limit]


class CapacityRuns:
    """One capacity report at a time, computed in a background thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.state: dict[str, Any] = {"status": "idle"}

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self.state)

    def start(self, run: Any, flavors: list[str], limit: int) -> bool:
        """Start ``run(flavors, limit)`` unless one is running; False when one is."""
        with self._lock:
            if self.state.get("status") == "running":
                return False
            self.state = {"status": "running", "started_at": time.time(), "flavors": flavors,
                          "limit": limit}

        def work() -> None:
            try:
                report = run(flavors, limit)
            except BerthError as exc:
                outcome: dict[str, Any] = {"status": "failed", "error": exc.message}
            except Exception as exc:  # reported to the page; the server stays up
                outcome = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
            else:
                outcome = {"status": "ready", "report": report}
            with self._lock:
                self.state = {**self.state, **outcome, "finished_at": time.time()}

        threading.Thread(target=work, name="berth-capacity", daemon=True).start()
        return True


def page() -> bytes:
    """The web view's HTML."""
    return resources.files("berth.service").joinpath("webview.html").read_bytes()


def _capacity_body(body: Any) -> tuple[list[str], int]:
    if body is None:
        body = {}
    if not isinstance(body, Mapping):
        raise InputError("body: expected a JSON object", field="body")
    unknown = sorted(set(body) - {"flavors", "limit"})
    if unknown:
        raise InputError(f"{unknown[0]}: unknown field (flavors, limit)", field=unknown[0])
    flavors = body.get("flavors") or []
    if not isinstance(flavors, list) or not all(isinstance(f, str) for f in flavors):
        raise InputError(f"flavors: expected a list of flavor names, got {flavors!r}",
                         field="flavors")
    limit = body.get("limit", 2000)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 100_000:
        raise InputError(f"limit: expected an integer from 1 to 100000, got {limit!r}",
                         field="limit")
    return list(flavors), limit


class ViewRoutes:
    """The web view's routes, mixed into :class:`~berth.service.api.SchedulerApp` (which
    provides ``service``, ``flavors``, ``recent``, ``capacity_runs``, ``served_app``,
    ``_enforce``, ``_for_caller`` and ``boot_spec``)."""

    service: Any
    flavors: dict[str, Any]
    recent: RecentDecisions
    capacity_runs: CapacityRuns
    served_app: Any
    if TYPE_CHECKING:  # provided by SchedulerApp
        def _enforce(self, rule: str, caller: Any, project: str | None) -> None: ...
        def _for_caller(self, body: Any, caller: Any, rule: str = ...) -> Any: ...
        def boot_spec(self, body: Any) -> Any: ...

    def _view(self, path: str, method: str, environ: dict[str, Any], caller: Any,
              start_response: StartResponse) -> Iterable[bytes]:
        if path == "/ui":
            if method != "GET":
                return reply(start_response, 405, {"error": {"code": "berth.http.method",
                                                             "message": "use GET"}})
            return reply_bytes(start_response, 200, page(), "text/html; charset=utf-8",
                               [("Content-Security-Policy",
                                 "default-src 'self'; script-src 'unsafe-inline'; "
                                 "style-src 'unsafe-inline'; img-src data:")])
        if path == "/decisions" and method == "GET":
            self._enforce(HOSTS, caller, None)
            return reply(start_response, 200, {"decisions": self.recent.latest(RECENT)})
        if path == "/what-if" and method == "POST":
            # Host by host reasons and weights: the operators' (like /hosts), by default.
            body = self._for_caller(read_json(environ), caller, WHAT_IF)
            return reply(start_response, *self.what_if(body))
        if path == "/capacity" and method in ("GET", "POST"):
            self._enforce(HOSTS, caller, None)
            if method == "GET":
                return reply(start_response, 200, self.capacity_runs.snapshot())
            flavors, limit = _capacity_body(read_json(environ))
            unknown = [f for f in flavors if f not in self.flavors]
            if unknown:
                raise InputError(f"flavors: unknown flavor {unknown[0]!r} (known: "
                                 f"{', '.join(sorted(self.flavors))})", field="flavors")
            token = environ.get("HTTP_X_AUTH_TOKEN", "")
            started = self.capacity_runs.start(
                lambda names, cap: self._capacity(names, cap, token), flavors, limit)
            return reply(start_response, 202, {**self.capacity_runs.snapshot(),
                                               "started": started})
        return reply(start_response, 405, {"error": {"code": "berth.http.method",
                                                     "message": f"no route {method} {path}"}})

    def what_if(self, body: Any) -> tuple[int, dict[str, Any]]:
        """The explained decision a boot of ``body`` would get now (200), or the
        refusal with its explanation (409); nothing claimed."""
        spec = self.boot_spec(body)
        if not hasattr(self.service, "what_if"):
            raise InputError("what-if: this API process has no scheduler in process; ask "
                             "berth serve", field="what-if")
        try:
            decision = self.service.what_if(spec)
        except SchedulingError as exc:
            answer: dict[str, Any] = {"error": error_dict(exc)}
            diagnosis = getattr(exc, "diagnosis", None)
            if diagnosis is not None:
                answer["diagnosis"] = diagnosis.to_dict()
            return 409, answer
        answer = decision.to_dict()
        answer["claimed"] = False
        return 200, answer

    def _capacity(self, flavors: list[str], limit: int, token: str) -> dict[str, Any]:
        """The capacity report of this server's cloud, read through its own API with the
        caller's token."""
        import httpx

        from berth.service.capacity import capacity, cloud_of

        if self.served_app is None:
            raise InputError("capacity: this server cannot read itself (not berth serve)",
                             field="capacity")
        transport = httpx.WSGITransport(app=self.served_app)
        with cloud_of(None, "http://berth.local", token, self.service.config,
                      now=time.time(), transport=transport) as offline:
            return capacity(offline, flavors or None, limit=limit).to_dict()
