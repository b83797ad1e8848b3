"""POST /reshaper (reference 4.13): atomic inventory and allocation moves."""

from __future__ import annotations

import uuid
from typing import Any

from placement.support import Api, code

SERVICE = {"X-Roles": "service"}


def alloc(rp: str, gen: int | None, **res: int) -> dict[str, Any]:
    return {
        "allocations": {rp: {"resources": res}},
        "project_id": "p",
        "user_id": "u",
        "consumer_generation": gen,
        "consumer_type": "INSTANCE",
    }


def test_reshape_moves_vgpu_inventory_to_a_child(any_api: Api) -> None:
    api = any_api
    root = api.provider(VCPU=8, VGPU=4)
    child = api.provider(parent=root)
    consumer = str(uuid.uuid4())
    assert (
        api.put(
            f"/allocations/{consumer}", mv="1.39", json=alloc(root, None, VCPU=1, VGPU=1)
        ).status_code
        == 204
    )
    g_root, g_child = api.generation(root), api.generation(child)
    body = {
        "inventories": {
            root: {"resource_provider_generation": g_root, "inventories": {"VCPU": {"total": 8}}},
            child: {"resource_provider_generation": g_child, "inventories": {"VGPU": {"total": 4}}},
        },
        "allocations": {
            consumer: {
                "allocations": {
                    root: {"resources": {"VCPU": 1}},
                    child: {"resources": {"VGPU": 1}},
                },
                "project_id": "p",
                "user_id": "u",
                "consumer_generation": 1,
                "consumer_type": "INSTANCE",
            }
        },
    }
    assert api.post("/reshaper", mv="1.38", json=body, headers=SERVICE).status_code == 204
    # Inventory + allocations: +3 each.
    assert api.generation(root) == g_root + 3
    assert api.generation(child) == g_child + 3
    got = api.get(f"/allocations/{consumer}", mv="1.38").json()
    assert got["allocations"][child]["resources"] == {"VGPU": 1}
    assert got["consumer_generation"] == 2
    assert set(api.get(f"/resource_providers/{root}/inventories").json()["inventories"]) == {"VCPU"}


def test_reshaper_errors(api: Api) -> None:
    rp = api.provider(VCPU=8)
    assert api.post("/reshaper", mv="1.29", json={}).status_code == 404
    r = api.post(
        "/reshaper", mv="1.30", json={"inventories": {}, "allocations": {}, "bad_field": 1}
    )
    assert "'bad_field' was unexpected" in r.text
    ghost = str(uuid.uuid4())
    r = api.post(
        "/reshaper",
        mv="1.30",
        json={
            "inventories": {ghost: {"resource_provider_generation": 0, "inventories": {}}},
            "allocations": {},
        },
    )
    assert r.status_code == 400 and code(r) == "placement.resource_provider.not_found"
    assert f"Resource provider {ghost} in inventories not found" in r.text
    gen = api.generation(rp)
    r = api.post(
        "/reshaper",
        mv="1.30",
        json={
            "inventories": {rp: {"resource_provider_generation": gen - 1, "inventories": {}}},
            "allocations": {},
        },
    )
    assert r.status_code == 409 and f"actual: {gen}, given: {gen - 1}" in r.text
    r = api.post(
        "/reshaper",
        mv="1.30",
        json={
            "inventories": {
                rp: {
                    "resource_provider_generation": gen,
                    "inventories": {"DISK_OF_STEEL": {"total": 1}},
                }
            },
            "allocations": {},
        },
    )
    assert r.status_code == 400 and "No such resource class DISK_OF_STEEL" in r.text
    consumer = str(uuid.uuid4())
    api.put(f"/allocations/{consumer}", mv="1.39", json=alloc(rp, None, VCPU=2))
    gen = api.generation(rp)
    r = api.post(
        "/reshaper",
        mv="1.30",
        json={
            "inventories": {rp: {"resource_provider_generation": gen, "inventories": {}}},
            "allocations": {},
        },
    )
    assert r.status_code == 409 and code(r) == "placement.inventory.inuse"
    assert api.generation(rp) == gen  # nothing half-written
    r = api.post(
        "/reshaper",
        mv="1.38",
        json={
            "inventories": {
                rp: {"resource_provider_generation": gen, "inventories": {"VCPU": {"total": 8}}}
            },
            "allocations": {consumer: {**alloc(rp, 1, VCPU=9)}},
        },
    )
    assert r.status_code == 409 and "Unable to allocate inventory" in r.text
    assert api.get(f"/allocations/{consumer}", mv="1.39").json()["allocations"][rp][
        "resources"
    ] == {"VCPU": 2}
