"""The columnar snapshot and the per-request working set."""

from __future__ import annotations

import math

import numpy as np
import pytest

from berth.host_state import WorkingSet
from berth.model import Instance
from berth.snapshot import HostRecord, HostSnapshot
from builders import NOW, cloud, host, spec


def test_equal_strings_and_dicts_share_one_interned_signature():
    snap = cloud(host("a", stats={"x": "1"}), host("b", stats={"x": "1"}), host("c", stats={"x": "2"}))
    codes = snap.codes("stats").tolist()
    assert codes[0] == codes[1] != codes[2]
    assert len(snap.table("stats")) == 2


def test_hosts_share_an_aggregate_signature_when_they_share_membership():
    snap = cloud(host("a").in_aggregate("x", k="v"), host("b").in_aggregate("x"), host("c"))
    codes = snap.codes("aggregates").tolist()
    assert codes[0] == codes[1] != codes[2]
    assert [a.name for a in snap.aggregates_of_signature(codes[0])] == ["x"]


def test_counters_come_from_stats_unless_given():
    snap = HostSnapshot.from_records([
        HostRecord("a", stats={"num_instances": "3", "io_workload": "2", "failed_builds": "1"}),
        HostRecord("b", num_instances=7),
    ])
    assert snap.num("num_instances").tolist() == [3, 7]
    assert snap.num("num_io_ops").tolist() == [2, 0]
    assert snap.num("failed_builds").tolist() == [1, 0]


def test_a_report_updates_one_row_in_place_and_a_new_node_is_appended():
    snap = cloud(host("a", free_ram_mb=1000), host("b", free_ram_mb=2000))
    generation = snap.generation
    row = snap.upsert(HostRecord("a", free_ram_mb=1500))
    assert row == 0 and snap.num("free_ram_mb").tolist() == [1500, 2000]
    assert snap.upsert(HostRecord("c", free_ram_mb=10)) == 2
    assert len(snap) == 3 and snap.generation > generation
    snap.update_host(1, free_ram_mb=1999)
    assert snap.num("free_ram_mb")[1] == 1999


def test_duplicate_nodes_are_refused():
    with pytest.raises(ValueError, match="duplicate compute node a/a"):
        HostSnapshot.from_records([HostRecord("a"), HostRecord("a")])


def test_derived_indexes_are_rebuilt_after_a_change():
    snap = cloud(host("a", instances=["i1"]), host("b"))
    assert snap.instance_rows() == {"i1": 0}
    snap.upsert(HostRecord("b", instances={"i2": Instance("i2")}))
    assert snap.instance_rows() == {"i1": 0, "i2": 1}


def test_numeric_updates_keep_derived_indexes_and_reports_drop_them():
    snap = cloud(host("a"), host("b"))
    built = []
    index = snap.cached("probe", lambda: built.append(1) or object())
    before = (snap.generation, snap.structure_generation)
    snap.update_host(0, free_ram_mb=1.0)  # a claim: numbers only
    assert snap.cached("probe", lambda: built.append(1) or object()) is index
    assert snap.generation == before[0] + 1 and snap.structure_generation == before[1]
    snap.upsert(HostRecord("b"))
    assert snap.cached("probe", lambda: built.append(1) or object()) is not index
    assert len(built) == 2 and snap.structure_generation == before[1] + 1


def test_consumption_stays_in_the_working_set_and_follows_nova():
    snap = cloud(host("a", free_ram_mb=4096, free_disk_mb=10240, vcpus_used=1))
    ws = WorkingSet(snap, NOW)
    hs = ws.host_state(0)
    hs.consume_from_request(spec(vcpus=2, memory_mb=1024, root_gb=2, ephemeral_gb=1, swap=512))
    assert (hs.free_ram_mb, hs.free_disk_mb, hs.vcpus_used) == (3072, 10240 - 3 * 1024, 3)
    assert (hs.num_instances, hs.num_io_ops) == (1, 1)  # swap is not taken from disk
    assert hs.updated == NOW
    assert snap.num("free_ram_mb")[0] == 4096  # the shared snapshot is untouched


def test_a_host_state_view_speaks_novas_attribute_names():
    snap = cloud(host("a", hypervisor_version=None, host_ip="10.0.0.1").in_aggregate("az", availability_zone="az1"))
    hs = WorkingSet(snap, NOW).host_state(0)
    assert hs.hypervisor_version is None and hs.host_ip == "10.0.0.1"
    assert hs.supported_instances == [["x86_64", "kvm", "hvm"]]
    assert hs.aggregates[0].availability_zone == "az1"
    assert hs.service["disabled"] is False and hs.limits == {}
    hs.limits["memory_mb"] = 1.0
    hs.custom = "plugin data"
    assert hs.limits == {"memory_mb": 1.0} and hs.custom == "plugin data"
    with pytest.raises(AttributeError):
        hs.cell_uuid = "x"


def test_bulk_limits_reach_the_per_host_view():
    snap = cloud(host("a"), host("b"))
    ws = WorkingSet(snap, NOW)
    ws.set_limits("vcpu", np.array([1]), np.array([32.0]))
    assert ws.host_state(1).limits == {"vcpu": 32.0}
    assert ws.host_state(0).limits == {}
    assert math.isnan(ws._limit_cols["vcpu"][0])
