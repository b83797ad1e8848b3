"""Stand-ins for Glance and Neutron, enough for a real Nova 34 to boot, move and delete
servers on the fake virt driver without networks (``"networks": "none"``).

* Glance (v2): version discovery, ``GET /v2/images`` and ``/v2/images/{id}`` for the
  images given (``cirros``, raw, x86_64 by default), ``/v2/schemas/image`` (permissive).
* Neutron (v2.0): version discovery, ``GET`` of any collection answers it empty (the
  ``default`` security group excepted), ``GET`` of one resource 404, every write 204/201
  with an empty body.

Run as ``python -m peers.novafakes glance|neutron PORT`` (from ``tests/``).
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable, Iterable
from typing import Any

IMAGE_ID = "155d900f-4e14-4e4c-a73d-069cbf4541e6"
STAMP = "2026-01-01T00:00:00Z"


def image(image_id: str = IMAGE_ID, name: str = "cirros", **properties: str) -> dict[str, Any]:
    """An active raw image as Glance v2 shows it."""
    return {"id": image_id, "name": name, "status": "active", "visibility": "public",
            "protected": False, "container_format": "bare", "disk_format": "raw",
            "min_ram": 0, "min_disk": 0, "size": 25165824, "virtual_size": None,
            "checksum": "", "os_hash_algo": None, "os_hash_value": None, "owner": "admin",
            "created_at": STAMP, "updated_at": STAMP, "tags": [], "file":
            f"/v2/images/{image_id}/file", "self": f"/v2/images/{image_id}",
            "schema": "/v2/schemas/image", "hw_architecture": "x86_64", **properties}


_TEXT = {"type": ["null", "string"]}
_NUMBER = {"type": ["null", "integer"]}
#: Glance's image schema, as glanceclient validates its models with it.
IMAGE_SCHEMA = {
    "name": "image", "additionalProperties": {"type": "string"}, "links": [],
    "properties": {
        **{k: _TEXT for k in ("id", "name", "status", "visibility", "checksum", "owner",
                              "container_format", "disk_format", "created_at", "updated_at",
                              "file", "self", "schema", "os_hash_algo", "os_hash_value",
                              "direct_url")},
        **{k: _NUMBER for k in ("size", "virtual_size", "min_ram", "min_disk")},
        "protected": {"type": "boolean"}, "os_hidden": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "locations": {"type": "array"},
    },
}

Start = Callable[..., Any]


def _reply(start: Start, status: str, body: Any = None) -> Iterable[bytes]:
    data = b"" if body is None else json.dumps(body).encode()
    start(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]


def glance(images: list[dict[str, Any]]) -> Any:
    by_id = {i["id"]: i for i in images}

    def app(environ: dict[str, Any], start: Start) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/").rstrip("/") or "/"
        host = f"http://{environ.get('HTTP_HOST', '127.0.0.1')}"
        if path in ("/", "/versions"):
            return _reply(start, "300 Multiple Choices" if path == "/" else "200 OK", {
                "versions": [{"id": "v2.16", "status": "CURRENT",
                              "links": [{"rel": "self", "href": f"{host}/v2/"}]}]})
        if path == "/v2/schemas/image":
            return _reply(start, "200 OK", IMAGE_SCHEMA)
        if path == "/v2/images":
            return _reply(start, "200 OK", {"images": images, "schema": "/v2/schemas/images",
                                            "first": "/v2/images"})
        if path.startswith("/v2/images/"):
            found = by_id.get(path.split("/")[3])
            if found is not None:
                return _reply(start, "200 OK", found)
        return _reply(start, "404 Not Found", {"message": f"no {path}"})

    return app


def neutron() -> Any:
    default_group = {"id": str(uuid.uuid5(uuid.NAMESPACE_DNS, "default-sg")), "name": "default",
                     "description": "", "security_group_rules": [], "tenant_id": "admin",
                     "project_id": "admin"}

    def app(environ: dict[str, Any], start: Start) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO", "/").rstrip("/") or "/"
        host = f"http://{environ.get('HTTP_HOST', '127.0.0.1')}"
        if path in ("/", "/v2.0"):
            return _reply(start, "200 OK", {"versions": [{
                "id": "v2.0", "status": "CURRENT",
                "links": [{"rel": "self", "href": f"{host}/v2.0/"}]}]})
        parts = [p for p in path.split("/") if p][1:]  # after v2.0
        if method != "GET":
            return _reply(start, "204 No Content")
        name = parts[0].removesuffix(".json") if parts else ""
        if len(parts) == 1:
            key = name.replace("-", "_")
            items = [default_group] if key == "security_groups" else []
            return _reply(start, "200 OK", {key: items})
        return _reply(start, "404 Not Found", {"NeutronError": {
            "type": "NotFound", "message": f"no {path}", "detail": ""}})

    return app


def main(argv: list[str]) -> int:
    import waitress

    kind, port = argv[1], int(argv[2])
    app = glance([image()]) if kind == "glance" else neutron()
    waitress.serve(app, host="127.0.0.1", port=port, threads=4, _quiet=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
