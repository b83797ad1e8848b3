"""Appendix A wire texts produced by JSON Schema and query parsing, plus the candidates route."""

from __future__ import annotations

import uuid

import pytest

from placement.support import Api, code, detail


def test_empty_post_allocations_is_not_enough_properties(api: Api) -> None:
    r = api.post("/allocations", mv="1.13", json={})
    assert r.status_code == 400
    text = detail(r)
    assert "does not have enough properties" in text or "should be non-empty" in text
    assert "Failed validating 'minProperties'" in text


@pytest.mark.parametrize(
    ("path", "mv", "body", "text"),
    [
        ("/resource_providers", "1.0", {}, "Failed validating 'required' in schema"),
        ("/resource_providers", "1.0", {"name": "x", "uuid": "bad"}, "Failed validating 'format'"),
        (
            "/resource_providers",
            "1.0",
            {"name": "x", "extra": 1},
            "JSON does not validate: Additional properties are not allowed",
        ),
        (
            "/allocations/{c}",
            "1.12",
            {
                "allocations": {str(uuid.UUID(int=7)): {"generation": 1}},
                "project_id": "p",
                "user_id": "u",
            },
            "'resources' is a required property",
        ),
        (
            "/allocations/{c}",
            "1.0",
            {
                "allocations": [
                    {"resource_provider": {"uuid": str(uuid.UUID(int=7))}, "resources": {"VCPU": 0}}
                ]
            },
            "JSON does not validate: 0 is less than the minimum of 1",
        ),
    ],
    ids=["missing required", "bad format", "extra property", "no resources", "zero amount"],
)
def test_schema_texts(api: Api, path: str, mv: str, body: object, text: str) -> None:
    method = "POST" if path == "/resource_providers" else "PUT"
    r = api.request(method, path.format(c=uuid.uuid4()), mv=mv, json=body)
    assert r.status_code == 400
    assert text in detail(r)


def test_resources_with_an_empty_element(api: Api) -> None:
    r = api.get("/resource_providers", mv="1.4", params={"resources": "VCPU:1,"})
    assert r.status_code == 400
    assert (
        "Badly formed resources parameter. Expected resources query string parameter in form: "
        "?resources=VCPU:2,MEMORY_MB:1024. Got: ." in detail(r)
    )


def test_allocation_candidates_route(api: Api) -> None:
    assert (
        api.get("/allocation_candidates", mv="1.9", params={"resources": "VCPU:1"}).status_code
        == 404
    )
    r = api.get(
        "/allocation_candidates",
        mv="1.10",
        params={"resources": "VCPU:1"},
        headers={"Accept": "text/plain"},
    )
    assert r.status_code == 406
    r = api.get("/allocation_candidates", mv="1.10", params={"resources": "VCPU:1"}, token="nobody")
    assert r.status_code == 403
    assert "placement:allocation_candidates:list" in r.text
    r = api.get("/allocation_candidates", mv="1.15", params={"resources": "VCPU:1", "limit": "1"})
    assert r.status_code == 400 and "'limit' was unexpected" in r.text
    r = api.get(
        "/allocation_candidates",
        mv="1.25",
        params={"resources1": "VCPU:1", "group_policy": "bogus"},
    )
    assert "'bogus' is not one of ['none', 'isolate']" in r.text
    r = api.get("/allocation_candidates", mv="1.36", params={"required": "HW_CPU_X86_AVX"})
    assert r.status_code == 400 and code(r) == "placement.query.missing_value"
    rp = api.provider(VCPU=4)
    r = api.get("/allocation_candidates", mv="1.39", params={"resources": "VCPU:4"})
    assert r.status_code == 200
    assert r.headers["cache-control"] == "no-cache" and "last-modified" in r.headers
    body = r.json()
    assert any(rp in req["allocations"] for req in body["allocation_requests"])
    assert body["provider_summaries"][rp]["resources"]["VCPU"] == {"capacity": 4, "used": 0}
