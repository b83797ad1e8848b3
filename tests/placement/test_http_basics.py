"""Cross-cutting HTTP behaviour (reference section 1) over a real server."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from placement.support import Api, code, detail


def test_root_answers_without_a_token_and_lists_the_version_range(api: Api) -> None:
    r = api.get("/", token=None)
    assert r.status_code == 200
    assert r.json() == {
        "versions": [
            {
                "id": "v1.0",
                "max_version": "1.39",
                "min_version": "1.0",
                "status": "CURRENT",
                "links": [{"rel": "self", "href": ""}],
            }
        ]
    }
    assert r.headers["openstack-api-version"] == "placement 1.0"
    assert re.fullmatch(r"req-[0-9a-f-]{36}", r.headers["x-openstack-request-id"])


def test_missing_token_gives_webob_style_401_without_version_header(api: Api) -> None:
    r = api.get("/resource_providers", token=None)
    assert r.status_code == 401
    body = r.json()
    assert body["code"] == "401 Unauthorized" and body["title"] == "Unauthorized"
    assert "openstack-api-version" not in r.headers
    assert "x-openstack-request-id" in r.headers


@pytest.mark.parametrize(
    ("header", "version"),
    [
        (None, "1.0"),
        ("placement latest", "1.39"),
        ("PLACEMENT 1.7", "1.7"),
        ("compute 2.1, placement 1.3, placement 1.5", "1.5"),
    ],
    ids=[
        "no header means 1.0",
        "latest means 1.39",
        "service name is case-insensitive",
        "last placement entry wins",
    ],
)
def test_microversion_header_selection(api: Api, header: str | None, version: str) -> None:
    headers = {"OpenStack-API-Version": header} if header else {}
    r = api.get("/resource_providers", headers=headers)
    assert r.status_code == 200
    assert r.headers["openstack-api-version"] == f"placement {version}"
    assert r.headers["vary"] == "openstack-api-version"


@pytest.mark.parametrize(
    ("value", "status", "text"),
    [
        ("pony.horse", 400, "invalid version string: pony.horse"),
        ("1.2.3", 400, "invalid version string: 1.2.3"),
        ("0.5", 406, "Unacceptable version header: 0.5"),
        ("9.99", 406, "Unacceptable version header: 9.99"),
    ],
    ids=["garbage is 400", "three parts is 400", "too low is 406", "too high is 406"],
)
def test_bad_microversions(api: Api, value: str, status: int, text: str) -> None:
    r = api.get("/resource_providers", mv=value)
    assert r.status_code == status
    assert text in r.text
    entry = r.json()["errors"][0]
    assert "code" not in entry
    assert "openstack-api-version" not in r.headers
    if status == 406:
        assert entry["max_version"] == "1.39" and entry["min_version"] == "1.0"


def test_error_code_only_from_1_23(api: Api) -> None:
    missing = "/resource_providers/00000000-0000-0000-0000-00000000dead"
    assert "code" not in api.get(missing, mv="1.22").json()["errors"][0]
    assert code(api.get(missing, mv="1.23")) == "placement.undefined_code"


def test_trailing_slash_and_unknown_paths_are_404(api: Api) -> None:
    for path in ("/resource_providers/", "/nope", "/resource_providers/x/bogus"):
        r = api.get(path, mv="1.39")
        assert r.status_code == 404, path
        assert "The resource could not be found." in r.text
        assert "vary" not in r.headers  # quirk: router errors lack vary
        assert r.headers["openstack-api-version"] == "placement 1.39"


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("DELETE", "/resource_providers", "GET, POST"),
        ("POST", "/resource_providers/abc", "GET, PUT, DELETE"),
        ("PATCH", "/resource_providers/abc/inventories", "GET, POST, PUT, DELETE"),
        ("OPTIONS", "/", "GET"),
        ("HEAD", "/resource_providers", "GET, POST"),
    ],
    ids=[
        "collection",
        "single item",
        "inventories",
        "OPTIONS on root without CORS",
        "HEAD is not special",
    ],
)
def test_unsupported_method_is_405_with_allow(api: Api, method: str, path: str, allow: str) -> None:
    r = api.request(method, path, mv="1.39")
    assert r.status_code == 405
    assert r.headers["allow"] == allow
    if method != "HEAD":
        assert f"The method {method} is not allowed for this resource." in r.text


def test_delete_all_inventories_below_1_5_is_405(api: Api) -> None:
    rp = api.provider()
    r = api.delete(f"/resource_providers/{rp}/inventories", mv="1.4")
    assert r.status_code == 405
    # Placement's bare 405 from its versioned handler: WebOb's sentence, no detail, no
    # Allow header (a differential run found Berth adding both).
    assert detail(r) == "The method DELETE is not allowed for this resource. \n\n "
    assert "allow" not in {k.lower() for k in r.headers}
    assert api.delete(f"/resource_providers/{rp}/inventories", mv="1.5").status_code == 204


def test_handler_newer_than_request_is_404_with_empty_detail(api: Api) -> None:
    r = api.get("/traits", mv="1.5")
    assert r.status_code == 404
    assert detail(r) == "The resource could not be found.\n\n   "


def test_accept_must_allow_json(api: Api) -> None:
    r = api.get("/resource_providers", headers={"Accept": "text/plain"})
    assert r.status_code == 406
    assert "Only application/json is provided" in r.text
    browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
    assert api.get("/resource_providers", headers={"Accept": browser}).status_code == 200


def test_error_body_follows_accept(api: Api) -> None:
    r = api.get("/nope", headers={"Accept": "text/html"})
    assert r.status_code == 404
    assert r.headers["content-type"].startswith("text/html")
    assert "<h1>404 Not Found</h1>" in r.text


def test_content_type_is_required_with_a_body(api: Api) -> None:
    r = api.post(
        "/resource_providers",
        content=b'{"name": "x"}',
        headers={"Content-Type": ""},
    )
    assert r.status_code == 400
    assert "content-type header required when content-length > 0" in r.text


def test_wrong_media_type_is_415(api: Api) -> None:
    r = api.post(
        "/resource_providers", content=b'{"name": "x"}', headers={"Content-Type": "text/plain"}
    )
    assert r.status_code == 415
    assert "The media type text/plain is not supported, use application/json" in r.text
    r = api.post("/resource_providers", headers={"Content-Type": ""})
    assert r.status_code == 415
    assert "The media type None is not supported, use application/json" in r.text


def test_charset_parameter_is_ignored(api: Api) -> None:
    r = api.post(
        "/resource_providers",
        content=json.dumps({"name": "charset-ok"}).encode(),
        headers={"Content-Type": "application/json; charset=UTF-8"},
    )
    assert r.status_code == 201


def test_non_integer_content_length_is_400(server: object, api: Api) -> None:
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(api.base)
    with socket.create_connection((parts.hostname, parts.port)) as sock:
        sock.sendall(
            b"GET /resource_providers HTTP/1.1\r\nHost: x\r\nX-Auth-Token: admin\r\n"
            b"Content-Length: abc\r\nConnection: close\r\n\r\n"
        )
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    # The HTTP server itself rejects a non-numeric Content-Length before the app sees it.
    assert data.startswith(b"HTTP/1.1 400")


def test_malformed_json_is_400(api: Api) -> None:
    r = api.post(
        "/resource_providers", content=b"{bad", headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400
    assert "Malformed JSON: " in r.text


def test_cache_headers_only_from_1_15(api: Api) -> None:
    old = api.get("/resource_providers", mv="1.14")
    assert "last-modified" not in old.headers and "cache-control" not in old.headers
    new = api.get("/resource_providers", mv="1.15")
    assert new.headers["cache-control"] == "no-cache"
    assert new.headers["last-modified"].endswith(" GMT")


def test_inventories_without_inventory_send_no_last_modified(api: Api) -> None:
    rp = api.provider()
    r = api.get(f"/resource_providers/{rp}/inventories", mv="1.15")
    assert r.headers["cache-control"] == "no-cache"
    assert "last-modified" not in r.headers


def test_system_scope_is_forbidden(api: Api) -> None:
    r = api.get("/resource_providers", mv="1.39", headers={"OpenStack-System-Scope": "all"})
    assert r.status_code == 403
    assert "Policy does not allow placement:resource_providers:list to be performed." in r.text
    assert "vary" not in r.headers


def test_non_admin_is_forbidden_but_service_role_is_allowed(api: Api) -> None:
    assert api.get("/resource_providers", token="user").status_code == 403
    r = api.get("/resource_providers", token="user", headers={"X-Roles": "service"})
    assert r.status_code == 200


def test_token_with_empty_user_is_401(api: Api) -> None:
    assert api.get("/resource_providers", token=":proj").status_code == 401


def test_never_a_500_for_unicode_paths(api: Api) -> None:
    r = api.get("/resource_providers/%C3%A9", mv="1.39")
    assert r.status_code == 404
    assert isinstance(httpx.Response, type)


def test_wsgiref_invented_content_type_counts_as_missing(tmp_path: object) -> None:
    import threading
    from pathlib import Path
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from berth.placement.cli import make_wsgi_app

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    app = make_wsgi_app(str(Path(str(tmp_path)) / "wsgiref.sqlite"))
    httpd = make_server("127.0.0.1", 0, app, handler_class=Quiet)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{httpd.server_port}"
        r = httpx.post(f"{url}/resource_providers", headers={"X-Auth-Token": "admin"})
        assert r.status_code == 415
        assert "The media type None is not supported, use application/json" in r.text
    finally:
        httpd.shutdown()
        httpd.server_close()
