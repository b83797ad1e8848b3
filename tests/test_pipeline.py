"""The pipeline's semantics (reference §8, §10.4), with small test filters and weighers."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from berth.claims import CandidateSet, InMemoryPlacement
from berth.errors import NoValidHost, UnsupportedPolicy
from berth.explain import diagnosis_lines
from berth.filters.base import BaseHostFilter, Reject
from berth.host_state import HostState
from berth.model import InstanceGroup, RequestSpec
from berth.model.request import new_instance_uuids
from berth.pipeline import Scheduler, tie_keys
from berth.weighers.base import BaseHostWeigher
from builders import NOW, cloud, host, spec


class RamLeft(BaseHostFilter):
    """Passes hosts with at least the flavor's RAM free (a test stand-in for RamFilter)."""

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        if host_state.free_ram_mb < spec_obj.memory_mb:
            return Reject.of("insufficient RAM", requested_mb=spec_obj.memory_mb,
                             free_mb=host_state.free_ram_mb)
        return None


class Counting(BaseHostFilter):
    """Records how often it is asked about each host."""

    run_filter_once_per_request = True

    def __init__(self, config=None):
        super().__init__(config)
        self.calls: list[int] = []

    def filter_all_hosts(self, hosts, spec_obj):
        self.calls.append(len(hosts))
        return np.ones(len(hosts), dtype=bool)

    def host_passes(self, host_state, spec_obj):
        return True


class NotInAz(BaseHostFilter):
    """Rejects hosts whose name starts with 'b' (a stand-in for an AZ filter)."""

    def check(self, host_state, spec_obj):
        if host_state.host.startswith("b"):
            return Reject.of("not in availability zone", requested="az1")
        return None


class FreeRam(BaseHostWeigher):
    """More free RAM wins."""

    minval = 0

    def _weigh_object(self, host_state, weight_properties):
        return host_state.free_ram_mb


def run(scheduler, snap, req, seed=0, placement=True, explain=False, **kw):
    """Schedule as ``berth schedule`` does: with placement, the instances are named
    first (from the same seeded generator), so the request claims."""
    p = InMemoryPlacement(snap)
    rng = random.Random(seed)
    if placement:
        kw.setdefault("instance_uuids", new_instance_uuids(rng, req.num_instances))
    return scheduler.select_destinations(
        req, snap, now=NOW, rng=rng,
        candidates=p.candidates(req) if placement else None,
        claimer=p if placement else None, explain=explain, **kw,
    ), p


def test_the_host_list_shrinks_across_the_instances_of_one_request():
    # a has room for one 3 GiB instance, b and c for two each: after two instances the
    # filter must see the consumption of the first ones.
    snap = cloud(host("a", free_ram_mb=3072, total_usable_ram_mb=3072),
                 host("b", free_ram_mb=6144, total_usable_ram_mb=6144),
                 host("c", free_ram_mb=8192, total_usable_ram_mb=8192))
    s = Scheduler(filters=[RamLeft()], weighers=[FreeRam()])
    decision, _ = run(s, snap, spec(memory_mb=3072, num_instances=4), explain=True)
    # c (8192) then b (6144) then c again (5120 left): each choice sees the previous ones.
    assert [h for h, _ in decision.hosts][:3] == ["c", "b", "c"]
    steps = decision.diagnosis.instances
    # c has 2048 left for the fourth instance and drops out ...
    assert steps[3].hosts_available == 2
    # ... and instance k only ever sees the hosts that passed for instance k-1.
    for before, after in zip(steps, steps[1:]):
        assert after.hosts_considered == before.hosts_available


def test_once_per_request_filters_run_only_for_the_first_instance():
    counting = Counting()
    snap = cloud(host("a"), host("b"), host("c"))
    s = Scheduler(filters=[counting], weighers=[])
    run(s, snap, spec(num_instances=3))
    assert counting.calls == [3]


def test_alternates_come_from_the_chosen_hosts_cell_and_never_repeat_a_chosen_host():
    snap = cloud(*(host(f"a{i}", cell_uuid="cell-a") for i in range(4)),
                 *(host(f"b{i}", cell_uuid="cell-b") for i in range(4)))
    s = Scheduler(filters=[], weighers=[FreeRam()])
    decision, _ = run(s, snap, spec(num_instances=2))
    chosen = {sel[0].service_host for sel in decision.selections}
    for sels in decision.selections:
        assert len(sels) == 3  # max_attempts 3 -> 2 alternates
        assert {x.cell_uuid for x in sels} == {sels[0].cell_uuid}
        assert not {x.service_host for x in sels[1:]} & chosen


def test_alternates_carry_an_unclaimed_allocation_request():
    snap = cloud(host("a"), host("b"))
    s = Scheduler(filters=[], weighers=[])
    decision, placement = run(s, snap, spec())
    main, alt = decision.selections[0]
    assert main.allocation_request_dict is not None and alt.allocation_request_dict is not None
    assert list(placement.allocations) == decision.instance_uuids  # only the main host is claimed
    assert alt.allocation_request_version == "1.36"


def test_forced_hosts_bypass_every_filter_and_match_case_insensitively():
    snap = cloud(host("bravo"), host("alpha"))
    s = Scheduler(filters=[NotInAz()], weighers=[])
    decision, _ = run(s, snap, spec(force_hosts=["BRAVO"]))
    assert decision.hosts == [("bravo", "bravo")]


def test_forced_hosts_run_the_filters_when_the_request_is_a_check_type():
    snap = cloud(host("bravo"), host("alpha"))
    s = Scheduler(filters=[NotInAz()], weighers=[])
    with pytest.raises(NoValidHost):
        run(s, snap, spec(force_hosts=["bravo"], hints={"_nova_check_type": "resize"}))


def test_an_empty_check_type_hint_still_lets_forced_hosts_skip_the_filters():
    # Nova tests the hint's value, not its presence (host_manager.get_filtered_hosts).
    snap = cloud(host("bravo"), host("alpha"))
    s = Scheduler(filters=[NotInAz()], weighers=[])
    decision, _ = run(s, snap, spec(force_hosts=["bravo"], hints={"_nova_check_type": []}))
    assert decision.hosts == [("bravo", "bravo")]


def test_ignored_hosts_are_removed_case_insensitively_and_force_nodes_is_case_sensitive():
    snap = cloud(host("alpha", node="n1"), host("alpha", node="N2"), host("charlie"))
    s = Scheduler(filters=[], weighers=[])
    decision, _ = run(s, snap, spec(ignore_hosts=["ALPHA"]))
    assert decision.hosts == [("charlie", "charlie")]
    decision, _ = run(s, snap, spec(force_nodes=["N2"]))
    assert decision.hosts == [("alpha", "N2")]
    with pytest.raises(NoValidHost):
        run(s, snap, spec(force_nodes=["n2"]))


def test_the_same_seed_gives_the_same_subset_choice_and_different_seeds_spread():
    from berth.config import SchedulerConfig

    config = SchedulerConfig.from_dict({"filter_scheduler": {"host_subset_size": 4}})
    snap = cloud(*(host(f"h{i}") for i in range(8)))
    s = Scheduler(config, filters=[], weighers=[])
    first = [run(s, snap, spec(), seed=42)[0].hosts for _ in range(3)]
    assert first[0] == first[1] == first[2]
    spread = {run(s, snap, spec(), seed=seed)[0].hosts[0] for seed in range(40)}
    assert len(spread) == 4  # only the best four hosts (all tie, input order) are eligible


def test_equal_hosts_are_walked_in_the_schedulers_own_tie_order():
    # Nova walks equally weighed hosts in the arbitrary order of a set, different in each
    # scheduler process: schedulers with their own salt start on different hosts, each
    # the same every time; without a salt, ties go by row.
    snap = cloud(*(host(f"h{i:02d}") for i in range(32)))
    firsts = {}
    for salt in (None, 1, 2, 3, 2**63 + 5):
        s = Scheduler(filters=[], weighers=[FreeRam()], tie_salt=salt)
        hosts = [run(s, snap, spec(), seed=seed)[0].hosts[0] for seed in range(3)]
        assert len(set(hosts)) == 1
        firsts[salt] = hosts[0]
    assert firsts[None] == ("h00", "h00")
    assert len({firsts[salt] for salt in (1, 2, 3, 2**63 + 5)}) > 1
    # The alternates follow the same order: the tied hosts by ascending tie key.
    order = [s for s in run(Scheduler(filters=[], weighers=[FreeRam()], tie_salt=7), snap,
                            spec())[0].selections[0]]
    keys = tie_keys(7, np.array([int(sel.service_host[1:]) for sel in order]))
    assert list(keys) == sorted(keys)


def test_the_tie_order_only_breaks_ties():
    snap = cloud(*(host(f"h{i}", free_ram_mb=1024 * (i + 1)) for i in range(6)))
    for salt in (None, 11, 12):
        s = Scheduler(filters=[], weighers=[FreeRam()], tie_salt=salt)
        assert run(s, snap, spec())[0].hosts == [("h5", "h5")]


class RecordingPlacement(InMemoryPlacement):
    """In-memory placement that remembers which consumers were rolled back."""

    def __init__(self, snapshot):
        super().__init__(snapshot)
        self.rolled_back: list[str] = []

    def rollback(self, consumer_uuids):
        self.rolled_back.extend(consumer_uuids)
        super().rollback(consumer_uuids)


def test_no_valid_host_rolls_back_the_claims_already_made_for_the_request():
    snap = cloud(host("a", free_ram_mb=4096, total_usable_ram_mb=4096),
                 host("b", free_ram_mb=4096, total_usable_ram_mb=4096))
    s = Scheduler(filters=[RamLeft()], weighers=[])
    placement = RecordingPlacement(snap)
    req = spec(memory_mb=4096, num_instances=3)
    rng = random.Random(0)
    with pytest.raises(NoValidHost) as info:
        s.select_destinations(req, snap, now=NOW, rng=rng,
                              candidates=placement.candidates(req), claimer=placement,
                              instance_uuids=new_instance_uuids(rng, 3))
    assert "not enough hosts" in str(info.value)
    assert placement.rolled_back and placement.allocations == {}
    assert placement.used["MEMORY_MB"].tolist() == [0.0, 0.0]


def test_an_unexpected_error_after_a_claim_rolls_the_claims_back():
    snap = cloud(host("a"), host("b"), host("c"))

    class Boom(BaseHostFilter):
        calls = 0

        def filter_all_hosts(self, hosts, spec_obj):
            Boom.calls += 1
            if Boom.calls == 2:
                raise RuntimeError("plugin bug")
            return np.ones(len(hosts), dtype=bool)

    placement = RecordingPlacement(snap)
    req = spec(num_instances=2)
    rng = random.Random(0)
    with pytest.raises(RuntimeError, match="plugin bug"):
        Scheduler(filters=[Boom()], weighers=[]).select_destinations(
            req, snap, now=NOW, rng=rng, candidates=placement.candidates(req),
            claimer=placement, instance_uuids=new_instance_uuids(rng, 2))
    assert len(placement.rolled_back) == 1 and placement.allocations == {}
    assert placement.used["MEMORY_MB"].tolist() == [0.0, 0.0, 0.0]


def test_no_candidates_from_placement_is_no_valid_host_with_an_empty_reason():
    snap = cloud(host("a"))
    s = Scheduler(filters=[], weighers=[])
    with pytest.raises(NoValidHost) as info:
        s.select_destinations(spec(), snap, now=NOW, rng=random.Random(0),
                              candidates=CandidateSet(by_row={}), claimer=InMemoryPlacement(snap))
    assert info.value.reason == ""


def test_candidates_that_map_to_no_known_host_are_not_enough_hosts_not_an_empty_reason():
    # Placement answered (§8.2.7): no host state matches its providers, so no host is in
    # play; the empty reason is only for an answer without allocation requests.
    snap = cloud(host("a"))
    s = Scheduler(filters=[], weighers=[])
    with pytest.raises(NoValidHost) as info:
        s.select_destinations(spec(), snap, now=NOW, rng=random.Random(0), instance_uuids=["i1"],
                              candidates=CandidateSet(by_row={}, no_allocation_requests=False),
                              claimer=InMemoryPlacement(snap))
    assert info.value.reason == "There are not enough hosts available."


def test_a_failed_claim_moves_on_to_the_next_host():
    class Refuses:
        def __init__(self):
            self.tried = []

        def claim(self, consumer, alloc, spec_obj, version):
            rp = next(iter(alloc["allocations"]))
            self.tried.append(rp)
            return len(self.tried) > 1

        def rollback(self, consumers):
            pass

    snap = cloud(host("a", free_ram_mb=8000), host("b", free_ram_mb=4000))
    s = Scheduler(filters=[], weighers=[FreeRam()])
    claimer = Refuses()
    decision = s.select_destinations(spec(), snap, now=NOW, rng=random.Random(0),
                                     candidates=InMemoryPlacement(snap).candidates(spec()),
                                     claimer=claimer, instance_uuids=["i1"])
    assert decision.hosts == [("b", "b")]
    assert len(claimer.tried) == 2


def test_without_instance_uuids_the_legacy_path_claims_nothing_and_selections_carry_no_request():
    # Nova's _legacy_find_hosts (§8.2.5): an old conductor passes no uuids; placement's
    # rows are still the hosts in play, but nothing is claimed.
    snap = cloud(host("a", free_ram_mb=4096), host("b", free_ram_mb=8192), host("c", free_ram_mb=1024))
    s = Scheduler(filters=[RamLeft()], weighers=[FreeRam()])
    decision, placement = run(s, snap, spec(memory_mb=3072, num_instances=2), instance_uuids=None)
    # b (8192) then b again (5120 left beats a's 4096): consumption still applies.
    assert decision.hosts == [("b", "b"), ("b", "b")]
    assert placement.allocations == {}
    assert decision.instance_uuids == []
    for sels in decision.selections:
        assert [(x.allocation_request, x.allocation_request_version) for x in sels] == [
            ("null", None)] * len(sels)


def test_legacy_alternates_do_not_need_allocation_candidates():
    snap = cloud(host("a", free_ram_mb=8192), host("b", free_ram_mb=4096))
    s = Scheduler(filters=[], weighers=[FreeRam()])
    placement = InMemoryPlacement(snap)
    answer = placement.candidates(spec())
    # b is in placement's answer but has no candidate left (as after a NUMA/PCI filter).
    candidates = CandidateSet({0: answer.by_row[0], 1: []}, answer.version)
    legacy = s.select_destinations(spec(), snap, now=NOW, rng=random.Random(0),
                                   candidates=candidates, claimer=placement)
    assert [x.service_host for x in legacy.selections[0]] == ["a", "b"]
    claiming = s.select_destinations(spec(), snap, now=NOW, rng=random.Random(0),
                                     candidates=candidates, claimer=placement,
                                     instance_uuids=["i1"])
    assert [x.service_host for x in claiming.selections[0]] == ["a"]


def test_the_specs_own_instance_uuid_is_kept_when_no_uuids_are_given():
    seen: set[str | None] = set()

    class Spy(BaseHostFilter):
        RUN_ON_REBUILD = True

        def host_passes(self, host_state, spec_obj):
            seen.add(spec_obj.instance_uuid)
            return True

    snap = cloud(host("a"), host("b"))
    req = spec(instance_uuid="11111111-1111-1111-1111-111111111111",
               hints={"_nova_check_type": ["rebuild"]})
    Scheduler(filters=[Spy()], weighers=[], per_host=True).select_destinations(
        req, snap, now=NOW, rng=random.Random(0))
    assert seen == {"11111111-1111-1111-1111-111111111111"}


def test_an_empty_uuid_list_claims_for_no_instance_and_is_not_enough_hosts():
    # Nova counts spec.num_instances when the list is empty, then walks the empty list.
    snap = cloud(host("a"))
    s = Scheduler(filters=[], weighers=[])
    with pytest.raises(NoValidHost, match="not enough hosts"):
        run(s, snap, spec(), instance_uuids=[])


def test_a_rebuild_skips_filters_that_do_not_run_on_rebuild_and_claims_nothing():
    snap = cloud(host("bravo"))
    s = Scheduler(filters=[NotInAz()], weighers=[])
    req = spec(hints={"_nova_check_type": ["rebuild"]})
    decision, placement = run(s, snap, req)
    assert decision.hosts == [("bravo", "bravo")]
    assert placement.allocations == {}
    assert decision.selections[0][0].allocation_request == "null"


def test_the_callers_snapshot_and_spec_are_left_untouched():
    snap = cloud(host("a", free_ram_mb=4096))
    req = spec(memory_mb=1024, group=InstanceGroup(policy="soft-affinity"))
    s = Scheduler(filters=[], weighers=[])
    s.select_destinations(req, snap, now=NOW, rng=random.Random(0))
    assert snap.num("free_ram_mb").tolist() == [4096.0]
    assert req.instance_group.hosts == [] and req.instance_uuid is None


def test_a_claiming_multi_create_leaves_every_part_of_the_callers_spec_as_it_was():
    # The request works on a private copy (new top level, its own copies of what it
    # writes into): group members and hosts, NUMA topology, PCI requests, instance uuid.
    snap = cloud(*(host(f"h{i}", free_ram_mb=8192) for i in range(4)))
    req = spec(memory_mb=1024, num_instances=3, hints={"same_host": []},
               extra_specs={"hw:cpu_policy": "shared"},
               group=InstanceGroup(policy="soft-affinity", uuid="g", members=["old"]))
    before = copy.deepcopy(req)
    s = Scheduler(filters=[], weighers=[])
    rng = random.Random(0)
    s.select_destinations(req, snap, now=NOW, rng=rng,
                          candidates=InMemoryPlacement(snap).candidates(req),
                          instance_uuids=new_instance_uuids(rng, 3))
    assert req == before


def test_virtual_consumption_and_the_server_group_are_visible_to_the_next_instance():
    seen: list[tuple[int, list[str]]] = []

    class Spy(BaseHostFilter):
        def host_passes(self, host_state, spec_obj):
            seen.append((host_state.free_ram_mb, list(spec_obj.instance_group.hosts)))
            return True

    snap = cloud(host("a", free_ram_mb=4096))
    s = Scheduler(filters=[Spy()], weighers=[])
    group = InstanceGroup(policy="soft-affinity")
    s.select_destinations(spec(memory_mb=1024, num_instances=2, group=group), snap, now=NOW,
                           rng=random.Random(0), return_alternates=False)
    assert seen == [(4096, []), (3072, ["a"])]


def test_explanations_count_rejections_by_reason_with_the_request_numbers():
    hosts = [host(f"a{i}", free_ram_mb=1024 + 100 * i) for i in range(7)]
    hosts += [host(f"b{i}", free_ram_mb=8192) for i in range(5)]
    snap = cloud(*hosts)
    s = Scheduler(filters=[NotInAz(), RamLeft()], weighers=[])
    with pytest.raises(NoValidHost) as info:
        run(s, snap, spec(memory_mb=4096), placement=False, explain=True)
    summary = info.value.diagnosis.summary()
    assert summary == ("0/12 hosts available: 7 insufficient RAM (requested 4096 MB), "
                       "5 not in availability zone (requested az1)")
    assert str(info.value) == "No valid host was found. There are not enough hosts available."


def test_explanations_break_down_each_top_hosts_weight_by_weigher():
    snap = cloud(host("a", free_ram_mb=1000), host("b", free_ram_mb=3000))
    s = Scheduler(filters=[], weighers=[FreeRam()])
    decision, _ = run(s, snap, spec(memory_mb=1), explain=True)
    top = decision.diagnosis.instances[0].weighing
    assert [w.host for w in top] == ["b", "a"]
    for w in top:
        assert w.weight == pytest.approx(sum(t.contribution for t in w.terms))


def test_a_hard_group_policy_without_its_filter_is_unsupported():
    snap = cloud(host("a"))
    s = Scheduler(filters=[], weighers=[])
    with pytest.raises(UnsupportedPolicy, match="ServerGroupAntiAffinityFilter"):
        run(s, snap, spec(group=InstanceGroup(policy="anti-affinity")))


def test_a_multi_create_in_an_anti_affinity_group_lands_on_distinct_hosts():
    from berth.filters.server_group import ServerGroupAntiAffinityFilter

    snap = cloud(host("a"), host("b"), host("c"))
    group = InstanceGroup(policy="anti-affinity")
    s = Scheduler(filters=[ServerGroupAntiAffinityFilter()], weighers=[FreeRam()])
    decision, _ = run(s, snap, spec(num_instances=3, group=group))
    assert sorted(h for h, _ in decision.hosts) == ["a", "b", "c"]
    with pytest.raises(NoValidHost):
        run(s, snap, spec(num_instances=4, group=InstanceGroup(policy="anti-affinity")))


def test_soft_anti_affinity_spreads_a_multi_create_when_it_is_the_only_preference():
    from berth.weighers.affinity import ServerGroupSoftAntiAffinityWeigher

    snap = cloud(host("a"), host("b"))
    group = InstanceGroup(policy="soft-anti-affinity")
    s = Scheduler(filters=[], weighers=[ServerGroupSoftAntiAffinityWeigher()])
    decision, _ = run(s, snap, spec(num_instances=2, group=group))
    assert sorted(h for h, _ in decision.hosts) == ["a", "b"]


def test_a_requested_cell_is_the_only_cell_queried_even_when_it_is_disabled():
    # Nova (§10.2.1) asks only the requested cell when the request may not cross cells,
    # without looking at whether that cell is disabled.
    from berth.model import CellMapping, Destination

    snap = cloud(host("a", cell_uuid="c1"), host("b", cell_uuid="c2"))
    snap.disabled_cells = frozenset({"c1"})
    s = Scheduler(filters=[], weighers=[])
    req = spec(requested_destination=Destination(cell=CellMapping(uuid="c1", disabled=True)))
    decision, _ = run(s, snap, req)
    assert decision.hosts == [("a", "a")]


def test_a_compute_node_without_a_service_record_is_never_scheduled_to():
    # Nova's host manager skips such a node (§10.2.3), even when placement offers it.
    serviceless = host("a", free_ram_mb=8192)
    serviceless.record.service = None
    snap = cloud(serviceless, host("b", free_ram_mb=1024))
    s = Scheduler(filters=[], weighers=[FreeRam()])
    assert run(s, snap, spec())[0].hosts == [("b", "b")]
    assert run(s, snap, spec(), placement=False)[0].hosts == [("b", "b")]
    with pytest.raises(NoValidHost):
        run(s, snap, spec(force_hosts=["a"]))


def test_without_a_requested_cell_only_enabled_cells_are_queried():
    from berth.model import CellMapping, Destination

    snap = cloud(host("a", cell_uuid="c1"), host("b", cell_uuid="c2"))
    snap.disabled_cells = frozenset({"c1"})
    s = Scheduler(filters=[], weighers=[])
    assert run(s, snap, spec())[0].hosts == [("b", "b")]
    # A cross-cell move may go to any enabled cell, the requested one included or not.
    cross = Destination(cell=CellMapping(uuid="c1"), allow_cross_cell_move=True)
    assert run(s, snap, spec(requested_destination=cross))[0].hosts == [("b", "b")]


def test_pci_devices_are_taken_from_the_pool_of_the_provider_the_claim_used():
    # One NIC on each of two providers of h1. Both instances' best candidate names rp1:
    # the first claim takes rp1's device, so consumption must empty rp1's pool (not the
    # first matching pool, rp0) and the second instance gets the rp0 candidate (§2.3).
    from berth.config import SchedulerConfig
    from berth.filters.pci_passthrough import PciPassthroughFilter
    from berth.hardware.numa import prepare_request
    from berth.hardware.pci import PciDeviceStats
    from berth.resource_request import RequestGroup

    config = SchedulerConfig.from_dict(
        {"pci": {"alias": ['{"name": "nic", "vendor_id": "8086", "product_id": "1520"}']}})
    pools = PciDeviceStats.from_pools([
        {"vendor_id": "8086", "product_id": "1520", "numa_node": None, "count": 1, "rp_uuid": rp}
        for rp in ("rp0", "rp1")])
    snap = cloud(host("h1", uuid="u1", pci_stats=pools))
    req = spec(extra_specs={"pci_passthrough:alias": "nic:1"}, num_instances=2)
    prepare_request(req, config)
    group = f"{req.pci_requests.requests[0].request_id}-0"
    req.requested_resources = [RequestGroup(requester_id=group,
                                            resources={"CUSTOM_PCI_8086_1520": 1})]

    def candidate(rp):
        return {"allocations": {"u1": {"resources": {"VCPU": 1}}}, "mappings": {"": ["u1"], group: [rp]}}

    claimed = []

    class Accepts:
        def claim(self, consumer, alloc, spec_obj, version):
            claimed.append(alloc["mappings"][group])
            return True

        def rollback(self, consumers):
            pass

    s = Scheduler(config, filters=[PciPassthroughFilter(config)], weighers=[])
    decision = s.select_destinations(
        req, snap, now=NOW, rng=random.Random(0), instance_uuids=["i1", "i2"],
        candidates=CandidateSet(by_row={0: [candidate("rp1"), candidate("rp0")]}),
        claimer=Accepts(), return_alternates=False)
    assert decision.hosts == [("h1", "h1"), ("h1", "h1")]
    assert claimed == [["rp1"], ["rp0"]]


class _Recording(Scheduler):
    """Remembers the last host order (the one alternates are taken from)."""

    def _sorted_hosts(self, req, rows, index):
        self.last_order = super()._sorted_hosts(req, rows, index)
        return self.last_order


@settings(max_examples=60, deadline=None)
@given(
    cells=st.lists(st.sampled_from(["c1", "c2", "c3"]), min_size=2, max_size=14),
    rams=st.lists(st.sampled_from([2048, 4096, 8192, 16384]), min_size=14, max_size=14),
    without_candidates=st.sets(st.integers(0, 13), max_size=4),
    num=st.integers(1, 6),
    attempts=st.integers(1, 5),
    seed=st.integers(0, 1000),
)
def test_alternates_are_the_first_same_cell_hosts_of_the_final_order_per_instance(
    cells, rams, without_candidates, num, attempts, seed,
):
    from berth.config import SchedulerConfig

    snap = cloud(*(host(f"h{i:02d}", cell_uuid=c, free_ram_mb=rams[i]) for i, c in enumerate(cells)))
    config = SchedulerConfig.default().replace("scheduler", max_attempts=attempts)
    s = _Recording(config, filters=[RamLeft()], weighers=[FreeRam()])
    req = spec(memory_mb=1024, num_instances=num)
    placement = InMemoryPlacement(snap)
    found = placement.candidates(req)
    by_row = {r: c for r, c in found.by_row.items() if r not in without_candidates}
    if not by_row:
        return
    try:
        decision = s.select_destinations(req, snap, now=NOW, rng=random.Random(seed),
                                         candidates=CandidateSet(by_row, found.version),
                                         instance_uuids=[f"i{k}" for k in range(num)])
    except NoValidHost:
        return
    order = s.last_order.to_array().tolist()
    names = snap.obj("host")
    chosen = {snap.row_of(sels[0].service_host) for sels in decision.selections}
    for sels in decision.selections:
        row = snap.row_of(sels[0].service_host)
        # The walk of the reference: every host in order, same cell, not chosen, with
        # candidates, up to max_attempts - 1 of them.
        expected = [names[a] for a in order
                    if cells[a] == cells[row] and a not in chosen and by_row.get(a)][:attempts - 1]
        assert [x.service_host for x in sels[1:]] == expected
        assert all(x.allocation_request_dict == by_row[snap.row_of(x.service_host)][0]
                   for x in sels[1:])
    # Each Selection has its own limits dict.
    every = [x for sels in decision.selections for x in sels]
    assert len({id(x.limits) for x in every}) == len(every)


# ---------------------------------------- validation of only the filters that run (issue 17)
def _validating_scheduler():
    from berth.filters.compute_capabilities import ComputeCapabilitiesFilter
    from berth.filters.json_filter import JsonFilter

    return Scheduler(None, filters=[RamLeft(), ComputeCapabilitiesFilter(), JsonFilter()],
                     weighers=[])


BAD_QUERY = {"query": "[\"=\", \"$free_ram_mb\""}  # malformed JSON
BAD_SPEC = {"free_ram_mb": ">= lots"}  # a numeric operator with a word


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"hints": BAD_QUERY}, "query"),
        ({"extra_specs": BAD_SPEC}, "free_ram_mb"),
    ],
    ids=["a malformed JSON query hint", "a malformed capabilities extra spec"],
)
def test_a_malformed_spec_of_a_filter_that_runs_is_an_error_naming_it(fields, error):
    from berth.errors import InputError

    with pytest.raises(InputError, match=error):
        _validating_scheduler().select_destinations(
            spec(**fields), cloud(host("a"), host("b")), now=NOW, rng=random.Random(0))


def test_a_forced_host_boot_is_not_refused_for_filters_that_do_not_run():
    # Nova places a forced host without running the filters: the bad hint never matters.
    decision = _validating_scheduler().select_destinations(
        spec(hints=BAD_QUERY, extra_specs=BAD_SPEC, force_hosts=["b"]),
        cloud(host("a"), host("b")), now=NOW, rng=random.Random(0), explain=True)
    assert decision.hosts == [("b", "b")]
    skipped = {s.name: s.skipped for s in decision.diagnosis.instances[0].steps}
    assert skipped["JsonFilter"] == skipped["ComputeCapabilitiesFilter"] == "hosts are forced"


def test_a_rebuild_is_not_refused_for_filters_that_do_not_run_on_rebuild():
    hints = {**BAD_QUERY, "_nova_check_type": ["rebuild"]}
    decision = _validating_scheduler().select_destinations(
        spec(hints=hints, extra_specs=BAD_SPEC), cloud(host("a")), now=NOW,
        rng=random.Random(0), explain=True)
    assert decision.hosts == [("a", "a")]
    steps = decision.diagnosis.instances[0].steps
    assert {s.name: s.skipped for s in steps}["JsonFilter"] == "does not run on rebuild"


def test_a_filter_after_the_first_empty_result_is_never_reached_so_never_validated():
    # RamLeft leaves no host: Nova stops there, NoValidHost, the bad specs unread.
    with pytest.raises(NoValidHost) as caught:
        _validating_scheduler().select_destinations(
            spec(memory_mb=10**6, hints=BAD_QUERY, extra_specs=BAD_SPEC),
            cloud(host("a"), host("b")), now=NOW, rng=random.Random(0), explain=True)
    assert "insufficient RAM" in caught.value.diagnosis.summary()


def test_a_refused_claim_is_explained_with_the_resource_and_the_amounts():
    # Placement's answer still lists "big", but another request took most of its memory
    # before this one claimed: the claim is refused there and the next host is used.
    snap = cloud(host("big", free_ram_mb=8192, total_usable_ram_mb=8192),
                 host("small", free_ram_mb=4096, total_usable_ram_mb=4096))
    req = spec(memory_mb=2048)
    p = InMemoryPlacement(snap)
    candidates = p.candidates(req)
    rp = next(iter(candidates.by_row[0][0]["allocations"]))
    assert p.claim("someone-else", {"allocations": {rp: {"resources": {"MEMORY_MB": 7168}}}},
                   req, None)
    rng = random.Random(0)
    s = Scheduler(filters=[], weighers=[FreeRam()])
    decision = s.select_destinations(req, snap, now=NOW, rng=rng, candidates=candidates,
                                     claimer=p, explain=True,
                                     instance_uuids=new_instance_uuids(rng, 1))
    assert decision.hosts == [("small", "small")]
    inst = decision.diagnosis.instances[0]
    assert inst.claim_failures == [("big", "big", "insufficient MEMORY_MB (requested 2048, free 1024)")]
    assert "  claims refused on: big (insufficient MEMORY_MB (requested 2048, free 1024))" in \
        diagnosis_lines(decision.diagnosis)
    assert decision.diagnosis.to_dict()["instances"][0]["claim_failures"] == [
        ["big", "big", "insufficient MEMORY_MB (requested 2048, free 1024)"]]


class PrefersA(BaseHostWeigher):
    """Host "a" first, whatever its usage (as a weigher blind to what ran out would)."""

    def _weigh_object(self, host_state, weight_properties):
        return 1.0 if host_state.host == "a" else 0.0


def test_a_host_placement_refused_for_capacity_is_not_asked_again_in_the_request():
    # "a" holds two instances, then placement refuses it; the weigher keeps putting it
    # first. Nova would ask placement again for every later instance (and be refused
    # again); Berth remembers the refusal for the rest of the request.
    snap = cloud(host("a", free_ram_mb=4096, total_usable_ram_mb=4096),
                 host("b", free_ram_mb=65536, total_usable_ram_mb=65536))
    req = spec(memory_mb=2048, num_instances=6)
    p = InMemoryPlacement(snap)
    asked: list[str] = []
    real_claim = p.claim

    def claim(consumer, alloc, spec_obj, version):
        asked.append(next(iter(alloc["allocations"])))
        return real_claim(consumer, alloc, spec_obj, version)

    p.claim = claim  # type: ignore[method-assign]
    rng = random.Random(0)
    decision = Scheduler(filters=[], weighers=[PrefersA()]).select_destinations(
        req, snap, now=NOW, rng=rng, candidates=p.candidates(req), claimer=p,
        instance_uuids=new_instance_uuids(rng, 6))
    assert [h for h, _ in decision.hosts] == ["a", "a", "b", "b", "b", "b"]
    assert asked.count("a/a") == 3  # two claims, one refusal


def _run_out(subset: int) -> NoValidHost:
    """Five 2 GiB instances on "a" (4 GiB, ranked first) and "b" (2 GiB): three fit."""
    from berth.config import SchedulerConfig

    snap = cloud(host("a", free_ram_mb=4096, total_usable_ram_mb=4096),
                 host("b", free_ram_mb=2048, total_usable_ram_mb=2048))
    req = spec(memory_mb=2048, num_instances=5)
    p = InMemoryPlacement(snap)
    rng = random.Random(0)
    config = SchedulerConfig.default().replace("filter_scheduler", host_subset_size=subset)
    with pytest.raises(NoValidHost) as caught:
        Scheduler(config, filters=[], weighers=[PrefersA()]).select_destinations(
            req, snap, now=NOW, rng=rng, candidates=p.candidates(req), claimer=p,
            instance_uuids=new_instance_uuids(rng, 5), explain=True)
    assert caught.value.fitted == 3
    return caught.value


def test_a_multi_create_that_runs_out_explains_every_host_it_could_not_claim():
    """The instance that found no host: hosts were left by the filters, and its
    explanation says why none was claimed: the hosts refused now, and those full from
    earlier instances of the request (not asked again)."""
    refused = _run_out(1)
    last = refused.diagnosis.instances[-1]
    full = "insufficient MEMORY_MB (requested 2048, free 0)"
    # "a" took two, was refused for the third (which went to "b"): not asked again.
    assert last.chosen is None
    assert last.full_hosts == [("a", "a", full)]
    assert last.claim_failures == [("b", "b", full)]
    assert refused.diagnosis.summary() == (
        "2/2 hosts available, none claimable (1 refused the claim, 1 full from earlier "
        "instances of this request)")
    lines = diagnosis_lines(refused.diagnosis)
    tail = lines[lines.index("instance 4 -> no host: " + refused.diagnosis.summary()):]
    at = tail.index(f"  claims refused on: b ({full})")
    assert tail[at + 1] == ("  not asked again (their claims were refused for earlier "
                            f"instances of this request): a ({full})")
    assert refused.diagnosis.to_dict()["instances"][-1]["full_hosts"] == [["a", "a", full]]
    # Earlier instances that found a host do not list the hosts they skipped.
    assert not any("not asked again" in line for line in lines[:lines.index(
        "instance 4 -> no host: " + refused.diagnosis.summary())])


def test_no_random_pick_is_told_for_an_instance_that_found_no_host():
    refused = _run_out(2)
    assert [d.random_pick is not None for d in refused.diagnosis.instances] == [
        True, True, True, False]
    lines = diagnosis_lines(refused.diagnosis)
    failed_at = next(i for i, line in enumerate(lines) if line.startswith("instance 4 "))
    assert not any("random pick" in line for line in lines[failed_at:])
    assert "random_pick" not in refused.diagnosis.to_dict()["instances"][-1]


def test_no_valid_host_names_the_step_that_left_no_host():
    """The filter that removed the last hosts, for metrics and replays (``emptied_by``)."""
    from berth.config import SchedulerConfig
    from berth.errors import NoValidHost
    from berth.model import Flavor, RequestSpec, ServiceRecord
    from berth.pipeline import Scheduler
    from berth.snapshot import HostRecord, HostSnapshot

    snap = HostSnapshot.from_records([
        HostRecord("a", total_usable_ram_mb=4096, free_ram_mb=4096, vcpus_total=4,
                   service=ServiceRecord("a", disabled=True, last_seen_up=1.0)),
    ])
    spec = RequestSpec(flavor=Flavor(name="f", vcpus=1, memory_mb=512))
    import random

    with pytest.raises(NoValidHost) as info:
        Scheduler(SchedulerConfig.default()).select_destinations(
            spec, snap, now=2.0, rng=random.Random(1))
    assert info.value.emptied_by == "ComputeFilter"


@pytest.mark.parametrize("per_host", [False, True])
def test_a_member_claimed_on_a_host_that_has_not_reported_it_yet_counts_there(per_host):
    """The shared database says where a group's members are claimed (``member_hosts``):
    a member the host's last report does not list yet (its build just finished) counts
    on that host for the group filters, on both paths."""
    from berth.filters.server_group import ServerGroupAntiAffinityFilter
    from berth.model.compute import Instance

    snap = cloud(host("a", free_ram_mb=8192), host("b", free_ram_mb=8192),
                 host("c", free_ram_mb=8192, instances={"m2": Instance(uuid="m2")}))
    group = InstanceGroup(policy="anti-affinity", uuid="g", members=["m1", "m2"],
                          hosts=["a", "c"], member_hosts={"m1": "a", "m2": "c"})
    # per_host: Nova's shape (host_passes on each host state), else the columnar path.
    s = Scheduler(filters=[ServerGroupAntiAffinityFilter()], weighers=[FreeRam()],
                  per_host=per_host)
    decision, _ = run(s, snap, spec(memory_mb=1024, num_instances=1, group=group))
    assert decision.hosts == [("b", "b")]
    with pytest.raises(NoValidHost):
        run(s, snap, spec(memory_mb=1024, num_instances=2, group=group))
    # Without the claims, host a looked empty and ranked first with host b.
    blind = InstanceGroup(policy="anti-affinity", uuid="g", members=["m1", "m2"])
    assert run(s, snap, spec(memory_mb=1024, num_instances=2, group=blind))[0].hosts == [
        ("a", "a"), ("b", "b")]


def test_a_member_counted_from_its_claim_is_of_its_own_flavor():
    """TypeAffinityFilter sees the member counted from its claim with its flavor id (as
    the host's report will list it): a host holding a member of the request's flavor
    still passes, one holding another flavor's does not."""
    from berth.filters.type_affinity import TypeAffinityFilter

    snap = cloud(host("a", free_ram_mb=8192), host("b", free_ram_mb=8192))
    group = InstanceGroup(policy="soft-affinity", uuid="g", members=["m1", "m2"],
                          hosts=["a", "b"], member_hosts={"m1": "a", "m2": "b"},
                          member_flavors={"m1": 7, "m2": 8})
    s = Scheduler(filters=[TypeAffinityFilter()], weighers=[FreeRam()])
    req = spec(memory_mb=1024, group=group)
    req.flavor.id = 7
    assert run(s, snap, req)[0].hosts == [("a", "a")]
