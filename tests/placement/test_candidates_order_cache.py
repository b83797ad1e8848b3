"""The kept flat orders (``candidates_order.flat_order``): an order taken from the
cache is the order computed afresh, for the inputs it was kept under and no others."""

from __future__ import annotations

import random
import uuid

import os_resource_classes
import os_traits
import pytest

from berth.placement import candidates_order
from berth.placement.candidates_graph import Inventory, Provider, ProviderGraph
from berth.placement.candidates_order import flat_order


def _graph(n: int, used: dict[int, int], seed: int = 0) -> ProviderGraph:
    rng = random.Random(seed)
    providers = []
    for i in range(n):
        u = str(uuid.UUID(int=rng.getrandbits(128)))
        inventories = {"VCPU": Inventory("VCPU", 8, 0, 1, 8, 1, 1.0),
                       "DISK_GB": Inventory("DISK_GB", 100, 0, 1, 100, 1, 1.0)}
        providers.append(Provider(u, f"n{i}", 1, None, u, inventories,
                                  {"VCPU": used.get(i, 0)}, frozenset(), frozenset()))
    return ProviderGraph(providers, os_traits.get_traits(), os_resource_classes.STANDARDS)


def _fresh(*args, **kwargs) -> list[int]:
    candidates_order._FLAT_ORDERS.clear()
    return flat_order(*args, **kwargs)


@pytest.fixture(autouse=True)
def _empty_cache():
    candidates_order._FLAT_ORDERS.clear()
    yield
    candidates_order._FLAT_ORDERS.clear()


def test_a_kept_order_is_the_fresh_order_and_a_copy():
    graph = _graph(300, {})
    args = (graph, list(range(0, 300, 2)), {"VCPU": 1, "DISK_GB": 5}, list(range(300)))
    first = flat_order(*args)
    first.reverse()  # the caller's list is its own
    assert flat_order(*args) == _fresh(*args)
    assert len(candidates_order._FLAT_ORDERS) == 1


@pytest.mark.parametrize("change", ["chosen", "walked", "amount", "cap", "ids"])
def test_any_input_the_order_depends_on_gives_a_new_order(change):
    graph = _graph(300, {})
    chosen, walked, resources, cap = list(range(0, 300, 2)), list(range(300)), \
        {"VCPU": 1, "DISK_GB": 5}, None
    flat_order(graph, chosen, resources, walked, cap)
    if change == "chosen":
        chosen = chosen[1:]
    elif change == "walked":
        walked = walked[:-1]
    elif change == "amount":
        resources = {"VCPU": 2, "DISK_GB": 5}
    elif change == "cap":
        cap = 100
    else:
        graph = ProviderGraph(graph.providers, graph.trait_names, os_resource_classes.STANDARDS,
                              [i + 1000 for i in graph.ids])
    got = flat_order(graph, chosen, resources, walked, cap)
    assert len(candidates_order._FLAT_ORDERS) == 2
    assert got == _fresh(graph, chosen, resources, walked, cap)


def test_only_the_latest_orders_are_kept():
    graph = _graph(50, {})
    for k in range(candidates_order._FLAT_ORDERS.size + 5):
        flat_order(graph, list(range(k, 50)), {"VCPU": 1}, list(range(50)))
    assert len(candidates_order._FLAT_ORDERS) == candidates_order._FLAT_ORDERS.size


def test_request_hashes_at_once_are_each_requests_own_hash():
    from berth.placement.candidates_order import request_hash, request_hashes

    graph = _graph(20, {})
    rng = random.Random(3)
    amounts = [{}]
    for _ in range(200):
        request: dict[int, dict[str, int]] = {}
        for p in rng.sample(range(20), rng.randint(1, 3)):
            classes = rng.sample(["VCPU", "MEMORY_MB", "DISK_GB", "CUSTOM_X"], rng.randint(1, 3))
            request[p] = {rc: rng.randint(1, 4096) for rc in classes}
        amounts.append(request)
    expected = [request_hash([(graph.ids[p], rc, n) for p, per_rc in a.items()
                              for rc, n in per_rc.items()]) for a in amounts]
    assert request_hashes(graph, amounts) == expected
