"""Policy modes (reference 1.8), CORS (1.10) and mounting under a prefix (1.4)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from placement.support import Api, Server, start_server


@pytest.fixture(scope="module")
def rbac(server: Server) -> Iterator[Api]:
    # Sharing the session server's (already migrated) database keeps start-up fast.
    srv = start_server(server.db, "--policy", "secure-rbac")
    yield Api(srv.url)
    srv.stop()


@pytest.fixture(scope="module")
def open_api(server: Server) -> Iterator[Api]:
    srv = start_server(server.db, "--policy", "open")
    yield Api(srv.url)
    srv.stop()


@pytest.fixture(scope="module")
def cors_server(server: Server) -> Iterator[Server]:
    srv = start_server(
        server.db,
        "--cors-origin",
        "http://valid.example.com",
        "--cors-allow-header",
        "openstack-api-version",
        "--prefix",
        "/placement",
    )
    yield srv
    srv.stop()


def test_secure_rbac_reshaper_is_service_only(rbac: Api) -> None:
    r = rbac.post("/reshaper", mv="1.30", json={"inventories": {}, "allocations": {}})
    assert r.status_code == 403
    assert "Policy does not allow placement:reshaper:reshape to be performed." in r.text
    r = rbac.post(
        "/reshaper",
        mv="1.30",
        json={"inventories": {}, "allocations": {}},
        headers={"X-Roles": "service"},
    )
    assert r.status_code == 400  # past policy: the schema wants one inventory


def test_legacy_reshaper_admits_admin(api: Api) -> None:
    r = api.post("/reshaper", mv="1.30", json={"inventories": {}, "allocations": {}})
    assert r.status_code == 400


def test_secure_rbac_reader_sees_own_project_usages_only(rbac: Api) -> None:
    hdrs = {"X-Roles": "reader", "X-Project-Id": "proj-a"}
    ok = rbac.get("/usages", mv="1.9", params={"project_id": "proj-a"}, token="alice", headers=hdrs)
    assert ok.status_code == 200
    no = rbac.get("/usages", mv="1.9", params={"project_id": "proj-b"}, token="alice", headers=hdrs)
    assert no.status_code == 403
    assert rbac.get("/resource_providers", token="alice", headers=hdrs).status_code == 403


def test_open_policy_admits_any_token(open_api: Api) -> None:
    assert open_api.get("/resource_providers", token="nobody").status_code == 200
    assert open_api.get("/resource_providers", token=None).status_code == 401


def test_cors_preflight_and_simple_requests(cors_server: Server) -> None:
    api = Api(cors_server.url)
    pre = api.request(
        "OPTIONS",
        "/",
        token=None,
        headers={
            "Origin": "http://valid.example.com",
            "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "openstack-api-version",
        },
    )
    assert pre.status_code == 200
    assert pre.headers["access-control-allow-origin"] == "http://valid.example.com"
    assert pre.headers["access-control-allow-credentials"] == "true"
    assert pre.headers["access-control-max-age"] == "3600"
    assert pre.headers["access-control-allow-methods"] == "GET"
    assert pre.headers["access-control-allow-headers"] == "openstack-api-version"
    bad = api.request(
        "OPTIONS",
        "/",
        token=None,
        headers={"Origin": "http://invalid.example.com", "Access-Control-Request-Method": "GET"},
    )
    assert bad.status_code == 200 and "access-control-allow-origin" not in bad.headers
    simple = api.get("/", token=None, headers={"Origin": "http://valid.example.com"})
    assert simple.headers["access-control-allow-origin"] == "http://valid.example.com"
    assert "OpenStack-API-Version" in simple.headers["access-control-expose-headers"]
    assert simple.headers["vary"] == "openstack-api-version,Origin"


def test_without_cors_origin_gets_no_acao(api: Api) -> None:
    r = api.get("/", token=None, headers={"Origin": "http://valid.example.com"})
    assert "access-control-allow-origin" not in r.headers


def test_prefix_appears_in_links_and_locations(cors_server: Server) -> None:
    api = Api(cors_server.url)
    assert cors_server.url.endswith("/placement")
    r = api.post("/resource_providers", mv="1.20", json={"name": "prefixed"})
    assert r.status_code == 200
    uuid = r.json()["uuid"]
    assert r.headers["location"].endswith(f"/placement/resource_providers/{uuid}")
    assert r.json()["links"][0]["href"] == f"/placement/resource_providers/{uuid}"


def test_sigterm_stops_the_server_cleanly(server: Server) -> None:
    extra = start_server(server.db)
    assert Api(extra.url).get("/", token=None).status_code == 200
    extra.stop()
    assert extra.proc.returncode == 0
