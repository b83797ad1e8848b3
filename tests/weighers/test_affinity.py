"""Soft server-group weighers (reference §7.2, §13 item 10): members on the host = host
instances ∩ group members, only for the weigher's own policy; soft-anti-affinity negates
the raw value; multipliers soft_(anti_)affinity_weight_multiplier (1.0, minimum 0.0)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from berth.errors import ConfigError
from berth.model import Instance, InstanceGroup
from berth.weighers.affinity import (
    ServerGroupSoftAffinityWeigher,
    ServerGroupSoftAntiAffinityWeigher,
)
from builders import cloud, host, spec, working_set

from ._helpers import check_paths_agree, config, multipliers_both, raw_both, weights_of


def snap():
    return cloud(host("a", instances=["m1", "m2", "x"]), host("b", instances=["m3"]),
                 host("c", instances=["y"]))


def group(policy, members=("m1", "m2", "m3")):
    return InstanceGroup(policy=policy, members=list(members))


def test_soft_affinity_counts_group_members_on_each_host():
    req = spec(group=group("soft-affinity"))
    assert raw_both(ServerGroupSoftAffinityWeigher(), snap(), req) == [2, 1, 0]
    # normalized (2-0)/2 = 1, 0.5, 0
    assert weights_of([ServerGroupSoftAffinityWeigher()], snap(), req) == [1.0, 0.5, 0.0]


def test_soft_anti_affinity_negates_the_count():
    req = spec(group=group("soft-anti-affinity"))
    assert raw_both(ServerGroupSoftAntiAffinityWeigher(), snap(), req) == [-2, -1, 0]
    # normalized (-2+2)/2 = 0, 0.5, 1: the host without members wins
    assert weights_of([ServerGroupSoftAntiAffinityWeigher()], snap(), req) == [0.0, 0.5, 1.0]


@pytest.mark.parametrize(
    ("weigher", "policy"),
    [
        pytest.param(ServerGroupSoftAffinityWeigher, "soft-anti-affinity",
                     id="soft-affinity weigher ignores a soft-anti-affinity group"),
        pytest.param(ServerGroupSoftAffinityWeigher, "affinity",
                     id="soft-affinity weigher ignores a hard affinity group"),
        pytest.param(ServerGroupSoftAntiAffinityWeigher, "soft-affinity",
                     id="soft-anti-affinity weigher ignores a soft-affinity group"),
        pytest.param(ServerGroupSoftAntiAffinityWeigher, None,
                     id="no server group weighs zero"),
    ],
)
def test_other_policies_weigh_zero(weigher, policy):
    req = spec(group=group(policy) if policy else None)
    assert raw_both(weigher(), snap(), req) == [0, 0, 0]


def test_duplicate_members_count_once():
    req = spec(group=group("soft-affinity", ["m1", "m1", "m1"]))
    assert raw_both(ServerGroupSoftAffinityWeigher(), snap(), req) == [1, 0, 0]


def test_instances_placed_earlier_in_the_request_count():
    # A multi-create put stub "new1" on host c; it is a group member, so c now has one.
    s = snap()
    ws = working_set(s)
    ws.add_instance(2, Instance(uuid="new1"))
    ws.add_instance(0, Instance(uuid="m1"))  # already reported there: counted once
    req = spec(group=group("soft-affinity", ["m1", "m2", "m3", "new1"]))
    assert raw_both(ServerGroupSoftAffinityWeigher(), s, req, ws) == [2, 1, 1]


def test_negative_multipliers_are_refused_at_start_up():
    with pytest.raises(ConfigError, match="soft_anti_affinity_weight_multiplier"):
        config(filter_scheduler={"soft_anti_affinity_weight_multiplier": -1.0})


def test_the_aggregate_override():
    s = cloud(host("a").in_aggregate("x", soft_affinity_weight_multiplier="4",
                                     soft_anti_affinity_weight_multiplier="0"), host("b"))
    assert multipliers_both(ServerGroupSoftAffinityWeigher(), s) == [4.0, 1.0]
    assert multipliers_both(ServerGroupSoftAntiAffinityWeigher(), s) == [0.0, 1.0]


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_bulk_and_per_host_paths_agree(data):
    check_paths_agree([ServerGroupSoftAffinityWeigher, ServerGroupSoftAntiAffinityWeigher], data)


@pytest.mark.parametrize(
    ("policy", "same_host"),
    [pytest.param("soft-anti-affinity", False, id="soft-anti-affinity spreads a multi-create"),
     pytest.param("soft-affinity", True, id="soft-affinity packs a multi-create")],
)
def test_a_multi_create_sees_the_members_it_already_placed(policy, same_host):
    import random

    from berth.pipeline import Scheduler
    from builders import NOW

    # Identical hosts; only the group weigher can tell them apart once a member is placed.
    conf = config(filter_scheduler={"weight_classes": [
        "ServerGroupSoftAffinityWeigher", "ServerGroupSoftAntiAffinityWeigher"]})
    uuids = ["new-1", "new-2"]
    req = spec(group=InstanceGroup(policy=policy, members=list(uuids)), num_instances=2)
    decision = Scheduler(conf, filters=[]).select_destinations(
        req, cloud(host("a"), host("b"), host("c")), now=NOW, rng=random.Random(3),
        instance_uuids=uuids, return_alternates=False)
    first, second = decision.hosts
    assert (first == second) is same_host
