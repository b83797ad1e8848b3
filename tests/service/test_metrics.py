"""``/metrics``, request ids, the access log and the decision log lines of the serving
processes, as an operator scrapes and reads them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from berth.service.metrics import route_of

from .serving import free_port

#: The noauth2 token of the administrator (the servers run --auth-strategy noauth2).
ADMIN = {"X-Auth-Token": "admin"}

CLOUD = """
flavors: [{name: web, vcpus: 2, memory_mb: 2048, root_gb: 10}]
hosts:
  - {host: "n{index}", count: 3, vcpus: 8, memory_mb: 8704, local_gb: 100}
"""
RID = "req-12345678-1234-4234-8234-123456789abc"




def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _run_until_up(argv: list[str], url: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "berth.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(url + "/metrics", timeout=1)
            return proc
        except httpx.HTTPError:
            time.sleep(0.2)
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
    raise AssertionError("not up")


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    return out


def test_berth_serve_exports_metrics_and_logs_each_request_and_decision(tmp_path: Path) -> None:
    cloud = tmp_path / "cloud.yaml"
    cloud.write_text(CLOUD)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _run_until_up(["serve", "--auth-strategy", "noauth2", "--db", f"sqlite:///{tmp_path}/b.sqlite", "--port",
                          str(port), "--cloud", str(cloud)], url)
    try:
        answer = httpx.post(url + "/boot", json={"flavor": "web", "num": 2}, timeout=30,
                            headers={"X-Openstack-Request-Id": RID, **ADMIN})
        assert answer.status_code == 200 and answer.headers["x-openstack-request-id"] == RID
        huge = {"name": "huge", "vcpus": 64, "memory_mb": 1024, "root_gb": 1}
        assert httpx.post(url + "/boot", json={"flavor": huge}, timeout=30, headers=ADMIN).status_code == 409
        assert httpx.get(url + "/placement/resource_providers", timeout=10,
                         headers={"X-Auth-Token": "admin"}).status_code == 200
        metrics = httpx.get(url + "/metrics", timeout=10)
        assert metrics.headers["content-type"].startswith("text/plain")
        samples = _samples(metrics.text)
    finally:
        log = _stop(proc)
    assert samples[("berth_http_requests_total", (("app", "scheduler"), ("method", "POST"),
                                                  ("route", "/boot"), ("status", "200")))] == 1
    assert samples[("berth_http_requests_total", (("app", "placement"), ("method", "GET"),
                                                  ("route", "/placement/resource_providers"),
                                                  ("status", "200")))] == 1
    assert samples[("berth_scheduling_requests_total", (("outcome", "placed"),))] == 1
    assert samples[("berth_no_valid_host_total", (("cause", "placement"),))] == 1
    assert samples[("berth_instances_placed_total", ())] == 2
    assert samples[("berth_claims_total", (("result", "success"),))] == 2
    assert samples[("berth_compute_nodes", (("state", "up"),))] == 3
    assert ("berth_compute_report_age_seconds", (("quantile", "1.0"),)) in samples
    assert ("berth_http_queue_depth", ()) in samples
    assert samples[("berth_http_request_duration_seconds_count",
                    (("app", "scheduler"), ("route", "/boot")))] == 2
    # One line per decision and per request, each with the request's id.
    assert f"[{RID}] placed 2 x web in" in log
    assert f'INFO berth.access [{RID}] 127.0.0.1 "POST /boot" 200' in log
    assert "NoValidHost for 1 x huge (placement)" in log
    assert '"GET /placement/resource_providers" 200' in log
    assert "listening on http://127.0.0.1:" in log


def test_berth_placement_serve_exports_metrics_and_says_where_it_listens(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _run_until_up(["placement", "serve", "--auth-strategy", "noauth2", "--db", f"sqlite:///{tmp_path}/p.sqlite",
                          "--port", str(port)], url)
    try:
        assert httpx.get(url + "/resource_providers", timeout=10,
                         headers={"X-Auth-Token": "admin"}).status_code == 200
        samples = _samples(httpx.get(url + "/metrics", timeout=10).text)
    finally:
        log = _stop(proc)
    assert samples[("berth_http_requests_total", (("app", "placement"), ("method", "GET"),
                                                  ("route", "/resource_providers"),
                                                  ("status", "200")))] == 1
    assert f"listening on http://127.0.0.1:{port}" in log
    assert '"GET /resource_providers" 200' in log


def test_routes_have_ids_replaced_so_labels_stay_bounded() -> None:
    assert route_of("/resource_providers/6f1f7d0c-1c55-4f0e-9d1e-6a3f1b0b8e11/inventories/VCPU") \
        == "/resource_providers/{id}/inventories/VCPU"
    assert route_of("/resource_providers/x/inventories/CUSTOM_GPU") \
        == "/resource_providers/{id}/inventories/{id}"
    assert route_of("/placement/traits/CUSTOM_T1") == "/placement/traits/{id}"
    assert route_of("/servers/6f1f7d0c1c554f0e9d1e6a3f1b0b8e11/migrate") == "/servers/{id}/migrate"
    assert route_of("/os-services/c1-s05") == "/os-services/{id}"
    assert route_of("/") == "/"
    assert route_of("/placement") == route_of("/placement/") == "/placement/"


def test_every_route_of_both_apis_keeps_its_own_label() -> None:
    """A route missing from the known collections would be counted as ``other``."""
    from berth.placement.app import ROUTES

    templates = [*ROUTES, "/boot", "/hosts", "/healthz", "/openapi.json", "/os-services",
                 "/os-services/{host}", "/servers", "/servers/{uuid}", "/compute-nodes",
                 "/aggregates", "/flavors", "/images", "/server-groups", "/capacity",
                 "/decisions", "/what-if", "/ui", "/metrics",
                 *(f"/servers/{{uuid}}/{action}" for action in (
                     "migrate", "resize", "evacuate", "rebuild", "confirm-resize",
                     "revert-resize"))]
    for template in templates:
        template = template or "/"  # Placement's root answers without its slash too
        path = template.replace("{resource_class}", "VCPU")
        path = "/".join("x1" if part.startswith("{") else part for part in path.split("/"))
        expected = "/".join("{id}" if part.startswith("{") and part != "{resource_class}"
                            else part for part in template.split("/"))
        expected = expected.replace("{resource_class}", "VCPU")
        assert route_of(path) == expected, template
        assert route_of("/placement" + path) == "/placement" + expected, template


def test_unknown_paths_and_methods_add_no_series() -> None:
    """Any client, even one refused its token, could otherwise grow ``/metrics`` (and the
    process) by a series a request."""
    from berth.service.metrics import Metrics, instrument

    def app(environ: dict[str, object], start_response: object) -> list[bytes]:
        start_response("404 Not Found", [("Content-Length", "0")])  # type: ignore[operator]
        return []

    metrics = Metrics()
    wrapped = instrument(app, metrics, "scheduler")
    for i in range(200):
        path = [f"/nosuch-{i}", f"/servers/x/nosuch-{i}", f"/a/{i}/b/{i}/c/{i}",
                f"/placement/resource_classes/CUSTOM_{i}"][i % 4]
        method = "GET" if i % 2 else f"M{i}"
        environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "wsgi.input": None}
        body = wrapped(environ, lambda status, headers: None)
        body.close()  # type: ignore[attr-defined]
    series = {labels for (name, labels) in _samples(metrics.render().decode())
              if name == "berth_http_requests_total"}
    assert series == {
        (("app", "scheduler"), ("method", "GET"), ("route", "other"), ("status", "404")),
        (("app", "scheduler"), ("method", "other"), ("route", "other"), ("status", "404")),
        (("app", "placement"), ("method", "GET"), ("route", "/placement/resource_classes/{id}"),
         ("status", "404"))}


def test_scheduler_and_compute_processes_export_metrics(tmp_path: Path) -> None:
    """``berth scheduler`` and ``berth compute`` have no HTTP API; ``--metrics-port``
    gives each its ``/metrics``: decisions, rejections per filter, the hosts it sees and
    the age of their reports, reports applied; the fleet's hosts and builds."""
    import re

    from berth.service.localcluster import LocalCluster, rabbit_unavailable, rabbit_vhost
    from pgdb import fresh_pg_database

    reason = rabbit_unavailable()
    if reason:
        pytest.skip(reason)
    cloud = tmp_path / "cloud.yaml"
    cloud.write_text(CLOUD + "server_groups: [{name: apart, policy: anti-affinity}]\n")
    with fresh_pg_database("berth_metrics") as db, rabbit_vhost("berth_metrics") as bus:
        cluster = LocalCluster(tmp_path / "run", db, bus, cloud, schedulers=1, apis=1,
                               compute_args=("--metrics-port", "0"),
                               scheduler_args=("--metrics-port", "0"))
        try:
            cluster.start()
            api = cluster.alive_urls()[0]
            cluster.wait_hosts(api, 3, timeout=60)
            answer = httpx.post(api + "/boot", json={"flavor": "web", "num": 2,
                                                     "hints": {"group": "apart"}},
                                headers=ADMIN, timeout=60)
            assert answer.status_code == 200, answer.text

            def scrape(name: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
                found = re.search(r"^metrics on (http://\S+)$", cluster.log(name), re.M)
                assert found, cluster.log(name)
                return _samples(httpx.get(found.group(1), timeout=10).text)

            sched = scrape("scheduler0")
            assert sched[("berth_scheduling_requests_total", (("outcome", "placed"),))] == 1
            assert sched[("berth_instances_placed_total", ())] == 2
            # The second member's host list lost the first member's host.
            assert sched[("berth_filter_rejections_total",
                          (("filter", "ServerGroupAntiAffinityFilter"),))] >= 1
            assert sched[("berth_compute_nodes", (("state", "up"),))] == 3
            assert sched[("berth_host_reports_applied_total", ())] >= 3
            assert ("berth_compute_report_age_seconds", (("quantile", "1.0"),)) in sched
            compute = scrape("compute")
            assert compute[("berth_compute_hosts", ())] == 3
            assert compute[("berth_builds_total", (("result", "built"),))] == 2
        finally:
            cluster.close()


def test_a_scheduler_keeps_a_window_of_latencies_not_all_of_them() -> None:
    from berth.service.scheduler import ServiceStats

    stats = ServiceStats()
    stats.latencies = type(stats.latencies)(maxlen=5)
    for i in range(3):
        stats.record_latency(float(i))
    assert stats.latencies_since(0) == [0.0, 1.0, 2.0] and stats.latencies_since(3) == []
    for i in range(3, 12):
        stats.record_latency(float(i))
    assert stats.timed == 12 and len(stats.latencies) == 5
    assert stats.latencies_since(10) == [10.0, 11.0]
    assert stats.latencies_since(3) == [7.0, 8.0, 9.0, 10.0, 11.0]  # what the window holds


def test_a_placement_mounted_under_a_prefix_keeps_its_route_labels() -> None:
    """``berth placement serve --prefix /api/placement``: the routes under the prefix."""
    from berth.service.metrics import Metrics, instrument

    def app(environ: dict[str, object], start_response: object) -> list[bytes]:
        start_response("200 OK", [("Content-Length", "0")])  # type: ignore[operator]
        return []

    metrics = Metrics()
    wrapped = instrument(app, metrics, "placement", mount="/api/placement/")
    for path in ("/api/placement/resource_providers/x1/traits", "/api/placement", "/elsewhere"):
        body = wrapped({"REQUEST_METHOD": "GET", "PATH_INFO": path, "wsgi.input": None},
                       lambda status, headers: None)
        body.close()  # type: ignore[attr-defined]
    routes = {dict(labels)["route"] for (name, labels) in _samples(metrics.render().decode())
              if name == "berth_http_requests_total"}
    assert routes == {"/resource_providers/{id}/traits", "/", "other"}
