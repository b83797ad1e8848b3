"""Under ``limit``, Berth's Placement API keeps the very allocation requests, in the very
order, that Placement 16 keeps: compared with the real service, a peer process from
``.venv-placement``, on a generated flat cloud and a generated nested one.

Placement's order comes from Python sets of its requests, so it depends on the
process's ``PYTHONHASHSEED``: both servers run with the same seed here (with different
seeds two Placement processes disagree with each other as much as with Berth).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from peers import placement as peer

pytestmark = pytest.mark.slow
HEADERS = {"X-Auth-Token": "admin", "OpenStack-API-Version": "placement 1.39"}
SEED = 0


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[dict[str, str]]:
    why = peer.available()
    if why:
        pytest.skip(why)
    real = peer.Placement(tmp_path / "real", hash_seed=SEED).start()
    port = peer.free_port()
    log = tmp_path / "berth.log"
    with open(log, "wb") as out:
        berth = subprocess.Popen(
            [sys.executable, "-m", "berth.cli", "placement", "serve", "--auth-strategy",
             "noauth2", "--port", str(port), "--db", f"sqlite:///{tmp_path}/berth.sqlite"],
            stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONHASHSEED": str(SEED)})
    url = f"http://127.0.0.1:{port}"
    try:
        peer.wait_up(url + "/", berth, log)
        yield {"placement": real.url, "berth": url}
    finally:
        berth.terminate()
        berth.wait(timeout=30)
        real.stop()


def _load(urls: dict[str, str], providers: list[dict[str, Any]]) -> None:
    """The same providers, created in the same order, in both services (with their
    inventories, then their traits and aggregates when they have some)."""
    custom = sorted({t for p in providers for t in p.get("traits", ()) if t.startswith("CUSTOM_")})
    for url in urls.values():
        with httpx.Client(base_url=url, headers=HEADERS, timeout=60) as http:
            for trait in custom:
                assert http.put(f"/traits/{trait}").status_code in (201, 204)
            for p in providers:
                body = {"uuid": p["uuid"], "name": p["name"]}
                if p.get("parent"):
                    body["parent_provider_uuid"] = p["parent"]
                assert http.post("/resource_providers", json=body).status_code == 200
                generation = 0
                for what, value in (("inventories", {rc: {"total": n} for rc, n
                                                     in p["inventory"].items()}),
                                    ("traits", p.get("traits")), ("aggregates", p.get("aggs"))):
                    if not value:
                        continue
                    resp = http.put(f"/resource_providers/{p['uuid']}/{what}", json={
                        "resource_provider_generation": generation, what: value})
                    assert resp.status_code == 200, resp.text
                    generation = resp.json()["resource_provider_generation"]


def _requests(url: str, query: dict[str, str]) -> list[Any]:
    resp = httpx.get(url + "/allocation_candidates", params=query, headers=HEADERS, timeout=60)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    # The requests in answer order; within one, JSON key and mapping order carry no
    # meaning (Placement's come from sets of uuid strings).
    return [[_canonical(r) for r in body["allocation_requests"]],
            sorted(body["provider_summaries"])]


def _canonical(request: dict[str, Any]) -> Any:
    return (sorted((u, sorted(a["resources"].items())) for u, a in request["allocations"].items()),
            sorted((s, sorted(ps)) for s, ps in request["mappings"].items()))


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def test_a_flat_cloud_keeps_the_same_first_n(servers: dict[str, str]) -> None:
    rng = random.Random(11)
    _load(servers, [{"uuid": _uuid(rng), "name": f"cn{i:04d}", "inventory": {
        "VCPU": rng.choice([8, 16, 32]), "MEMORY_MB": rng.choice([16384, 32768, 65536]),
        "DISK_GB": rng.choice([100, 500])}} for i in range(300)])
    for query in ({"resources": "VCPU:1,MEMORY_MB:1024,DISK_GB:10", "limit": "50"},
                  {"resources": "VCPU:1,MEMORY_MB:20000", "limit": "30"},
                  {"resources": "DISK_GB:200,VCPU:2", "limit": "40"},
                  {"resources": "MEMORY_MB:1024", "limit": "299"},
                  # A lone numbered group: the same single-provider path, the same order.
                  {"resources1": "MEMORY_MB:1024", "limit": "25"},
                  {"resources": "DISK_GB:10", "resources1": "VCPU:1,MEMORY_MB:1024",
                   "group_policy": "none", "limit": "70"}):
        assert _requests(servers["berth"], query) == _requests(servers["placement"], query), query


def test_a_nested_cloud_keeps_the_same_first_n(servers: dict[str, str]) -> None:
    rng = random.Random(5)
    providers: list[dict[str, Any]] = []
    for i in range(100):
        root = _uuid(rng)
        providers.append({"uuid": root, "name": f"cn{i:04d}",
                          "inventory": {"DISK_GB": rng.choice([100, 500])}})
        for j in range(rng.choice([1, 2, 2, 4])):
            providers.append({"uuid": _uuid(rng), "name": f"cn{i:04d}_numa{j}", "parent": root,
                              "inventory": {"VCPU": rng.choice([4, 8, 16]),
                                            "MEMORY_MB": rng.choice([8192, 16384, 32768])}})
    _load(servers, providers)
    for query in ({"resources": "VCPU:1,MEMORY_MB:1024,DISK_GB:10", "limit": "50"},
                  {"resources": "VCPU:4,MEMORY_MB:10000", "limit": "30"},
                  {"resources": "DISK_GB:200,VCPU:2", "limit": "40"},
                  # Numbered groups: Placement's merge of the groups' own lists.
                  {"resources": "DISK_GB:10", "resources1": "VCPU:2,MEMORY_MB:1024",
                   "resources2": "VCPU:2,MEMORY_MB:1024", "group_policy": "isolate",
                   "limit": "60"},
                  {"resources1": "VCPU:1,MEMORY_MB:1024", "resources2": "VCPU:1",
                   "group_policy": "none", "limit": "80"},
                  {"resources1": "VCPU:1", "resources": "DISK_GB:10", "group_policy": "none",
                   "limit": "40"}):
        assert _requests(servers["berth"], query) == _requests(servers["placement"], query), query
    # Without limit the answers hold the same requests (Berth keeps its own order).
    query = {"resources": "VCPU:1,MEMORY_MB:1024,DISK_GB:10"}
    ours, theirs = _requests(servers["berth"], query), _requests(servers["placement"], query)
    assert sorted(ours[0]) == sorted(theirs[0]) and ours[1] == theirs[1]


def _answer(url: str, query: dict[str, str], mv: str) -> list[Any]:
    """The requests (without mappings, absent before 1.34) and the summarized providers."""
    resp = httpx.get(url + "/allocation_candidates", params=query, timeout=60,
                     headers={**HEADERS, "OpenStack-API-Version": f"placement {mv}"})
    assert resp.status_code == 200, resp.text
    body = resp.json()
    return [[sorted((u, sorted(a["resources"].items())) for u, a in r["allocations"].items())
             for r in body["allocation_requests"]], sorted(body["provider_summaries"])]


def test_old_microversions_and_numbered_groups_over_trees_keep_the_same_requests(
        servers: dict[str, str]) -> None:
    """Below 1.29 Placement forms the nested-aware answer, drops the requests that take
    from two providers of one tree (keeping its order), then limits, and summarizes the
    remaining requests' providers whose tree a kept request uses. A lone numbered group
    is ordered as its single-provider path forms its list. (A differential run found
    both: another request kept, summaries missing.)"""
    rng = random.Random(8)
    providers: list[dict[str, Any]] = []
    for i in range(60):
        root = _uuid(rng)
        providers.append({"uuid": root, "name": f"cn{i:04d}", "inventory": {
            "DISK_GB": rng.choice([100, 500]), "VCPU": rng.choice([0, 8])}})
        if not providers[-1]["inventory"]["VCPU"]:
            del providers[-1]["inventory"]["VCPU"]
        for j in range(rng.choice([1, 2, 3])):
            providers.append({"uuid": _uuid(rng), "name": f"cn{i:04d}_numa{j}", "parent": root,
                              "inventory": {"VCPU": rng.choice([4, 8])}})
    _load(servers, providers)
    for mv, query in (("1.28", {"resources": "VCPU:1,DISK_GB:1", "limit": "1"}),
                      ("1.28", {"resources": "VCPU:1,DISK_GB:1", "limit": "12"}),
                      ("1.17", {"resources": "VCPU:1", "limit": "5"}),
                      ("1.28", {"resources": "VCPU:6", "limit": "9"}),
                      ("1.25", {"resources1": "VCPU:1", "limit": "7"}),
                      ("1.38", {"resources1": "VCPU:5", "limit": "10"})):
        assert _answer(servers["berth"], query, mv) == _answer(servers["placement"], query, mv), \
            (mv, query)


def test_filters_over_trees_keep_the_same_order(servers: dict[str, str]) -> None:
    """Trait, aggregate and root filters narrow Placement's gathering of a tree group's
    providers set by set; the whole answer (``limit`` one short of it) keeps its order."""
    rng = random.Random(3)
    aggs = [_uuid(rng) for _ in range(3)]
    providers: list[dict[str, Any]] = []
    for i in range(100):
        root = _uuid(rng)
        providers.append({"uuid": root, "name": f"cn{i:04d}", "aggs": [aggs[i % 3]],
                          "inventory": {"DISK_GB": 100} if i % 2 else {},
                          "traits": ["CUSTOM_ROOT_B"] if i % 4 == 0 else []})
        for j in range(rng.choice([1, 2, 2, 3])):
            numa = _uuid(rng)
            providers.append({"uuid": numa, "name": f"cn{i:04d}_numa{j}", "parent": root,
                              "inventory": {"VCPU": 8, "MEMORY_MB": 16384},
                              "traits": ["CUSTOM_A"] if rng.random() < 0.5 else []})
            if j < 2:
                providers.append({"uuid": _uuid(rng), "name": f"cn{i:04d}_numa{j}_pf",
                                  "parent": numa, "inventory": {"SRIOV_NET_VF": 4},
                                  "traits": [rng.choice(["CUSTOM_A", "CUSTOM_B"])]})
    _load(servers, providers)
    base = {"resources": "VCPU:1,SRIOV_NET_VF:1"}
    for extra in ({"required": "CUSTOM_A"}, {"required": "!CUSTOM_B"},
                  {"required": "in:CUSTOM_A,CUSTOM_B"},
                  {"member_of": f"in:{aggs[0]},{aggs[1]}"}, {"member_of": f"!{aggs[0]}"},
                  {"root_required": "CUSTOM_ROOT_B"}, {"root_required": "!CUSTOM_ROOT_B"},
                  {"required": "CUSTOM_A", "resources1": "MEMORY_MB:1024",
                   "group_policy": "none"}):
        query = {**base, **extra}
        whole = _requests(servers["placement"], query)[0]
        query["limit"] = str(len(whole) - 1)
        assert _requests(servers["berth"], query) == _requests(servers["placement"], query), query


def test_same_subtree_and_resourceless_groups_keep_the_same_order(servers: dict[str, str]) -> None:
    """``same_subtree`` drops some of the merge's products and a resourceless group
    brings a provider and no resources; the rest of the merge is Placement's."""
    rng = random.Random(9)
    providers: list[dict[str, Any]] = []
    for i in range(100):
        root = _uuid(rng)
        providers.append({"uuid": root, "name": f"cn{i:04d}",
                          "inventory": {"DISK_GB": 100} if i % 2 else {}})
        for j in range(rng.choice([1, 2, 2, 3])):
            numa = _uuid(rng)
            providers.append({"uuid": numa, "name": f"cn{i:04d}_numa{j}", "parent": root,
                              "inventory": {"VCPU": 8, "MEMORY_MB": 16384}})
            if j < 2:
                providers.append({"uuid": _uuid(rng), "name": f"cn{i:04d}_numa{j}_pf",
                                  "parent": numa, "inventory": {"SRIOV_NET_VF": 4},
                                  "traits": [rng.choice(["CUSTOM_A", "CUSTOM_B"])]})
    _load(servers, providers)
    for query in ({"resources1": "VCPU:1", "resources2": "SRIOV_NET_VF:1",
                   "same_subtree": "1,2", "group_policy": "none"},
                  {"resources1": "VCPU:1", "resources2": "SRIOV_NET_VF:1",
                   "required2": "CUSTOM_A", "same_subtree": "1,2", "group_policy": "isolate"},
                  {"resources1": "VCPU:1", "resources2": "SRIOV_NET_VF:1",
                   "required3": "CUSTOM_A", "same_subtree": "2,3", "group_policy": "none"},
                  {"resources": "VCPU:1,DISK_GB:5", "required1": "CUSTOM_B",
                   "resources2": "SRIOV_NET_VF:1", "same_subtree": "1,2",
                   "group_policy": "none"}):
        whole = _requests(servers["placement"], query)[0]
        query["limit"] = str(len(whole) - 1)
        assert _requests(servers["berth"], query) == _requests(servers["placement"], query), query


def test_sharing_providers_keep_the_same_requests_in_the_same_order(
        servers: dict[str, str]) -> None:
    """Sharing providers pair with their anchors (``anchors_for_sharing_providers``);
    a request of sharing providers alone stays with the first tree that forms it, so a
    merge pairs it with that tree's requests only; a numbered group copies a sharing
    provider's request to its anchors."""
    rng = random.Random(13)
    aggs = [_uuid(rng) for _ in range(3)]
    providers: list[dict[str, Any]] = []
    for i in range(120):
        inventory = {"VCPU": rng.choice([8, 16]), "MEMORY_MB": rng.choice([16384, 32768])}
        if i % 2:
            inventory["DISK_GB"] = 500
        providers.append({"uuid": _uuid(rng), "name": f"cn{i:04d}", "inventory": inventory,
                          "traits": ["CUSTOM_A"] if i % 3 == 0 else [],
                          "aggs": [aggs[i % 3]] + ([aggs[(i + 1) % 3]] if i % 5 == 0 else [])})
    for k in range(3):
        providers.append({"uuid": _uuid(rng), "name": f"shared{k}",
                          "inventory": {"DISK_GB": 10000, "IPV4_ADDRESS": 100},
                          "traits": ["MISC_SHARES_VIA_AGGREGATE"], "aggs": [aggs[k]]})
    _load(servers, providers)
    merged = {"resources": "DISK_GB:10", "resources1": "VCPU:1", "group_policy": "none"}
    ours, theirs = _requests(servers["berth"], merged), _requests(servers["placement"], merged)
    # One for each of the 60 nodes with their own disk, one for each shared pool (not
    # one for every node a pool serves).
    assert len(theirs[0]) == 60 + 3
    assert sorted(ours[0]) == sorted(theirs[0]) and ours[1] == theirs[1]
    for query in ({"resources": "VCPU:1,MEMORY_MB:1024,DISK_GB:10"},
                  {"resources": "VCPU:1,DISK_GB:10,IPV4_ADDRESS:1"},
                  {"resources": "VCPU:1,MEMORY_MB:1024", "resources1": "DISK_GB:10",
                   "group_policy": "none"},
                  {"resources1": "DISK_GB:10", "resources2": "VCPU:1", "group_policy": "none"},
                  {"resources": "VCPU:1,DISK_GB:10", "member_of": f"in:{aggs[0]},{aggs[1]}"},
                  {"resources": "VCPU:1,DISK_GB:10", "required": "CUSTOM_A"},
                  {"resources": "VCPU:1,DISK_GB:10", "member_of": aggs[1],
                   "resources1": "DISK_GB:5", "group_policy": "none"}):
        whole = _requests(servers["placement"], query)[0]
        query["limit"] = str(len(whole) - 1)
        assert _requests(servers["berth"], query) == _requests(servers["placement"], query), query
