"""Move operations through the service: the request each one sends the scheduler, and
the claims as Nova moves them (the migration consumer holds the source allocation until
confirm; revert and failures put everything back), checked in Placement."""

from __future__ import annotations

from pathlib import Path

import pytest

from berth.config import SchedulerConfig
from berth.errors import InputError, InstanceNotFound, MaxRetriesExceeded, MoveRefused, NoValidHost
from berth.model.request import Flavor, ImageMeta, RequestSpec
from berth.moves import MoveRequest
from berth.service.conductor import FakeDriver
from berth.service.moves import MoveService
from berth.service.stack import Stack

from .builders import node
from .conftest import TEST_CONFIG, fresh_stack

TINY = Flavor(name="tiny", vcpus=1, memory_mb=512, root_gb=1, id=1)
SMALL = Flavor(name="small", vcpus=2, memory_mb=1024, root_gb=2, id=2)


def _moves(stack: Stack, driver: FakeDriver | None = None, seed: int = 1) -> MoveService:
    service = stack.scheduler(seed=seed)
    return stack.moves(stack.conductor(service, driver or FakeDriver(agents=stack.agents)))


def _boot(moves: MoveService, flavor: Flavor = TINY, **fields: object) -> str:
    (built,) = moves.conductor.build_instances(RequestSpec(flavor=flavor, **fields))  # type: ignore[arg-type]
    return built.instance_uuid


def _host_of(stack: Stack, provider: str) -> str:
    return next(h for h, a in stack.agents.items() if a.uuid == provider)


def _held(stack: Stack, consumer: str) -> dict[str, dict[str, int]]:
    """A consumer's allocations by host name, as the Placement API answers them."""
    allocations = stack.client.get_allocations(consumer).allocations
    return {_host_of(stack, rp): res for rp, res in allocations.items()}


def _usage(stack: Stack) -> dict[str, int]:
    """MEMORY_MB used per host in placement."""
    return {host: stack.client.provider_usages(agent.uuid).get("MEMORY_MB", 0)
            for host, agent in stack.agents.items()}


@pytest.fixture
def three(stack: Stack) -> Stack:
    """h1-h3 with 8192 + 1024 x i MB: RAMWeigher puts a boot on h3, a move from h3 on h2."""
    stack.register_hosts([node(f"h{i}", memory_mb=8192 + i * 1024) for i in (1, 2, 3)])
    return stack


def test_migrate_leaves_the_source_allocation_with_the_migration_until_confirm(
        three: Stack) -> None:
    moves = _moves(three)
    uuid = _boot(moves)
    assert _held(three, uuid) == {"h3": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}

    answer = moves.move(uuid, MoveRequest("migrate"))
    # The source is ignored (no COMPUTE_SAME_HOST_COLD_MIGRATE): the next best host.
    assert (answer["host"], answer["status"], answer["tried"]) == ("h2", "VERIFY_RESIZE", ["h2"])
    migration = answer["migration_uuid"]
    assert _held(three, uuid) == {"h2": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}
    assert _held(three, migration) == {"h3": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}
    assert answer["allocations"]["migration"] == three.client.get_allocations(migration).allocations
    # The source still counts the instance's usage; the destination lists the instance.
    assert three.agents["h3"].host_record(0).free_ram_mb == 11264 - 512 - 512
    assert uuid in three.agents["h2"].host_record(0).instances

    # GET /servers/{uuid} meanwhile: the migration consumer's hold on the source too.
    shown = moves.show(uuid)
    assert shown["migration_uuid"] == migration
    assert shown["allocations"]["migration"] == answer["allocations"]["migration"]
    assert [m["status"] for m in shown["migrations"]] == ["finished"]

    confirmed = moves.confirm(uuid)
    assert confirmed["status"] == "ACTIVE" and confirmed["host"] == "h2"
    assert "migration" not in moves.show(uuid)["allocations"]
    assert three.client.get_allocations(migration).allocations == {}
    assert _usage(three) == {"h1": 0, "h2": 512, "h3": 0}
    assert [m["status"] for m in confirmed["migrations"]] == ["confirmed"]
    assert three.agents["h3"].host_record(0).free_ram_mb == 11264 - 512


def test_resize_revert_gives_the_instance_its_source_allocation_back(three: Stack) -> None:
    moves = _moves(three)
    uuid = _boot(moves)
    answer = moves.move(uuid, MoveRequest("resize", flavor=SMALL))
    migration = answer["migration_uuid"]
    assert _held(three, uuid) == {"h2": {"VCPU": 2, "MEMORY_MB": 1024, "DISK_GB": 2}}
    assert _held(three, migration) == {"h3": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}
    with pytest.raises(MoveRefused, match="VERIFY_RESIZE"):
        moves.move(uuid, MoveRequest("migrate"))

    reverted = moves.revert(uuid)
    assert (reverted["host"], reverted["status"], reverted["flavor"]) == ("h3", "ACTIVE", "tiny")
    assert _held(three, uuid) == {"h3": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}
    assert three.client.get_allocations(migration).allocations == {}
    assert _usage(three) == {"h1": 0, "h2": 0, "h3": 512}
    assert uuid not in three.agents["h2"].host_record(0).instances
    assert uuid in three.agents["h3"].host_record(0).instances
    with pytest.raises(MoveRefused, match="not VERIFY_RESIZE"):
        moves.confirm(uuid)


def test_resize_to_the_same_flavor_is_refused(three: Stack) -> None:
    moves = _moves(three)
    uuid = _boot(moves)
    with pytest.raises(InputError, match="already has flavor 'tiny'"):
        moves.move(uuid, MoveRequest("resize", flavor=TINY))
    assert moves.instances.get(uuid).status == "ACTIVE"  # type: ignore[union-attr]


def test_resize_stays_on_its_host_only_with_allow_resize_to_same_host(
        template_db: Path, tmp_path: Path) -> None:
    config = TEST_CONFIG.replace("DEFAULT", allow_resize_to_same_host=True)
    stack = fresh_stack(template_db, tmp_path, config)
    try:
        stack.register_hosts([node("h1")])
        moves = _moves(stack)
        uuid = _boot(moves)
        answer = moves.move(uuid, MoveRequest("resize", flavor=SMALL))
        # One host: it holds the old flavor (migration) and the new one (instance).
        assert answer["host"] == "h1"
        assert _held(stack, uuid) == {"h1": {"VCPU": 2, "MEMORY_MB": 1024, "DISK_GB": 2}}
        assert _held(stack, answer["migration_uuid"]) == {
            "h1": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}
        assert _usage(stack) == {"h1": 1536}
        # The host reports both too, and runs the instance once.
        record = stack.agents["h1"].host_record(0)
        assert record.free_ram_mb == 8192 - 512 - 1536 and list(record.instances) == [uuid]
        moves.confirm(uuid)
        assert _usage(stack) == {"h1": 1024}
        assert stack.agents["h1"].host_record(0).free_ram_mb == 8192 - 512 - 1024
        # Without the option a cold migration has nowhere to go.
        with pytest.raises(NoValidHost):
            moves.move(uuid, MoveRequest("migrate"))
    finally:
        stack.close()


def test_a_cold_migration_stays_on_a_host_whose_node_has_the_same_host_trait(
        stack: Stack) -> None:
    stack.register_hosts([node("h1", traits=["COMPUTE_SAME_HOST_COLD_MIGRATE"])])
    moves = _moves(stack)
    uuid = _boot(moves)
    answer = moves.move(uuid, MoveRequest("migrate"))
    assert answer["host"] == "h1"


def test_no_host_for_a_migration_puts_the_allocation_back(three: Stack) -> None:
    moves = _moves(three)
    uuid = _boot(moves, Flavor(name="big", vcpus=1, memory_mb=10000, root_gb=1, id=9))
    with pytest.raises(NoValidHost) as caught:
        moves.move(uuid, MoveRequest("migrate"), explain=True)
    assert caught.value.diagnosis is not None
    assert _held(three, uuid) == {"h3": {"VCPU": 1, "MEMORY_MB": 10000, "DISK_GB": 1}}
    (migration,) = moves.instances.migrations(uuid)
    assert migration.status == "error"
    assert three.client.get_allocations(migration.uuid).allocations == {}
    assert moves.instances.get(uuid).status == "ACTIVE"  # type: ignore[union-attr]


def test_a_failed_build_on_the_destination_goes_on_to_an_alternate(three: Stack) -> None:
    moves = _moves(three, FakeDriver(fail_hosts={"h2"}, agents=three.agents))
    uuid = _boot(moves)
    answer = moves.move(uuid, MoveRequest("migrate"))
    assert (answer["host"], answer["tried"]) == ("h1", ["h2", "h1"])
    assert _held(three, uuid) == {"h1": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}
    assert _usage(three) == {"h1": 512, "h2": 0, "h3": 512}


def test_every_destination_failing_reverts_the_claims(three: Stack) -> None:
    moves = _moves(three, FakeDriver(fail_hosts={"h1", "h2"}, agents=three.agents))
    uuid = _boot(moves)
    with pytest.raises(MaxRetriesExceeded):
        moves.move(uuid, MoveRequest("migrate"))
    assert _held(three, uuid) == {"h3": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}
    assert _usage(three) == {"h1": 0, "h2": 0, "h3": 512}
    assert [m.status for m in moves.instances.migrations(uuid)] == ["failed"]


def test_a_requested_host_is_the_only_destination(three: Stack) -> None:
    moves = _moves(three)
    uuid = _boot(moves)
    answer = moves.move(uuid, MoveRequest("migrate", host="h1"))
    assert answer["host"] == "h1"
    moves.revert(uuid)
    with pytest.raises(InputError, match="can't be the same one"):
        moves.move(uuid, MoveRequest("migrate", host="h3"))
    with pytest.raises(InputError, match="compute host 'h9' could not be found"):
        moves.move(uuid, MoveRequest("migrate", host="h9"))


def test_a_move_keeps_the_zone_its_instance_was_booted_in_unchecked(three: Stack) -> None:
    """Nova's API checks a zone when a server is created, not when it moves: an instance
    whose zone has no enabled host left still migrates. The move's request carries no
    check-type hint (Nova 34 gives one to a rebuild only); the service is told instead."""
    moves = _moves(three)
    uuid = _boot(moves)
    record = moves.instances.get(uuid)
    assert record is not None
    moves.instances.record(uuid, record.host, record.nodename,
                           {**record.spec, "availability_zone": "retired"})
    with pytest.raises(InputError, match="zone 'retired' is not available"):
        _boot(moves, availability_zone="retired")
    answer = moves.move(uuid, MoveRequest("migrate"))
    assert answer["host"] == "h2"


def test_evacuate_needs_the_source_down_and_claims_on_top_of_the_source(three: Stack) -> None:
    moves = _moves(three)
    uuid = _boot(moves)
    with pytest.raises(MoveRefused, match="Compute service of h3 is still in use"):
        moves.move(uuid, MoveRequest("evacuate"))
    source = three.agents["h3"]
    source.forced_down = True
    source.report()
    answer = moves.move(uuid, MoveRequest("evacuate"))
    assert (answer["host"], answer["status"], answer["alternates"]) == ("h2", "ACTIVE", [])
    # Nova: the instance consumer holds both until the source's compute cleans up.
    assert _held(three, uuid) == {"h2": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1},
                                  "h3": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}
    assert [m.status for m in moves.instances.migrations(uuid)] == ["done"]
    assert three.client.get_allocations(answer["migration_uuid"]).allocations == {}


def test_rebuild_runs_on_the_instance_host_with_the_rebuild_filters_only(
        template_db: Path, tmp_path: Path) -> None:
    config = SchedulerConfig.from_dict({"filter_scheduler": {
        "enabled_filters": ["ComputeFilter", "ImagePropertiesFilter"],
        "weight_classes": ["RAMWeigher"]}})
    stack = fresh_stack(template_db, tmp_path, config)
    try:
        stack.register_hosts([node("h1"), node("h2", memory_mb=16384)])
        moves = _moves(stack)
        uuid = _boot(moves)
        before = _held(stack, uuid)
        arm = ImageMeta(name="arm", properties={"hw_architecture": "aarch64"})
        with pytest.raises(NoValidHost):
            moves.move(uuid, MoveRequest("rebuild", image=arm))
        x86 = ImageMeta(name="x86", properties={"hw_architecture": "x86_64"})
        answer = moves.move(uuid, MoveRequest("rebuild", image=x86))
        assert (answer["host"], answer["migration_uuid"], answer["scheduled"]) == ("h2", None, True)
        assert _held(stack, uuid) == before  # nothing claimed
        assert moves.show(uuid)["image"] == "x86"
        # The same image again is rebuilt without asking the scheduler.
        assert moves.move(uuid, MoveRequest("rebuild", image=x86))["scheduled"] is False
    finally:
        stack.close()


def test_cross_cell_moves_only_when_allowed_and_the_home_cell_is_preferred(
        template_db: Path, tmp_path: Path) -> None:
    config = TEST_CONFIG.replace("filter_scheduler",
                                 weight_classes=["RAMWeigher", "CrossCellWeigher"])
    stack = fresh_stack(template_db, tmp_path, config)
    try:
        stack.register_hosts([node("a1", cell_uuid="cell-a", memory_mb=16384),
                              node("a2", cell_uuid="cell-a", memory_mb=4096),
                              node("b1", cell_uuid="cell-b", memory_mb=32768)])
        moves = _moves(stack)
        uuid = _boot(moves, force_hosts=["a1"])
        # Not allowed: only cell-a is asked; a2 although b1 has far more RAM.
        assert moves.move(uuid, MoveRequest("migrate"))["host"] == "a2"
        moves.revert(uuid)
        # Allowed: CrossCellWeigher (x1e6) keeps the move in its cell all the same.
        assert moves.move(uuid, MoveRequest("migrate", allow_cross_cell=True))["host"] == "a2"
        moves.revert(uuid)
        stack.agents["a2"].set_disabled(True)
        with pytest.raises(NoValidHost):
            moves.move(uuid, MoveRequest("migrate"))
        # With no host left in its cell, an allowed move crosses.
        assert moves.move(uuid, MoveRequest("migrate", allow_cross_cell=True))["host"] == "b1"
    finally:
        stack.close()


def test_moving_an_unknown_instance_is_not_found(three: Stack) -> None:
    moves = _moves(three)
    with pytest.raises(InstanceNotFound):
        moves.move("0b8f9c3e-0000-4000-8000-000000000000", MoveRequest("migrate"))


RESTART_CLOUD = """
flavors: [{name: small, vcpus: 1, memory_mb: 1024, root_gb: 10}]
hosts:
  - {host: a, vcpus: 8, memory_mb: 16384, local_gb: 100,
     instances: [{uuid: 0b8f9c3e-0000-4000-8000-0000000000ee, flavor: small}]}
  - {host: b, vcpus: 8, memory_mb: 8192, local_gb: 100}
"""


def test_a_moved_cloud_instance_stays_where_it_went_when_the_file_is_seeded_again(
        first: Stack, tmp_path: Path) -> None:
    from berth.service.seeding import seed_from_cloud

    from .builders import reopen

    path = tmp_path / "cloud.yaml"
    path.write_text(RESTART_CLOUD)
    uuid = "0b8f9c3e-0000-4000-8000-0000000000ee"
    seed_from_cloud(first, str(path))
    moves = _moves(first)
    assert moves.move(uuid, MoveRequest("migrate"))["host"] == "b"
    moves.confirm(uuid)
    assert _held(first, uuid) == {"b": {"VCPU": 1, "MEMORY_MB": 1024, "DISK_GB": 10}}
    first.close()
    # A restart with the same file: the instance is not placed on 'a' again.
    again = reopen(first)
    try:
        seed_from_cloud(again, str(path))
        again.resume_agents()
        assert _held(again, uuid) == {"b": {"VCPU": 1, "MEMORY_MB": 1024, "DISK_GB": 10}}
        assert _usage(again) == {"a": 0, "b": 1024}
        assert uuid not in again.agents["a"].host_record(0).instances
        assert uuid in again.agents["b"].host_record(0).instances
        assert again.instances.get(uuid).host == "b"  # type: ignore[union-attr]
    finally:
        again.close()


def test_the_source_of_an_evacuation_lets_go_when_it_is_up_again(three: Stack) -> None:
    moves = _moves(three)
    uuid = _boot(moves)
    source = three.agents["h3"]
    source.forced_down = True
    source.report()
    answer = moves.move(uuid, MoveRequest("evacuate"))
    assert moves.cleanup_evacuated("h2") == []  # not the source
    source.forced_down = False
    source.report()
    assert moves.cleanup_evacuated("h3") == [uuid]
    assert _held(three, uuid) == {"h2": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}
    assert _usage(three) == {"h1": 0, "h2": 512, "h3": 0}
    assert source.host_record(0).free_ram_mb == 11264 - 512
    assert [m.status for m in moves.instances.migrations(uuid)] == ["completed"]
    assert moves.cleanup_evacuated("h3") == []  # once
    assert answer["migration_uuid"]


def test_the_audit_finds_nothing_amiss_during_or_after_a_migration(three: Stack) -> None:
    from berth.service.reconcile import scan

    moves = _moves(three)
    uuid = _boot(moves)
    migration = moves.move(uuid, MoveRequest("migrate"))["migration_uuid"]
    # The migration consumer holds the source by right of its migration record.
    findings = scan(three.builds, three.groups, timeout=60)
    assert findings.clean, findings.as_dict()
    moves.confirm(uuid)
    assert scan(three.builds, three.groups, timeout=60).clean
    assert three.client.get_allocations(migration).allocations == {}


# ----------------------------------------------------------------------------- live migration
def _hypervisors(stack: Stack) -> None:
    """h1 (the smallest) runs an older QEMU, h2 (the middle) the source's, h3 (the
    biggest) another hypervisor type: a boot lands on h3... so boots pin a source."""
    stack.register_hosts([
        node("h1", memory_mb=9216, hypervisor_version=9000000),
        node("h2", memory_mb=10240, hypervisor_version=6000000),
        node("h3", memory_mb=11264, hypervisor_type="VMware"),
        node("h4", memory_mb=8192, hypervisor_version=8002000)])


def test_live_migration_ends_on_its_destination_with_nothing_to_confirm(three: Stack) -> None:
    moves = _moves(three)
    uuid = _boot(moves)
    answer = moves.move(uuid, MoveRequest("live-migrate"))
    # The source ignored, no alternates, ACTIVE at once; the source's hold is gone.
    assert (answer["host"], answer["status"], answer["alternates"], answer["skipped"]) == (
        "h2", "ACTIVE", [], [])
    migration = answer["migration_uuid"]
    assert _held(three, uuid) == {"h2": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}
    assert three.client.get_allocations(migration).allocations == {}
    assert answer["allocations"] == {"instance": three.client.get_allocations(uuid).allocations,
                                     "migration": {}}
    assert _usage(three) == {"h1": 0, "h2": 512, "h3": 0}
    assert uuid not in three.agents["h3"].host_record(0).instances
    assert three.agents["h3"].host_record(0).free_ram_mb == 11264 - 512
    assert [(m["migration_type"], m["status"], m["dest_host"])
            for m in moves.show(uuid)["migrations"]] == [("live-migration", "completed", "h2")]
    with pytest.raises(MoveRefused, match="not VERIFY_RESIZE"):
        moves.confirm(uuid)
    # A named host is a hint the filters still judge; its own host is ignored (NoValidHost,
    # as Nova's scheduler answers, not a refusal of the API).
    assert moves.move(uuid, MoveRequest("live-migrate", host="h1"))["host"] == "h1"
    with pytest.raises(NoValidHost):
        moves.move(uuid, MoveRequest("live-migrate", host="h1"))
    assert _held(three, uuid) == {"h1": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}
    with pytest.raises(InputError, match="compute host 'h9' could not be found"):
        moves.move(uuid, MoveRequest("live-migrate", host="h9"))
    with pytest.raises(InputError, match="allow_cross_cell: only migrate and resize"):
        moves.move(uuid, MoveRequest("live-migrate", allow_cross_cell=True))


def test_live_migration_skips_destinations_the_conductor_checks_turn_down(stack: Stack) -> None:
    """RAMWeigher prefers h3 (another hypervisor type), then h2 (an older version): the
    conductor gives each claim up and asks again, and h1 (newer) takes the instance."""
    _hypervisors(stack)
    moves = _moves(stack)
    uuid = _boot(moves, force_hosts=["h4"])
    answer = moves.move(uuid, MoveRequest("live-migrate"))
    assert answer["host"] == "h1" and answer["tried"] == ["h1"]
    assert answer["skipped"] == [
        {"host": "h3", "reason": "hypervisor type 'VMware' is not the source's 'QEMU' "
                                 "(InvalidHypervisorType)"},
        {"host": "h2", "reason": "hypervisor version 6000000 is older than the source's "
                                 "8002000 (DestinationHypervisorTooOld)"}]
    assert _held(stack, uuid) == {"h1": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}
    assert _usage(stack) == {"h1": 512, "h2": 0, "h3": 0, "h4": 0}
    # From h1 nothing is new enough, and no other host is QEMU: NoValidHost, every
    # allocation as before, the migration in error.
    with pytest.raises(NoValidHost, match="The live-migration checks skipped h3: hypervisor "
                       "type 'VMware'.*; h2: hypervisor version 6000000"):
        moves.move(uuid, MoveRequest("live-migrate"))
    assert _held(stack, uuid) == {"h1": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}
    assert _usage(stack) == {"h1": 512, "h2": 0, "h3": 0, "h4": 0}
    assert [m.status for m in moves.instances.migrations(uuid)] == ["completed", "error"]
    assert moves.instances.get(uuid).status == "ACTIVE"  # type: ignore[union-attr]


def test_live_migration_retries_and_version_check_follow_the_options(
        template_db: Path, tmp_path: Path) -> None:
    for options, outcome in (
            ({"DEFAULT": {"migrate_max_retries": 1}}, MaxRetriesExceeded),
            ({"DEFAULT": {"migrate_max_retries": 2}}, "h1"),
            ({"workarounds": {"skip_hypervisor_version_check_on_lm": True}}, "h2")):
        config = SchedulerConfig.from_dict({
            **options, "filter_scheduler": {"weight_classes": ["RAMWeigher"]}})
        stack = fresh_stack(template_db, _fresh_dir(tmp_path), config)
        try:
            _hypervisors(stack)
            moves = _moves(stack)
            uuid = _boot(moves, force_hosts=["h4"])
            if outcome is MaxRetriesExceeded:
                with pytest.raises(MaxRetriesExceeded, match="Exceeded max scheduling retries 2 "
                                   "for instance .* during live migration"):
                    moves.move(uuid, MoveRequest("live-migrate"))
                assert _held(stack, uuid) == {"h4": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}
                assert _usage(stack) == {"h1": 0, "h2": 0, "h3": 0, "h4": 512}
            else:
                assert moves.move(uuid, MoveRequest("live-migrate"))["host"] == outcome
        finally:
            stack.close()


def _fresh_dir(base: Path) -> Path:
    path = base / f"s{len(list(base.iterdir()))}"
    path.mkdir()
    return path


def _with_extra_specs(moves: MoveService, uuid: str, extra_specs: dict[str, str]) -> None:
    """The instance as if booted with a flavor with ``extra_specs`` (that the test
    hosts could not have taken) and a UEFI image."""
    record = moves.instances.get(uuid)
    assert record is not None
    flavor = {**record.spec["flavor"], "extra_specs": extra_specs}
    image = {"name": "uefi", "properties": {"hw_firmware_type": "uefi"}}
    moves.instances.record(uuid, record.host, record.nodename,
                           {**record.spec, "flavor": flavor, "image": image})


def test_live_migration_refusals_come_first(three: Stack) -> None:
    moves = _moves(three)
    refused = {"with accelerators": {"accel:device_profile": "gpu"},
               "hw:tpm_secret_security 'host' only, not 'user'": {"hw:tpm_version": "2.0"},
               "with encrypted memory": {"hw:mem_encryption": "true"}}
    for message, extra_specs in refused.items():
        uuid = _boot(moves)
        _with_extra_specs(moves, uuid, extra_specs)
        with pytest.raises(InputError, match=message):
            moves.move(uuid, MoveRequest("live-migrate"))
        assert moves.instances.get(uuid).status == "ACTIVE"  # type: ignore[union-attr]
        assert moves.instances.migrations(uuid) == []
    # A vTPM whose secret the host holds is scheduled (and no test host has the traits
    # of a vTPM: NoValidHost).
    uuid = _boot(moves)
    _with_extra_specs(moves, uuid, {"hw:tpm_version": "2.0", "hw:tpm_secret_security": "host"})
    with pytest.raises(NoValidHost):
        moves.move(uuid, MoveRequest("live-migrate"))
    assert [m.status for m in moves.instances.migrations(uuid)] == ["error"]
    # A source whose service is down: Nova's ComputeServiceUnavailable.
    uuid = _boot(moves)
    source = three.agents[moves.instances.get(uuid).host]  # type: ignore[union-attr]
    source.forced_down = True
    source.report()
    with pytest.raises(MoveRefused, match="is unavailable at this time"):
        moves.move(uuid, MoveRequest("live-migrate"))


def test_a_failed_live_migration_is_not_rescheduled_and_puts_everything_back(
        three: Stack) -> None:
    moves = _moves(three, FakeDriver(fail_hosts={"h2"}, agents=three.agents))
    uuid = _boot(moves)
    with pytest.raises(MaxRetriesExceeded, match="the live-migrate of instance"):
        moves.move(uuid, MoveRequest("live-migrate"))
    assert _held(three, uuid) == {"h3": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}
    assert _usage(three) == {"h1": 0, "h2": 0, "h3": 512}
    assert uuid in three.agents["h3"].host_record(0).instances
    assert [m.status for m in moves.instances.migrations(uuid)] == ["failed"]
    assert moves.instances.get(uuid).status == "ACTIVE"  # type: ignore[union-attr]


def test_a_destination_check_that_fails_puts_every_allocation_back(
        three: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object) -> object:
        def check(_selection: object) -> None:
            raise RuntimeError("the check broke")
        return check

    monkeypatch.setattr("berth.service.moves.destination_check", broken)
    moves = _moves(three)
    uuid = _boot(moves)
    with pytest.raises(RuntimeError, match="the check broke"):
        moves.move(uuid, MoveRequest("live-migrate"))
    assert _held(three, uuid) == {"h3": {"VCPU": 1, "MEMORY_MB": 512, "DISK_GB": 1}}
    (migration,) = moves.instances.migrations(uuid)
    assert migration.status == "error"
    assert three.client.get_allocations(migration.uuid).allocations == {}
    assert moves.instances.get(uuid).status == "ACTIVE"  # type: ignore[union-attr]
