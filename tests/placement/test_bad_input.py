"""Bad input never produces a 500 and never half-writes (reference: 400/409/415 only)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from placement.support import Api

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "name",
                    "uuid",
                    "total",
                    "resources",
                    "allocations",
                    "project_id",
                    "user_id",
                    "consumer_generation",
                    "consumer_type",
                    "resource_provider_generation",
                    "inventories",
                    "traits",
                    "aggregates",
                    "VCPU",
                    "parent_provider_uuid",
                ]
            )
            | st.text(max_size=10),
            children,
            max_size=5,
        )
    ),
    max_leaves=20,
)

WRITE_PATHS = [
    ("POST", "/resource_providers"),
    ("PUT", "/resource_providers/{rp}"),
    ("POST", "/resource_providers/{rp}/inventories"),
    ("PUT", "/resource_providers/{rp}/inventories"),
    ("PUT", "/resource_providers/{rp}/inventories/VCPU"),
    ("PUT", "/resource_providers/{rp}/aggregates"),
    ("PUT", "/resource_providers/{rp}/traits"),
    ("PUT", "/allocations/{consumer}"),
    ("POST", "/allocations"),
    ("POST", "/resource_classes"),
    ("POST", "/reshaper"),
]


@pytest.fixture(scope="module")
def target(api: Api) -> str:
    return api.provider(VCPU=8)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    body=JSON_VALUES,
    which=st.integers(0, len(WRITE_PATHS) - 1),
    mv=st.sampled_from(["1.0", "1.14", "1.28", "1.39"]),
)
def test_random_bodies_never_give_a_500(
    api: Api, target: str, body: Any, which: int, mv: str
) -> None:
    method, path = WRITE_PATHS[which]
    path = path.format(rp=target, consumer=uuid.uuid4())
    r = api.request(method, path, mv=mv, json=body)
    assert r.status_code < 500, (method, path, body, r.text)


@pytest.mark.parametrize(
    "raw",
    [b"[" * 100000, b'{"name": "\xff"}', b"", b"null", b'"x"', b"1e999", b'{"name": NaN}'],
    ids=["deep nesting", "bad utf-8", "empty body", "null", "a string", "huge float", "NaN"],
)
def test_odd_raw_bodies_are_400(any_api: Api, raw: bytes) -> None:
    r = any_api.post(
        "/resource_providers", content=raw, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400, r.text


@pytest.mark.parametrize(
    "raw, where",
    [(rb'{"name": "\ud800"}', "name"), (rb'{"name": "x", "uuid": "\udfff"}', "uuid"),
     (rb'{"\ud800": 1}', "body")],
    ids=["name", "uuid", "key"],
)
def test_an_unpaired_surrogate_is_malformed_json(any_api: Api, raw: bytes, where: str) -> None:
    """Valid JSON text, but no Unicode: no database or encoder takes it (it was a 500)."""
    r = any_api.post(
        "/resource_providers", content=raw, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400, r.text
    assert f"Malformed JSON: {where}: " in r.text
    assert "unpaired UTF-16 surrogate" in r.text


def test_an_unpaired_surrogate_in_traits_writes_nothing(api: Api, target: str) -> None:
    generation = api.get(f"/resource_providers/{target}", mv="1.39").json()[
        "generation"]
    raw = b'{"resource_provider_generation": %d, "traits": ["CUSTOM_\\ud800"]}' % generation
    r = api.request("PUT", f"/resource_providers/{target}/traits", mv="1.39", content=raw,
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert "traits[0]: the string holds an unpaired UTF-16 surrogate" in r.text
    assert api.get(f"/resource_providers/{target}", mv="1.39").json()[
        "generation"] == generation


@pytest.mark.parametrize(
    "params",
    [
        {"resources": "VCPU:99999999999999999999999"},
        {"member_of": "in:"},
        {"required": "!"},
        {"in_tree": "x" * 1000},
        {"name": "\x00"},
    ],
    ids=["huge amount", "empty in:", "bare bang", "long in_tree", "nul in name"],
)
def test_odd_query_strings_never_give_a_500(any_api: Api, params: dict[str, str]) -> None:
    r = any_api.get("/resource_providers", mv="1.39", params=params)
    assert r.status_code in (200, 400), r.text


def test_huge_generations_are_conflicts_not_errors(api: Api, target: str) -> None:
    big = 2**70
    r = api.put(
        f"/resource_providers/{target}/inventories",
        mv="1.39",
        json={"resource_provider_generation": big, "inventories": {}},
    )
    assert r.status_code == 409
    r = api.put(
        f"/allocations/{uuid.uuid4()}",
        mv="1.39",
        json={
            "allocations": {target: {"resources": {"VCPU": 2**70}}},
            "project_id": "p",
            "user_id": "u",
            "consumer_generation": big,
            "consumer_type": "X",
        },
    )
    assert r.status_code == 409
    assert json.loads(r.text)["errors"][0]["code"] == "placement.concurrent_update"


def test_nul_characters_are_rejected_cleanly(any_api: Api) -> None:
    r = any_api.post("/resource_providers", mv="1.39", json={"name": "nul\x00name"})
    assert r.status_code in (200, 400), r.text
