"""What a differential run against the real Placement 16 found (the same random request
sequences sent to both; each case here answered differently before its fix).

Most are about order: which check Placement makes first decides the answer when a
request breaks two rules, or when an empty answer comes before a name is looked up.
"""

from __future__ import annotations

import uuid
from typing import Any

from placement.support import Api, code, detail


def new_uuid() -> str:
    return str(uuid.uuid4())


def _custom_trait(api: Api) -> str:
    """A trait that exists and that no provider has."""
    name = f"CUSTOM_ORDER_{uuid.uuid4().hex[:12].upper()}"
    assert api.put(f"/traits/{name}", mv="1.6").status_code == 201
    return name


def _alloc(rp: str, gen: int | None, project: str = "p1", user: str = "u1",
           ctype: str = "INSTANCE", **resources: int) -> dict[str, Any]:
    return {"allocations": {rp: {"resources": resources}} if resources else {},
            "project_id": project, "user_id": user, "consumer_generation": gen,
            "consumer_type": ctype}


# ------------------------------------------------------------------ consumers


def test_an_empty_write_for_a_consumer_without_allocations_keeps_it(any_api: Api) -> None:
    """Placement writes only consumers that have allocation rows: an empty write for a
    new consumer creates it (generation 0) and neither bumps nor deletes it."""
    api = any_api
    consumer = new_uuid()
    empty = {"allocations": {}, "project_id": "p1", "user_id": "u1", "consumer_generation": None}
    assert api.put(f"/allocations/{consumer}", mv="1.28", json=empty).status_code == 204
    r = api.put(f"/allocations/{consumer}", mv="1.28", json=empty)
    assert r.status_code == 409 and "expected 0 but got None" in detail(r)
    assert code(r) == "placement.concurrent_update"
    # At generation 0 it is written again, and stays at 0.
    again = {**empty, "consumer_generation": 0}
    assert api.put(f"/allocations/{consumer}", mv="1.28", json=again).status_code == 204
    assert api.put(f"/allocations/{consumer}", mv="1.28", json=again).status_code == 204
    # The same through POST /allocations.
    other = new_uuid()
    assert api.post("/allocations", mv="1.28", json={other: empty}).status_code == 204
    r = api.post("/allocations", mv="1.28", json={other: empty})
    assert r.status_code == 409 and "expected 0 but got None" in detail(r)


def test_a_write_that_fails_on_a_missing_provider_leaves_an_existing_consumer(
    any_api: Api,
) -> None:
    """Placement changes a consumer's project, user and type in the transaction that
    writes its allocations: a write refused for a missing provider changes none."""
    api = any_api
    rp = api.provider(VCPU=8)
    consumer, project = new_uuid(), f"p-{new_uuid()}"
    assert api.put(f"/allocations/{consumer}", mv="1.38",
                   json=_alloc(rp, None, project=project, VCPU=1)).status_code == 204
    ghost = new_uuid()
    moved = _alloc(ghost, 1, project="p2", user="u2", ctype="MIGRATION", VCPU=1)
    r = api.put(f"/allocations/{consumer}", mv="1.38", json=moved)
    assert r.status_code == 400 and "that does not exist" in detail(r)
    r = api.post("/allocations", mv="1.38", json={consumer: moved})
    assert r.status_code == 400 and "that does not exist" in detail(r)
    got = api.get(f"/allocations/{consumer}", mv="1.38").json()
    assert (got["project_id"], got["user_id"], got["consumer_type"]) == (
        project, "u1", "INSTANCE")
    assert got["consumer_generation"] == 1
    usages = api.get(f"/usages?project_id={project}", mv="1.38").json()["usages"]
    assert usages == {"INSTANCE": {"VCPU": 1, "consumer_count": 1}}


# ------------------------------------------------------------------ providers


def test_a_provider_needs_a_name_that_is_not_empty(any_api: Api) -> None:
    rp = new_uuid()
    r = any_api.post("/resource_providers", mv="1.20", json={"name": "", "uuid": rp})
    assert r.status_code == 400
    assert (f'Unable to create resource provider "", {rp}: Object action create failed '
            "because: name is required") in detail(r)
    assert any_api.get(f"/resource_providers/{rp}", mv="1.20").status_code == 404


def test_updating_a_missing_provider_is_404_before_its_body_is_read(api: Api) -> None:
    missing = new_uuid()
    for body in (b"[1,", b'{"bogus": 1}', b"null"):
        r = api.put(f"/resource_providers/{missing}", mv="1.39", content=body,
                    headers={"Content-Type": "application/json"})
        assert r.status_code == 404, (body, r.text)
        assert f"No resource provider with uuid {missing} found" in detail(r)


def test_deleting_a_parent_with_allocations_names_its_children_first(any_api: Api) -> None:
    api = any_api
    parent = api.provider(VCPU=8)
    api.provider(parent=parent)
    assert api.put(f"/allocations/{new_uuid()}", mv="1.38",
                   json=_alloc(parent, None, VCPU=1)).status_code == 204
    r = api.delete(f"/resource_providers/{parent}", mv="1.39")
    assert r.status_code == 409
    assert code(r) == "placement.resource_provider.cannot_delete_parent"


# ------------------------------------------------------------------ inventories


def test_an_inventory_s_capacity_counts_its_allocation_ratio(any_api: Api) -> None:
    """capacity = int((total - reserved) * allocation_ratio): > 0 below 1.26, >= 0 from."""
    api = any_api
    rp = api.provider()

    def put(mv: str, gen: int, **record: Any) -> Any:
        return api.put(f"/resource_providers/{rp}/inventories", mv=mv,
                       json={"resource_provider_generation": gen,
                             "inventories": {"VCPU": {"total": 8, **record}}})

    r = put("1.25", 0, allocation_ratio=0.1)
    assert r.status_code == 400
    assert "The reserved value is greater than or equal to total." in detail(r)
    r = put("1.39", 0, allocation_ratio=-1)
    assert r.status_code == 400 and "The reserved value is greater than total." in detail(r)
    # 8 * 0.1 rounds down to a capacity of 0: allowed from 1.26.
    assert put("1.26", 0, allocation_ratio=0.1).status_code == 200
    # A negative ratio over a negative remainder is a positive capacity to Placement.
    assert put("1.39", 1, reserved=9, allocation_ratio=-1).status_code == 200
    # POST: the capacity is checked before the class is found to exist already.
    r = api.post(f"/resource_providers/{rp}/inventories", mv="1.25",
                 json={"resource_class": "VCPU", "total": 8, "allocation_ratio": 0})
    assert r.status_code == 400 and "greater than or equal to total" in detail(r)


def test_put_inventories_checks_capacity_before_what_is_in_use(any_api: Api) -> None:
    api = any_api
    rp = api.provider(DISK_GB=8)
    assert api.put(f"/allocations/{new_uuid()}", mv="1.38",
                   json=_alloc(rp, None, DISK_GB=1)).status_code == 204
    r = api.put(f"/resource_providers/{rp}/inventories", mv="1.39",
                json={"resource_provider_generation": 2,
                      "inventories": {"VCPU": {"total": 4, "reserved": 5}}})
    assert r.status_code == 400 and "greater than total" in detail(r)
    r = api.put(f"/resource_providers/{rp}/inventories", mv="1.39",
                json={"resource_provider_generation": 2,
                      "inventories": {"VCPU": {"total": 4}}})
    assert r.status_code == 409 and code(r) == "placement.inventory.inuse"


def test_an_inventory_key_that_is_no_class_name_passes_the_schema(any_api: Api) -> None:
    """Placement's schema lets it through: a stale generation answers first, then it is
    an unknown class. A malformed record under it is still a 400 (Placement: a 500)."""
    api = any_api
    rp = api.provider(VCPU=8)
    url = f"/resource_providers/{rp}/inventories"
    r = api.put(url, mv="1.39", json={"resource_provider_generation": 0,
                                      "inventories": {"vcpu": {"total": 8}}})
    assert r.status_code == 409 and code(r) == "placement.concurrent_update"
    r = api.put(url, mv="1.39", json={"resource_provider_generation": 1,
                                      "inventories": {"vcpu": {"total": 8}}})
    assert r.status_code == 400 and "No such resource class vcpu" in detail(r)
    r = api.put(url, mv="1.39", json={"resource_provider_generation": 1,
                                      "inventories": {"vcpu": "eight"}})
    assert r.status_code == 400 and "JSON does not validate" in detail(r)


def test_the_reshaper_does_not_check_capacity(any_api: Api) -> None:
    api = any_api
    rp = api.provider(VCPU=8)
    body = {"inventories": {rp: {"resource_provider_generation": 1,
                                 "inventories": {"VCPU": {"total": 8, "reserved": 9}}}},
            "allocations": {}}
    assert api.post("/reshaper", mv="1.30", json=body).status_code == 204
    got = api.get(f"/resource_providers/{rp}/inventories", mv="1.30").json()
    assert got["inventories"]["VCPU"]["reserved"] == 9


# ------------------------------------------------------------------ queries


def test_list_providers_answers_empty_before_checking_later_names(api: Api) -> None:
    """Placement's order: required traits (none has them: []), forbidden traits,
    member_of (no member: []), then resource classes."""
    trait = _custom_trait(api)
    api.provider(VCPU=8)
    for query in (f"member_of={new_uuid()}&resources=CUSTOM_NOPE:1",
                  f"required={trait},!CUSTOM_NOPE",
                  f"required={trait}&resources=CUSTOM_NOPE:1",
                  f"required={trait},!{trait}"):
        r = api.get(f"/resource_providers?{query}", mv="1.39")
        assert r.status_code == 200 and r.json() == {"resource_providers": []}, (query, r.text)
    # Unknown names are still 400 where Placement reaches them.
    r = api.get("/resource_providers?required=CUSTOM_NOPE", mv="1.39")
    assert r.status_code == 400 and "No such trait(s): CUSTOM_NOPE" in detail(r)
    r = api.get("/resource_providers?required=!CUSTOM_NOPE", mv="1.39")
    assert r.status_code == 400 and "No such trait(s): CUSTOM_NOPE" in detail(r)
    r = api.get("/resource_providers?resources=CUSTOM_NOPE:1", mv="1.39")
    assert r.status_code == 400 and "No such resource class CUSTOM_NOPE" in detail(r)


def test_candidates_answer_empty_before_checking_later_names(api: Api) -> None:
    """Placement's order: root_required (no root: empty), then per group its classes,
    its member_of (no member: empty), its traits; a group with no candidates ends the
    search before the next group's names are looked at."""
    trait = _custom_trait(api)
    api.provider(VCPU=8)
    empty = {"allocation_requests": [], "provider_summaries": {}}
    for query in (f"resources=VCPU:1&member_of={new_uuid()}&required=CUSTOM_NOPE",
                  f"resources1=VCPU:1&member_of1={new_uuid()}&required1=CUSTOM_NOPE"
                  "&group_policy=none",
                  f"resources=CUSTOM_NOPE:1&root_required={trait}",
                  f"resources=VCPU:1&required=CUSTOM_NOPE&root_required={trait}",
                  "resources1=VCPU:100000&resources2=CUSTOM_NOPE:1&group_policy=none"):
        r = api.get(f"/allocation_candidates?{query}", mv="1.39")
        assert r.status_code == 200 and r.json() == empty, (query, r.text)
    r = api.get(f"/allocation_candidates?resources=CUSTOM_NOPE:1&member_of={new_uuid()}",
                mv="1.39")
    assert r.status_code == 400 and "No such resource class CUSTOM_NOPE" in detail(r)
    r = api.get("/allocation_candidates?resources=VCPU:1&root_required=CUSTOM_NOPE",
                mv="1.39")
    assert r.status_code == 400 and "No such trait(s): CUSTOM_NOPE" in detail(r)


# ------------------------------------------------------------------ second round


def test_a_project_first_seen_in_a_refused_write_is_not_cached(any_api: Api) -> None:
    """Two consumers of one refused POST share a new project: the second found the row
    the first inserted and cached its id, which the rollback took away (SQLite then gave
    it to the next project). Later writes booked the project's usage elsewhere."""
    api = any_api
    rp = api.provider(VCPU=1)
    px, py = f"px-{new_uuid()}", f"py-{new_uuid()}"

    def body(project: str) -> dict[str, Any]:
        return {"allocations": {rp: {"resources": {"VCPU": 1}}}, "project_id": project,
                "user_id": f"u-{project}", "consumer_generation": None}

    r = api.post("/allocations", mv="1.28",
                 json={new_uuid(): body(px), new_uuid(): body(px)})
    assert r.status_code == 409
    other = new_uuid()
    assert api.put(f"/allocations/{other}", mv="1.28", json=body(py)).status_code == 204
    assert api.delete(f"/allocations/{other}", mv="1.28").status_code == 204
    mine = new_uuid()
    assert api.put(f"/allocations/{mine}", mv="1.28", json=body(px)).status_code == 204
    got = api.get(f"/allocations/{mine}", mv="1.28").json()
    assert (got["project_id"], got["user_id"]) == (px, f"u-{px}")
    assert api.get(f"/usages?project_id={px}", mv="1.9").json()["usages"] == {"VCPU": 1}
    assert api.get(f"/usages?project_id={py}", mv="1.9").json()["usages"] == {}
    assert api.delete(f"/allocations/{mine}", mv="1.28").status_code == 204


def test_a_resource_class_renamed_to_its_own_name_is_saved(api: Api) -> None:
    name = f"CUSTOM_SAME_{uuid.uuid4().hex[:8].upper()}"
    assert api.post("/resource_classes", mv="1.2", json={"name": name}).status_code == 201
    r = api.put(f"/resource_classes/{name}", mv="1.6", json={"name": name})
    assert r.status_code == 200 and r.json()["name"] == name


def test_a_trait_prefix_is_matched_as_placement_s_like(any_api: Api) -> None:
    """``name=startswith:`` is SQL LIKE 'prefix%' in Placement: ``_`` and ``%`` match
    any character, and letters in either case (SQLite's and MySQL's LIKE; on PostgreSQL
    Berth's matched case until a differential run on it)."""
    api = any_api
    stem = f"CUSTOM_LIKE{uuid.uuid4().hex[:6].upper()}"
    for suffix in ("_T1", "_TX", "ZT1"):
        assert api.put(f"/traits/{stem}{suffix}", mv="1.6").status_code == 201
    names = api.get(f"/traits?name=startswith:{stem}_T_", mv="1.6").json()["traits"]
    assert set(names) == {f"{stem}_T1", f"{stem}_TX", f"{stem}ZT1"}
    names = api.get(f"/traits?name=startswith:{stem}%1", mv="1.6").json()["traits"]
    assert set(names) == {f"{stem}_T1", f"{stem}ZT1"}
    names = api.get(f"/traits?name=startswith:{stem.lower()}_tx", mv="1.6").json()["traits"]
    assert set(names) == {f"{stem}_TX"}


def test_a_resourceless_group_with_only_forbidden_filters_has_no_candidates(
    api: Api,
) -> None:
    """Placement keeps a resourceless group's providers from its required traits and
    aggregates; with forbidden ones only, that set is empty and keeps none."""
    api.provider(VCPU=4)
    for group in ("required1=!HW_CPU_X86_SSE", f"member_of1=!{new_uuid()}"):
        r = api.get(f"/allocation_candidates?resources=VCPU:1&{group}&same_subtree=1",
                    mv="1.36")
        assert r.status_code == 200, r.text
        assert r.json() == {"allocation_requests": [], "provider_summaries": {}}, group


# ------------------------------------------------------------------ a review's finds


def test_an_infinite_allocation_ratio_is_refused_where_placement_fails(any_api: Api) -> None:
    """``-1e400`` reads as an infinity, and a ratio below -MAX_FLOAT times a large total
    makes one: Placement answers 500 (int(-inf)), and a reshaper that stored one made
    every later candidates request fail. Berth refuses both with a 400."""
    api = any_api
    rp = api.provider(VCPU=8)
    url = f"/resource_providers/{rp}/inventories"
    for ratio in (b"-1e400", b"-1e308"):
        body = (b'{"resource_provider_generation": 1, "inventories": {"VCPU": '
                b'{"total": 10, "allocation_ratio": ' + ratio + b"}}}")
        r = api.put(url, mv="1.39", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, (ratio, r.text)
        reshape = (b'{"inventories": {"' + rp.encode() + b'": {"resource_provider_generation":'
                   b' 1, "inventories": {"VCPU": {"total": 10, "allocation_ratio": ' + ratio
                   + b'}}}}, "allocations": {}}')
        r = api.post("/reshaper", mv="1.30", content=reshape,
                     headers={"Content-Type": "application/json"})
        assert r.status_code == 400, (ratio, r.text)
    assert "Number out of range: -1e400" in detail(api.put(
        url, mv="1.39", content=b'{"resource_provider_generation": 1, "inventories": '
        b'{"VCPU": {"total": 1, "allocation_ratio": -1e400}}}',
        headers={"Content-Type": "application/json"}))
    r = api.get(f"/allocation_candidates?resources=VCPU:1&member_of={new_uuid()}", mv="1.39")
    assert r.status_code == 200


def test_the_reshaper_checks_each_provider_s_generation_in_turn(any_api: Api) -> None:
    api = any_api
    rp = api.provider(VCPU=8)
    body = {"inventories": {rp: {"resource_provider_generation": 0,
                                 "inventories": {"VCPU": {"total": 8}}},
                            new_uuid(): {"resource_provider_generation": 0,
                                         "inventories": {"VCPU": {"total": 8}}}},
            "allocations": {}}
    r = api.post("/reshaper", mv="1.30", json=body)
    assert r.status_code == 409 and code(r) == "placement.concurrent_update", r.text


def test_an_empty_name_filter_is_ignored(api: Api) -> None:
    rp = api.provider()
    listed = api.get("/resource_providers?name=", mv="1.39").json()["resource_providers"]
    assert rp in {p["uuid"] for p in listed}


# ------------------------------------------------------------------ third round


def test_error_details_are_on_one_line_as_webob_leaves_them(api: Api) -> None:
    """WebOb strips an error's text before Placement puts it in JSON: newlines become
    spaces (a schema error's dump of the schema comes out on one line)."""
    r = api.get("/allocation_candidates?resources=VCPU:1&bogus=1", mv="1.16")
    assert r.status_code == 400
    text = detail(r)
    explanation, rest = text.split("\n\n ", 1)
    assert "\n" not in rest and "('bogus' was unexpected)  Failed validating" in rest
    r = api.post("/resource_providers", json={"name": "x", "bogus": 1}, mv="1.39")
    assert r.status_code == 400 and "\n" not in detail(r).split("\n\n ", 1)[1]


def test_a_limit_is_any_number_of_digits_placement_reads(api: Api) -> None:
    """Placement's limit schema bounds no length (``minLength: 1``): 41 digits keep every
    candidate; past Python's 4,300 digits Placement fails (a 500), Berth answers 400."""
    api.provider(VCPU=8)
    r = api.get("/allocation_candidates?resources=VCPU:1&limit=1" + "0" * 40, mv="1.39")
    assert r.status_code == 200 and r.json()["allocation_requests"]
    r = api.get("/allocation_candidates?resources=VCPU:1&limit=" + "1" * 4301, mv="1.39")
    assert r.status_code == 400 and "limit has 4301 digits" in detail(r)
    r = api.get("/allocation_candidates?resources=VCPU:1&limit=", mv="1.39")
    assert r.status_code == 400 and "'minLength'" in detail(r)


def test_a_sharing_provider_that_is_not_a_root_is_answered(any_api: Api) -> None:
    """Placement 16 fails here (a KeyError building summaries: it builds them only for
    the trees whose root it has); Berth answers, the sharing child's tree summarized
    (docs/architecture.md, deviations from Placement)."""
    api = any_api
    agg = new_uuid()
    compute = api.provider(MEMORY_MB=4)
    other = api.provider()
    share = api.provider(parent=other, DISK_GB=4)
    for rp, gen in ((compute, 1), (share, 1)):
        r = api.put(f"/resource_providers/{rp}/aggregates", mv="1.39",
                    json={"resource_provider_generation": gen, "aggregates": [agg]})
        assert r.status_code == 200, r.text
    r = api.put(f"/resource_providers/{share}/traits", mv="1.39",
                json={"resource_provider_generation": 2, "traits": ["MISC_SHARES_VIA_AGGREGATE"]})
    assert r.status_code == 200, r.text
    r = api.get(f"/allocation_candidates?resources=MEMORY_MB:1,DISK_GB:1&member_of={agg}",
                mv="1.39")
    assert r.status_code == 200, r.text
    body = r.json()
    assert [sorted(a["allocations"]) for a in body["allocation_requests"]] == [
        sorted([compute, share])]
    assert set(body["provider_summaries"]) == {compute, other, share}


def test_not_found_and_in_use_texts_are_placement_s(any_api: Api) -> None:
    """Texts a differential run on PostgreSQL and SQLite found differing: a missing
    provider's inner text, PUT/DELETE traits of one (Placement's NotFound leaves the
    handler bare), DELETE of an inventory that is not there or of an unknown class, and
    DELETE of every inventory while one is in use."""
    api = any_api
    missing = new_uuid()
    r = api.get(f"/resource_providers/{missing}/inventories", mv="1.39")
    assert detail(r).endswith(f"No resource provider with uuid {missing} found : No resource "
                              f"provider with uuid {missing} found  ")
    for method in ("put", "delete"):
        r = getattr(api, method)(f"/resource_providers/{missing}/traits", mv="1.39",
                                 **({"json": {"traits": [], "resource_provider_generation": 0}}
                                    if method == "put" else {}))
        assert r.status_code == 404
        assert detail(r).endswith(f"No resource provider with uuid {missing} found  ")
    rp = api.provider(DISK_GB=10)
    r = api.delete(f"/resource_providers/{rp}/inventories/VCPU", mv="1.39")
    assert detail(r).endswith("No inventory of class VCPU found for delete: No inventory of "
                              "class VCPU found for delete  ")
    r = api.delete(f"/resource_providers/{rp}/inventories/CUSTOM_NOPE", mv="1.39")
    assert detail(r).endswith("No inventory of class CUSTOM_NOPE found for delete: No such "
                              "resource class CUSTOM_NOPE.  ")
    consumer = new_uuid()
    assert api.put(f"/allocations/{consumer}", mv="1.38",
                   json=_alloc(rp, None, DISK_GB=1)).status_code == 204
    r = api.delete(f"/resource_providers/{rp}/inventories", mv="1.39")
    assert r.status_code == 409
    assert detail(r).endswith(f"Inventory for 'DISK_GB' on resource provider '{rp}' in use.  ")


def test_allocation_errors_are_checked_in_placement_s_order(any_api: Api) -> None:
    """Placement checks allocation by allocation, in the body's order: its inventory,
    its unit constraints, then capacity with what was asked of that provider and class
    so far; providers with no inventory of any class asked come first, all named.
    (A differential run found Berth naming another class each time.)"""
    api = any_api
    rp = api.provider()
    r = api.put(f"/resource_providers/{rp}/inventories", mv="1.39", json={
        "resource_provider_generation": 0, "inventories": {
            "VCPU": {"total": 1}, "MEMORY_MB": {"total": 100, "min_unit": 10}}})
    assert r.status_code == 200, r.text
    body = {"allocations": {rp: {"resources": {"VCPU": 2, "MEMORY_MB": 1}}},
            "project_id": "p", "user_id": "u", "consumer_generation": None,
            "consumer_type": "INSTANCE"}
    r = api.put(f"/allocations/{new_uuid()}", mv="1.39", json=body)
    assert r.status_code == 409 and "'VCPU'" in detail(r) and "exceed the capacity" in detail(r)
    # Across consumers of one POST: the first allocation past capacity names its class.
    two = api.provider(VCPU=2, DISK_GB=1)
    c1, c2 = new_uuid(), new_uuid()
    r = api.post("/allocations", mv="1.39", json={
        c1: {"allocations": {two: {"resources": {"DISK_GB": 1, "VCPU": 3}}},
             "project_id": "p", "user_id": "u", "consumer_generation": None,
             "consumer_type": "INSTANCE"},
        c2: {"allocations": {two: {"resources": {"DISK_GB": 1}}},
             "project_id": "p", "user_id": "u", "consumer_generation": None,
             "consumer_type": "INSTANCE"}})
    assert r.status_code == 409 and "'VCPU'" in detail(r), detail(r)
    # A provider with no inventory of any class asked: every class, every such provider.
    empty = api.provider()
    body = {"allocations": {two: {"resources": {"VCPU": 1}}, empty: {"resources": {"DISK_GB": 1}}},
            "project_id": "p", "user_id": "u", "consumer_generation": None,
            "consumer_type": "INSTANCE"}
    r = api.put(f"/allocations/{new_uuid()}", mv="1.39", json=body)
    assert r.status_code == 409
    assert f"Inventory for 'VCPU, DISK_GB' on resource provider '{empty}' invalid." in detail(r) \
        or f"Inventory for 'DISK_GB, VCPU' on resource provider '{empty}' invalid." in detail(r)


def test_an_unknown_resource_class_s_404_has_no_vary_as_placement_s(api: Api) -> None:
    """Placement's handlers let ResourceClassNotFound out (GET, DELETE, and renaming
    below 1.7): the 404 carries no Vary header, as an error from outside a handler."""
    for method, mv, kw in (("get", "1.39", {}), ("delete", "1.39", {}),
                           ("put", "1.6", {"json": {"name": "CUSTOM_NEW"}})):
        r = getattr(api, method)("/resource_classes/CUSTOM_NOPE", mv=mv, **kw)
        assert r.status_code == 404 and "No such resource class CUSTOM_NOPE." in detail(r)
        assert "vary" not in {k.lower() for k in r.headers}, (method, dict(r.headers))


def test_an_empty_inventory_answer_has_no_last_modified_as_placement_s(any_api: Api) -> None:
    """Placement picks last-modified from the inventories it answers with: none when
    a PUT leaves the provider without inventory."""
    api = any_api
    rp = api.provider()
    r = api.put(f"/resource_providers/{rp}/inventories", mv="1.39",
                json={"resource_provider_generation": 0, "inventories": {}})
    assert r.status_code == 200 and "last-modified" not in {k.lower() for k in r.headers}
    assert r.headers["cache-control"] == "no-cache"
