"""Server groups are stored, resolved by uuid or name with their members' hosts, and
grow by the instances booted into them."""

from __future__ import annotations

import pytest

from berth.errors import InputError
from berth.model.request import Flavor, InstanceGroup
from berth.service.compute import SnapshotFeed
from berth.service.stack import Stack

from .builders import node

GROUP_UUID = "aaaaaaaa-0000-4000-8000-000000000001"
MEMBER = "00000000-0000-4000-8000-00000000000a"


def test_a_group_resolves_by_uuid_or_name_with_the_hosts_its_members_run_on(
        stack: Stack) -> None:
    h1, _ = stack.register_hosts([node("h1"), node("h2")])
    h1.spawn(MEMBER, Flavor(name="t", vcpus=1, memory_mb=512), "p")
    stack.groups.put(InstanceGroup(policy="anti-affinity", uuid=GROUP_UUID, name="web",
                                   members=[MEMBER]))
    snapshot = SnapshotFeed(stack.records).refresh()
    for ref in (GROUP_UUID, "web"):
        group = stack.groups.resolve(ref, snapshot)
        assert group.policy == "anti-affinity" and group.members == [MEMBER]
        assert group.hosts == ["h1"]


def test_an_unknown_group_is_an_input_error_naming_the_hint(stack: Stack) -> None:
    stack.groups.put(InstanceGroup(policy="affinity", uuid=GROUP_UUID, name="db"))
    with pytest.raises(InputError, match=r"hints.group: no server group named or with uuid "
                                         r"'nope' \(known: db\)"):
        stack.groups.resolve("nope", SnapshotFeed(stack.records).refresh())


def test_a_name_two_groups_share_asks_for_the_uuid(stack: Stack) -> None:
    for i in (1, 2):
        stack.groups.put(InstanceGroup(policy="affinity", uuid=f"{GROUP_UUID[:-1]}{i}",
                                       name="twin"))
    with pytest.raises(InputError, match="2 server groups are named 'twin'; give the uuid"):
        stack.groups.resolve("twin", SnapshotFeed(stack.records).refresh())


def test_members_are_added_once_and_survive_a_new_definition_of_the_group(
        stack: Stack) -> None:
    stack.groups.put(InstanceGroup(policy="affinity", uuid=GROUP_UUID, name="db",
                                   members=[MEMBER]))
    stack.groups.add_members(GROUP_UUID, [MEMBER, "m2", "m3"])
    stack.groups.put(InstanceGroup(policy="soft-affinity", uuid=GROUP_UUID, name="db"))
    (group,) = stack.groups.find("db")
    assert group.policy == "soft-affinity" and group.members == [MEMBER, "m2", "m3"]


def test_members_that_were_not_built_leave_the_group_and_the_others_stay(
        stack: Stack) -> None:
    stack.groups.put(InstanceGroup(policy="affinity", uuid=GROUP_UUID, name="db",
                                   members=[MEMBER]))
    stack.groups.add_members(GROUP_UUID, ["m2", "m3", "m2"])
    stack.groups.remove_members(GROUP_UUID, ["m3", "not-a-member"])
    group = stack.groups.get(GROUP_UUID)
    assert group is not None and group.members == [MEMBER, "m2"]
    assert stack.groups.get("bbbbbbbb-0000-4000-8000-000000000001") is None
