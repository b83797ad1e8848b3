"""Resource providers (reference 4.2): create, show, list filters, update, re-parent, delete."""

from __future__ import annotations

import re
import uuid

import pytest

from placement.support import Api, code, detail


def new_uuid() -> str:
    return str(uuid.uuid4())


def test_create_below_1_20_is_201_with_location_and_no_body(api: Api) -> None:
    u = new_uuid()
    r = api.post("/resource_providers", mv="1.19", json={"name": f"n-{u}", "uuid": u})
    assert r.status_code == 201
    assert r.content == b""
    assert "content-type" not in r.headers
    assert r.headers["location"] == f"{api.base}/resource_providers/{u}"


def test_create_from_1_20_returns_the_provider(api: Api) -> None:
    r = api.post("/resource_providers", mv="1.20", json={"name": "twenty"})
    assert r.status_code == 200
    body = r.json()
    assert body["generation"] == 0 and body["name"] == "twenty"
    assert re.search(r"/resource_providers/[a-f0-9-]+$", r.headers["location"])
    assert r.headers["cache-control"] == "no-cache" and "last-modified" in r.headers


def test_uuid_is_normalized(api: Api) -> None:
    raw = uuid.uuid4().hex.upper()
    r = api.post("/resource_providers", mv="1.20", json={"name": f"norm-{raw}", "uuid": raw})
    assert r.json()["uuid"] == str(uuid.UUID(raw))


@pytest.mark.parametrize("mv,links", [("1.0", 3), ("1.10", 5), ("1.11", 6)])
def test_links_by_version(api: Api, mv: str, links: int) -> None:
    rp = api.provider()
    body = api.get(f"/resource_providers/{rp}", mv=mv).json()
    assert len(body["links"]) == links
    assert body["links"][0] == {"rel": "self", "href": f"/resource_providers/{rp}"}
    assert ("root_provider_uuid" in body) is (mv >= "1.14" and mv != "1.10")


def test_duplicate_name_and_uuid_are_409_duplicate_name(any_api: Api) -> None:
    api = any_api
    rp = api.provider(name="dup-name")
    r = api.post("/resource_providers", mv="1.39", json={"name": "dup-name"})
    assert r.status_code == 409
    assert "Conflicting resource provider name: dup-name already exists" in r.text
    assert code(r) == "placement.duplicate_name"
    r = api.post("/resource_providers", mv="1.39", json={"name": "other", "uuid": rp})
    assert r.status_code == 409
    assert f"Conflicting resource provider uuid: {rp} already exists" in r.text


@pytest.mark.parametrize(
    ("body", "text"),
    [
        ({"name": "x", "uuid": "not-a-uuid"}, "is not a 'uuid'"),
        ({"name": "x", "bogus": 1}, "'bogus' was unexpected"),
        ({}, "'name' is a required property"),
        ({"name": "x" * 201}, "Failed validating 'maxLength'"),
        ({"name": 5}, "5 is not of type 'string'"),
    ],
    ids=["bad uuid", "unknown key", "missing name", "long name", "name not a string"],
)
def test_create_schema_errors(api: Api, body: dict[str, object], text: str) -> None:
    r = api.post("/resource_providers", mv="1.39", json=body)
    assert r.status_code == 400
    assert "JSON does not validate" in r.text
    assert text in detail(r)


def test_parent_rules_on_create(api: Api) -> None:
    u = new_uuid()
    r = api.post(
        "/resource_providers",
        mv="1.14",
        json={"name": "child", "uuid": u, "parent_provider_uuid": u},
    )
    assert r.status_code == 400
    assert f'Unable to create resource provider \\"child\\", {u}:' in r.text
    assert "parent provider UUID cannot be same as UUID" in r.text
    r = api.post(
        "/resource_providers",
        mv="1.14",
        json={"name": "orphan", "parent_provider_uuid": new_uuid()},
    )
    assert r.status_code == 400
    assert "parent provider UUID does not exist" in r.text
    r = api.post(
        "/resource_providers", mv="1.13", json={"name": "old", "parent_provider_uuid": None}
    )
    assert "'parent_provider_uuid' was unexpected" in r.text


def test_nested_tree_root_and_in_tree(any_api: Api) -> None:
    api = any_api
    root = api.provider()
    child = api.provider(parent=root)
    grandchild = api.provider(parent=child)
    body = api.get(f"/resource_providers/{grandchild}", mv="1.14").json()
    assert body["parent_provider_uuid"] == child
    assert body["root_provider_uuid"] == root
    listed = api.get("/resource_providers", mv="1.14", params={"in_tree": child}).json()
    assert {p["uuid"] for p in listed["resource_providers"]} == {root, child, grandchild}
    empty = api.get("/resource_providers", mv="1.14", params={"in_tree": new_uuid()}).json()
    assert empty == {"resource_providers": []}


def test_show_missing_provider_is_404(api: Api) -> None:
    u = new_uuid()
    r = api.get(f"/resource_providers/{u}", mv="1.39")
    assert r.status_code == 404
    assert f"No resource provider with uuid {u} found" in r.text
    assert api.get("/resource_providers/not-a-uuid").status_code == 404


def test_update_name_keeps_generation_and_has_no_location(any_api: Api) -> None:
    api = any_api
    rp = api.provider(VCPU=4)
    r = api.put(f"/resource_providers/{rp}", mv="1.39", json={"name": f"renamed-{rp}"})
    assert r.status_code == 200
    assert r.json()["generation"] == 1
    assert "location" not in r.headers
    other = api.provider(name="taken-name")
    r = api.put(f"/resource_providers/{rp}", mv="1.39", json={"name": "taken-name"})
    assert r.status_code == 409
    assert "Conflicting resource provider taken-name already exists." in r.text
    assert code(r) == "placement.duplicate_name"
    assert other


def test_update_rejects_uuid_in_body(api: Api) -> None:
    rp = api.provider()
    r = api.put(f"/resource_providers/{rp}", mv="1.39", json={"name": "a", "uuid": rp})
    assert r.status_code == 400 and "'uuid' was unexpected" in r.text


def test_reparenting_rules(any_api: Api) -> None:
    api = any_api
    a, b = api.provider(), api.provider()
    child = api.provider()
    # Setting a parent on a root is always allowed.
    r = api.put(
        f"/resource_providers/{child}",
        mv="1.14",
        json={"name": f"c-{child}", "parent_provider_uuid": a},
    )
    assert r.status_code == 200 and r.json()["root_provider_uuid"] == a
    r = api.put(
        f"/resource_providers/{child}",
        mv="1.36",
        json={"name": f"c-{child}", "parent_provider_uuid": b},
    )
    assert r.status_code == 400
    assert "re-parenting a provider is not currently allowed." in r.text
    r = api.put(
        f"/resource_providers/{child}",
        mv="1.36",
        json={"name": f"c-{child}", "parent_provider_uuid": None},
    )
    assert "un-parenting a provider is not currently allowed." in r.text
    grandchild = api.provider(parent=child)
    r = api.put(
        f"/resource_providers/{child}",
        mv="1.37",
        json={"name": f"c-{child}", "parent_provider_uuid": b},
    )
    assert r.status_code == 200
    assert api.get(f"/resource_providers/{grandchild}", mv="1.37").json()["root_provider_uuid"] == b
    r = api.put(
        f"/resource_providers/{child}",
        mv="1.37",
        json={"name": f"c-{child}", "parent_provider_uuid": grandchild},
    )
    assert r.status_code == 400
    assert "creating loop in the provider tree is not allowed." in r.text
    r = api.put(
        f"/resource_providers/{child}",
        mv="1.37",
        json={"name": f"c-{child}", "parent_provider_uuid": None},
    )
    assert r.status_code == 200
    assert (
        api.get(f"/resource_providers/{grandchild}", mv="1.37").json()["root_provider_uuid"]
        == child
    )
    r = api.put(
        f"/resource_providers/{child}",
        mv="1.37",
        json={"name": f"c-{child}", "parent_provider_uuid": new_uuid()},
    )
    assert "Object action create failed because: parent provider UUID does not exist." in r.text


def test_delete_rules(any_api: Api) -> None:
    api = any_api
    parent = api.provider()
    child = api.provider(parent=parent)
    r = api.delete(f"/resource_providers/{parent}", mv="1.39")
    assert r.status_code == 409
    assert (
        f"Unable to delete parent resource provider {parent}: It has child resource providers."
        in r.text
    )
    assert code(r) == "placement.resource_provider.cannot_delete_parent"
    assert api.delete(f"/resource_providers/{child}").status_code == 204
    assert api.delete(f"/resource_providers/{parent}").status_code == 204
    r = api.delete(f"/resource_providers/{parent}")
    assert r.status_code == 404 and "found for delete" in r.text


def test_list_filters_by_name_uuid_and_schema(api: Api) -> None:
    rp = api.provider(name="findme")
    by_name = api.get("/resource_providers", params={"name": "findme"}).json()
    assert [p["uuid"] for p in by_name["resource_providers"]] == [rp]
    by_uuid = api.get("/resource_providers", params={"uuid": rp}).json()
    assert [p["uuid"] for p in by_uuid["resource_providers"]] == [rp]
    r = api.get("/resource_providers", params={"spam": "1"})
    assert r.status_code == 400
    assert (
        "Invalid query string parameters: Additional properties are not allowed ('spam' was unexpected)"
        in r.text
    )
    r = api.get("/resource_providers", mv="1.2", params={"member_of": new_uuid()})
    assert "'member_of' was unexpected" in r.text
    r = api.get("/resource_providers", params={"uuid": "zzz"})
    assert "is not a 'uuid'" in r.text


def test_member_of_filter(any_api: Api) -> None:
    api = any_api
    agg1, agg2 = new_uuid(), new_uuid()
    a, b, c = api.provider(), api.provider(), api.provider()
    api.put(f"/resource_providers/{a}/aggregates", mv="1.1", json=[agg1])
    api.put(f"/resource_providers/{b}/aggregates", mv="1.1", json=[agg2])
    api.put(f"/resource_providers/{c}/aggregates", mv="1.1", json=[agg1, agg2])

    def names(mv: str, *values: str) -> set[str]:
        r = api.get("/resource_providers", mv=mv, params=[("member_of", v) for v in values])
        assert r.status_code == 200, r.text
        return {p["uuid"] for p in r.json()["resource_providers"]}

    assert names("1.3", agg1) == {a, c}
    assert names("1.3", f"in:{agg1},{agg2}") == {a, b, c}
    assert names("1.24", agg1, agg2) == {c}
    assert names("1.32", agg1, f"!{agg2}") == {a}
    assert names("1.32", f"!in:{agg1},{agg2}").isdisjoint({a, b, c})
    assert names("1.3", new_uuid()) == set()
    r = api.get("/resource_providers", mv="1.3", params=[("member_of", agg1), ("member_of", agg2)])
    assert "Multiple member_of parameters are not supported" in r.text
    r = api.get("/resource_providers", mv="1.31", params={"member_of": f"!{agg1}"})
    assert (
        "Forbidden member_of parameters are not supported in the specified microversion" in r.text
    )
    r = api.get("/resource_providers", mv="1.3", params={"member_of": f"{agg1},{agg2}"})
    assert (
        "Multiple values for 'member_of' must be prefixed with the 'in:' or '!in:' keyword"
        in r.text
    )
    r = api.get("/resource_providers", mv="1.3", params={"member_of": "in:nope"})
    assert "Expected 'member_of' parameter to contain valid UUID(s). Got: nope" in r.text


def test_resources_filter(any_api: Api) -> None:
    api = any_api
    big = api.provider(VCPU=64, MEMORY_MB=65536)
    small = api.provider(VCPU=1, MEMORY_MB=512)
    r = api.get("/resource_providers", mv="1.4", params={"resources": "VCPU:32,MEMORY_MB:1024"})
    found = {p["uuid"] for p in r.json()["resource_providers"]}
    assert big in found and small not in found
    cases = {
        "": "Got: empty string.",
        "VCPU": "Got: VCPU.",
        "VCPU:fred": "Requested resource VCPU expected positive integer amount. Got: fred.",
        "VCPU:-2": "Requested resource VCPU requires amount >= 1. Got: -2.",
        "COWS:1": "Invalid resource class in resources parameter: No such resource class COWS.",
    }
    for value, text in cases.items():
        r = api.get("/resource_providers", mv="1.4", params={"resources": value})
        assert r.status_code == 400, value
        assert text in r.text, value


def test_required_traits_filter(any_api: Api) -> None:
    api = any_api
    a, b = api.provider(), api.provider()
    api.put(
        f"/resource_providers/{a}/traits",
        mv="1.6",
        json={"traits": ["HW_CPU_X86_AVX", "HW_CPU_X86_SSE"], "resource_provider_generation": 0},
    )
    api.put(
        f"/resource_providers/{b}/traits",
        mv="1.6",
        json={"traits": ["HW_CPU_X86_AVX2"], "resource_provider_generation": 0},
    )

    def found(mv: str, *values: str) -> set[str]:
        r = api.get("/resource_providers", mv=mv, params=[("required", v) for v in values])
        assert r.status_code == 200, r.text
        return {p["uuid"] for p in r.json()["resource_providers"]} & {a, b}

    assert found("1.18", "HW_CPU_X86_AVX") == {a}
    assert found("1.22", "!HW_CPU_X86_AVX") == {b}
    assert found("1.22", "!!!HW_CPU_X86_AVX") == {b}
    assert found("1.39", "in:HW_CPU_X86_AVX,HW_CPU_X86_AVX2") == {a, b}
    assert found("1.39", "HW_CPU_X86_AVX", "HW_CPU_X86_SSE") == {a}
    # Below 1.39 only the last value counts.
    assert found("1.38", "HW_CPU_X86_AVX2", "HW_CPU_X86_AVX") == {a}
    r = api.get("/resource_providers", mv="1.21", params={"required": "!HW_CPU_X86_AVX"})
    assert (
        "Invalid query string parameters: Expected 'required' parameter value of the form: "
        "HW_CPU_X86_VMX,CUSTOM_MAGIC. Got: !HW_CPU_X86_AVX"
    ) in r.text
    r = api.get("/resource_providers", mv="1.38", params={"required": "in:HW_CPU_X86_AVX"})
    assert (
        "The format 'in:HW_CPU_X86_VMX,CUSTOM_MAGIC' only supported since microversion 1.39."
        in r.text
    )
    r = api.get("/resource_providers", mv="1.22", params={"required": "HW_CPU_X86_AVX,"})
    assert "HW_CPU_X86_VMX,!CUSTOM_MAGIC. Got an empty trait in: HW_CPU_X86_AVX," in r.text
    r = api.get("/resource_providers", mv="1.18", params={"required": "CUSTOM_NO_EXIST"})
    assert (
        'Invalid trait(s) in \\"required\\" parameter: No such trait(s): CUSTOM_NO_EXIST.' in r.text
    )


def test_list_is_in_creation_order(api: Api) -> None:
    made = [api.provider() for _ in range(3)]
    listed = [p["uuid"] for p in api.get("/resource_providers").json()["resource_providers"]]
    assert [u for u in listed if u in made] == made
