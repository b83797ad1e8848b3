"""Server groups are stored, resolved by uuid or name with the hosts their members are
claimed on, and
grow by the instances booted into them."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from berth.errors import InputError
from berth.model.request import Flavor, InstanceGroup
from berth.placement.db import create_db_engine, run_migrations
from berth.service.groups import ServerGroupStore
from berth.service.stack import Stack
from pgdb import fresh_pg_database

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
    # The spec its build record keeps while it builds gives its flavor.
    stack.builds.begin([MEMBER], "req-1", spec='{"flavor": {"id": 42}}')
    for ref in (GROUP_UUID, "web"):
        group = stack.groups.resolve(ref)
        assert group.policy == "anti-affinity" and group.members == [MEMBER, OTHER]
        assert group.hosts == ["h1"] and group.member_hosts == {MEMBER: "h1"}
        assert group.member_flavors == {MEMBER: 42}
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


def test_a_deleted_instance_leaves_every_group_it_was_in_and_only_those(stack: Stack) -> None:
    stack.groups.put(InstanceGroup("anti-affinity", uuid="g1", name="a", members=["i-1", "i-2"]))
    stack.groups.put(InstanceGroup("affinity", uuid="g2", name="b", members=["i-1"]))
    assert stack.groups.leave("i-1") == 2
    assert stack.groups.of_member("i-1") == []
    assert [g.members for g in stack.groups.all()] == [["i-2"], []]
    assert stack.groups.leave("i-1") == 0


def test_members_keep_the_order_they_joined_in_through_edits(stack: Stack) -> None:
    stack.groups.put(InstanceGroup("affinity", uuid=GROUP_UUID, name="db", members=["c", "a"]))
    stack.groups.add_members(GROUP_UUID, ["b", "a", "d"])
    stack.groups.remove_members(GROUP_UUID, ["a"])
    stack.groups.add_members(GROUP_UUID, ["a"])
    group = stack.groups.get(GROUP_UUID)
    assert group is not None and group.members == ["c", "b", "d", "a"]
    with pytest.raises(InputError, match="server group nope: no such group"):
        stack.groups.add_members("nope", ["x"])


def test_a_group_of_many_members_is_read_and_emptied_whole(stack: Stack) -> None:
    members = [f"i-{n:05d}" for n in range(1_234)]
    stack.groups.put(InstanceGroup("soft-affinity", uuid=GROUP_UUID, name="big",
                                   members=members))
    assert stack.groups.resolve("big").members == members
    stack.groups.remove_members(GROUP_UUID, members[::-1])
    assert stack.groups.all()[0].members == []


def _old_schema(engine: sa.Engine) -> None:
    """The table as earlier Berth wrote it: members as a JSON list in a column."""
    with engine.begin() as conn:
        conn.execute(sa.text(
            "CREATE TABLE berth_server_groups (uuid VARCHAR(36) PRIMARY KEY, "
            "name VARCHAR(255) NOT NULL, policy VARCHAR(32) NOT NULL, rules TEXT NOT NULL, "
            "members TEXT NOT NULL, project_id VARCHAR(255), user_id VARCHAR(255))"))
        conn.execute(sa.text("CREATE INDEX ix_berth_server_groups_name ON berth_server_groups "
                             "(name)"))
        conn.execute(sa.text(
            "INSERT INTO berth_server_groups VALUES "
            "('g1', 'web', 'anti-affinity', '{}', '[\"i-3\", \"i-1\", \"i-3\"]', 'p', 'u'), "
            "('g2', 'db', 'affinity', '{}', '[]', NULL, NULL)"))


def _moved(url: str) -> None:
    engine = create_db_engine(url)
    try:
        run_migrations(engine)
        _old_schema(engine)
        stores = [ServerGroupStore(engine), ServerGroupStore(engine)]  # the second: nothing left
        assert "members" not in {c["name"] for c in sa.inspect(engine).get_columns(
            "berth_server_groups")}
        groups = {g.name: g for g in stores[1].all()}
        assert groups["web"].members == ["i-3", "i-1"] and groups["db"].members == []
        assert groups["web"].project_id == "p" and groups["web"].policy == "anti-affinity"
        assert [g.uuid for g in stores[0].of_member("i-1")] == ["g1"]
        stores[0].add_members("g2", ["i-9"])
        assert stores[1].resolve("db").members == ["i-9"]
        with pytest.raises(InputError, match="server group nope: no such group"):
            stores[0].add_members("nope", ["i-9", "i-10"])
        assert stores[1].of_member("i-10") == [] and len(stores[1].of_member("i-9")) == 1
    finally:
        engine.dispose()


def test_members_stored_by_an_earlier_berth_move_to_their_table_once(tmp_path: Path) -> None:
    _moved(f"sqlite:///{tmp_path / 'old.db'}")


def test_members_stored_by_an_earlier_berth_move_on_postgresql() -> None:
    with fresh_pg_database("berth_groups") as url:
        _moved(url)


def test_processes_loading_one_cloud_file_together_store_each_group_once() -> None:
    with fresh_pg_database("berth_groups") as url:
        engines = [create_db_engine(url) for _ in range(2)]
        try:
            run_migrations(engines[0])
            stores = [ServerGroupStore(e) for e in engines]
            errors: list[BaseException] = []

            def put(n: int) -> None:
                try:
                    stores[n % 2].put(InstanceGroup("anti-affinity", uuid=GROUP_UUID, name="web",
                                                    members=[f"i-{n % 3}"]))
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

            threads = [threading.Thread(target=put, args=(n,)) for n in range(12)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == []
            (group,) = stores[1].all()
            assert sorted(group.members) == ["i-0", "i-1", "i-2"]
        finally:
            for e in engines:
                e.dispose()
