"""Each endpoint appears exactly at the microversion the reference's section 2 gives it."""

from __future__ import annotations

import uuid

import pytest

from placement.support import Api

RP = "{rp}"

# (method, path, first microversion) straight from the reference's history table.
ENDPOINTS = [
    ("GET", f"/resource_providers/{RP}/aggregates", "1.1"),
    ("PUT", f"/resource_providers/{RP}/aggregates", "1.1"),
    ("GET", "/resource_classes", "1.2"),
    ("POST", "/resource_classes", "1.2"),
    ("GET", "/resource_classes/VCPU", "1.2"),
    ("DELETE", f"/resource_providers/{RP}/inventories", "1.5"),
    ("GET", "/traits", "1.6"),
    ("GET", "/traits/HW_CPU_X86_AVX", "1.6"),
    ("PUT", "/traits/CUSTOM_MV", "1.6"),
    ("GET", f"/resource_providers/{RP}/traits", "1.6"),
    ("GET", "/usages?project_id=p", "1.9"),
    ("GET", "/allocation_candidates?resources=VCPU:1", "1.10"),
    ("POST", "/allocations", "1.13"),
    ("POST", "/reshaper", "1.30"),
]


def _prev(mv: str) -> str:
    major, minor = mv.split(".")
    return f"{major}.{int(minor) - 1}"


@pytest.fixture(scope="module")
def rp(api: Api) -> str:
    return api.provider(VCPU=1)


@pytest.mark.parametrize(
    ("method", "path", "first"),
    ENDPOINTS,
    ids=[f"{m} {p.split('?')[0]} from {v}" for m, p, v in ENDPOINTS],
)
def test_endpoint_appears_at_its_microversion(
    api: Api, rp: str, method: str, path: str, first: str
) -> None:
    url = path.replace(RP, rp)
    body = {} if method in ("POST", "PUT") and "traits/" not in path else None
    before = api.request(method, url, mv=_prev(first), json=body)
    # Below its version a handler is not there: 404 (405 for DELETE inventories).
    expected_before = 405 if path.endswith("/inventories") else 404
    assert before.status_code == expected_before, before.text
    at = api.request(method, url, mv=first, json=body)
    assert at.status_code not in (404, 405) or (
        method == "GET" and "/traits/" in url and at.status_code == 404
    ), at.text


@pytest.mark.parametrize(
    ("mv", "keys"),
    [
        ("1.0", {"uuid", "name", "generation", "links"}),
        (
            "1.14",
            {"uuid", "name", "generation", "links", "parent_provider_uuid", "root_provider_uuid"},
        ),
    ],
)
def test_provider_representation_keys(api: Api, rp: str, mv: str, keys: set[str]) -> None:
    assert set(api.get(f"/resource_providers/{rp}", mv=mv).json()) == keys


def test_put_resource_class_switches_from_rename_to_create_at_1_7(api: Api) -> None:
    name = f"CUSTOM_MV_{uuid.uuid4().hex[:8].upper()}"
    r = api.put(f"/resource_classes/{name}", mv="1.6", json={"name": name})
    assert r.status_code == 404  # rename of a class that does not exist
    assert api.put(f"/resource_classes/{name}", mv="1.7").status_code == 201
    r = api.put(
        f"/resource_classes/{name}", mv="1.6", headers={"Content-Type": "text/plain"}, content=b"x"
    )
    assert r.status_code == 415
