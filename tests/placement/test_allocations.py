"""Allocations (reference 4.7-4.9, 3.1): every body version, consumer generations, capacity."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from placement.support import Api, code, detail


def new_uuid() -> str:
    return str(uuid.uuid4())


def body_138(rp: str, gen: int | None, **resources: int) -> dict[str, Any]:
    return {
        "allocations": {rp: {"resources": resources}},
        "project_id": "proj",
        "user_id": "user",
        "consumer_generation": gen,
        "consumer_type": "INSTANCE",
    }


def test_put_list_format_below_1_8_uses_incomplete_ids(any_api: Api) -> None:
    api = any_api
    rp = api.provider(VCPU=8)
    consumer = new_uuid()
    body = {"allocations": [{"resource_provider": {"uuid": rp}, "resources": {"VCPU": 2}}]}
    assert api.put(f"/allocations/{consumer}", mv="1.0", json=body).status_code == 204
    got = api.get(f"/allocations/{consumer}", mv="1.12").json()
    assert got["allocations"] == {rp: {"resources": {"VCPU": 2}, "generation": 2}}
    assert got["project_id"] == "00000000-0000-0000-0000-000000000000"
    r = api.put(f"/allocations/{consumer}", mv="1.0", json={**body, "project_id": "p"})
    assert "'project_id' was unexpected" in r.text
    r = api.put(f"/allocations/{consumer}", mv="1.8", json=body)
    assert "'project_id' is a required property" in r.text


def test_put_dict_format_and_get_by_version(any_api: Api) -> None:
    api = any_api
    rp = api.provider(VCPU=8, MEMORY_MB=1024)
    consumer = new_uuid()
    body = {
        "allocations": {rp: {"resources": {"VCPU": 1, "MEMORY_MB": 256}}},
        "project_id": "proj",
        "user_id": "user",
    }
    assert api.put(f"/allocations/{consumer}", mv="1.12", json=body).status_code == 204
    assert api.get(f"/allocations/{consumer}", mv="1.11").json().keys() == {"allocations"}
    got = api.get(f"/allocations/{consumer}", mv="1.38").json()
    assert got["consumer_generation"] == 1
    assert got["consumer_type"] == "unknown"
    assert got["project_id"] == "proj" and got["user_id"] == "user"
    prov = api.get(f"/resource_providers/{rp}/allocations", mv="1.28").json()
    assert prov["allocations"][consumer] == {
        "resources": {"VCPU": 1, "MEMORY_MB": 256},
        "consumer_generation": 1,
    }
    assert api.get(f"/resource_providers/{rp}/usages").json()["usages"] == {
        "VCPU": 1,
        "MEMORY_MB": 256,
    }


def test_unknown_consumer_gives_empty_allocations(api: Api) -> None:
    assert api.get(f"/allocations/{new_uuid()}", mv="1.38").json() == {"allocations": {}}
    assert api.get("/allocations/not-a-uuid").json() == {"allocations": {}}


def test_consumer_generations(any_api: Api) -> None:
    api = any_api
    rp = api.provider(VCPU=8)
    consumer = new_uuid()
    r = api.put(
        f"/allocations/{consumer}",
        mv="1.28",
        json={**body_138(rp, 5, VCPU=1), "consumer_type": None} | {},
    )
    assert r.status_code == 400  # consumer_type null is not allowed in 1.28 either (unexpected)
    b = body_138(rp, 5, VCPU=1)
    del b["consumer_type"]
    r = api.put(f"/allocations/{consumer}", mv="1.28", json=b)
    assert r.status_code == 409
    assert "consumer generation conflict - expected null but got 5" in r.text
    assert code(r) == "placement.concurrent_update"
    b["consumer_generation"] = None
    assert api.put(f"/allocations/{consumer}", mv="1.28", json=b).status_code == 204
    b["consumer_generation"] = 3
    r = api.put(f"/allocations/{consumer}", mv="1.28", json=b)
    assert "consumer generation conflict - expected 1 but got 3" in r.text
    b["consumer_generation"] = 1
    assert api.put(f"/allocations/{consumer}", mv="1.28", json=b).status_code == 204
    assert api.get(f"/allocations/{consumer}", mv="1.28").json()["consumer_generation"] == 2
    del b["consumer_generation"]
    r = api.put(f"/allocations/{consumer}", mv="1.28", json=b)
    assert "'consumer_generation' is a required property" in r.text


def test_empty_allocations_delete_the_consumer_from_1_28(any_api: Api) -> None:
    api = any_api
    rp = api.provider(VCPU=8)
    consumer = new_uuid()
    assert (
        api.put(f"/allocations/{consumer}", mv="1.39", json=body_138(rp, None, VCPU=2)).status_code
        == 204
    )
    gen_before = api.generation(rp)
    empty = body_138(rp, 1)
    empty["allocations"] = {}
    assert api.put(f"/allocations/{consumer}", mv="1.39", json=empty).status_code == 204
    assert api.get(f"/allocations/{consumer}", mv="1.39").json() == {"allocations": {}}
    assert api.generation(rp) == gen_before + 1
    # The consumer is gone, so the next write must send null.
    r = api.put(f"/allocations/{consumer}", mv="1.39", json=body_138(rp, 1, VCPU=1))
    assert "expected null but got 1" in r.text
    r = api.put(
        f"/allocations/{consumer}",
        mv="1.27",
        json={"allocations": {}, "project_id": "p", "user_id": "u"},
    )
    assert r.status_code == 400 and "JSON does not validate" in r.text


def test_consumer_type_from_1_38(any_api: Api) -> None:
    api = any_api
    rp = api.provider(VCPU=8)
    consumer = new_uuid()
    b = body_138(rp, None, VCPU=1)
    r = api.put(f"/allocations/{consumer}", mv="1.37", json=b)
    assert "'consumer_type' was unexpected" in r.text
    del b["consumer_type"]
    r = api.put(f"/allocations/{consumer}", mv="1.38", json=b)
    assert "'consumer_type' is a required property" in r.text
    b["consumer_type"] = "instance"
    r = api.put(f"/allocations/{consumer}", mv="1.38", json=b)
    assert "'instance' does not match '^[A-Z0-9_]+$'" in r.text
    b["consumer_type"] = "MIGRATION"
    assert api.put(f"/allocations/{consumer}", mv="1.38", json=b).status_code == 204
    assert api.get(f"/allocations/{consumer}", mv="1.38").json()["consumer_type"] == "MIGRATION"


def test_mappings_are_accepted_and_ignored_from_1_34(api: Api) -> None:
    rp = api.provider(VCPU=8)
    b = body_138(rp, None, VCPU=1)
    del b["consumer_type"]
    b["mappings"] = {"": [rp]}
    assert api.put(f"/allocations/{new_uuid()}", mv="1.33", json=b).status_code == 400
    assert api.put(f"/allocations/{new_uuid()}", mv="1.34", json=b).status_code == 204


def test_empty_mappings_are_refused_on_put_and_post_as_placement_does(api: Api) -> None:
    rp = api.provider(VCPU=8)
    b = body_138(rp, None, VCPU=1)
    del b["consumer_type"]
    b["mappings"] = {}
    r = api.put(f"/allocations/{new_uuid()}", mv="1.34", json=b)
    assert r.status_code == 400 and "{} should be non-empty" in r.text
    r = api.post("/allocations", mv="1.34", json={new_uuid(): b})
    assert r.status_code == 400 and "{} should be non-empty" in r.text


def test_capacity_and_constraints(any_api: Api) -> None:
    api = any_api
    rp = api.provider(VCPU=4)
    gen = api.generation(rp)
    api.put(
        f"/resource_providers/{rp}/inventories/VCPU",
        json={"resource_provider_generation": gen, "total": 4, "max_unit": 3, "step_size": 1},
    )
    first = new_uuid()
    assert (
        api.put(f"/allocations/{first}", mv="1.39", json=body_138(rp, None, VCPU=3)).status_code
        == 204
    )
    r = api.put(f"/allocations/{new_uuid()}", mv="1.39", json=body_138(rp, None, VCPU=2))
    assert r.status_code == 409
    assert (
        f"Unable to allocate inventory: Unable to create allocation for 'VCPU' on resource provider '{rp}'. The requested amount would exceed the capacity."
        in r.text
    )
    assert code(r) == "placement.undefined_code"
    r = api.put(f"/allocations/{new_uuid()}", mv="1.39", json=body_138(rp, None, VCPU=4))
    assert "The requested amount would violate inventory constraints." in r.text
    r = api.put(f"/allocations/{new_uuid()}", mv="1.39", json=body_138(rp, None, PCI_DEVICE=1))
    assert f"Inventory for 'PCI_DEVICE' on resource provider '{rp}' invalid." in r.text
    r = api.put(f"/allocations/{new_uuid()}", mv="1.39", json=body_138(rp, None, CUSTOM_PONY=1))
    assert r.status_code == 400
    assert (
        "Unable to allocate inventory for consumer" in r.text
        and "No such resource class CUSTOM_PONY" in r.text
    )
    # Re-putting the same allocation always fits.
    assert (
        api.put(f"/allocations/{first}", mv="1.39", json=body_138(rp, 1, VCPU=3)).status_code == 204
    )
    # Failed writes left no consumers behind.
    assert api.get(f"/resource_providers/{rp}/usages").json()["usages"] == {"VCPU": 3}


def test_over_capacity_write_that_does_not_increase_usage_is_allowed(any_api: Api) -> None:
    api = any_api
    rp = api.provider(VCPU=8)
    consumer = new_uuid()
    assert (
        api.put(f"/allocations/{consumer}", mv="1.39", json=body_138(rp, None, VCPU=8)).status_code
        == 204
    )
    gen = api.generation(rp)
    r = api.put(
        f"/resource_providers/{rp}/inventories/VCPU",
        json={"resource_provider_generation": gen, "total": 4},
    )
    assert r.status_code == 200
    assert (
        api.put(f"/allocations/{consumer}", mv="1.39", json=body_138(rp, 1, VCPU=6)).status_code
        == 204
    )
    r = api.put(f"/allocations/{consumer}", mv="1.39", json=body_138(rp, 2, VCPU=7))
    assert r.status_code == 409 and "exceed the capacity" in r.text


def test_missing_provider_keeps_the_new_consumer(any_api: Api) -> None:
    api = any_api
    consumer, ghost = new_uuid(), new_uuid()
    r = api.put(f"/allocations/{consumer}", mv="1.39", json=body_138(ghost, None, VCPU=1))
    assert r.status_code == 400
    assert f"Allocation for resource provider '{ghost}' that does not exist" in r.text
    rp = api.provider(VCPU=1)
    r = api.put(f"/allocations/{consumer}", mv="1.39", json=body_138(rp, None, VCPU=1))
    assert "consumer generation conflict - expected 0 but got None" in r.text
    assert (
        api.put(f"/allocations/{consumer}", mv="1.39", json=body_138(rp, 0, VCPU=1)).status_code
        == 204
    )


def test_malformed_consumer_uuid(api: Api) -> None:
    r = api.put("/allocations/not-a-uuid", mv="1.39", json={})
    assert r.status_code == 400 and "Malformed consumer_uuid: not-a-uuid" in r.text


def test_provider_generations_bumped_only_for_providers_in_the_new_data(any_api: Api) -> None:
    api = any_api
    a, b = api.provider(VCPU=8), api.provider(VCPU=8)
    consumer = new_uuid()
    api.put(f"/allocations/{consumer}", mv="1.39", json=body_138(a, None, VCPU=1))
    ga, gb = api.generation(a), api.generation(b)
    api.put(f"/allocations/{consumer}", mv="1.39", json=body_138(b, 1, VCPU=1))
    assert (api.generation(a), api.generation(b)) == (ga, gb + 1)
    assert api.get(f"/resource_providers/{a}/usages").json()["usages"] == {"VCPU": 0}


def test_delete_allocations(any_api: Api) -> None:
    api = any_api
    rp = api.provider(VCPU=8)
    consumer = new_uuid()
    api.put(f"/allocations/{consumer}", mv="1.39", json=body_138(rp, None, VCPU=1))
    gen = api.generation(rp)
    assert api.delete(f"/allocations/{consumer}").status_code == 204
    assert api.generation(rp) == gen
    r = api.delete(f"/allocations/{consumer}")
    assert r.status_code == 404 and f"No allocations for consumer '{consumer}'" in r.text
    r = api.delete(f"/resource_providers/{rp}")
    assert r.status_code == 204


def test_provider_with_allocations_cannot_be_deleted(api: Api) -> None:
    rp = api.provider(VCPU=8)
    api.put(f"/allocations/{new_uuid()}", mv="1.39", json=body_138(rp, None, VCPU=1))
    r = api.delete(f"/resource_providers/{rp}", mv="1.39")
    assert r.status_code == 409
    assert f"Unable to delete resource provider {rp}: Resource provider has allocations." in r.text
    assert code(r) == "placement.resource_provider.inuse"


def test_post_allocations_for_several_consumers(any_api: Api) -> None:
    api = any_api
    rp = api.provider(VCPU=8)
    c1, c2 = new_uuid(), new_uuid()
    assert api.post("/allocations", mv="1.12", json={}).status_code == 404
    body = {
        c1: {
            "allocations": {rp: {"resources": {"VCPU": 2}}},
            "project_id": "p",
            "user_id": "u",
            "consumer_generation": None,
            "consumer_type": "INSTANCE",
        },
        c2: {
            "allocations": {rp: {"resources": {"VCPU": 3}}},
            "project_id": "p",
            "user_id": "u",
            "consumer_generation": None,
            "consumer_type": "INSTANCE",
        },
    }
    gen = api.generation(rp)
    assert api.post("/allocations", mv="1.39", json=body).status_code == 204
    assert api.generation(rp) == gen + 1
    assert api.get(f"/resource_providers/{rp}/usages").json()["usages"] == {"VCPU": 5}
    # Clearing one consumer with an empty allocations dict.
    clear = {
        c1: {
            "allocations": {},
            "project_id": "p",
            "user_id": "u",
            "consumer_generation": 1,
            "consumer_type": "INSTANCE",
        }
    }
    assert api.post("/allocations", mv="1.39", json=clear).status_code == 204
    assert api.get(f"/allocations/{c1}").json() == {"allocations": {}}
    # Over capacity across consumers: nothing is written and new consumers vanish.
    c3, c4 = new_uuid(), new_uuid()
    over = {
        c3: {
            "allocations": {rp: {"resources": {"VCPU": 3}}},
            "project_id": "p",
            "user_id": "u",
            "consumer_generation": None,
            "consumer_type": "INSTANCE",
        },
        c4: {
            "allocations": {rp: {"resources": {"VCPU": 3}}},
            "project_id": "p",
            "user_id": "u",
            "consumer_generation": None,
            "consumer_type": "INSTANCE",
        },
    }
    r = api.post("/allocations", mv="1.39", json=over)
    assert r.status_code == 409 and "exceed the capacity" in r.text
    assert api.get(f"/allocations/{c3}").json() == {"allocations": {}}
    over[c3]["allocations"] = {rp: {"resources": {"COWS": 1}}}
    r = api.post("/allocations", mv="1.39", json=over)
    assert (
        r.status_code == 400
        and "Unable to allocate inventory No such resource class COWS." in r.text
    )
    r = api.post("/allocations", mv="1.39", json={"not-a-uuid": {}})
    assert "does not match any of the regexes" in detail(r)


def test_usages_by_project_user_and_consumer_type(any_api: Api) -> None:
    api = any_api
    rp = api.provider(VCPU=64, MEMORY_MB=65536)
    project = f"proj-{new_uuid()}"
    for ctype, user in (("INSTANCE", "u1"), ("INSTANCE", "u2"), ("MIGRATION", "u1")):
        b = body_138(rp, None, VCPU=2, MEMORY_MB=128)
        b.update(project_id=project, user_id=user, consumer_type=ctype)
        assert api.put(f"/allocations/{new_uuid()}", mv="1.38", json=b).status_code == 204
    old = {"allocations": {rp: {"resources": {"VCPU": 1}}}, "project_id": project, "user_id": "u3"}
    api.put(f"/allocations/{new_uuid()}", mv="1.12", json=old)
    assert api.get("/usages", mv="1.8", params={"project_id": project}).status_code == 404
    flat = api.get("/usages", mv="1.9", params={"project_id": project}).json()
    assert flat == {"usages": {"VCPU": 7, "MEMORY_MB": 384}}
    by_user = api.get("/usages", mv="1.9", params={"project_id": project, "user_id": "u1"}).json()
    assert by_user == {"usages": {"VCPU": 4, "MEMORY_MB": 256}}
    grouped = api.get("/usages", mv="1.38", params={"project_id": project}).json()["usages"]
    assert grouped == {
        "INSTANCE": {"VCPU": 4, "MEMORY_MB": 256, "consumer_count": 2},
        "MIGRATION": {"VCPU": 2, "MEMORY_MB": 128, "consumer_count": 1},
        "unknown": {"VCPU": 1, "consumer_count": 1},
    }
    everything = api.get(
        "/usages", mv="1.38", params={"project_id": project, "consumer_type": "all"}
    ).json()
    assert everything["usages"] == {"all": {"VCPU": 7, "MEMORY_MB": 384, "consumer_count": 4}}
    unknown = api.get(
        "/usages", mv="1.38", params={"project_id": project, "consumer_type": "unknown"}
    ).json()
    assert unknown["usages"] == {"unknown": {"VCPU": 1, "consumer_count": 1}}
    assert api.get("/usages", mv="1.9", params={"project_id": "nobody"}).json() == {"usages": {}}
    r = api.get("/usages", mv="1.9")
    assert "'project_id' is a required property" in r.text
    r = api.get("/usages", mv="1.9", params={"project_id": project, "consumer_type": "all"})
    assert "Additional properties are not allowed" in r.text


@pytest.mark.parametrize(
    ("mv", "body", "text"),
    [
        ("1.0", {"allocations": []}, "Failed validating 'minItems'"),
        ("1.12", {"allocations": {}, "project_id": "p", "user_id": "u"}, "JSON does not validate"),
        (
            "1.12",
            {
                "allocations": {"x" * 36: {"resources": {"VCPU": 1}}},
                "project_id": "p",
                "user_id": "u",
            },
            "does not match any of the regexes",
        ),
        (
            "1.12",
            {
                "allocations": {str(uuid.UUID(int=1)): {"resources": {"VCPU": 0}}},
                "project_id": "p",
                "user_id": "u",
            },
            "0 is less than the minimum of 1",
        ),
        (
            "1.12",
            {
                "allocations": {str(uuid.UUID(int=1)): {"resources": {}}},
                "project_id": "p",
                "user_id": "u",
            },
            "Failed validating 'minProperties'",
        ),
        (
            "1.12",
            {
                "allocations": {str(uuid.UUID(int=1)): {"resources": {"VCPU": 1}}},
                "project_id": "",
                "user_id": "u",
            },
            "Failed validating 'minLength'",
        ),
    ],
    ids=[
        "empty list",
        "empty dict before 1.28",
        "bad provider key",
        "zero amount",
        "no resources",
        "empty project",
    ],
)
def test_allocation_schema_errors(api: Api, mv: str, body: dict[str, Any], text: str) -> None:
    r = api.put(f"/allocations/{new_uuid()}", mv=mv, json=body)
    assert r.status_code == 400
    assert text in detail(r)
