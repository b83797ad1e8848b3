"""Aggregates (4.4), provider traits (4.5), traits (4.11) and resource classes (4.10)."""

from __future__ import annotations

import uuid

from placement.support import Api, code, detail

CUSTOM_TRAIT_MSG = (
    "The trait is invalid. A valid trait must be no longer than 255 characters, start with "
    'the prefix \\"CUSTOM_\\" and use following characters: \\"A\\"-\\"Z\\", \\"0\\"-\\"9\\" and \\"_\\"'
)


def test_aggregates_before_1_19_are_a_bare_list_without_generation_changes(api: Api) -> None:
    rp = api.provider()
    agg = str(uuid.uuid4())
    assert api.get(f"/resource_providers/{rp}/aggregates", mv="1.0").status_code == 404
    r = api.put(f"/resource_providers/{rp}/aggregates", mv="1.1", json=[agg])
    assert r.status_code == 200 and r.json() == {"aggregates": [agg]}
    assert api.generation(rp) == 0
    r = api.put(f"/resource_providers/{rp}/aggregates", mv="1.1", json=[agg, agg])
    assert "has non-unique elements" in r.text
    r = api.put(f"/resource_providers/{rp}/aggregates", mv="1.1", json=["nope"])
    assert "is not a 'uuid'" in r.text


def test_aggregates_from_1_19_check_and_bump_the_generation(any_api: Api) -> None:
    api = any_api
    rp = api.provider()
    aggs = [str(uuid.uuid4()), str(uuid.uuid4())]
    r = api.put(
        f"/resource_providers/{rp}/aggregates",
        mv="1.19",
        json={"aggregates": aggs, "resource_provider_generation": 0},
    )
    assert r.status_code == 200
    assert r.json()["resource_provider_generation"] == 1
    assert sorted(r.json()["aggregates"]) == sorted(aggs)
    r = api.put(
        f"/resource_providers/{rp}/aggregates",
        mv="1.19",
        json={"aggregates": [], "resource_provider_generation": 0},
    )
    assert r.status_code == 409
    assert (
        "Resource provider's generation already changed. Please update the generation and try again."
        in r.text
    )
    r = api.put(f"/resource_providers/{rp}/aggregates", mv="1.19", json=aggs)
    assert r.status_code == 400 and "JSON does not validate" in r.text
    r = api.put(
        f"/resource_providers/{rp}/aggregates",
        mv="1.19",
        content=b"[",
        headers={"Content-Type": "application/json"},
    )
    assert "Malformed JSON" in r.text
    got = api.get(f"/resource_providers/{rp}/aggregates", mv="1.19").json()
    assert got["resource_provider_generation"] == 1


def test_provider_traits(any_api: Api) -> None:
    api = any_api
    rp = api.provider()
    url = f"/resource_providers/{rp}/traits"
    assert api.get(url, mv="1.5").status_code == 404
    assert api.get(url, mv="1.6").json() == {"traits": [], "resource_provider_generation": 0}
    r = api.put(
        url, mv="1.6", json={"traits": ["HW_CPU_X86_SHA"], "resource_provider_generation": 0}
    )
    assert r.status_code == 200 and r.json()["resource_provider_generation"] == 1
    # The same set again does not bump.
    r = api.put(
        url, mv="1.6", json={"traits": ["HW_CPU_X86_SHA"], "resource_provider_generation": 1}
    )
    assert r.json()["resource_provider_generation"] == 1
    r = api.put(
        url, mv="1.6", json={"traits": ["HW_CPU_X86_SHA"], "resource_provider_generation": 0}
    )
    assert r.status_code == 409 and "Resource provider's generation already changed" in r.text
    r = api.put(
        url, mv="1.6", json={"traits": ["CUSTOM_A", "CUSTOM_B"], "resource_provider_generation": 1}
    )
    assert r.status_code == 400 and "No such trait CUSTOM_A, CUSTOM_B" in r.text
    r = api.put(url, mv="1.6", json={"traits": "invalid_type", "resource_provider_generation": 1})
    assert "'invalid_type' is not of type 'array'" in r.text
    r = api.put(
        url, mv="1.6", json={"traits": [], "resource_provider_generation": "invalid_generation"}
    )
    assert "'invalid_generation' is not of type 'integer'" in r.text
    assert api.delete(url, mv="1.6").status_code == 204
    assert api.generation(rp) == 2
    missing = str(uuid.uuid4())
    r = api.get(f"/resource_providers/{missing}/traits", mv="1.6")
    assert r.status_code == 404 and f"No resource provider with uuid {missing} found" in r.text


def test_traits_crud_and_listing(api: Api) -> None:
    r = api.put("/traits/CUSTOM_TRAIT_1", mv="1.15")
    assert r.status_code == 201
    assert r.headers["location"].endswith("/traits/CUSTOM_TRAIT_1")
    assert "last-modified" in r.headers and r.headers["cache-control"] == "no-cache"
    assert api.put("/traits/CUSTOM_TRAIT_1", mv="1.6").status_code == 204
    assert api.get("/traits/CUSTOM_TRAIT_1", mv="1.6").status_code == 204
    r = api.get("/traits/CUSTOM_NOPE", mv="1.6")
    assert r.status_code == 404 and "No such trait(s): CUSTOM_NOPE." in r.text
    r = api.put("/traits/not_custom", mv="1.6")
    assert r.status_code == 400 and CUSTOM_TRAIT_MSG in r.text
    traits = api.get("/traits", mv="1.6").json()["traits"]
    assert len(traits) >= 378 and "CUSTOM_TRAIT_1" in traits
    r = api.get("/traits", mv="1.6", params={"name": "in:CUSTOM_TRAIT_1,HW_CPU_X86_SHA"})
    assert r.json()["traits"] == ["HW_CPU_X86_SHA", "CUSTOM_TRAIT_1"]
    r = api.get("/traits", mv="1.6", params={"name": "startswith:CUSTOM_TRAIT"})
    assert "CUSTOM_TRAIT_1" in r.json()["traits"]
    r = api.get("/traits", mv="1.6", params={"name": "in_abc"})
    assert (
        'Badly formatted name parameter. Expected name query string parameter in form: ?name=[in|startswith]:[name1,name2|prefix]. Got: \\"in_abc\\"'
        in r.text
    )
    r = api.get("/traits", mv="1.6", params={"name": "foo:bar"})
    assert len(r.json()["traits"]) == len(traits)
    r = api.get("/traits", mv="1.6", params={"associated": "maybe"})
    assert 'The query parameter \\"associated\\" only accepts \\"true\\" or \\"false\\"' in r.text
    r = api.get("/traits", mv="1.6", params={"bogus": "1"})
    assert "Invalid query string parameters: Additional properties are not allowed" in r.text
    rp = api.provider()
    api.put(
        f"/resource_providers/{rp}/traits",
        mv="1.6",
        json={"traits": ["CUSTOM_TRAIT_1"], "resource_provider_generation": 0},
    )
    assoc = api.get("/traits", mv="1.6", params={"associated": "TRUE"}).json()["traits"]
    assert "CUSTOM_TRAIT_1" in assoc
    unassoc = api.get("/traits", mv="1.6", params={"associated": "false"}).json()["traits"]
    assert "CUSTOM_TRAIT_1" not in unassoc
    r = api.delete("/traits/CUSTOM_TRAIT_1", mv="1.6")
    assert (
        r.status_code == 409
        and "The trait CUSTOM_TRAIT_1 is in use by a resource provider." in r.text
    )
    r = api.delete("/traits/HW_CPU_X86_SHA", mv="1.6")
    assert r.status_code == 400 and "Cannot delete standard trait HW_CPU_X86_SHA." in r.text
    api.put("/traits/CUSTOM_GONE", mv="1.6")
    assert api.delete("/traits/CUSTOM_GONE", mv="1.6").status_code == 204
    assert api.delete("/traits/CUSTOM_GONE", mv="1.6").status_code == 404


def test_resource_classes(any_api: Api) -> None:
    api = any_api
    assert api.get("/resource_classes", mv="1.1").status_code == 404
    classes = api.get("/resource_classes", mv="1.2").json()["resource_classes"]
    assert [c["name"] for c in classes[:3]] == ["VCPU", "MEMORY_MB", "DISK_GB"]
    standard = len([c for c in classes if not c["name"].startswith("CUSTOM_")])
    assert standard == 21
    r = api.post("/resource_classes", mv="1.2", json={"name": "CUSTOM_GOLD"})
    assert r.status_code == 201 and r.content == b""
    assert r.headers["location"].endswith("/resource_classes/CUSTOM_GOLD")
    r = api.post("/resource_classes", mv="1.2", json={"name": "CUSTOM_GOLD"})
    assert (
        r.status_code == 409 and "Conflicting resource class already exists: CUSTOM_GOLD" in r.text
    )
    r = api.post("/resource_classes", mv="1.2", json={"name": "GOLD"})
    assert "Failed validating 'pattern'" in r.text
    got = api.get("/resource_classes/CUSTOM_GOLD", mv="1.2").json()
    assert got == {
        "name": "CUSTOM_GOLD",
        "links": [{"rel": "self", "href": "/resource_classes/CUSTOM_GOLD"}],
    }
    r = api.get("/resource_classes/CUSTOM_NOPE", mv="1.2")
    assert r.status_code == 404 and "No such resource class CUSTOM_NOPE." in r.text
    # 1.2-1.6: rename.
    r = api.put("/resource_classes/CUSTOM_GOLD", mv="1.6", json={"name": "CUSTOM_PLATINUM"})
    assert r.status_code == 200 and r.json()["name"] == "CUSTOM_PLATINUM"
    assert "cache-control" not in r.headers
    r = api.put("/resource_classes/VCPU", mv="1.6", json={"name": "CUSTOM_X"})
    assert r.status_code == 400 and "Cannot update standard resource class VCPU" in r.text
    api.post("/resource_classes", mv="1.2", json={"name": "CUSTOM_SILVER"})
    r = api.put("/resource_classes/CUSTOM_PLATINUM", mv="1.6", json={"name": "CUSTOM_SILVER"})
    assert r.status_code == 409 and "Resource class already exists: CUSTOM_SILVER" in r.text
    # 1.7+: body-less create-or-check.
    r = api.put("/resource_classes/CUSTOM_BRONZE", mv="1.7")
    assert r.status_code == 201 and "location" in r.headers
    assert api.put("/resource_classes/CUSTOM_BRONZE", mv="1.7").status_code == 204
    r = api.put("/resource_classes/bronze", mv="1.7")
    assert r.status_code == 400
    assert "JSON does not validate: 'bronze' does not match '^CUSTOM_[A-Z0-9_]+$'" in detail(r)
    assert len(api.get("/resource_classes", mv="1.7").json()["resource_classes"]) >= 22
    r = api.delete("/resource_classes/VCPU", mv="1.2")
    assert r.status_code == 400
    assert "Error in delete resource class: Cannot delete standard resource class VCPU." in r.text
    rp = api.provider(CUSTOM_BRONZE=5)
    r = api.delete("/resource_classes/CUSTOM_BRONZE", mv="1.2")
    assert r.status_code == 409 and "Class is in use in inventory." in r.text
    assert api.delete("/resource_classes/CUSTOM_SILVER", mv="1.2").status_code == 204
    assert api.delete("/resource_classes/CUSTOM_SILVER", mv="1.2").status_code == 404
    assert rp and code(r) is None
