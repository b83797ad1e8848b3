"""Inventories (reference 4.3): create, replace, update, delete, capacity and in-use rules."""

from __future__ import annotations

import uuid

import pytest

from placement.support import Api, code, detail

MAX_INT = 2147483647


def inv_url(rp: str, rc: str | None = None) -> str:
    return f"/resource_providers/{rp}/inventories" + (f"/{rc}" if rc else "")


def test_post_inventory_applies_defaults_and_bumps_generation(any_api: Api) -> None:
    api = any_api
    rp = api.provider()
    r = api.post(inv_url(rp), mv="1.39", json={"resource_class": "VCPU", "total": 8})
    assert r.status_code == 201
    assert r.json() == {
        "total": 8,
        "reserved": 0,
        "min_unit": 1,
        "max_unit": MAX_INT,
        "step_size": 1,
        "allocation_ratio": 1.0,
        "resource_provider_generation": 1,
    }
    assert r.headers["location"].endswith(f"/resource_providers/{rp}/inventories/VCPU")
    again = api.post(inv_url(rp), mv="1.39", json={"resource_class": "VCPU", "total": 8})
    assert again.status_code == 409
    assert "Update conflict" in again.text and code(again) == "placement.concurrent_update"


@pytest.mark.parametrize(
    ("body", "text"),
    [
        (
            {"resource_class": "VCPU", "total": 0},
            "Failed validating 'minimum' in schema['properties']['total']",
        ),
        ({"resource_class": "VCPU", "total": -1}, "-1 is less than the minimum of 1"),
        ({"resource_class": "VCPU"}, "'total' is a required property"),
        (
            {"resource_class": "VCPU", "total": 1, "min_unit": 0},
            "Failed validating 'minimum' in schema['properties']['min_unit']",
        ),
        ({"resource_class": "VCPU", "total": MAX_INT + 1}, "Failed validating 'maximum'"),
        ({"resource_class": "vcpu", "total": 1}, "Failed validating 'pattern'"),
        ({"resource_class": "VCPU", "total": 1, "bad_field": 1}, "'bad_field' was unexpected"),
    ],
    ids=[
        "zero total",
        "negative total",
        "missing total",
        "zero min_unit",
        "over MAX_INT",
        "lower-case class",
        "unknown field",
    ],
)
def test_post_inventory_schema_errors(api: Api, body: dict[str, object], text: str) -> None:
    rp = api.provider()
    r = api.post(inv_url(rp), mv="1.39", json=body)
    assert r.status_code == 400
    assert text in detail(r)


def test_post_inventory_semantic_errors(api: Api) -> None:
    rp = api.provider()
    r = api.post(inv_url(rp), json={"resource_class": "NO_CLASS_14", "total": 1})
    assert r.status_code == 400
    assert f"Unable to create inventory for resource provider {rp}" in r.text
    assert "No such resource class NO_CLASS_14" in r.text
    r = api.post(inv_url(rp), mv="1.25", json={"resource_class": "VCPU", "total": 4, "reserved": 4})
    assert "greater than or equal to total" in r.text
    ok = api.post(
        inv_url(rp), mv="1.26", json={"resource_class": "VCPU", "total": 4, "reserved": 4}
    )
    assert ok.status_code == 201
    r = api.post(
        inv_url(rp), mv="1.26", json={"resource_class": "DISK_GB", "total": 4, "reserved": 5}
    )
    assert "greater than total" in r.text
    missing = str(uuid.uuid4())
    assert (
        api.post(inv_url(missing), json={"resource_class": "VCPU", "total": 1}).status_code == 404
    )


def test_get_inventories_and_one_inventory(api: Api) -> None:
    rp = api.provider(VCPU=8, DISK_GB=100)
    body = api.get(inv_url(rp), mv="1.15").json()
    assert body["resource_provider_generation"] == 1
    assert set(body["inventories"]) == {"VCPU", "DISK_GB"}
    one = api.get(inv_url(rp, "VCPU"), mv="1.15")
    assert one.json()["total"] == 8 and one.json()["resource_provider_generation"] == 1
    assert "last-modified" in one.headers
    r = api.get(inv_url(rp, "IPV4_ADDRESS"))
    assert r.status_code == 404 and f"No inventory of class IPV4_ADDRESS for {rp}" in r.text
    missing = str(uuid.uuid4())
    r = api.get(inv_url(missing))
    assert r.status_code == 404 and f"No resource provider with uuid {missing} found : " in r.text


def test_put_inventories_replaces_all_and_checks_generation_first(any_api: Api) -> None:
    api = any_api
    rp = api.provider(VCPU=8)
    r = api.put(
        inv_url(rp),
        json={"resource_provider_generation": 99, "inventories": {"BOGUS": {"total": 1}}},
    )
    assert r.status_code == 409
    assert "resource provider generation conflict" in r.text
    assert (
        code(
            api.put(
                inv_url(rp), mv="1.23", json={"resource_provider_generation": 99, "inventories": {}}
            )
        )
        == "placement.concurrent_update"
    )
    r = api.put(
        inv_url(rp),
        json={"resource_provider_generation": 1, "inventories": {"BOGUS": {"total": 1}}},
    )
    assert r.status_code == 400
    assert "Unknown resource class in inventory for resource provider" in r.text
    r = api.put(
        inv_url(rp),
        json={"resource_provider_generation": 1, "inventories": {"DISK_GB": {"total": 10}}},
    )
    assert r.status_code == 200
    assert r.json()["resource_provider_generation"] == 2
    assert set(r.json()["inventories"]) == {"DISK_GB"}
    r = api.put(inv_url(rp), json={"resource_provider_generation": 2, "inventories": {}})
    assert r.status_code == 200 and r.json()["resource_provider_generation"] == 3
    r = api.put(inv_url(rp), json={"resource_provider_generation": 3})
    assert "'inventories' is a required property" in r.text
    r = api.put(inv_url(rp), json={"inventories": {}})
    assert "'resource_provider_generation' is a required property" in r.text


def test_put_one_inventory(any_api: Api) -> None:
    api = any_api
    rp = api.provider(VCPU=8)
    r = api.put(inv_url(rp, "VCPU"), json={"resource_provider_generation": 1, "total": 16})
    assert r.status_code == 200
    assert r.json()["total"] == 16 and r.json()["resource_provider_generation"] == 2
    r = api.put(inv_url(rp, "VCPU"), json={"resource_provider_generation": 1, "total": 16})
    assert r.status_code == 409 and "resource provider generation conflict" in r.text
    r = api.put(inv_url(rp, "DISK_GB"), json={"resource_provider_generation": 2, "total": 16})
    assert r.status_code == 400
    assert f"No inventory record with resource class for resource provider {rp}" in r.text
    # The body is validated first: reserved above total on a class the provider lacks
    # reports the capacity, as Placement does, not the missing inventory.
    r = api.put(inv_url(rp, "MEMORY_MB"),
                json={"resource_provider_generation": 2, "total": 16, "reserved": 32})
    assert r.status_code == 400
    assert (f"Unable to update inventory for resource provider {rp}: Invalid inventory for "
            f"'MEMORY_MB' on resource provider '{rp}'. The reserved value is greater than"
            in r.text)
    r = api.put(inv_url(rp, "NO_CLASS_14"), json={"resource_provider_generation": 2, "total": 16})
    assert r.status_code == 404 and "No such resource class NO_CLASS_14" in r.text
    assert "vary" not in r.headers
    r = api.put(
        inv_url(rp, "VCPU"), json={"resource_provider_generation": 2, "total": 4, "reserved": 4}
    )
    assert (
        r.status_code == 400 and f"Unable to update inventory for resource provider {rp}" in r.text
    )
    r = api.put(inv_url(rp, "VCPU"), json={"total": 4})
    assert "'resource_provider_generation' is a required property" in r.text


def test_delete_one_inventory(any_api: Api) -> None:
    api = any_api
    rp = api.provider(VCPU=8, DISK_GB=10)
    assert api.delete(inv_url(rp, "VCPU")).status_code == 204
    assert api.generation(rp) == 2
    r = api.delete(inv_url(rp, "IPV4_ADDRESS"))
    assert r.status_code == 404 and "No inventory of class IPV4_ADDRESS found for delete" in r.text


def _allocate(api: Api, rp: str, **resources: int) -> str:
    consumer = str(uuid.uuid4())
    r = api.put(
        f"/allocations/{consumer}",
        mv="1.39",
        json={
            "allocations": {rp: {"resources": resources}},
            "project_id": "p",
            "user_id": "u",
            "consumer_generation": None,
            "consumer_type": "INSTANCE",
        },
    )
    assert r.status_code == 204, r.text
    return consumer


def test_in_use_inventory_cannot_be_removed(any_api: Api) -> None:
    api = any_api
    rp = api.provider(VCPU=8, DISK_GB=100, MEMORY_MB=1024)
    _allocate(api, rp, VCPU=2, DISK_GB=10)
    gen = api.generation(rp)
    r = api.put(
        inv_url(rp),
        mv="1.39",
        json={"resource_provider_generation": gen, "inventories": {"MEMORY_MB": {"total": 1}}},
    )
    assert r.status_code == 409
    assert f"Inventory for 'VCPU, DISK_GB' on resource provider '{rp}' in use" in r.text
    assert code(r) == "placement.inventory.inuse"
    r = api.delete(inv_url(rp, "VCPU"), mv="1.39")
    assert r.status_code == 409
    assert "Unable to delete inventory of class VCPU" in r.text
    assert code(r) == "placement.concurrent_update"
    r = api.delete(inv_url(rp), mv="1.39")
    assert r.status_code == 409 and code(r) == "placement.inventory.inuse"
    # Shrinking below current usage is allowed.
    r = api.put(
        inv_url(rp),
        mv="1.39",
        json={
            "resource_provider_generation": gen,
            "inventories": {"VCPU": {"total": 1}, "DISK_GB": {"total": 100}},
        },
    )
    assert r.status_code == 200, r.text
