"""Prometheus metrics, request ids and access logs for Berth's HTTP services.

:func:`instrument` wraps a WSGI app (the scheduler API of ``berth serve`` and ``berth
api``, the Placement API of ``berth placement serve``): every request gets a request id
(the client's ``X-Openstack-Request-Id`` when it is a valid ``req-<uuid>``, else a new
one), answered in ``x-openstack-request-id`` and put on every log line written while the
request runs (:class:`RequestIdFilter`); one access-log line per request on the
``berth.access`` logger; request counts and latency histograms by route; and ``GET
/metrics`` in Prometheus' text format.

A process's :class:`Metrics` also counts scheduling decisions (by outcome, NoValidHost by
cause, instances placed, decision time) through :meth:`Metrics.observe_decision`, which a
scheduler service calls after each request, and reads at scrape time what its
collectors report: claim outcomes and conflict retries, compute nodes by state and the
age of their last report, the server's queue of requests waiting for a thread.
"""

from __future__ import annotations

import contextvars
import logging
import re
import time
import uuid as uuidlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import os_resource_classes
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

ACCESS = logging.getLogger("berth.access")
#: The request id of the request this thread serves ("-" outside a request).
REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("berth_request_id",
                                                                   default="-")
_VALID_ID = re.compile(r"^req-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
#: The first segment of every route of the scheduler API, its web view and the Placement
#: API (mounted under ``/placement`` or alone), and the second-level ones; any other
#: path is counted as ``other``, so that no request, answered or not, adds a series of
#: its own (``tests/service/test_metrics.py`` checks every route maps to itself).
_COLLECTIONS = frozenset({
    "boot", "hosts", "healthz", "openapi.json", "os-services", "servers", "compute-nodes",
    "aggregates", "flavors", "images", "server-groups", "capacity", "decisions", "what-if",
    "ui", "metrics",
    "resource_providers", "resource_classes", "traits", "allocations",
    "allocation_candidates", "usages", "reshaper"})
_SUBCOLLECTIONS = frozenset({
    "inventories", "aggregates", "usages", "allocations", "traits",
    "migrate", "resize", "evacuate", "rebuild", "live-migrate", "confirm-resize",
    "revert-resize", "drain"})
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OTHER = "other"
#: Latency buckets (seconds): a scheduling request takes milliseconds, a cold one more.
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s] %(message)s"

StartResponse = Callable[..., Any]


class RequestIdFilter(logging.Filter):
    """Puts ``request_id`` (the current request's, or "-") on every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


class PoolResetFilter(logging.Filter):
    """SQLAlchemy's pool logs an ERROR with a traceback each time it cannot reset a
    connection the database dropped (every kept connection, on every outage), though
    the pool then discards it and the request is retried or answered 503: one WARNING
    line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        if (record.levelno >= logging.ERROR and record.name.startswith("sqlalchemy.pool")
                and str(record.msg).startswith("Exception during reset")):
            error = record.exc_info[1] if record.exc_info else None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg = "a database connection could not be reset and is discarded: %s"
            record.args = (str(error).splitlines()[0] if error else "lost",)
            record.exc_info = record.exc_text = None
        return True


def configure_logging(level: int = logging.INFO) -> None:
    """Root logging for a service: one line per record with time, level, logger and the
    request id, flushed as written (stderr is unbuffered)."""
    logging.basicConfig(level=level, force=True, format=LOG_FORMAT)
    for handler in logging.getLogger().handlers:
        handler.addFilter(RequestIdFilter())
        handler.addFilter(PoolResetFilter())  # the pool's records come from its children


def route_of(path: str) -> str:
    """The route a path belongs to, as a bounded label value: a known collection, then
    ``{id}`` for what follows it (a uuid, a host, a trait's name), a known
    sub-collection, then ``{id}`` again (a standard resource class stays: it is one of
    a few); ``other`` for anything else."""
    prefix = ""
    if path == "/placement" or path.startswith("/placement/"):
        prefix, path = "/placement", path[len("/placement"):] or "/"
    if path in ("", "/"):
        return prefix + "/"
    parts = path.split("/")[1:]
    if not path.startswith("/"):
        return OTHER
    if len(parts) > 4 or parts[0] not in _COLLECTIONS:
        return OTHER
    shown = [parts[0]]
    if len(parts) > 1:
        shown.append("{id}" if parts[1] else "")
    if len(parts) > 2:
        if parts[2] not in _SUBCOLLECTIONS:
            return OTHER
        shown.append(parts[2])
    if len(parts) > 3:
        shown.append(parts[3] if parts[3] in os_resource_classes.STANDARDS else "{id}")
    return prefix + "/" + "/".join(shown)


def method_of(method: str) -> str:
    """An HTTP method as a bounded label value."""
    return method if method in _METHODS else OTHER


class Metrics:
    """One process's metrics registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("berth_http_requests", "HTTP requests answered",
                                ["app", "method", "route", "status"], registry=self.registry)
        self.latency = Histogram("berth_http_request_duration_seconds",
                                 "Time to answer an HTTP request", ["app", "route"],
                                 buckets=_BUCKETS, registry=self.registry)
        self.decisions = Counter("berth_scheduling_requests",
                                 "Scheduling requests by outcome (placed, no_valid_host, error)",
                                 ["outcome"], registry=self.registry)
        self.no_valid_host = Counter("berth_no_valid_host",
                                     "NoValidHost answers by cause (request_filter, placement, "
                                     "hosts: filters, weighers and claims left too few)",
                                     ["cause"], registry=self.registry)
        self.placed = Counter("berth_instances_placed", "Instances given a host and a claim",
                              registry=self.registry)
        self.filter_rejections = Counter("berth_filter_rejections",
                                         "Hosts each filter removed from a request's list "
                                         "(summed over the instances of the request)",
                                         ["filter"], registry=self.registry)
        self.decision_time = Histogram("berth_scheduling_duration_seconds",
                                       "Time of one scheduling request in the scheduler",
                                       buckets=_BUCKETS, registry=self.registry)

    def add(self, collector: Collector) -> None:
        """Read ``collector`` at every scrape."""
        self.registry.register(collector)

    def observe_decision(self, outcome: str, seconds: float, *, placed: int = 0,
                         cause: str | None = None,
                         rejections: dict[str, int] | None = None) -> None:
        """Count one scheduling request."""
        self.decisions.labels(outcome).inc()
        for name, removed in (rejections or {}).items():
            self.filter_rejections.labels(name).inc(removed)
        self.decision_time.observe(seconds)
        if placed:
            self.placed.inc(placed)
        if cause is not None:
            self.no_valid_host.labels(cause).inc()

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)


class StatsCollector(Collector):
    """Gauges and counters read from objects at scrape time: ``read()`` returns
    ``(name, help, kind, {labels tuple: value}, label names)`` entries."""

    def __init__(self, read: Callable[[], Iterable[tuple[str, str, str, dict[tuple[str, ...], float],
                                                      tuple[str, ...]]]]) -> None:
        self.read = read

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        for name, help_text, kind, values, labels in self.read():
            family: Any = (CounterMetricFamily(name, help_text, labels=list(labels))
                           if kind == "counter"
                           else GaugeMetricFamily(name, help_text, labels=list(labels)))
            for key, value in values.items():
                family.add_metric(list(key), value)
            yield family


def instrument(app: Callable[..., Any], metrics: Metrics, name: str,
               mount: str = "") -> Callable[..., Any]:
    """``app`` with request ids, an access log, request metrics and ``GET /metrics``.
    ``mount``: the path prefix ``app`` is served under (``berth placement serve
    --prefix``), left out of the route labels."""
    mount = mount.rstrip("/")

    def wrapped(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        started = time.perf_counter()
        given = environ.get("HTTP_X_OPENSTACK_REQUEST_ID", "")
        request_id = given if _VALID_ID.match(given) else f"req-{uuidlib.uuid4()}"
        environ["berth.request_id"] = request_id
        token = REQUEST_ID.set(request_id)
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO", "") or "/"
        # As asked (the app may move a mount prefix from PATH_INFO to SCRIPT_NAME).
        asked = environ.get("SCRIPT_NAME", "") + path
        status_seen: list[str] = []

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            status_seen.append(status)
            if not any(k.lower() == "x-openstack-request-id" for k, _ in headers):
                headers = [*headers, ("x-openstack-request-id", request_id)]
            return start_response(status, headers, exc_info) if exc_info else \
                start_response(status, headers)

        try:
            if path == "/metrics" and method == "GET":
                body = metrics.render()
                start("200 OK", [("Content-Type", CONTENT_TYPE_LATEST),
                                 ("Content-Length", str(len(body)))])
                chunks: Iterable[bytes] = [body]
            else:
                chunks = app(environ, start)
            labelled = path
            if mount and (path == mount or path.startswith(mount + "/")):
                labelled = path[len(mount):] or "/"
            return _Finishing(chunks, lambda: _done(environ, metrics, name, method, labelled,
                                                    asked, status_seen, started, request_id))
        finally:
            REQUEST_ID.reset(token)

    return wrapped


def _done(environ: dict[str, Any], metrics: Metrics, name: str, method: str, path: str,
          asked: str, status_seen: list[str], started: float, request_id: str) -> None:
    seconds = time.perf_counter() - started
    status = status_seen[-1].split(" ", 1)[0] if status_seen else "000"
    route = route_of(path)
    if path == "/placement" or path.startswith("/placement/"):
        name = "placement"  # the Placement API mounted in the scheduler API's process
    metrics.requests.labels(name, method_of(method), route, status).inc()
    metrics.latency.labels(name, route).observe(seconds)
    query = environ.get("QUERY_STRING")
    token = REQUEST_ID.set(request_id)
    try:
        ACCESS.info('%s "%s %s%s" %s %.1f ms', environ.get("REMOTE_ADDR", "-"), method,
                    asked, f"?{query}" if query else "", status, seconds * 1000)
    finally:
        REQUEST_ID.reset(token)


class _Finishing:
    """The response body, calling ``done`` once it has been sent (or dropped)."""

    def __init__(self, chunks: Iterable[bytes], done: Callable[[], None]) -> None:
        self.chunks = chunks
        self.done = done

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.chunks)

    def close(self) -> None:
        try:
            close = getattr(self.chunks, "close", None)
            if close is not None:
                close()
        finally:
            self.done()


# --------------------------------------------------------------------------- collectors
def claims_collector(stats: Any) -> StatsCollector:
    """A claimer's :class:`~berth.service.placement.ClaimStats` as counters."""

    def read() -> Iterator[Any]:
        yield ("berth_claims", "Claims (PUT /allocations) by result", "counter",
               {("success",): stats.successes, ("refused",): stats.refusals,
                ("exhausted",): stats.exhausted, ("consumer_conflict",): stats.consumer_conflicts,
                ("error",): stats.errors}, ("result",))
        yield ("berth_claim_conflict_retries", "Claims retried after a generation conflict",
               "counter", {(): stats.conflict_retries}, ())
        yield ("berth_claim_rollbacks", "Claims rolled back (a request not placed whole)",
               "counter", {(): stats.rollbacks}, ())

    return StatsCollector(read)


def hosts_collector(service: Any) -> StatsCollector:
    """Compute nodes of a scheduler service's snapshot by state, and the age of their
    last report (the scheduler's view, read without refreshing it)."""
    import numpy as np

    from berth.filters.compute import effective_service_down_time

    def read() -> Iterator[Any]:
        snap = service.feed.snapshot
        now = service.clock()
        config = service.config
        down_after = effective_service_down_time(config.service_down_time,
                                                 config.report_interval)
        beats = np.asarray(snap.num("service_heartbeat"), dtype=float)
        ages = now - beats[~np.isnan(beats)] if len(beats) else np.zeros(0)
        disabled = np.asarray(snap.num("service_disabled"), dtype=bool)
        forced = np.asarray(snap.num("service_forced_down"), dtype=bool)
        with np.errstate(invalid="ignore"):
            stale = np.isnan(beats) | (now - beats > down_after)
        down = (stale | forced) & ~disabled
        states = {("up",): float((~down & ~disabled).sum()), ("down",): float(down.sum()),
                  ("disabled",): float(disabled.sum())}
        yield ("berth_compute_nodes", "Compute nodes the scheduler sees, by state", "gauge",
               states, ("state",))
        quantiles = {}
        if len(ages):
            for q in (0.5, 0.99, 1.0):
                quantiles[(str(q),)] = float(np.quantile(ages, q))
        yield ("berth_compute_report_age_seconds",
               "Age of the compute nodes' last reports (quantiles; 1.0 is the oldest)",
               "gauge", quantiles, ("quantile",))

    return StatsCollector(read)


def queue_collector(server: Any) -> StatsCollector:
    """A waitress server's requests waiting for a worker thread, and its busy threads."""

    def read() -> Iterator[Any]:
        dispatcher = getattr(server, "task_dispatcher", None)
        if dispatcher is None:
            return
        yield ("berth_http_queue_depth", "Requests read and waiting for a worker thread",
               "gauge", {(): float(len(dispatcher.queue))}, ())
        yield ("berth_http_busy_threads", "Worker threads serving a request", "gauge",
               {(): float(dispatcher.active_count)}, ())

    return StatsCollector(read)


def feed_collector(feed: Any) -> StatsCollector:
    """A scheduler's bus feed: host reports applied to its snapshot, and those dropped
    as older than what it holds."""

    def read() -> Iterator[Any]:
        yield ("berth_host_reports_applied", "Host reports applied to the snapshot", "counter",
               {(): float(feed.applied)}, ())
        yield ("berth_host_reports_stale", "Host reports dropped as older than the snapshot's",
               "counter", {(): float(feed.stale_dropped)}, ())

    return StatsCollector(read)


def compute_collector(fleet: Any, endpoint: Any) -> StatsCollector:
    """A compute process: its hosts, how long they took to register, its builds."""

    def read() -> Iterator[Any]:
        yield ("berth_compute_hosts", "Compute hosts this process runs", "gauge",
               {(): float(len(fleet.agents))}, ())
        yield ("berth_compute_registration_seconds",
               "Time the hosts took to register with Placement at start-up", "gauge",
               {(): float(fleet.registration_s)}, ())
        yield ("berth_builds", "Builds and terminations served, by result", "counter",
               {(k,): float(v) for k, v in endpoint.counts.items()}, ("result",))

    return StatsCollector(read)


def serve_metrics(metrics: Metrics, host: str, port: int) -> int:
    """``GET /metrics`` of a process with no HTTP API of its own, on a thread; returns the
    port (``0`` picks a free one)."""
    from prometheus_client import start_http_server

    server, _thread = start_http_server(port, addr=host, registry=metrics.registry)
    return int(server.server_address[1])
