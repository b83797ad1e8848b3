"""LocalPlacement answers exactly what the API answers, over the same store."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from berth.placement.app import make_app
from berth.placement.client import (
    BadRequestError,
    ConflictError,
    NotFoundError,
    PlacementAPIError,
    PlacementClient,
)
from berth.placement.db import prepare
from berth.placement.local import LocalPlacement
from berth.placement.store import PlacementStore

AGG = "4f1c9a52-7d1e-4b8e-9c55-3a0e6b2d8f10"  # fixed: test ids must not vary per process


Pair = tuple[PlacementClient, LocalPlacement]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlacementStore]:
    """A store with a small cloud: three flat nodes (one with a trait, one in an
    aggregate) and a node with a NUMA child."""
    path = Path(tmp_path_factory.mktemp("local")) / "p.sqlite"
    engine = prepare(f"sqlite:///{path}")
    store = PlacementStore(engine)
    api = PlacementClient("http://placement.local",
                          transport=httpx.WSGITransport(app=make_app(store)))
    for i in range(3):
        rp = api.create_provider(f"cn{i}")
        gen = api.set_inventories(rp.uuid, rp.generation, {
            "VCPU": {"total": 8}, "MEMORY_MB": {"total": 4096}, "DISK_GB": {"total": 100}})
        if i == 1:
            gen = api.set_provider_traits(rp.uuid, gen, ["HW_CPU_X86_AVX2"])
        if i == 2:
            api.set_aggregates(rp.uuid, gen, [AGG])
    root = api.create_provider("numa-host")
    api.set_inventories(root.uuid, root.generation, {"DISK_GB": {"total": 100}})
    child = api.create_provider("numa-host-numa0", parent_provider_uuid=root.uuid)
    api.set_inventories(child.uuid, child.generation, {
        "VCPU": {"total": 4}, "MEMORY_MB": {"total": 2048}})
    api.close()
    yield store
    engine.dispose()


def _pair(store: PlacementStore, version: str) -> Iterator[Pair]:
    api = PlacementClient("http://placement.local", microversion=version,
                          transport=httpx.WSGITransport(app=make_app(store)))
    yield api, LocalPlacement(store, microversion=version)
    api.close()


@pytest.fixture
def pair(store: PlacementStore) -> Iterator[Pair]:
    """An API client and a LocalPlacement at the scheduler's candidates version."""
    yield from _pair(store, "1.36")


@pytest.fixture
def pair39(store: PlacementStore) -> Iterator[Pair]:
    """The same at the claimer's version."""
    yield from _pair(store, "1.39")


@pytest.mark.parametrize("params", [
    {"resources": "VCPU:1,MEMORY_MB:512"},
    {"resources": "VCPU:1,MEMORY_MB:512,DISK_GB:10"},
    {"resources": "VCPU:1", "limit": "2"},
    {"resources": "VCPU:1", "required": "HW_CPU_X86_AVX2"},
    {"resources": "VCPU:1", "required": "!HW_CPU_X86_AVX2"},
    {"resources": "VCPU:1", "member_of": AGG},
    {"resources1": "VCPU:1", "resources2": "MEMORY_MB:256", "group_policy": "none"},
    {"resources": "VCPU:100"},
], ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_candidates_bodies_are_the_apis(pair: Pair, params: dict[str, str]) -> None:
    api, local = pair
    assert local.allocation_candidates(params) == api.allocation_candidates(params)


def _error(call: object, *args: object, **kw: object) -> PlacementAPIError:
    with pytest.raises(PlacementAPIError) as info:
        call(*args, **kw)  # type: ignore[operator]
    return info.value


def _same(a: PlacementAPIError, b: PlacementAPIError) -> None:
    assert (type(a), a.status, a.code, a.detail.strip()) == (
        type(b), b.status, b.code, b.detail.strip())


def test_a_bad_query_raises_the_apis_error(pair: Pair) -> None:
    api, local = pair
    for params in ({"resources": "NOT_A_CLASS:1"}, {"resources": "VCPU:x"},
                   {"resources": "VCPU:1", "group_policy": "sometimes"}):
        mine = _error(local.allocation_candidates, params)
        assert isinstance(mine, BadRequestError)
        _same(mine, _error(api.allocation_candidates, params))


def test_claims_reads_and_deletes_behave_as_the_api(pair39: Pair) -> None:
    api, local = pair39
    rp = api.list_providers(name="cn0")[0].uuid
    claim = {rp: {"VCPU": 1, "MEMORY_MB": 256}}
    for client in (api, local):
        consumer = str(uuid.uuid4())
        client.put_allocations(consumer, claim, project_id="p", user_id="u",
                               consumer_generation=None)
        got = client.get_allocations(consumer)
        assert got == api.get_allocations(consumer)
        assert got.allocations == claim
        assert got.consumer_generation == 1 and got.project_id == "p"
        again = _error(client.put_allocations, consumer, claim, project_id="p", user_id="u",
                       consumer_generation=None)
        assert isinstance(again, ConflictError) and again.is_generation_conflict
        client.put_allocations(consumer, {rp: {"VCPU": 2}}, project_id="p", user_id="u",
                               consumer_generation=1)
        assert api.get_allocations(consumer).allocations == {rp: {"VCPU": 2}}
        client.delete_allocations(consumer)
        assert local.get_allocations(consumer).allocations == {}
        assert isinstance(_error(client.delete_allocations, consumer), NotFoundError)
        # A delete that answers what it freed (a server delete reports it).
        client.put_allocations(consumer, claim, project_id="p", user_id="u",
                               consumer_generation=None)
        assert client.take_allocations(consumer) == claim
        assert api.get_allocations(consumer).allocations == {}
        assert isinstance(_error(client.take_allocations, consumer), NotFoundError)
    too_big = {rp: {"VCPU": 1000}}
    _same(_error(local.put_allocations, str(uuid.uuid4()), too_big, project_id="p",
                 user_id="u", consumer_generation=None),
          _error(api.put_allocations, str(uuid.uuid4()), too_big, project_id="p",
                 user_id="u", consumer_generation=None))
    missing = {str(uuid.uuid4()): {"VCPU": 1}}
    consumer = str(uuid.uuid4())
    _same(_error(local.put_allocations, consumer, missing, project_id="p", user_id="u",
                 consumer_generation=None),
          _error(api.put_allocations, str(uuid.uuid4()), missing, project_id="p", user_id="u",
                 consumer_generation=None))
    assert isinstance(_error(local.put_allocations, "not-a-uuid", claim, project_id="p",
                             user_id="u", consumer_generation=None), BadRequestError)


def test_reads_follow_the_microversion(pair: Pair, pair39: Pair) -> None:
    api39, local39 = pair39
    api36, local36 = pair
    rp = api39.list_providers(name="cn1")[0].uuid
    consumer = str(uuid.uuid4())
    local39.put_allocations(consumer, {rp: {"VCPU": 1}}, project_id="p", user_id="u",
                            consumer_generation=None)
    assert local36.get_allocations(consumer) == api36.get_allocations(consumer)
    assert local36.get_allocations(consumer).consumer_type is None  # 1.38+ only
    assert local39.get_allocations(consumer).consumer_type == "INSTANCE"
    local39.delete_allocations(consumer)


def test_a_claim_at_the_allocation_requests_microversion_records_no_consumer_type(
    pair39: Pair,
) -> None:
    """Nova claims at the allocation request's version (1.36): no consumer type is sent,
    so placement records none and later reads say "unknown"."""
    api, local = pair39
    rp = api.list_providers(name="cn0")[0].uuid
    for client in (api, local):
        consumer = str(uuid.uuid4())
        client.put_allocations(consumer, {rp: {"VCPU": 1}}, project_id="p", user_id="u",
                               consumer_generation=None, microversion="1.36")
        assert local.get_allocations(consumer).consumer_type == "unknown"
        assert api.get_allocations(consumer) == local.get_allocations(consumer)
        client.delete_allocations(consumer)
