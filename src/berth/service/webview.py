"""The web view of ``berth serve``: one page (``GET /ui``) and the routes it reads.

    GET  /ui          the page (no token: it asks for one and sends it with every call)
    GET  /decisions   the latest decisions (newest first): boots and moves, with the
                      flavor, number, project, the hosts chosen or why not, how long it
                      took and the hosts each filter removed; ``explained`` says the
                      request asked for an explanation
    GET  /decisions/{id}  one of them with its explanation (the first and last instances'
                      of a large request, each step's first rejections: a bounded size)
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

import base64
import functools
import hashlib
import itertools
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any

from berth.errors import BerthError, InputError, SchedulingError, error_dict
from berth.model.request import DEFAULT_FLAVORS, is_default_flavor
from berth.service.httpjson import StartResponse, read_json, reply, reply_bytes
from berth.service.policy import HOSTS, WHAT_IF

#: Decisions kept for the view.
RECENT = 50
#: An explanation kept with a decision holds at most this many instances (the first and
#: the last half of them: a refusal's cause is in its last), each step's first
#: :data:`KEPT_REJECTIONS` rejections and the :data:`KEPT_WEIGHED` best-weighed hosts:
#: an explained boot of 1,000 instances on 3,000 hosts would keep ~10 MB otherwise, and
#: the page reads the list every few seconds.
KEPT_INSTANCES = 20
KEPT_REJECTIONS = 5
KEPT_WEIGHED = 5
#: The outcome of a boot by how many of its instances were built.
PLACED, PARTLY_BUILT, NOT_BUILT, REFUSED = "placed", "partly built", "not built", "refused"


def kept_explanation(diagnosis: Mapping[str, Any]) -> dict[str, Any]:
    """``diagnosis`` (:meth:`~berth.explain.Diagnosis.to_dict`) cut to a bounded size;
    what is left out is counted (``instances_left_out``, ``rejections_left_out``,
    ``weighed_left_out``)."""
    instances = list(diagnosis.get("instances", ()))
    left_out = max(0, len(instances) - KEPT_INSTANCES)
    if left_out:
        half = KEPT_INSTANCES // 2
        instances = instances[:half] + instances[-half:]
    kept = []
    for inst in instances:
        steps = []
        for step in inst.get("steps", ()):
            rejections = step.get("rejections", [])
            steps.append({**step, "rejections": rejections[:KEPT_REJECTIONS],
                          "rejections_left_out": max(0, len(rejections) - KEPT_REJECTIONS)})
        weighing = sorted(inst.get("weighing", []), key=lambda w: -w.get("weight", 0.0))
        kept.append({**inst, "steps": steps, "weighing": weighing[:KEPT_WEIGHED],
                     "weighed_left_out": max(0, len(weighing) - KEPT_WEIGHED)})
    return {**diagnosis, "instances": kept, "instances_left_out": left_out}


class RecentDecisions:
    """The latest decisions, boots and moves, newest last (a bounded deque under a
    lock); each has an ``id``, which ``GET /decisions/{id}`` reads it by."""

    def __init__(self, size: int = RECENT) -> None:
        self.entries: deque[dict[str, Any]] = deque(maxlen=size)
        self._lock = threading.Lock()
        self._next = itertools.count(1)

    def _add(self, entry: dict[str, Any], diagnosis: Any) -> None:
        """Keep ``entry``, with ``diagnosis`` (a :class:`~berth.explain.Diagnosis` or its
        dict; None: not asked for) cut to size."""
        entry["explained"] = diagnosis is not None
        if diagnosis is not None:
            entry["diagnosis"] = kept_explanation(
                diagnosis if isinstance(diagnosis, Mapping) else diagnosis.to_dict())
        with self._lock:
            entry["id"] = next(self._next)
            self.entries.append(entry)

    @staticmethod
    def _base(spec: Any, seconds: float, operation: str = "boot") -> dict[str, Any]:
        return {"time": time.time(), "operation": operation, "flavor": spec.flavor.name,
                "num": spec.num_instances, "project_id": spec.project_id,
                "ms": round(seconds * 1000.0, 2), "availability_zone": spec.availability_zone}

    def placed(self, spec: Any, decision: Any, answer: Mapping[str, Any], seconds: float) -> None:
        """A boot that found hosts (some builds, or all, may still have failed)."""
        entry = self._base(spec, seconds)
        built = answer.get("instances", [])
        failed = answer.get("failed")
        entry.update(outcome=PLACED if not failed else PARTLY_BUILT if built else NOT_BUILT,
                     instances=[{"instance_uuid": i["instance_uuid"], "host": i["host"],
                                 "nodename": i.get("nodename")} for i in built],
                     funnel=dict(decision.rejections))
        if failed:
            entry["message"] = f"{len(failed)} of {len(failed) + len(built)} not built"
        self._add(entry, decision.diagnosis)

    def refused(self, spec: Any, exc: SchedulingError, seconds: float,
                operation: str = "boot") -> None:
        """A boot (or move) refused: NoValidHost or another scheduling error."""
        entry = self._base(spec, seconds, operation)
        entry.update(outcome=REFUSED, cause=getattr(exc, "cause", None) or exc.code,
                     message=exc.message, funnel=dict(getattr(exc, "rejections", {}) or {}),
                     instances=[])
        fitted = getattr(exc, "fitted", None)
        if fitted is not None:
            entry["instances_fit"] = fitted
        self._add(entry, getattr(exc, "diagnosis", None))

    def moved(self, spec: Any, answer: Mapping[str, Any], seconds: float) -> None:
        """A move (migrate, resize, evacuate, rebuild, live-migrate) that found its host."""
        entry = self._base(spec, seconds, str(answer.get("operation") or "move"))
        source = answer.get("source") or {}
        entry.update(outcome=PLACED, instances=[{
            "instance_uuid": answer.get("instance_uuid"), "host": answer.get("host"),
            "nodename": answer.get("nodename"), "source": source.get("host")}], funnel={})
        self._add(entry, answer.get("diagnosis"))

    def latest(self, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` entries, newest first, without their explanations."""
        with self._lock:
            newest = list(self.entries)[::-1][:limit]
        return [{k: v for k, v in e.items() if k != "diagnosis"} for e in newest]

    def get(self, entry_id: int) -> dict[str, Any] | None:
        """The entry ``entry_id`` with its explanation; None when it is gone or unknown."""
        with self._lock:
            for entry in self.entries:
                if entry["id"] == entry_id:
                    return dict(entry)
        return None


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


@functools.cache
def page() -> bytes:
    """The web view's HTML (read once)."""
    return resources.files("berth.service").joinpath("webview.html").read_bytes()


@functools.cache
def page_headers(html: bytes) -> list[tuple[str, str]]:
    """The page's security headers: its one inline script allowed by its hash (no other
    script runs, should a name ever reach the page unescaped), nothing fetched from
    elsewhere, never framed by another site, no type sniffing, no referrer sent."""
    start = html.index(b"<script>") + len(b"<script>")
    script = html[start:html.index(b"</script>", start)]
    digest = base64.b64encode(hashlib.sha256(script).digest()).decode()
    return [("Content-Security-Policy",
             f"default-src 'self'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; "
             "img-src data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"),
            ("X-Frame-Options", "DENY"), ("Referrer-Policy", "no-referrer"),
            ("Cache-Control", "no-cache")]


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
            html = page()
            return reply_bytes(start_response, 200, html, "text/html; charset=utf-8",
                               page_headers(html))
        if path == "/decisions" and method == "GET":
            self._enforce(HOSTS, caller, None)
            return reply(start_response, 200, {"decisions": self.recent.latest(RECENT)})
        if path.startswith("/decisions/") and method == "GET":
            self._enforce(HOSTS, caller, None)
            ref = path[len("/decisions/"):]
            entry = (self.recent.get(int(ref)) if ref.isascii() and ref.isdigit() and len(ref) <= 18
                     else None)
            if entry is None:
                return reply(start_response, 404, {"error": {
                    "code": "berth.http.not_found",
                    "message": f"no decision {ref[:40]!r} among the latest {RECENT}"}})
            return reply(start_response, 200, {"decision": entry})
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
            if not flavors:
                # Every flavor of the cloud, as for a cloud file: the ones it defines,
                # else Berth's defaults (the server also knows those by name).
                flavors = sorted(n for n, f in self.flavors.items()
                                 if not is_default_flavor(n, f)) or list(DEFAULT_FLAVORS)
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
