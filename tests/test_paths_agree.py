"""The columnar engine and the per-host (Nova-shaped) path agree, on random small clouds.

* every built-in filter: ``filter_all_hosts`` passes exactly the hosts ``host_passes`` does;
* every built-in weigher: bulk raw weights and multipliers equal the per-host ones (1e-9),
  and the columnar ranking's weights equal Nova's host-by-host normalization and sum;
* the whole pipeline: ``Scheduler`` and ``Scheduler(per_host=True)`` choose the same hosts
  and alternates for the same seed (so the partial ordering with ``np.partition`` and the
  per-request weigher memo give exactly the full stable sort's answer);
* a snapshot built in bulk equals one built row by row;
* clouds have multi-node service hosts (several nodes under one host name): every node
  sees the instances of its whole service host and the request's stubs on any node of
  it, as Nova's host manager shares them (or only its own stubs, when instance changes
  are not tracked); an anti-affinity multi-create never puts two instances on one
  service host.

Filters and weighers whose module does not exist yet are skipped.
"""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from berth.claims import InMemoryPlacement
from berth.config import SchedulerConfig
from berth.errors import InputError, NoValidHost
from berth.filters.base import BaseHostFilter
from berth.filters.host_affinity import members_per_row
from berth.filters.registry import BUILTIN_FILTERS
from berth.filters.registry import load_builtin as load_filter
from berth.host_state import WorkingSet
from berth.model import Instance, InstanceGroup, MetricItem, RequestSpec, ServiceRecord
from berth.model.request import new_instance_uuids
from berth.pipeline import Scheduler
from berth.snapshot import HostSnapshot
from berth.weighers.base import BaseHostWeigher, WeighedHost
from berth.weighers.handler import PerHostRanker, WeigherRanker
from berth.weighers.registry import BUILTIN_WEIGHERS
from berth.weighers.registry import load_builtin as load_weigher
from builders import NOW, cloud, host, spec

FAST = settings(max_examples=30, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

CPU_INFOS = [
    '{"vendor": "Intel", "features": ["aes", "mmx"], "maxphysaddr": {"bits": 46}}',
    '{"vendor": "AMD", "arch": "x86_64", "features": ["sse"], "maxphysaddr": {"bits": 48}}',
    "{}",
]
SUPPORTED = [[["x86_64", "kvm", "hvm"]], [["x86_64", "qemu", "hvm"]], [["aarch64", "kvm", "hvm"]]]
AGGREGATES: list[tuple[str, dict[str, str]]] = [
    ("az1", {"availability_zone": "az1"}),
    ("az2", {"availability_zone": "az2"}),
    ("ssd", {"ssd": "true", "hw_class": "standard"}),
    ("tenant", {"filter_tenant_id": "p1"}),
    ("dense", {"max_instances_per_host": "3", "max_io_ops_per_host": "2",
               "cpu_allocation_ratio": "2.0", "ram_allocation_ratio": "1.5",
               "disk_allocation_ratio": "2.0"}),
    ("spread", {"ram_weight_multiplier": "2.5", "cpu_weight_multiplier": "-1.0",
                "io_ops_weight_multiplier": "0.5"}),
    ("typed", {"instance_type": "m1.test,m1.big", "os_distro": "linux"}),
    ("isolated", {"hw_vm_mode": "hvm"}),
]
CELLS = ["cell-a", "cell-b"]


def _available(names: dict[str, str], load: Any) -> list[tuple[str, Any]]:
    found = []
    for name in names:
        try:
            found.append((name, load(name)))
        except (ImportError, AttributeError):
            continue
    return found


FILTERS = _available(BUILTIN_FILTERS, load_filter)
WEIGHERS = _available(BUILTIN_WEIGHERS, load_weigher)


@st.composite
def clouds(draw: Any, min_hosts: int = 1, max_hosts: int = 8) -> HostSnapshot:
    """Small clouds with varied sizes, usage, cells, aggregates, services and instances."""
    count = draw(st.integers(min_hosts, max_hosts))
    builders = []
    for i in range(count):
        ram = draw(st.sampled_from([2048, 8192, 16384]))
        disk_gb = draw(st.sampled_from([20, 100]))
        vcpus = draw(st.sampled_from([2, 8]))
        instances = [f"i-{i}-{k}" for k in range(draw(st.integers(0, 2)))]
        b = host(
            f"h{i}" if draw(st.booleans()) or i == 0 else f"h{i - 1}",
            node=f"n{i}",
            cell_uuid=draw(st.sampled_from(CELLS)),
            total_usable_ram_mb=ram,
            free_ram_mb=draw(st.sampled_from([ram, ram, ram // 2, ram // 4, 512, -256])),
            total_usable_disk_gb=disk_gb,
            free_disk_mb=draw(st.sampled_from([disk_gb * 1024, disk_gb * 1024, 5 * 1024, 0])),
            vcpus_total=vcpus,
            vcpus_used=draw(st.integers(0, vcpus)),
            stats={"num_instances": str(draw(st.integers(0, 5))),
                   "io_workload": str(draw(st.integers(0, 4))),
                   "failed_builds": str(draw(st.sampled_from([0, 0, 1, 3])))},
            hypervisor_version=draw(st.sampled_from([None, 6000000, 7000000])),
            cpu_info=draw(st.sampled_from(CPU_INFOS)),
            supported_instances=draw(st.sampled_from(SUPPORTED)),
            cpu_allocation_ratio=draw(st.sampled_from([1.0, 4.0])),
            host_ip=f"10.0.0.{i + 1}",
            service=ServiceRecord(host=f"h{i}", disabled=draw(st.booleans()) and i % 4 == 3,
                                  last_seen_up=NOW - draw(st.sampled_from([1.0, 30.0, 30.0, 900.0]))),
            metrics=[MetricItem("cpu.percent", float(draw(st.integers(0, 100))))],
            instances=instances,
            updated=NOW - 5,
        )
        for index in draw(st.lists(st.integers(0, len(AGGREGATES) - 1), max_size=3,
                                   unique=True)):
            name, md = AGGREGATES[index]
            b.in_aggregate(name, **md)
        builders.append(b)
    names = [b.record.key for b in builders]
    assume(len(set(names)) == len(names))
    return cloud(*builders)


@st.composite
def requests(draw: Any, snap: HostSnapshot) -> RequestSpec:
    """A request drawing on the cloud's instances for hints and server groups."""
    instances = sorted(u for inst in snap.obj("instances") for u in inst)
    hints: dict[str, Any] = {}
    if instances and draw(st.booleans()):
        hints["same_host"] = draw(st.lists(st.sampled_from(instances), min_size=1, max_size=2))
    if instances and draw(st.booleans()):
        hints["different_host"] = draw(st.lists(st.sampled_from(instances), min_size=1,
                                                max_size=2))
    if draw(st.booleans()):
        hints["query"] = json.dumps([">=", "$free_ram_mb", draw(st.sampled_from([0, 1024]))])
    if draw(st.booleans()):
        hints["build_near_host_ip"] = "10.0.0.1"
        hints["cidr"] = "/30"
    group = None
    policy = draw(st.sampled_from([None, "affinity", "anti-affinity", "soft-affinity",
                                   "soft-anti-affinity"]))
    if policy is not None:
        hosts = sorted(set(snap.obj("host").tolist()))
        group = InstanceGroup(policy=policy, uuid="g1",
                              members=draw(st.lists(st.sampled_from(instances), max_size=3))
                              if instances else [],
                              hosts=draw(st.lists(st.sampled_from(hosts), max_size=2)))
    extra = draw(st.sampled_from([
        {}, {"ssd": "true"}, {"aggregate_instance_extra_specs:hw_class": "standard"},
        {"capabilities:cpu_info:vendor": "Intel"}, {"hw:cpu_policy": "shared"},
    ]))
    image = draw(st.sampled_from([
        {}, {"hw_architecture": "x86_64"}, {"img_hv_type": "kvm", "hw_vm_mode": "hvm"},
        {"os_distro": "linux"},
    ]))
    return spec(
        vcpus=draw(st.sampled_from([1, 2, 4])),
        memory_mb=draw(st.sampled_from([256, 1024, 4096])),
        root_gb=draw(st.sampled_from([1, 10])),
        flavor_name=draw(st.sampled_from(["m1.test", "m1.other"])),
        extra_specs=extra, image_props=image, hints=hints or None, group=group,
        project_id=draw(st.sampled_from(["p1", "p2", None])),
        availability_zone=draw(st.sampled_from([None, "az1"])),
        num_instances=draw(st.integers(1, 3)),
    )


@st.composite
def cloud_and_request(draw: Any, min_hosts: int = 1) -> tuple[HostSnapshot, RequestSpec]:
    snap = draw(clouds(min_hosts=min_hosts))
    return snap, draw(requests(snap))


def _outcome(fn: Any) -> Any:
    """The result, or the InputError class a bad host-side value raised."""
    try:
        return fn()
    except InputError as exc:
        return type(exc)


# ---------------------------------------------------------------------- filters
@pytest.mark.parametrize(("name", "cls"), FILTERS, ids=[f"{n} passes the same hosts on both paths"
                                                        for n, _ in FILTERS])
def test_bulk_and_per_host_filter_paths_pass_the_same_hosts(name: str, cls: Any) -> None:
    f: BaseHostFilter = cls(SchedulerConfig.default())

    @FAST
    @given(cloud_and_request())
    def check(case: tuple[HostSnapshot, RequestSpec]) -> None:
        snap, req = case
        try:
            f.validate_request(req)
        except InputError:
            assume(False)
        rows = np.arange(len(snap), dtype=np.int64)
        per_host = _outcome(lambda: [
            f.host_passes(WorkingSet(snap, NOW).host_state(r), req) for r in rows.tolist()])
        bulk = _outcome(lambda: [
            bool(x) for x in f.filter_all_hosts(WorkingSet(snap, NOW).hosts(rows), req)])
        assert bulk == per_host

    check()


# ---------------------------------------------------------------------- weighers
@pytest.mark.parametrize(("name", "cls"), WEIGHERS, ids=[f"{n} weighs the same on both paths"
                                                         for n, _ in WEIGHERS])
def test_bulk_and_per_host_weights_agree(name: str, cls: Any) -> None:
    config = SchedulerConfig.default().replace(
        "filter_scheduler", num_instances_weight_multiplier=-1.0,
        image_props_weight_multiplier=1.0)
    config = config.replace("metrics", weight_setting=["cpu.percent=1.5"])
    w: BaseHostWeigher = cls(config)

    @FAST
    @given(cloud_and_request())
    def check(case: tuple[HostSnapshot, RequestSpec]) -> None:
        snap, req = case
        ws = WorkingSet(snap, NOW)
        hosts = ws.hosts()
        states = list(hosts.states())
        raw_bulk = np.asarray(w.weigh_all_hosts(hosts, req), dtype=float)
        raw_host = np.array(w.weigh_objects([WeighedHost(s) for s in states], req), dtype=float)
        np.testing.assert_allclose(raw_bulk, raw_host, rtol=0, atol=1e-9)
        mult_bulk = np.asarray(w.multipliers_all_hosts(hosts), dtype=float)
        mult_host = np.array([w.weight_multiplier(s) for s in states], dtype=float)
        np.testing.assert_allclose(mult_bulk, mult_host, rtol=0, atol=1e-9)
        columnar = WeigherRanker([w]).rank(hosts, req).weights
        reference = PerHostRanker([w]).rank(WorkingSet(snap, NOW).hosts(), req).weights
        np.testing.assert_allclose(columnar, reference, rtol=0, atol=1e-9)

    check()


def test_all_weighers_together_give_nova_s_weights_on_both_paths() -> None:
    weighers = [cls(SchedulerConfig.default()) for _, cls in WEIGHERS]

    @FAST
    @given(cloud_and_request())
    def check(case: tuple[HostSnapshot, RequestSpec]) -> None:
        snap, req = case
        columnar = WeigherRanker(weighers).rank(WorkingSet(snap, NOW).hosts(), req)
        reference = PerHostRanker(weighers).rank(WorkingSet(snap, NOW).hosts(), req)
        np.testing.assert_allclose(columnar.weights, reference.weights, rtol=0, atol=1e-9)
        assert columnar.order.tolist() == reference.order.tolist()

    check()


# ---------------------------------------------------------------------- pipeline
class FewValues(BaseHostWeigher):
    """A plugin weigher with many exact ties (free RAM in 4 GiB steps), not memoized."""

    def _weigh_object(self, host_state: Any, weight_properties: Any) -> float:
        return float(host_state.free_ram_mb // 4096)


PIPELINE_FILTERS = [name for name, _ in FILTERS if name not in {"RetryFilter"}]


def _decide(scheduler: Scheduler, snap: HostSnapshot, req: RequestSpec, seed: int,
            placement: bool) -> Any:
    p = InMemoryPlacement(snap)
    rng = random.Random(seed)
    # With placement the instances are named first, so the claiming path is compared.
    uuids = new_instance_uuids(rng, req.num_instances) if placement else None
    try:
        decision = scheduler.select_destinations(
            req, snap, now=NOW, rng=rng, instance_uuids=uuids,
            candidates=p.candidates(req) if placement else None)
    except NoValidHost:
        return "NoValidHost"
    except InputError as exc:
        return type(exc)
    return [[(s.service_host, s.nodename) for s in sels] for sels in decision.selections]


@settings(FAST, max_examples=60)
@given(
    case=cloud_and_request(min_hosts=2),
    filter_names=st.lists(st.sampled_from(PIPELINE_FILTERS), max_size=5, unique=True),
    weigher_set=st.sampled_from(["all", "none", "ties"]),
    subset_size=st.integers(1, 4),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**16),
    placement=st.booleans(),
    tie_salt=st.one_of(st.none(), st.integers(0, 2**64 - 1)),
    track=st.booleans(),
)
def test_the_columnar_pipeline_chooses_what_the_per_host_pipeline_chooses(
    case: tuple[HostSnapshot, RequestSpec], filter_names: list[str], weigher_set: str,
    subset_size: int, shuffle: bool, seed: int, placement: bool, tie_salt: int | None,
    track: bool,
) -> None:
    snap, req = case
    if req.instance_group is not None and req.instance_group.policy in {"affinity",
                                                                        "anti-affinity"}:
        wanted = {"affinity": "ServerGroupAffinityFilter",
                  "anti-affinity": "ServerGroupAntiAffinityFilter"}[req.instance_group.policy]
        assume(any(name == wanted for name, _ in FILTERS))
        if wanted not in filter_names:
            filter_names = [*filter_names, wanted]
    config = SchedulerConfig.default().replace(
        "filter_scheduler", host_subset_size=subset_size,
        shuffle_best_same_weighed_hosts=shuffle, track_instance_changes=track)
    filters_by_name = dict(FILTERS)
    weighers: list[BaseHostWeigher] = {
        "all": [cls(config) for _, cls in WEIGHERS],
        "none": [],
        "ties": [FewValues(config)],
    }[weigher_set]

    def build(per_host: bool) -> Scheduler:
        return Scheduler(config, filters=[filters_by_name[n](config) for n in filter_names],
                         weighers=weighers, per_host=per_host, tie_salt=tie_salt)

    columnar = _decide(build(False), snap, req, seed, placement)
    reference = _decide(build(True), snap, req, seed, placement)
    assert columnar == reference


def test_partial_ordering_matches_a_full_stable_sort_over_many_instances_with_ties() -> None:
    # 60 hosts, weights with many exact ties, ten instances: every level of the order
    # breaks its ties by the previous one, which the partial ordering must reproduce.
    snap = cloud(*(host(f"h{i:02d}", free_ram_mb=4096 * (i % 4) + 8192,
                        total_usable_ram_mb=65536) for i in range(60)))
    for subset_size, shuffle in ((1, False), (3, True), (7, False)):
        config = SchedulerConfig.default().replace(
            "filter_scheduler", host_subset_size=subset_size,
            shuffle_best_same_weighed_hosts=shuffle)
        for seed in range(3):
            for salt in (None, seed * 7919 + 1):
                req = spec(memory_mb=4096, num_instances=10)
                got = [_decide(Scheduler(config, filters=[], weighers=[FewValues(config)],
                                         per_host=per_host, tie_salt=salt), snap, req, seed,
                               True)
                       for per_host in (False, True)]
                assert got[0] == got[1]


def test_identical_hosts_tie_on_every_level_and_both_paths_agree() -> None:
    # Every host equal: each instance's ranking ties everywhere but on the hosts taken
    # before, so every level orders its ties by the level below, down to the first.
    snap = cloud(*(host(f"h{i:02d}", total_usable_ram_mb=65536, free_ram_mb=65536)
                   for i in range(24)))
    for subset_size, salt in ((1, None), (2, 7919), (5, None)):
        config = SchedulerConfig.default().replace("filter_scheduler",
                                                   host_subset_size=subset_size)
        weighers = [cls(config) for _, cls in WEIGHERS]
        req = spec(memory_mb=2048, num_instances=40)
        got = [_decide(Scheduler(config, filters=[], weighers=weighers, per_host=per_host,
                                 tie_salt=salt), snap, req, 3, True)
               for per_host in (False, True)]
        assert got[0] == got[1]


def test_a_big_multi_create_on_identical_hosts_spreads_in_row_order() -> None:
    # 1,500 levels of ties (it once recursed once per instance: quadratic, and a
    # RecursionError past ~1,000): the spreading weighers take the hosts in row order.
    snap = cloud(*(host(f"h{i:04d}", total_usable_ram_mb=65536, free_ram_mb=65536)
                   for i in range(2000)))
    config = SchedulerConfig.default()
    req = spec(memory_mb=2048, num_instances=1500)
    chosen = _decide(Scheduler(config, filters=[], weighers=[cls(config) for _, cls in WEIGHERS]),
                     snap, req, 1, True)
    assert [sels[0][0] for sels in chosen] == [f"h{i:04d}" for i in range(1500)]


# ---------------------------------------------------------------------- service hosts
@FAST
@given(clouds(min_hosts=2), st.lists(st.tuples(st.integers(0, 7), st.sampled_from(["s1", "s2"])),
                                     max_size=4), st.booleans())
def test_every_node_sees_its_service_hosts_instances_and_stubs(
    snap: HostSnapshot, stubs: list[tuple[int, str]], shared: bool,
) -> None:
    # Nova's model, from the rows as reported: one instance set per service host name,
    # plus the stubs placed on any node of that host (tracked instance changes: one
    # shared dict) or on that node only (untracked: a copy per node).
    hosts = snap.obj("host")
    expected: dict[str, set[str]] = {}
    for name, instances in zip(hosts, snap.obj("instances")):
        expected.setdefault(name, set()).update(instances)
    seen = [set(expected[hosts[row]]) for row in range(len(snap))]
    ws = WorkingSet(snap, NOW, share_stubs=shared)
    for at, uuid in stubs:
        row = at % len(snap)
        ws.add_instance(row, Instance(uuid=uuid))
        for other in range(len(snap)):
            if other == row or (shared and hosts[other] == hosts[row]):
                seen[other].add(uuid)
    assert [set(ws.host_state(row).instances) for row in range(len(snap))] == seen
    # The bulk count of members agrees with the per-host view on every row.
    for uuids in (["s1"], ["s1", "s2"], sorted({u for i in snap.obj("instances") for u in i})):
        rows = np.arange(len(snap), dtype=np.int64)
        assert members_per_row(ws, uuids, rows).tolist() == [
            len(set(uuids) & seen[row]) for row in range(len(snap))]


@settings(FAST, max_examples=40)
@given(case=cloud_and_request(min_hosts=2), num=st.integers(2, 3), seed=st.integers(0, 999),
       per_host=st.booleans())
def test_an_anti_affinity_multi_create_never_shares_a_service_host(
    case: tuple[HostSnapshot, RequestSpec], num: int, seed: int, per_host: bool,
) -> None:
    # Whatever the nodes of a host, the chosen service hosts are distinct and hold no
    # member already (the stub of each pick is seen by every node of its host).
    snap, req = case
    assume("ServerGroupAntiAffinityFilter" in dict(FILTERS))
    members = list(req.instance_group.members) if req.instance_group else []
    req.instance_group = InstanceGroup(policy="anti-affinity", uuid="g", members=members)
    req.num_instances = num
    config = SchedulerConfig.default()
    scheduler = Scheduler(config, filters=[dict(FILTERS)["ServerGroupAntiAffinityFilter"](config)],
                          weighers=[cls(config) for _, cls in WEIGHERS], per_host=per_host)
    got = _decide(scheduler, snap, req, seed, True)
    assume(got != "NoValidHost")  # too few hosts with room (placement) or without members
    assert isinstance(got, list)
    hosts = [sels[0][0] for sels in got]
    assert len(set(hosts)) == len(hosts)
    index = snap.instance_rows()
    assert not {snap.obj("host")[index[m]] for m in members if m in index} & set(hosts)


# ---------------------------------------------------------------------- snapshot
@FAST
@given(clouds())
def test_a_snapshot_built_in_bulk_equals_one_built_row_by_row(snap: HostSnapshot) -> None:
    records = []
    for row in range(len(snap)):
        ws = WorkingSet(snap, NOW)
        records.append(_record_of(snap, ws, row))
    bulk = HostSnapshot.from_records(records, snap.aggregates)
    one_by_one = HostSnapshot(snap.aggregates)
    for record in records:
        one_by_one.upsert(record)
    assert len(bulk) == len(one_by_one)
    for name in ("free_ram_mb", "num_instances", "num_io_ops", "failed_builds",
                 "hypervisor_version", "updated", "service_disabled", "service_heartbeat"):
        np.testing.assert_array_equal(bulk.num(name), one_by_one.num(name))
    for name in ("cell_uuid", "cpu_info", "stats", "supported_instances", "aggregates"):
        assert [bulk.interned_value(name, r) for r in range(len(bulk))] == [
            one_by_one.interned_value(name, r) for r in range(len(one_by_one))]
        assert bulk.codes(name).tolist() == one_by_one.codes(name).tolist()
    for name in ("host", "nodename", "instances", "metrics", "service"):
        assert bulk.obj(name).tolist() == one_by_one.obj(name).tolist()


def _record_of(snap: HostSnapshot, ws: WorkingSet, row: int) -> Any:
    from berth.snapshot import HostRecord

    hs = ws.host_state(row)
    return HostRecord(
        host=hs.host, nodename=hs.nodename, cell_uuid=hs.cell_uuid,
        total_usable_ram_mb=hs.total_usable_ram_mb, free_ram_mb=hs.free_ram_mb,
        total_usable_disk_gb=hs.total_usable_disk_gb, free_disk_mb=hs.free_disk_mb,
        vcpus_total=hs.vcpus_total, vcpus_used=hs.vcpus_used,
        hypervisor_type=hs.hypervisor_type, hypervisor_version=hs.hypervisor_version,
        cpu_info=hs.cpu_info, supported_instances=hs.supported_instances, stats=hs.stats,
        metrics=hs.metrics, cpu_allocation_ratio=hs.cpu_allocation_ratio,
        service=snap.obj("service")[row], instances=dict(hs.instances), updated=hs.updated,
    )


def test_hosts_consumed_by_earlier_instances_are_weighed_again() -> None:
    # RAM spread: a (10 GiB free) takes the first instance, then has 8 GiB and loses to
    # b (9 GiB); the memoized raw weights must see the consumption.
    names = dict(WEIGHERS)
    if "RAMWeigher" not in names:
        pytest.skip("RAMWeigher is not present")
    snap = cloud(host("a", free_ram_mb=10240, total_usable_ram_mb=16384),
                 host("b", free_ram_mb=9216, total_usable_ram_mb=16384),
                 host("c", free_ram_mb=4096, total_usable_ram_mb=16384))
    config = SchedulerConfig.default()
    req = spec(memory_mb=2048, num_instances=3)
    got = [_decide(Scheduler(config, filters=[], weighers=[names["RAMWeigher"](config)],
                             per_host=per_host), snap, req, 0, True)
           for per_host in (False, True)]
    assert got[0] == got[1]
    # a (10) -> b (9) -> a (8 vs b 7).
    assert [sels[0][0] for sels in got[0]] == ["a", "b", "a"]


@settings(FAST, max_examples=25)
@given(
    free=st.lists(st.sampled_from([2048, 4096, 6144, 8192, 16384]), min_size=12, max_size=30),
    io=st.lists(st.integers(0, 3), min_size=30, max_size=30),
    policy=st.sampled_from([None, "anti-affinity", "soft-affinity"]),
    subset_size=st.integers(1, 3),
    seed=st.integers(0, 1000),
    tie_salt=st.one_of(st.none(), st.integers(0, 2**64 - 1)),
)
def test_multi_creates_on_bigger_clouds_match_instance_by_instance(
    free: list[int], io: list[int], policy: str | None, subset_size: int, seed: int,
    tie_salt: int | None,
) -> None:
    # Many near-equal hosts and eight instances: consumption keeps moving the extremes
    # of the RAM/CPU/IO ranges, and anti-affinity removes each chosen host.
    snap = cloud(*(host(f"h{i:02d}", free_ram_mb=f, total_usable_ram_mb=16384,
                        vcpus_used=i % 5, stats={"io_workload": str(io[i])},
                        instances=[f"i{i}"] if i % 4 == 0 else [])
                   for i, f in enumerate(free)))
    config = SchedulerConfig.default().replace("filter_scheduler", host_subset_size=subset_size)
    group = None
    if policy is not None:
        group = InstanceGroup(policy=policy, uuid="g", members=["i0", "i4"])
    names = dict(FILTERS)
    wanted = [n for n in ("ComputeFilter", "RamFilter", "ServerGroupAntiAffinityFilter")
              if n in names]
    assume(policy != "anti-affinity" or "ServerGroupAntiAffinityFilter" in names)
    req = spec(memory_mb=2048, num_instances=8 if policy != "anti-affinity" else 5, group=group)
    got = [_decide(Scheduler(config, filters=[names[n](config) for n in wanted],
                             weighers=[cls(config) for _, cls in WEIGHERS], per_host=per_host,
                             tie_salt=tie_salt),
                   snap, req, seed, True)
           for per_host in (False, True)]
    assert got[0] == got[1]


@settings(FAST, max_examples=30)
@given(
    case=cloud_and_request(min_hosts=3),
    steps=st.lists(st.tuples(st.integers(0, 7), st.lists(st.integers(0, 7), max_size=2)),
                   min_size=1, max_size=5),
    memory=st.sampled_from([512, 2048, 8192]),
    shared=st.booleans(),
)
def test_memoized_weights_equal_a_fresh_weighing_after_consumption_and_removals(
    case: tuple[HostSnapshot, RequestSpec], steps: list[tuple[int, list[int]]], memory: int,
    shared: bool,
) -> None:
    # The memo's incremental ranges and terms must give exactly what weighing every
    # host from scratch gives, whichever rows were consumed from or dropped.
    snap, req = case
    req.flavor.memory_mb = memory
    weighers = [cls(SchedulerConfig.default()) for _, cls in WEIGHERS]
    ranker = WeigherRanker(weighers)
    ws = WorkingSet(snap, NOW, share_stubs=shared)
    ws.memo["instances"] = 5
    rows = np.arange(len(snap), dtype=np.int64)
    for consumed, dropped in steps:
        memoized = ranker.rank(ws.hosts(rows), req).weights
        ws.memo["instances"] = 1  # the plain path: weigh every host now
        fresh = WeigherRanker(weighers).rank(ws.hosts(rows), req).weights
        ws.memo["instances"] = 5
        np.testing.assert_allclose(memoized, fresh, rtol=0, atol=1e-12)
        if len(rows) > 1:
            row = int(rows[consumed % len(rows)])
            ws.consume(row, req)
            group = req.instance_group
            if group is not None:
                # A multi-create's stub; a group member when there is one (affinity weighers).
                ws.add_instance(row, Instance(uuid=group.members[0] if group.members else "new"))
            keep = ~np.isin(np.arange(len(rows)), [d % len(rows) for d in dropped])
            if keep.any():
                rows = rows[keep]


def test_removing_the_host_with_the_most_free_ram_renormalizes_the_memoized_weights() -> None:
    names = dict(WEIGHERS)
    if "RAMWeigher" not in names:
        pytest.skip("RAMWeigher is not present")
    snap = cloud(host("a", free_ram_mb=1000), host("b", free_ram_mb=5000),
                 host("c", free_ram_mb=3000))
    ranker = WeigherRanker([names["RAMWeigher"](SchedulerConfig.default())])
    ws = WorkingSet(snap, NOW)
    ws.memo["instances"] = 5
    req = spec()
    ranker.rank(ws.hosts(np.array([0, 1, 2])), req)
    # b leaves: RAM normalizes by 3000 now (minval 0): 1000/3000 and 3000/3000.
    weights = ranker.rank(ws.hosts(np.array([0, 2])), req).weights
    np.testing.assert_allclose(weights, [1 / 3, 1.0], rtol=0, atol=1e-12)
