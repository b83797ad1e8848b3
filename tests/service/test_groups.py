"""Server groups are stored, resolved by uuid or name with the hosts their members are
claimed on, and
grow by the instances booted into them."""

from __future__ import annotations

import pytest

from berth.errors import InputError
from berth.model.request import Flavor, InstanceGroup
from berth.service.stack import Stack

from .builders import node

GROUP_UUID = "aaaaaaaa-0000-4000-8000-000000000001"
MEMBER = "00000000-0000-4000-8000-00000000000a"
OTHER = "00000000-0000-4000-8000-00000000000b"


def test_a_group_resolves_by_uuid_or_name_with_the_hosts_its_members_are_claimed_on(
        stack: Stack) -> None:
    h1, h2 = stack.register_hosts([node("h1"), node("h2")])
    stack.client.put_allocations(MEMBER, {h1.uuid: {"VCPU": 1, "MEMORY_MB": 512}},
                                 project_id="p", user_id="u", consumer_generation=None)
    # A host's report does not place a member; its claim does (h2 reports one with none).
    h2.spawn(OTHER, Flavor(name="t", vcpus=1, memory_mb=512), "p")
    stack.groups.put(InstanceGroup(policy="anti-affinity", uuid=GROUP_UUID, name="web",
                                   members=[MEMBER, OTHER]))
    for ref in (GROUP_UUID, "web"):
        group = stack.groups.resolve(ref)
        assert group.policy == "anti-affinity" and group.members == [MEMBER, OTHER]
        assert group.hosts == ["h1"]
    stack.client.delete_allocations(MEMBER)
    assert stack.groups.resolve("web").hosts == []


def test_an_unknown_group_is_an_input_error_naming_the_hint(stack: Stack) -> None:
    stack.groups.put(InstanceGroup(policy="affinity", uuid=GROUP_UUID, name="db"))
    with pytest.raises(InputError, match=r"hints.group: no server group named or with uuid "
                                         r"'nope' \(known: db\)"):
        stack.groups.resolve("nope")


def test_a_name_two_groups_share_asks_for_the_uuid(stack: Stack) -> None:
    for i in (1, 2):
        stack.groups.put(InstanceGroup(policy="affinity", uuid=f"{GROUP_UUID[:-1]}{i}",
                                       name="twin"))
    with pytest.raises(InputError, match="2 server groups are named 'twin'; give the uuid"):
        stack.groups.resolve("twin")


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


def test_the_groups_of_a_member_are_found_without_reading_them_all(stack: Stack) -> None:
    stack.groups.put(InstanceGroup("anti-affinity", uuid="g1", name="a", members=["i-1", "i-2"]))
    stack.groups.put(InstanceGroup("affinity", uuid="g2", name="b", members=["i-1"]))
    stack.groups.put(InstanceGroup("affinity", uuid="g3", name="c", members=["i-10", "x%_"]))
    assert sorted(g.uuid for g in stack.groups.of_member("i-1")) == ["g1", "g2"]
    assert [g.uuid for g in stack.groups.of_member("x%_")] == ["g3"]
    assert stack.groups.of_member("%") == []
