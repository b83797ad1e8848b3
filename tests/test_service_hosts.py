"""Instances per service host (reference §2.1, §8.2 step 8, §10.2), as Nova keeps them.

Nova's host manager looks instances up by ``compute.host`` and every node of that host
shares the dict, including the stubs the scheduler adds after each pick of a
multi-create. The example of issue 13: service host ``ironic1`` with nodes ``node-a``
(running ``i-1``) and ``node-b``, plus host ``cmp2``. Every case runs on the columnar
and on the per-host path.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from berth.claims import InMemoryPlacement
from berth.config import SchedulerConfig
from berth.explain import diagnosis_lines
from berth.filters.base import BaseHostFilter
from berth.filters.host_affinity import DifferentHostFilter, SameHostFilter
from berth.filters.num_instances import NumInstancesFilter
from berth.filters.server_group import ServerGroupAffinityFilter, ServerGroupAntiAffinityFilter
from berth.filters.type_affinity import TypeAffinityFilter
from berth.host_state import WorkingSet
from berth.model import Instance, InstanceGroup
from berth.model.request import RequestSpec, new_instance_uuids
from berth.pipeline import Decision, Scheduler
from berth.service_hosts import ServiceHosts
from berth.snapshot import HostSnapshot
from berth.weighers.affinity import (
    ServerGroupSoftAffinityWeigher,
    ServerGroupSoftAntiAffinityWeigher,
)
from berth.weighers.base import BaseHostWeigher, WeighedHost
from berth.weighers.image_properties import ImagePropertiesWeigher
from berth.weighers.num_instances import NumInstancesWeigher
from berth.weighers.ram import RAMWeigher
from builders import NOW, cloud, host, spec

PATHS = pytest.mark.parametrize("per_host", [False, True], ids=["columnar", "per-host"])
UBUNTU = {"os_distro": "ubuntu", "hw_architecture": "x86_64"}


def ironic(**node_a: Any) -> HostSnapshot:
    """The issue's cloud: node-a is the largest, cmp2 the smallest, so RAM spreading
    picks node-a, then node-b, then cmp2 when nothing else decides."""
    fields: dict[str, Any] = {
        "total_usable_ram_mb": 32768, "free_ram_mb": 31744,
        "instances": {"i-1": Instance(uuid="i-1", instance_type_id=1, image_properties=UBUNTU)},
        "stats": {"num_instances": "1"}}
    fields.update(node_a)
    return cloud(host("ironic1", node="node-a", **fields),
                 host("ironic1", node="node-b", total_usable_ram_mb=16384, free_ram_mb=16384),
                 host("cmp2", total_usable_ram_mb=8192, free_ram_mb=8192))


NODES = [("ironic1", "node-a"), ("ironic1", "node-b"), ("cmp2", "cmp2")]


def decide(snap: HostSnapshot, req: RequestSpec, filters: list[BaseHostFilter],
           per_host: bool, weighers: list[BaseHostWeigher] | None = None,
           config: SchedulerConfig | None = None) -> Decision:
    config = config or SchedulerConfig.default()
    placement = InMemoryPlacement(snap, config)
    rng = random.Random(0)
    scheduler = Scheduler(config, filters=filters, per_host=per_host,
                          weighers=weighers if weighers is not None else [RAMWeigher(config)])
    return scheduler.select_destinations(
        req, snap, now=NOW, rng=rng, instance_uuids=new_instance_uuids(rng, req.num_instances),
        candidates=placement.candidates(req), claimer=placement, explain=True)


def chosen(decision: Decision) -> list[tuple[str, str]]:
    return [(sels[0].service_host, sels[0].nodename) for sels in decision.selections]


def passed(decision: Decision) -> set[tuple[str, str]]:
    """The first instance's host and alternates: every host that passed (3 at most)."""
    return {(s.service_host, s.nodename) for s in decision.selections[0]}


# ---------------------------------------------------------------------- the example
@PATHS
def test_same_host_passes_both_nodes_of_the_service_host_running_the_instance(
        per_host: bool) -> None:
    decision = decide(ironic(), spec(hints={"same_host": "i-1"}), [SameHostFilter()], per_host)
    assert passed(decision) == {("ironic1", "node-a"), ("ironic1", "node-b")}


@PATHS
def test_different_host_passes_only_the_other_service_host(per_host: bool) -> None:
    decision = decide(ironic(), spec(hints={"different_host": "i-1"}), [DifferentHostFilter()],
                      per_host)
    assert passed(decision) == {("cmp2", "cmp2")}


@PATHS
def test_the_second_instance_of_an_anti_affinity_group_goes_to_the_other_service_host(
        per_host: bool) -> None:
    # The first pick (node-a, most free RAM) leaves its stub on ironic1, which node-b
    # sees too: the second instance goes to cmp2, although node-b outweighs it.
    group = InstanceGroup(policy="anti-affinity", uuid="g")
    decision = decide(ironic(), spec(group=group, num_instances=2),
                      [ServerGroupAntiAffinityFilter()], per_host)
    assert chosen(decision) == [("ironic1", "node-a"), ("cmp2", "cmp2")]


@PATHS
def test_without_tracked_instance_changes_a_stub_stays_on_the_node_it_was_placed_on(
        per_host: bool) -> None:
    # Nova then gives each node its own copy of the host's instances (from the
    # database), so node-b does not see the stub on node-a and takes the second one.
    config = SchedulerConfig.default().replace("filter_scheduler", track_instance_changes=False)
    group = InstanceGroup(policy="anti-affinity", uuid="g")
    decision = decide(ironic(), spec(group=group, num_instances=2),
                      [ServerGroupAntiAffinityFilter()], per_host, config=config)
    assert chosen(decision) == [("ironic1", "node-a"), ("ironic1", "node-b")]
    # The instances reported by a sibling are still the host's.
    decision = decide(ironic(), spec(hints={"different_host": "i-1"}), [DifferentHostFilter()],
                      per_host, config=config)
    assert passed(decision) == {("cmp2", "cmp2")}


@PATHS
def test_a_group_member_on_one_node_keeps_an_anti_affinity_group_off_its_sibling(
        per_host: bool) -> None:
    group = InstanceGroup(policy="anti-affinity", uuid="g", members=["i-1"], hosts=["ironic1"])
    decision = decide(ironic(), spec(group=group), [ServerGroupAntiAffinityFilter()], per_host)
    assert passed(decision) == {("cmp2", "cmp2")}


@PATHS
def test_an_affinity_group_keeps_to_every_node_of_its_service_host(per_host: bool) -> None:
    group = InstanceGroup(policy="affinity", uuid="g", members=["i-1"], hosts=["ironic1"])
    decision = decide(ironic(), spec(group=group, num_instances=2),
                      [ServerGroupAffinityFilter()], per_host)
    assert {h for h, _ in chosen(decision)} == {"ironic1"}
    assert passed(decision) == {("ironic1", "node-a"), ("ironic1", "node-b")}


@PATHS
def test_max_instances_per_host_counts_each_nodes_own_instances(per_host: bool) -> None:
    # num_instances is a per-node stat in Nova: node-b runs nothing and passes.
    config = SchedulerConfig.default().replace("filter_scheduler", max_instances_per_host=1)
    decision = decide(ironic(), spec(), [NumInstancesFilter(config)], per_host, config=config)
    assert passed(decision) == {("ironic1", "node-b"), ("cmp2", "cmp2")}


@PATHS
def test_type_affinity_reads_the_flavors_of_the_whole_service_host(per_host: bool) -> None:
    decision = decide(ironic(), spec(flavor_id=2), [TypeAffinityFilter()], per_host)
    assert passed(decision) == {("cmp2", "cmp2")}


# ---------------------------------------------------------------------- weighers
def raw(weigher: BaseHostWeigher, ws: WorkingSet, req: RequestSpec) -> tuple[list[float],
                                                                                list[float]]:
    """Raw weights of every node on the bulk path and the per-host path."""
    bulk = [float(x) for x in weigher.weigh_all_hosts(ws.hosts(), req)]
    states = [WeighedHost(s) for s in ws.hosts().states()]
    return bulk, [float(x) for x in weigher.weigh_objects(states, req)]


@pytest.mark.parametrize(("weigher", "policy", "expected"), [
    (ServerGroupSoftAffinityWeigher, "soft-affinity", [1, 1, 0]),
    (ServerGroupSoftAntiAffinityWeigher, "soft-anti-affinity", [-1, -1, 0]),
], ids=["soft affinity counts the member on both nodes of ironic1",
        "soft anti-affinity counts the member on both nodes of ironic1"])
def test_soft_affinity_weighers_count_members_per_service_host(
        weigher: type[BaseHostWeigher], policy: str, expected: list[int]) -> None:
    req = spec(group=InstanceGroup(policy=policy, uuid="g", members=["i-1"]))
    bulk, per_host = raw(weigher(SchedulerConfig.default()), WorkingSet(ironic(), NOW), req)
    assert bulk == per_host == expected


def test_a_stub_placed_on_one_node_weighs_on_its_sibling_too() -> None:
    req = spec(group=InstanceGroup(policy="soft-anti-affinity", uuid="g", members=["new"]))
    ws = WorkingSet(ironic(), NOW)
    ws.add_instance(ironic().row_of("ironic1", "node-b") or 0, Instance(uuid="new"))
    bulk, per_host = raw(ServerGroupSoftAntiAffinityWeigher(SchedulerConfig.default()), ws, req)
    assert bulk == per_host == [-1, -1, 0]


@PATHS
def test_soft_anti_affinity_sends_the_second_instance_off_the_first_ones_service_host(
        per_host: bool) -> None:
    # node-a has 32 GiB, node-b 16, cmp2 8: RAM alone would take node-b second (its
    # normalized RAM 0.5 against cmp2's 0.25); the stub on ironic1 costs node-b the
    # full soft-anti-affinity weight, so cmp2 wins.
    config = SchedulerConfig.default()
    group = InstanceGroup(policy="soft-anti-affinity", uuid="g")
    decision = decide(ironic(instances={}, stats={}), spec(group=group, num_instances=2), [],
                      per_host, config=config,
                      weighers=[RAMWeigher(config), ServerGroupSoftAntiAffinityWeigher(config)])
    assert chosen(decision) == [("ironic1", "node-a"), ("cmp2", "cmp2")]


def test_image_properties_weigher_counts_the_instances_of_the_whole_service_host() -> None:
    config = SchedulerConfig.default().replace("filter_scheduler",
                                               image_props_weight_multiplier=1.0)
    req = spec(image_props={"os_distro": "ubuntu", "hw_architecture": "x86_64"})
    bulk, per_host = raw(ImagePropertiesWeigher(config), WorkingSet(ironic(), NOW), req)
    assert bulk == per_host == [2, 2, 0]  # two matching (property, value) pairs on ironic1


def test_num_instances_weigher_stays_per_node() -> None:
    bulk, per_host = raw(NumInstancesWeigher(SchedulerConfig.default()),
                         WorkingSet(ironic(), NOW), spec())
    assert bulk == per_host == [1, 0, 0]


# ---------------------------------------------------------------------- explanations
def test_the_explanation_names_both_nodes_the_hint_rejects_and_labels_nodes() -> None:
    decision = decide(ironic(), spec(hints={"different_host": "i-1"}), [DifferentHostFilter()],
                      per_host=False)
    assert decision.diagnosis is not None
    inst = decision.diagnosis.instances[0]
    assert inst.summary() == "1/3 hosts available: 2 a hinted instance is on the host " \
                             "(instances ['i-1'])"
    lines = diagnosis_lines(decision.diagnosis, verbose=True)
    assert "      ironic1/node-a: a hinted instance is on the host (instances ['i-1'])" in lines
    assert "      ironic1/node-b: a hinted instance is on the host (instances ['i-1'])" in lines
    assert lines[0].startswith("instance 1 -> cmp2: 1/3 hosts available")


def test_the_weighing_table_tells_the_nodes_of_one_host_apart() -> None:
    group = InstanceGroup(policy="soft-anti-affinity", uuid="g", members=["i-1"])
    config = SchedulerConfig.default()
    decision = decide(ironic(), spec(group=group), [], per_host=False, config=config,
                      weighers=[RAMWeigher(config), ServerGroupSoftAntiAffinityWeigher(config)])
    assert decision.diagnosis is not None
    lines = diagnosis_lines(decision.diagnosis)
    table = lines[lines.index("  top hosts by weight:") + 1:]
    assert [row.split()[0] for row in table] == ["host", "cmp2", "ironic1/node-a",
                                                 "ironic1/node-b"]


# ---------------------------------------------------------------------- the index
def test_one_node_per_host_keeps_each_rows_own_instances() -> None:
    snap = cloud(host("a", instances=["x"]), host("b"))
    hosts = snap.service_hosts()
    assert not hosts.multi_node
    assert hosts.codes.tolist() == [0, 1] and hosts.rows_of(1) == (1,)
    assert hosts.instances(0) is snap.obj("instances")[0]


def test_the_nodes_of_a_host_share_one_merged_instance_dict() -> None:
    snap = cloud(host("h", node="n1", instances=["x"]), host("other", instances=["y"]),
                 host("h", node="n2", instances=["z"]))
    hosts = snap.service_hosts()
    assert hosts.multi_node
    assert hosts.codes.tolist() == [0, 1, 0]
    assert hosts.rows_of(0) == (0, 2) and hosts.rows_of(1) == (1,) and hosts.first_row(1) == 1
    assert hosts.instances(0) is hosts.instances(2)
    assert list(hosts.instances_column()) == [hosts.instances(r) for r in range(3)]
    assert set(hosts.instances(0)) == {"x", "z"} and set(hosts.instances(1)) == {"y"}
    assert hosts.codes_of(np.array([2, 1])).tolist() == [0, 1]
    # Each node still reports its own (usage and num_instances are per node).
    assert set(snap.obj("instances")[0]) == {"x"}


def test_a_new_report_rebuilds_the_index() -> None:
    from berth.snapshot import HostRecord

    snap = cloud(host("h", node="n1", instances=["x"]), host("h", node="n2"))
    assert set(snap.service_hosts().instances(1)) == {"x"}
    snap.upsert(HostRecord(host="h", nodename="n2", instances={"y": Instance(uuid="y")}))
    assert set(snap.service_hosts().instances(0)) == {"x", "y"}


def test_stubs_touch_every_node_of_the_host_so_memoized_weights_refresh() -> None:
    snap = ironic()
    ws = WorkingSet(snap, NOW)
    ws.add_instance(0, Instance(uuid="s"))
    assert ws.touched == [0, 1] and ws.touched_fields == ["instances", "instances"]
    assert set(ws.instances(1)) == {"i-1", "s"} and set(ws.instances(2)) == set()
    assert set(ws.extra_instances()) == {0, 1}
    alone = WorkingSet(snap, NOW, share_stubs=False)
    alone.add_instance(0, Instance(uuid="s"))
    assert alone.touched == [0] and set(alone.extra_instances()) == {0}
    assert set(alone.instances(0)) == {"i-1", "s"} and set(alone.instances(1)) == {"i-1"}
    assert ServiceHosts(["a", "b", "a"], snap.obj("instances")).rows_of(0) == (0, 2)


# ---------------------------------------------------------------------- offline, berth schedule
IRONIC_CLOUD = """
flavors:
  - {name: small, vcpus: 1, memory_mb: 1024, root_gb: 10}
images:
  - {name: ubuntu, properties: {os_distro: ubuntu}}
hosts:
  - {host: ironic1, nodename: node-a, vcpus: 16, memory_mb: 32768, local_gb: 400,
     instances: [{uuid: i-1, flavor: small, image: ubuntu}]}
  - {host: ironic1, nodename: node-b, vcpus: 8, memory_mb: 16384, local_gb: 200}
  - {host: cmp2, vcpus: 4, memory_mb: 8192, local_gb: 100}
server_groups:
  - {name: apart, policy: anti-affinity}
  - {name: near, policy: soft-affinity, members: [i-1]}
"""
NOVA_CONF = """
[filter_scheduler]
enabled_filters = ComputeFilter,SameHostFilter,DifferentHostFilter,ServerGroupAntiAffinityFilter
"""


@pytest.fixture
def ironic_files(tmp_path: Any) -> tuple[str, str]:
    cloud_file, conf = tmp_path / "ironic.yaml", tmp_path / "nova.conf"
    cloud_file.write_text(IRONIC_CLOUD)
    conf.write_text(NOVA_CONF)
    return str(cloud_file), str(conf)


def schedule(capsys: Any, files: tuple[str, str], *argv: str) -> dict[str, Any]:
    import json

    from berth.cli import main

    assert main(["schedule", files[0], "--config-file", files[1], "--flavor", "small",
                 "--seed", "1", "--now", "1800000000", "--json", "--explain", *argv]) == 0
    return dict(json.loads(capsys.readouterr().out))


def _nodes(selection: dict[str, Any]) -> tuple[str, str]:
    return selection["host"], selection["nodename"]


def test_berth_schedule_same_host_passes_both_nodes_of_ironic1(capsys: Any,
                                                                ironic_files: Any) -> None:
    answer = schedule(capsys, ironic_files, "--hint", "same_host=i-1")
    inst = answer["instances"][0]
    assert {_nodes(s) for s in [inst, *inst["alternates"]]} == {
        ("ironic1", "node-a"), ("ironic1", "node-b")}


def test_berth_schedule_different_host_passes_only_cmp2(capsys: Any, ironic_files: Any) -> None:
    answer = schedule(capsys, ironic_files, "--hint", "different_host=i-1")
    inst = answer["instances"][0]
    assert _nodes(inst) == ("cmp2", "cmp2") and inst["alternates"] == []
    step = next(s for s in answer["diagnosis"]["instances"][0]["steps"]
                if s["name"] == "DifferentHostFilter")
    assert [(r["host"], r["nodename"]) for r in step["rejections"]] == [
        ("ironic1", "node-a"), ("ironic1", "node-b")]


def test_berth_schedule_sends_the_second_anti_affinity_instance_to_cmp2(
        capsys: Any, ironic_files: Any) -> None:
    answer = schedule(capsys, ironic_files, "--group", "apart", "--num", "2")
    assert [_nodes(i) for i in answer["instances"]] == [
        ("ironic1", "node-a"), ("cmp2", "cmp2")]


def test_berth_schedule_explains_which_nodes_the_hint_rejects(capsys: Any,
                                                              ironic_files: Any) -> None:
    from berth.cli import main

    assert main(["schedule", ironic_files[0], "--config-file", ironic_files[1], "--flavor",
                 "small", "--hint", "different_host=i-1", "--now", "1800000000", "--explain",
                 "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "instance 1 -> cmp2: 1/3 hosts available: 2 a hinted instance is on the host" in out
    assert "ironic1/node-b: a hinted instance is on the host (instances ['i-1'])" in out


def test_berth_schedule_weighs_the_soft_affinity_member_on_both_nodes(
        capsys: Any, ironic_files: Any) -> None:
    answer = schedule(capsys, ironic_files, "--group", "near")
    weighing = answer["diagnosis"]["instances"][0]["weighing"]
    soft = {(w["host"], w["nodename"]): next(t["raw"] for t in w["terms"]
                                             if t["weigher"] == "ServerGroupSoftAffinityWeigher")
            for w in weighing}
    assert soft == {("ironic1", "node-a"): 1.0, ("ironic1", "node-b"): 1.0, ("cmp2", "cmp2"): 0.0}
