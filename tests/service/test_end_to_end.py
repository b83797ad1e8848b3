"""A request through the resource store: candidates, claims, alternates, conductor."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from berth.errors import MaxRetriesExceeded, NoValidHost
from berth.model.request import Destination, Flavor, RequestSpec
from berth.placement.client import PlacementClient
from berth.service.compute import ComputeNodeSpec
from berth.service.conductor import FakeDriver
from berth.service.placement import CandidatesAnswer, PlacementCandidates, candidate_set
from berth.service.scheduler import SchedulerService
from berth.service.stack import Stack

from .conftest import TEST_CONFIG, fresh_stack

FLAVOR = Flavor(name="small", vcpus=2, memory_mb=2048, root_gb=10, id=1)


def _spec(flavor: Flavor = FLAVOR, **kw: object) -> RequestSpec:
    return RequestSpec(flavor=flavor, project_id="proj", user_id="user", **kw)  # type: ignore[arg-type]


def _hosts(n: int, memory_mb: int = 8192 + 512, **kw: object) -> list[ComputeNodeSpec]:
    return [ComputeNodeSpec(host=f"h{i}", vcpus=8, memory_mb=memory_mb, local_gb=100, **kw)  # type: ignore[arg-type]
            for i in range(n)]


def _usage(stack: Stack) -> dict[str, dict[str, int]]:
    """Non-zero usages per host."""
    return {a.node.host: {rc: n for rc, n in stack.client.provider_usages(a.uuid).items() if n}
            for a in stack.agents.values()}


def test_a_request_claims_the_best_host_and_returns_alternates_with_their_requests(
        stack: Stack) -> None:
    stack.register_hosts(_hosts(4))
    service = stack.scheduler(seed=1)
    decision = service.select_destinations(_spec())
    (selections,) = decision.selections
    assert len(selections) == TEST_CONFIG.scheduler.max_attempts
    chosen = selections[0]
    assert chosen.allocation_request_version == "1.36"
    assert chosen.allocation_request_dict is not None
    assert chosen.allocation_request_dict["allocations"] == {
        chosen.compute_node_uuid: {"resources": {"DISK_GB": 10, "MEMORY_MB": 2048, "VCPU": 2}}}
    for alt in selections[1:]:
        assert alt.service_host != chosen.service_host
        assert alt.allocation_request_dict is not None
        assert alt.compute_node_uuid in alt.allocation_request_dict["allocations"]
    usages = _usage(stack)
    assert usages[chosen.service_host] == {"VCPU": 2, "MEMORY_MB": 2048, "DISK_GB": 10}
    assert sum(1 for u in usages.values() if u.get("VCPU")) == 1
    assert stack.client.get_allocations(decision.instance_uuids[0]).project_id == "proj"


def test_the_service_names_the_instances_from_its_seed_and_claims_for_them(stack: Stack) -> None:
    from berth.model.request import new_instance_uuids
    from berth.service.builds import instance_uuid_rng

    stack.register_hosts(_hosts(2))
    decision = stack.scheduler(seed=1).select_destinations(_spec(num_instances=2))
    # From the seed and this process's start number on the database.
    rng = instance_uuid_rng(1, stack.builds.start)
    assert decision.instance_uuids == new_instance_uuids(rng, 2)
    for uuid in decision.instance_uuids:
        assert stack.client.get_allocations(uuid).allocations


def test_spreading_follows_local_consumption_between_reports(stack: Stack) -> None:
    # Berth's consume_between_reports: Nova's pre-Queens host-state cache.
    stack.config = stack.config.replace("filter_scheduler", consume_between_reports=True)
    stack.register_hosts(_hosts(3))
    service = stack.scheduler(seed=1)
    hosts = [service.select_destinations(_spec()).selections[0][0].service_host for _ in range(3)]
    # RAMWeigher spreads: each claim lowers the chosen host's free RAM in the snapshot.
    assert sorted(hosts) == ["h0", "h1", "h2"]
    snapshot = service.feed.snapshot
    for name in hosts:
        row = snapshot.row_of(name)
        assert snapshot.num("free_ram_mb")[row] == 8192 - 2048
        assert snapshot.num("num_io_ops")[row] == 1  # every scheduled operation counts (§2.3)


def test_by_default_the_next_request_sees_the_hosts_as_they_last_reported(stack: Stack) -> None:
    # Nova 34 builds fresh host states per request (§2.4): without a report in between,
    # the equal hosts tie again and the first one wins again; placement, which counts
    # every claim, still has room on it.
    stack.register_hosts(_hosts(3))
    service = stack.scheduler(seed=1)
    hosts = [service.select_destinations(_spec()).selections[0][0].service_host for _ in range(3)]
    assert hosts == ["h0", "h0", "h0"]
    row = service.feed.snapshot.row_of("h0")
    assert service.feed.snapshot.num("free_ram_mb")[row] == 8192
    assert service.feed.snapshot.num("num_io_ops")[row] == 0
    assert _usage(stack)["h0"]["MEMORY_MB"] == 3 * 2048


def test_a_full_cloud_is_no_valid_host_and_multi_create_rolls_back(stack: Stack) -> None:
    stack.register_hosts(_hosts(2, memory_mb=2048 + 512))
    service = stack.scheduler(seed=1)
    with pytest.raises(NoValidHost, match="not enough hosts"):
        service.select_destinations(_spec(num_instances=3))
    assert all(not u for u in _usage(stack).values())
    service.select_destinations(_spec(num_instances=2))
    with pytest.raises(NoValidHost) as info:
        service.select_destinations(_spec())
    assert info.value.reason == ""  # placement had no candidates


def test_concurrent_claims_are_refused_by_placement_and_the_next_host_is_tried(
        stack: Stack) -> None:
    stack.register_hosts(_hosts(2, memory_mb=2048 + 512))
    first, second = stack.scheduler(seed=1), stack.scheduler(seed=1)
    first.feed.refresh()
    second.feed.refresh()
    a = first.select_destinations(_spec()).selections[0][0].service_host
    # The second service's snapshot has not seen the first claim, but placement has.
    b = second.select_destinations(_spec()).selections[0][0].service_host
    assert {a, b} == {"h0", "h1"}


def test_a_disabled_host_is_left_out_by_placement(stack: Stack) -> None:
    agents = stack.register_hosts(_hosts(2))
    agents[0].set_disabled(True, "maintenance")
    service = stack.scheduler(seed=1)
    for _ in range(3):
        assert service.select_destinations(_spec()).selections[0][0].service_host == "h1"


def test_a_host_whose_heartbeat_is_too_old_is_down(stack: Stack) -> None:
    agents = stack.register_hosts(_hosts(2))
    agents[0].report(now=agents[0].clock() - 3600)
    service = stack.scheduler(seed=1)
    assert service.select_destinations(_spec()).selections[0][0].service_host == "h1"


def test_a_forced_host_is_the_only_candidate_and_an_unknown_one_fails(stack: Stack) -> None:
    stack.register_hosts(_hosts(3))
    service = stack.scheduler(seed=1)
    decision = service.select_destinations(_spec(force_hosts=["h2"]))
    assert [s.service_host for s in decision.selections[0]] == ["h2"]
    with pytest.raises(NoValidHost, match="No such host - host: h9 node: None"):
        service.select_destinations(_spec(requested_destination=Destination(host="h9")))


def test_pinned_cpus_fall_back_to_vcpu_candidates(stack: Stack) -> None:
    stack.register_hosts([ComputeNodeSpec(host="pinned", vcpus=0, pcpus=8, memory_mb=8704,
                                          local_gb=100),
                          ComputeNodeSpec(host="shared", vcpus=8, memory_mb=8704, local_gb=100)])
    service = stack.scheduler(seed=1)
    flavor = Flavor(name="pin", vcpus=2, memory_mb=1024, extra_specs={"hw:cpu_policy": "dedicated"})
    hosts = {s.service_host for s in service.select_destinations(_spec(flavor)).selections[0]}
    assert hosts == {"pinned", "shared"}
    assert service.stats.fallback_queries == 1
    usages = _usage(stack)
    assert usages["pinned"].get("PCPU") == 2 or usages["shared"].get("VCPU") == 2

    no_fallback = SchedulerService(
        TEST_CONFIG.replace("workarounds", disable_fallback_pcpu_query=True), service.feed,
        service.candidates, service.claimer)
    hosts = {s.service_host for s in no_fallback.select_destinations(_spec(flavor)).selections[0]}
    assert hosts == {"pinned"}


def test_a_request_filter_failure_is_no_valid_host_with_its_reason(stack: Stack) -> None:
    stack.register_hosts(_hosts(1))
    service = stack.scheduler(seed=1)
    flavor = Flavor(name="tpm", vcpus=1, memory_mb=512,
                    extra_specs={"hw:tpm_version": "2.0", "hw:tpm_secret_security": "x"})
    with pytest.raises(NoValidHost, match="unsupported hw:tpm_secret_security"):
        service.select_destinations(_spec(flavor))


def test_availability_zone_goes_through_placement_aggregates(stack: Stack) -> None:
    from berth.model.aggregate import Aggregate

    zone = Aggregate(1, "z", uuid="5e1d3c3a-1b7c-4a8e-9a57-3f1f0c8e2b11", hosts=("h2",),
                     metadata={"availability_zone": "az2"})
    stack.register_hosts(_hosts(3), [zone])
    service = stack.scheduler(seed=1)
    decision = service.select_destinations(_spec(availability_zone="az2"))
    assert [s.service_host for s in decision.selections[0]] == ["h2"]
    assert decision.selections[0][0].availability_zone == "az2"


def test_a_claim_for_an_existing_consumer_is_refused_and_leaves_its_allocations(
        stack: Stack) -> None:
    agents = stack.register_hosts(_hosts(2))
    claimer = stack.scheduler().claimer
    consumer = "0b8f9c3e-0000-4000-8000-00000000abcd"
    a, b = agents[0].uuid, agents[1].uuid
    assert claimer.claim(consumer, {"allocations": {a: {"resources": {"VCPU": 1}}}}, _spec(), "1.36")
    # Another instance's claim for the same uuid: placement's consumer-generation check
    # on a new consumer refuses it; the first instance's allocation is untouched.
    assert not claimer.claim(consumer, {"allocations": {b: {"resources": {"VCPU": 2}}}}, _spec(),
                             "1.36")
    assert stack.client.get_allocations(consumer).allocations == {a: {"VCPU": 1}}
    assert claimer.stats.consumer_conflicts == 1 and claimer.stats.successes == 1
    claimer.rollback([consumer])
    assert stack.client.get_allocations(consumer).allocations == {}


def test_a_rebuild_claims_nothing(stack: Stack) -> None:
    stack.register_hosts(_hosts(2))
    service = stack.scheduler(seed=1)
    decision = service.select_destinations(_spec(scheduler_hints={"_nova_check_type": "rebuild"}))
    assert decision.selections[0][0].allocation_request == "null"
    assert all(not u for u in _usage(stack).values())


def test_an_unreachable_placement_gives_no_candidates(tmp_path: Path) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    client = PlacementClient("http://nowhere", transport=httpx.MockTransport(refuse))
    answer = PlacementCandidates(client).get([("resources", "VCPU:1")])
    assert answer.allocation_requests == [] and answer.error is not None


def test_candidates_map_by_root_provider_uuid_and_skip_unknown_summaries(stack: Stack) -> None:
    stack.register_hosts(_hosts(2))
    snapshot = stack.scheduler().feed.refresh()
    u0, u1 = (stack.agents[h].uuid for h in ("h0", "h1"))
    ar_shared = {"allocations": {u0: {"resources": {"VCPU": 1}},
                                 "sharing": {"resources": {"DISK_GB": 1}}}}
    ar1 = {"allocations": {u1: {"resources": {"VCPU": 1}}}}
    answer = CandidatesAnswer([ar_shared, ar1], {u0: {}, "sharing": {}, "stranger": {}})
    cands = candidate_set(snapshot, answer)
    assert cands.by_row == {snapshot.row_of("h0"): [ar_shared]}  # h1 not in summaries


def test_an_unsupported_group_policy_is_refused_before_placement_is_asked(stack: Stack) -> None:
    # TEST_CONFIG enables only ComputeFilter, so anti-affinity is unsupported; the flavor
    # fits nowhere, which must not turn the refusal into a NoValidHost.
    from berth.errors import UnsupportedPolicy
    from berth.model.request import InstanceGroup

    stack.register_hosts(_hosts(1))
    service = stack.scheduler(seed=1)
    huge = Flavor(name="huge", vcpus=64, memory_mb=2048, root_gb=1, id=2)
    with pytest.raises(UnsupportedPolicy):
        service.select_destinations(_spec(huge, instance_group=InstanceGroup(policy="anti-affinity")))
    assert service.stats.candidate_queries == 0


def test_an_answer_is_empty_only_without_allocation_requests() -> None:
    from builders import cloud, host

    snapshot = cloud(host("a", uuid="u-a"))
    stranger = CandidatesAnswer([{"allocations": {"u-zzz": {"resources": {"VCPU": 1}}}}],
                                {"u-zzz": {}})
    unmapped = candidate_set(snapshot, stranger)
    assert dict(unmapped.by_row) == {} and unmapped.no_allocation_requests is False
    assert candidate_set(snapshot, CandidatesAnswer()).no_allocation_requests is True


# ----------------------------------------------------------------- conductor
def test_the_conductor_reschedules_onto_an_alternate_and_moves_the_claim(stack: Stack) -> None:
    stack.register_hosts(_hosts(3))
    service = stack.scheduler(seed=1)
    driver = FakeDriver(agents=stack.agents)
    conductor = stack.conductor(service, driver)
    spec = _spec()
    decision = service.select_destinations(spec)
    selected = decision.selections[0][0].service_host
    driver.fail_hosts = {selected}
    result = conductor.build_one(decision.instance_uuids[0], decision.selections[0], spec)
    assert result.tried[0] == selected and result.host != selected
    usages = _usage(stack)
    assert not usages[selected] and usages[result.host]["VCPU"] == 2
    assert stack.client.get_allocations(result.instance_uuid).allocations == {
        stack.agents[result.host].uuid: {"VCPU": 2, "MEMORY_MB": 2048, "DISK_GB": 10}}
    # The agent reported the build: the next refresh sees the instance on the host.
    snapshot = service.feed.refresh()
    row = snapshot.row_of(result.host)
    assert row is not None and result.instance_uuid in snapshot.obj("instances")[row]
    assert stack.agents[selected].failed_builds == 1


def test_an_alternate_whose_claim_is_refused_is_skipped(stack: Stack) -> None:
    stack.register_hosts(_hosts(3, memory_mb=2048 + 512))
    service = stack.scheduler(seed=1)
    driver = FakeDriver(agents=stack.agents)
    conductor = stack.conductor(service, driver)
    spec = _spec()
    decision = service.select_destinations(spec)
    first, alt1, alt2 = (s.service_host for s in decision.selections[0])
    # Someone else fills the first alternate meanwhile.
    service.select_destinations(_spec(force_hosts=[alt1]))
    driver.fail_hosts = {first}
    result = conductor.build_one(decision.instance_uuids[0], decision.selections[0], spec)
    assert result.host == alt2 and result.tried == [first, alt2]


def test_max_retries_exceeded_after_max_attempts_failed_builds(stack: Stack) -> None:
    stack.register_hosts(_hosts(5))
    service = stack.scheduler(seed=1)
    driver = FakeDriver(fail_hosts={f"h{i}" for i in range(5)}, agents=stack.agents)
    conductor = stack.conductor(service, driver)
    with pytest.raises(MaxRetriesExceeded, match="Exhausted all hosts"):
        conductor.build_instances(_spec())
    assert len(driver.attempts) == TEST_CONFIG.scheduler.max_attempts
    assert all(not u for u in _usage(stack).values())


def test_a_host_that_fails_once_then_succeeds_with_fail_first(stack: Stack) -> None:
    stack.register_hosts(_hosts(1))
    service = stack.scheduler(seed=1)
    driver = FakeDriver(fail_first={"h0": 1}, agents=stack.agents)
    conductor = stack.conductor(service, driver)
    with pytest.raises(MaxRetriesExceeded):
        conductor.build_instances(_spec())  # only one host, no alternate
    (result,) = conductor.build_instances(_spec())
    assert result.host == "h0"


def test_stacks_on_separate_databases_do_not_share_state(template_db: Path, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a, b = fresh_stack(template_db, tmp_path / "a"), fresh_stack(template_db, tmp_path / "b")
    try:
        a.register_hosts(_hosts(1))
        with pytest.raises(NoValidHost):
            b.scheduler().select_destinations(_spec())
    finally:
        a.close()
        b.close()


def test_every_query_feature_is_accepted_by_the_store(stack: Stack) -> None:
    from berth.model.aggregate import Aggregate
    from berth.resource_request import RequestGroup, RequestLevelParams

    agg = Aggregate(1, "a", uuid="11111111-2222-3333-4444-555555555555", hosts=("h0", "h1"))
    stack.register_hosts(
        [ComputeNodeSpec(host=f"h{i}", vcpus=8, memory_mb=8704, local_gb=100,
                         traits=["HW_CPU_X86_AVX2", "CUSTOM_GOLD"]) for i in range(3)], [agg])
    service = stack.scheduler(seed=1)
    flavor = Flavor(name="rich", vcpus=2, memory_mb=1024, root_gb=5, swap=1500, extra_specs={
        "trait:HW_CPU_X86_AVX2": "required", "trait:HW_GPU_API_VULKAN": "forbidden",
        "resources_extra:MEMORY_MB": "256", "trait_extra:CUSTOM_GOLD": "required",
        "group_policy": "none"})
    spec = _spec(flavor, requested_destination=Destination(
        aggregates=[agg.uuid], forbidden_aggregates={"99999999-2222-3333-4444-555555555555"}),
        request_level_params=RequestLevelParams(root_required={"CUSTOM_GOLD"}),
        requested_resources=[RequestGroup(requester_id="port1", resources={"VCPU": 1})],
        scheduler_hints={"different_host": "x"})
    decision = service.select_destinations(spec)
    assert not service.stats.candidate_errors
    assert {s.service_host for s in decision.selections[0]} == {"h0", "h1"}
    alloc = decision.selections[0][0].allocation_request_dict
    assert alloc is not None and set(alloc["mappings"]) == {"", "_extra", "port1"}
