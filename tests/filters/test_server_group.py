"""ServerGroupAffinityFilter and ServerGroupAntiAffinityFilter (reference §3.5, §3.6)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from misc_filter_strategies import UUIDS, random_cloud

from berth.filters.server_group import ServerGroupAffinityFilter, ServerGroupAntiAffinityFilter
from berth.host_state import WorkingSet
from berth.model import Instance, InstanceGroup
from builders import NOW, cloud, host, passes_bulk, passes_per_host, spec, state


def both(f, snap, req):  # type: ignore[no-untyped-def]
    per_host = passes_per_host(f, snap, req)
    assert passes_bulk(f, snap, req) == per_host
    return per_host


def three_hosts():  # type: ignore[no-untyped-def]
    return cloud(host("h1", instances=["a", "b"]), host("h2", instances=["c"]), host("h3"))


@pytest.mark.parametrize(
    ("group", "expected"),
    [
        (None, [True, True, True]),
        (InstanceGroup("affinity"), [True, True, True]),
        (InstanceGroup("affinity", hosts=["h2"]), [False, True, False]),
        (InstanceGroup("affinity", hosts=["h1", "h3", "h1"]), [True, False, True]),
        (InstanceGroup("anti-affinity", hosts=["h2"]), [True, True, True]),
        (InstanceGroup("soft-affinity", hosts=["h2"]), [True, True, True]),
        (InstanceGroup("affinity", hosts=["H2"]), [False, False, False]),
    ],
    ids=[
        "no server group passes every host",
        "the first member of an affinity group may go anywhere",
        "later members go only to the group's hosts",
        "several group hosts, duplicates allowed",
        "anti-affinity groups are not this filter's business",
        "soft-affinity is not affinity",
        "host names compare exactly",
    ],
)
def test_affinity(group: InstanceGroup | None, expected: list[bool]) -> None:
    assert both(ServerGroupAffinityFilter(), three_hosts(), spec(group=group)) == expected


def test_affinity_reason_lists_the_group_hosts() -> None:
    reject = ServerGroupAffinityFilter().check(
        state(three_hosts(), "h1"), spec(group=InstanceGroup("affinity", hosts=["h3", "h2"])))
    assert reject is not None and reject.reason == "not a server group host"
    assert reject.numbers == {"group_hosts": ["h2", "h3"]}


@pytest.mark.parametrize(
    ("group", "instance_uuid", "expected"),
    [
        (None, None, [True, True, True]),
        (InstanceGroup("affinity", members=["a", "c"]), None, [True, True, True]),
        (InstanceGroup("soft-anti-affinity", members=["a", "c"]), None, [True, True, True]),
        (InstanceGroup("anti-affinity", members=[]), None, [True, True, True]),
        (InstanceGroup("anti-affinity", members=["a"]), None, [False, True, True]),
        (InstanceGroup("anti-affinity", members=["a", "c", "zz"]), None, [False, False, True]),
        (InstanceGroup("anti-affinity", members=["a", "b"], rules={"max_server_per_host": 2}),
         None, [False, True, True]),
        (InstanceGroup("anti-affinity", members=["a", "c"], rules={"max_server_per_host": 2}),
         None, [True, True, True]),
        (InstanceGroup("anti-affinity", members=["a", "c"]), "a", [True, False, True]),
        (InstanceGroup("anti-affinity", members=["a", "c"]), "b", [True, False, True]),
    ],
    ids=[
        "no server group passes every host",
        "affinity groups are not this filter's business",
        "soft-anti-affinity is handled by a weigher, not here",
        "a group without members passes every host",
        "a host holding a member fails",
        "members not on any host count nowhere",
        "max_server_per_host 2: a host with two members fails",
        "max_server_per_host 2: a host with one member passes",
        "the host already holding the moved instance passes",
        "the moved instance need not be a member to keep its host",
    ],
)
def test_anti_affinity(group: InstanceGroup | None, instance_uuid: str | None,
                       expected: list[bool]) -> None:
    req = spec(group=group, instance_uuid=instance_uuid)
    assert both(ServerGroupAntiAffinityFilter(), three_hosts(), req) == expected


def test_anti_affinity_reason_counts_members() -> None:
    group = InstanceGroup("anti-affinity", members=["a", "b"], rules={"max_server_per_host": "2"})
    reject = ServerGroupAntiAffinityFilter().check(state(three_hosts(), "h1"), spec(group=group))
    assert reject is not None and reject.reason == "server group member already on host"
    assert reject.numbers == {"members_on_host": 2, "max_server_per_host": 2}


def test_anti_affinity_sees_members_this_request_already_placed() -> None:
    # A multi-create: instance 0 landed on h3 and was recorded as a stub there.
    snap = three_hosts()
    group = InstanceGroup("anti-affinity", members=["new0", "new1"])
    ws = WorkingSet(snap, NOW)
    ws.add_instance(2, Instance(uuid="new0"))
    req = spec(group=group, instance_uuid="new1")
    f = ServerGroupAntiAffinityFilter()
    bulk = [bool(x) for x in f.filter_all_hosts(ws.hosts(), req)]
    per_host = [f.host_passes(ws.host_state(r), req) for r in range(3)]
    assert bulk == per_host == [True, True, False]


def test_flags_are_novas() -> None:
    for cls in (ServerGroupAffinityFilter, ServerGroupAntiAffinityFilter):
        assert not cls.run_filter_once_per_request and not cls.RUN_ON_REBUILD


@settings(max_examples=60, deadline=None)
@given(
    snap=random_cloud(),
    policy=st.sampled_from(["affinity", "anti-affinity", "soft-affinity"]),
    members=st.lists(st.sampled_from([*UUIDS, "new0", "new1"]), max_size=6),
    group_hosts=st.lists(st.sampled_from(["h0", "h1", "h3", "h8"]), max_size=3),
    max_per_host=st.sampled_from([None, 1, 2, 3]),
    instance_uuid=st.sampled_from([None, "new0", *UUIDS[:4]]),
    stubs=st.lists(st.tuples(st.integers(0, 6), st.sampled_from(["new0", "new1", UUIDS[0]])),
                   max_size=3),
)
def test_bulk_and_per_host_paths_agree(  # type: ignore[no-untyped-def]
    snap, policy, members, group_hosts, max_per_host, instance_uuid, stubs
) -> None:
    rules = {} if max_per_host is None else {"max_server_per_host": max_per_host}
    group = InstanceGroup(policy, members=members, hosts=group_hosts, rules=rules)
    req = spec(group=group, instance_uuid=instance_uuid)
    ws = WorkingSet(snap, NOW)
    for row, uuid in stubs:
        if row < len(snap) and uuid not in ws.instances(row):
            ws.add_instance(row, Instance(uuid=uuid))
    for f in (ServerGroupAffinityFilter(), ServerGroupAntiAffinityFilter()):
        rows = np.arange(len(snap))
        bulk = [bool(x) for x in f.filter_all_hosts(ws.hosts(rows), req)]
        assert bulk == [f.host_passes(ws.host_state(r), req) for r in range(len(snap))]


def schedule(filters: list[str], group: InstanceGroup, uuids: list[str], n_hosts: int = 3):  # type: ignore[no-untyped-def]
    import random

    from berth.config import SchedulerConfig
    from berth.pipeline import Scheduler

    config = SchedulerConfig.from_dict({"filter_scheduler": {"enabled_filters": filters}})
    snap = cloud(*(host(f"h{i}") for i in range(n_hosts)))
    return Scheduler(config).select_destinations(
        spec(group=group), snap, now=NOW, rng=random.Random(7), instance_uuids=uuids)


def test_a_multi_create_spreads_an_anti_affinity_group_over_distinct_hosts() -> None:
    uuids = ["m0", "m1", "m2"]
    decision = schedule(["ServerGroupAntiAffinityFilter"],
                        InstanceGroup("anti-affinity", members=list(uuids)), uuids)
    assert len({h for h, _ in decision.hosts}) == 3


def test_an_anti_affinity_multi_create_larger_than_the_cloud_has_no_valid_host() -> None:
    from berth.errors import NoValidHost

    uuids = ["m0", "m1", "m2", "m3"]
    with pytest.raises(NoValidHost):
        schedule(["ServerGroupAntiAffinityFilter"],
                 InstanceGroup("anti-affinity", members=list(uuids)), uuids)


def test_max_server_per_host_lets_a_multi_create_double_up() -> None:
    uuids = ["m0", "m1", "m2", "m3"]
    group = InstanceGroup("anti-affinity", members=list(uuids), rules={"max_server_per_host": 2})
    decision = schedule(["ServerGroupAntiAffinityFilter"], group, uuids, n_hosts=2)
    assert sorted(h for h, _ in decision.hosts) == ["h0", "h0", "h1", "h1"]


def test_a_multi_create_keeps_an_affinity_group_on_the_first_members_host() -> None:
    uuids = ["m0", "m1", "m2"]
    decision = schedule(["ServerGroupAffinityFilter"],
                        InstanceGroup("affinity", members=list(uuids)), uuids)
    assert len({h for h, _ in decision.hosts}) == 1
