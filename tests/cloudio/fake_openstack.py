"""A local OpenStack for the importer: Keystone v3, Nova's compute API, Glance's image API
v2 and Berth's own Placement API, on one 127.0.0.1 port.

The compute and image answers are rendered from a cloud file (its document for names,
its loaded :class:`~berth.cloudfile.Cloud` for derived values) in the shapes Nova 34
gives at the microversion asked for: os-hypervisors without sizes and cpu_info from
2.88, flavors with ``extra_specs`` from 2.61, server groups' ``policy``/``rules`` from
2.64, servers' embedded flavor from 2.47. Lists page as Nova's do (``limit``/``marker``
with ``*_links``; ``limit``/``offset`` for server groups; Glance's ``next``), with a
small ``max_limit`` so every pager runs. Placement is a real Berth store the cloud file
was registered into by ``berth serve``'s own seeding. Every route but discovery wants the
token Keystone issued.
"""

from __future__ import annotations

import json
import threading
import uuid as uuidlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from berth.cloudfile import Cloud, stable_uuid

TOKEN = "admin"  # Berth's Placement (noauth2) reads it as the admin role
PASSWORD = "secret"
MAX_VERSION = "2.100"
MAX_LIMIT = 2


def _v(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor)


class FakeOpenStack:
    """The WSGI app; ``base`` is set once the server listens. ``extra`` adds fields to
    the objects rendered (bad data for the warning tests), keyed by kind then name."""

    def __init__(self, doc: dict[str, Any], cloud: Cloud, placement_app: Any,
                 max_version: str = MAX_VERSION) -> None:
        self.doc = doc
        self.cloud = cloud
        self.placement_app = placement_app
        self.max_version = max_version
        self.base = ""
        self.extra: dict[str, dict[str, dict[str, Any]]] = {}
        self.drop_service_host: set[str] = set()
        self.unplaced_servers: list[str] = []
        self.requests: list[tuple[str, str, str | None]] = []

    # ------------------------------------------------------------------ WSGI
    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        method = environ["REQUEST_METHOD"]
        query = {k: v[-1] for k, v in parse_qs(environ.get("QUERY_STRING", ""),
                                               keep_blank_values=True).items()}
        if path.startswith("/placement"):
            environ["SCRIPT_NAME"] = "/placement"
            environ["PATH_INFO"] = path[len("/placement"):] or "/"
            return self.placement_app(environ, start_response)  # type: ignore[no-any-return]
        version = self._microversion(environ)
        self.requests.append((method, path, version))
        status, body, headers = self.route(method, path, query, version, environ)
        data = json.dumps(body).encode()
        start_response(status, [("Content-Type", "application/json"),
                                ("Content-Length", str(len(data))), *headers])
        return [data]

    def _microversion(self, environ: dict[str, Any]) -> str | None:
        header = environ.get("HTTP_OPENSTACK_API_VERSION") or ""
        for entry in header.split(","):
            parts = entry.strip().split()
            if len(parts) == 2 and parts[0] == "compute":
                return self.max_version if parts[1] == "latest" else parts[1]
        return environ.get("HTTP_X_OPENSTACK_NOVA_API_VERSION")

    def route(self, method: str, path: str, query: dict[str, str], version: str | None,
              environ: dict[str, Any]) -> tuple[str, Any, list[tuple[str, str]]]:
        if path.rstrip("/") in ("/identity", "/identity/v3") and method == "GET":
            return "200 OK", {"version": self._identity_version()}, []
        if path == "/identity/v3/auth/tokens" and method == "POST":
            length = int(environ.get("CONTENT_LENGTH") or 0)
            auth = json.loads(environ["wsgi.input"].read(length) or b"{}").get("auth", {})
            password = auth.get("identity", {}).get("password", {}).get("user", {}).get("password")
            if password != PASSWORD:
                return "401 Unauthorized", {"error": {
                    "code": 401, "title": "Unauthorized",
                    "message": "The request you have made requires authentication."}}, []
            return "201 Created", self._token(), [("X-Subject-Token", TOKEN)]
        if path.rstrip("/") == "/compute":
            return "200 OK", {"versions": [self._compute_version()]}, []
        if path.rstrip("/") == "/compute/v2.1":
            return "200 OK", {"version": self._compute_version()}, []
        if path.rstrip("/") == "/image":
            return "300 Multiple Choices", {"versions": [
                {"id": "v2.16", "status": "CURRENT",
                 "links": [{"rel": "self", "href": f"{self.base}/image/v2/"}]}]}, []
        if environ.get("HTTP_X_AUTH_TOKEN") != TOKEN:
            return "401 Unauthorized", {"error": {"code": 401, "message": "no token"}}, []
        if path.startswith("/image/v2/images") and method == "GET":
            return "200 OK", self._images(query), []
        if not path.startswith("/compute/v2.1/") or method != "GET":
            return "404 Not Found", {"itemNotFound": {"code": 404, "message": path}}, []
        v = version or "2.1"
        if _v(v) > _v(self.max_version):
            return "406 Not Acceptable", {"computeFault": {"code": 406, "message": v}}, []
        route = path[len("/compute/v2.1"):]
        handlers: dict[str, Callable[[dict[str, str], str], Any]] = {
            "/os-hypervisors/detail": self._hypervisors, "/os-services": self._services,
            "/os-aggregates": self._aggregates, "/flavors/detail": self._flavors,
            "/os-server-groups": self._server_groups, "/servers/detail": self._servers}
        if route in handlers:
            return "200 OK", handlers[route](query, v), []
        if route.startswith("/flavors/") and route.endswith("/os-extra_specs"):
            flavorid = route.split("/")[2]
            for f in self._flavor_entries():
                if str(f.get("flavorid", f["name"])) == flavorid:
                    return "200 OK", {"extra_specs": f.get("extra_specs") or {}}, []
        return "404 Not Found", {"itemNotFound": {"code": 404, "message": route}}, []

    # ------------------------------------------------------------------ keystone
    def _identity_version(self) -> dict[str, Any]:
        return {"id": "v3.14", "status": "stable", "updated": "2020-04-07T00:00:00Z",
                "links": [{"rel": "self", "href": f"{self.base}/identity/v3/"}],
                "media-types": [{"base": "application/json",
                                 "type": "application/vnd.openstack.identity-v3+json"}]}

    def _token(self) -> dict[str, Any]:
        def service(kind: str, name: str, url: str) -> dict[str, Any]:
            return {"type": kind, "name": name, "id": kind,
                    "endpoints": [{"id": f"{kind}-public", "interface": "public",
                                   "region": "RegionOne", "region_id": "RegionOne",
                                   "url": url}]}

        domain = {"id": "default", "name": "Default"}
        return {"token": {
            "methods": ["password"], "expires_at": "2099-01-01T00:00:00.000000Z",
            "issued_at": "2026-01-01T00:00:00.000000Z", "audit_ids": ["a"],
            "user": {"id": "u-admin", "name": "admin", "domain": domain},
            "project": {"id": "p-admin", "name": "admin", "domain": domain},
            "roles": [{"id": "r-admin", "name": "admin"}],
            "catalog": [service("identity", "keystone", f"{self.base}/identity"),
                        service("compute", "nova", f"{self.base}/compute/v2.1"),
                        service("image", "glance", f"{self.base}/image"),
                        service("placement", "placement", f"{self.base}/placement")]}}

    def _compute_version(self) -> dict[str, Any]:
        return {"id": "v2.1", "status": "CURRENT", "version": self.max_version,
                "min_version": "2.1", "updated": "2013-07-23T11:33:21Z",
                "links": [{"rel": "self", "href": f"{self.base}/compute/v2.1/"}]}

    # ------------------------------------------------------------------ paging
    def _page(self, items: list[dict[str, Any]], query: dict[str, str], key: str,
              path: str) -> dict[str, Any]:
        limit = min(int(query.get("limit", MAX_LIMIT)), MAX_LIMIT)
        start = 0
        if "marker" in query:
            start = next(i for i, item in enumerate(items) if str(item["id"]) == query["marker"]) + 1
        page = items[start:start + limit]
        body: dict[str, Any] = {key: page}
        if len(page) == limit and start + limit < len(items) + 1 and page:
            others = "&".join(f"{k}={v}" for k, v in query.items() if k not in ("marker", "limit"))
            body[f"{key}_links"] = [{"rel": "next", "href": (
                f"http://nova.internal:8774/v2.1{path}?{others}&limit={limit}"
                f"&marker={page[-1]['id']}")}]
        return body

    # ------------------------------------------------------------------ compute
    def _rows(self) -> Iterator[int]:
        return iter(range(len(self.cloud.snapshot)))

    def _az(self, host: str) -> str:
        for agg in self.cloud.snapshot.aggregates:
            if host in agg.hosts and agg.availability_zone:
                return agg.availability_zone
        return "nova"

    def _hypervisors(self, query: dict[str, str], v: str) -> Any:
        snap = self.cloud.snapshot
        items = []
        for row in self._rows():
            host, node = snap.obj("host")[row], snap.obj("nodename")[row]
            service = snap.obj("service")[row]
            item: dict[str, Any] = {
                "id": snap.obj("uuid")[row], "hypervisor_hostname": node,
                "state": "up", "status": "disabled" if service.disabled else "enabled",
                "hypervisor_type": snap.interned_value("hypervisor_type", row),
                "hypervisor_version": int(snap.num("hypervisor_version")[row]),
                "host_ip": snap.obj("host_ip")[row],
                "service": {"host": host, "id": stable_uuid("service", host),
                            "disabled_reason": service.disabled_reason}}
            if host in self.drop_service_host:
                item["service"] = {"id": stable_uuid("service", host)}
            if _v(v) < (2, 88):
                total = int(snap.num("total_usable_ram_mb")[row])
                disk = int(snap.num("total_usable_disk_gb")[row])
                item.update({
                    "cpu_info": json.loads(snap.interned_value("cpu_info", row)),
                    "vcpus": int(snap.num("vcpus_total")[row]),
                    "vcpus_used": int(snap.num("vcpus_used")[row]),
                    "memory_mb": total, "memory_mb_used": total - int(snap.num("free_ram_mb")[row]),
                    "free_ram_mb": int(snap.num("free_ram_mb")[row]),
                    "local_gb": disk, "local_gb_used": int(snap.num("disk_mb_used")[row]) // 1024,
                    "free_disk_gb": int(snap.num("free_disk_mb")[row]) // 1024,
                    "disk_available_least": int(snap.num("free_disk_mb")[row]) // 1024,
                    "current_workload": int(snap.num("num_io_ops")[row]),
                    "running_vms": len(snap.obj("instances")[row])})
            item.update(self.extra.get("hypervisor", {}).get(node, {}))
            items.append(item)
        return self._page(items, query, "hypervisors", "/os-hypervisors/detail")

    def _services(self, query: dict[str, str], v: str) -> Any:
        snap = self.cloud.snapshot
        seen, items = set(), []
        for row in self._rows():
            host = snap.obj("host")[row]
            if host in seen:
                continue
            seen.add(host)
            service = snap.obj("service")[row]
            up = not service.forced_down and service.last_seen_up is not None and \
                service.last_seen_up >= self.now - 60
            items.append({"id": stable_uuid("service", host), "binary": "nova-compute",
                          "host": host, "zone": self._az(host),
                          "status": "disabled" if service.disabled else "enabled",
                          "state": "up" if up else "down", "updated_at": "2026-11-25T10:00:00.000000",
                          "disabled_reason": service.disabled_reason,
                          "forced_down": service.forced_down})
        items.append({"id": "s-sched", "binary": "nova-scheduler", "host": "ctl1", "zone": "internal",
                      "status": "enabled", "state": "up", "updated_at": None,
                      "disabled_reason": None, "forced_down": False})
        wanted = query.get("binary")
        return {"services": [s for s in items if wanted is None or s["binary"] == wanted]}

    now = 0.0

    def _aggregates(self, query: dict[str, str], v: str) -> Any:
        items = []
        for agg in self.cloud.snapshot.aggregates:
            item = {"id": agg.id, "uuid": agg.uuid, "name": agg.name,
                    "availability_zone": agg.availability_zone, "hosts": list(agg.hosts),
                    "metadata": dict(agg.metadata), "created_at": "2026-01-01T00:00:00.000000",
                    "updated_at": None, "deleted_at": None, "deleted": False}
            item.update(self.extra.get("aggregate", {}).get(agg.name, {}))
            items.append(item)
        return {"aggregates": items}

    def _flavor_entries(self) -> list[dict[str, Any]]:
        return list(self.doc.get("flavors") or [])

    def _flavors(self, query: dict[str, str], v: str) -> Any:
        items = []
        for f in self._flavor_entries():
            item: dict[str, Any] = {
                "id": str(f.get("flavorid", f["name"])), "name": f["name"], "vcpus": f["vcpus"],
                "ram": f["memory_mb"], "disk": f.get("root_gb", 0),
                "OS-FLV-EXT-DATA:ephemeral": f.get("ephemeral_gb", 0),
                "swap": f.get("swap", 0) or (0 if _v(v) >= (2, 75) else ""),
                "OS-FLV-DISABLED:disabled": False, "os-flavor-access:is_public": True,
                "rxtx_factor": 1.0, "description": None,
                "links": [{"rel": "self", "href": f"{self.base}/compute/v2.1/flavors/x"}]}
            if _v(v) >= (2, 61):
                item["extra_specs"] = dict(f.get("extra_specs") or {})
            item.update(self.extra.get("flavor", {}).get(f["name"], {}))
            items.append(item)
        return self._page(items, query, "flavors", "/flavors/detail")

    def _server_groups(self, query: dict[str, str], v: str) -> Any:
        items = []
        for g in self.cloud.server_groups.values():
            item: dict[str, Any] = {"id": g.uuid, "name": g.name, "members": list(g.members),
                                    "project_id": g.project_id, "user_id": "u1"}
            if _v(v) >= (2, 64):
                item.update({"policy": g.policy, "rules": dict(g.rules)})
            else:
                item.update({"policies": [g.policy], "metadata": {}})
            item.update(self.extra.get("server group", {}).get(g.name, {}))
            items.append(item)
        limit = min(int(query.get("limit", MAX_LIMIT)), MAX_LIMIT)
        offset = int(query.get("offset", 0))
        return {"server_groups": items[offset:offset + limit]}

    def _servers(self, query: dict[str, str], v: str) -> Any:
        assert query.get("all_tenants") == "1"
        flavors = {f["name"]: f for f in self._flavor_entries()}
        images = {i["name"]: i for i in self.doc.get("images") or []}
        items = []
        for entry in self.doc["hosts"]:
            for inst in entry.get("instances") or []:
                flavor = flavors.get(inst.get("flavor"))
                item: dict[str, Any] = {
                    "id": inst["uuid"], "name": f"vm-{inst['uuid'][:8]}", "status": "ACTIVE",
                    "tenant_id": inst.get("project_id"), "user_id": "u1", "metadata": {},
                    "OS-EXT-SRV-ATTR:host": entry["host"],
                    "OS-EXT-SRV-ATTR:hypervisor_hostname": entry.get("nodename", entry["host"]),
                    "OS-EXT-STS:vm_state": "active", "addresses": {}, "links": []}
                if flavor is None:
                    item["flavor"] = {}
                elif _v(v) >= (2, 47):
                    item["flavor"] = {"original_name": flavor["name"], "vcpus": flavor["vcpus"],
                                      "ram": flavor["memory_mb"], "disk": flavor.get("root_gb", 0),
                                      "ephemeral": flavor.get("ephemeral_gb", 0),
                                      "swap": flavor.get("swap", 0),
                                      "extra_specs": dict(flavor.get("extra_specs") or {})}
                else:
                    item["flavor"] = {"id": str(flavor.get("flavorid", flavor["name"]))}
                image = images.get(inst.get("image"))
                item["image"] = {"id": image_id(image)} if image else ""
                item.update(self.extra.get("server", {}).get(inst["uuid"], {}))
                items.append(item)
        for server_id in self.unplaced_servers:
            items.append({"id": server_id, "name": "shelved", "status": "SHELVED_OFFLOADED",
                          "tenant_id": "p1", "user_id": "u1", "metadata": {},
                          "OS-EXT-SRV-ATTR:host": None,
                          "OS-EXT-SRV-ATTR:hypervisor_hostname": None,
                          "flavor": {}, "image": "", "addresses": {}, "links": []})
        return self._page(items, query, "servers", "/servers/detail")

    # ------------------------------------------------------------------ glance
    def _images(self, query: dict[str, str]) -> Any:
        items = []
        for image in self.doc.get("images") or []:
            item: dict[str, Any] = {
                "id": image_id(image), "name": image["name"], "status": "active",
                "visibility": "public", "protected": False, "os_hidden": False,
                "disk_format": image.get("disk_format", "qcow2"), "container_format": "bare",
                "size": 1024, "virtual_size": None, "min_ram": 0, "min_disk": 0,
                "checksum": None, "owner": "p-admin", "tags": [],
                "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z",
                "self": f"/v2/images/{image_id(image)}", "file": f"/v2/images/{image_id(image)}/file",
                "schema": "/v2/schemas/image",
                **{k: v for k, v in (image.get("properties") or {}).items()}}
            item.update(self.extra.get("image", {}).get(image["name"], {}))
            items.append(item)
        limit = min(int(query.get("limit", 25)), MAX_LIMIT)
        start = 0
        if "marker" in query:
            start = next(i for i, item in enumerate(items) if item["id"] == query["marker"]) + 1
        page = items[start:start + limit]
        body: dict[str, Any] = {"images": page, "first": "/v2/images", "schema": "/v2/schemas/images"}
        if start + limit < len(items):
            body["next"] = f"/v2/images?marker={page[-1]['id']}&limit={limit}"
        return body


def image_id(image: dict[str, Any]) -> str:
    """The id the fake Glance gives an image of the cloud file."""
    return str(image.get("id") or stable_uuid("image", image["name"]))


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib's name
        pass


class _ThreadingServer(WSGIServer):
    daemon_threads = True

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(target=self._handle, args=(request, client_address), daemon=True)
        thread.start()

    def _handle(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        finally:
            self.shutdown_request(request)


@contextmanager
def serving(app: FakeOpenStack) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 (a free port); yields its base URL."""
    server = make_server("127.0.0.1", 0, app, server_class=_ThreadingServer, handler_class=_Quiet)
    app.base = f"http://127.0.0.1:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield app.base
    finally:
        server.shutdown()
        server.server_close()


def clouds_yaml(base: str) -> str:
    """A clouds.yaml naming this fake cloud ``fake``."""
    return (
        "clouds:\n"
        "  fake:\n"
        "    auth:\n"
        f"      auth_url: {base}/identity/v3\n"
        "      username: admin\n"
        f"      password: {PASSWORD}\n"
        "      project_name: admin\n"
        "      user_domain_name: Default\n"
        "      project_domain_name: Default\n"
        "    region_name: RegionOne\n"
        "    identity_api_version: 3\n"
        "    interface: public\n")


def new_uuid() -> str:
    """A random uuid (servers the cloud file does not hold)."""
    return str(uuidlib.uuid4())
