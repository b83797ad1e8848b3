"""The columnar snapshot and the per-request working set."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from berth.host_state import WorkingSet
from berth.interning import freeze
from berth.model import Aggregate, Instance, MetricItem, ServiceRecord
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


def test_a_node_without_a_service_record_is_marked_and_keeps_none():
    records = [HostRecord("a"), HostRecord("b", service=ServiceRecord(host="b", disabled=True))]
    one_by_one = HostSnapshot()
    for record in records:
        one_by_one.upsert(record)
    for snap in (HostSnapshot.from_records(records), one_by_one):
        assert snap.num("has_service").tolist() == [False, True]
        assert snap.obj("service")[0] is None
        assert WorkingSet(snap, NOW).host_state(0).service == {}
    snap = HostSnapshot.from_records(records)
    snap.upsert(HostRecord("a", service=ServiceRecord(host="a")))  # the service registers
    assert snap.num("has_service").tolist() == [True, True]


def test_duplicate_nodes_are_refused():
    with pytest.raises(ValueError, match="duplicate compute node a/a"):
        HostSnapshot.from_records([HostRecord("a"), HostRecord("a")])


def test_derived_indexes_are_rebuilt_after_a_change():
    snap = cloud(host("a", instances=["i1"]), host("b"))
    assert snap.instance_rows() == {"i1": 0}
    snap.upsert(HostRecord("b", instances={"i2": Instance("i2")}))
    assert snap.instance_rows() == {"i1": 0, "i2": 1}



@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from("abcd"),
                          st.lists(st.sampled_from([f"i{n}" for n in range(8)]), max_size=4)),
                max_size=25))
def test_the_instance_index_follows_reports_as_a_rebuild_would(reports):
    """instance_rows is kept up to date report by report (an instance moving between
    hosts, hosts emptied, new hosts appended): always what a fresh build gives, and an
    index handed out earlier does not change under its reader."""
    snap = cloud(host("a", instances=["i0"]), host("b"))
    for name, uuids in reports:
        before = snap.instance_rows()
        frozen = dict(before)
        snap.upsert(HostRecord(name, instances={u: Instance(u) for u in uuids}))
        fresh = HostSnapshot.from_records(
            [HostRecord(h, instances=dict(snap.obj("instances")[row]))
             for row, h in enumerate(snap.obj("host")[:len(snap)])])
        got = snap.instance_rows()
        assert dict(got) == dict(fresh.instance_rows())
        assert len(got) == len(fresh.instance_rows())
        assert dict(before) == frozen


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


def test_table_derived_values_outlive_reports_until_the_aggregates_change():
    from berth.weighers.utils import weight_multipliers_all_hosts

    key = "ram_weight_multiplier"
    snap = cloud(host("a").in_aggregate("x", **{key: "3"}), host("b"))
    built = []
    value = snap.table_cached("probe", lambda: built.append(1) or object())
    snap.upsert(HostRecord("b", instances={"i2": Instance("i2")}))  # a report
    assert snap.table_cached("probe", lambda: built.append(1) or object()) is value
    assert weight_multipliers_all_hosts(WorkingSet(snap, NOW).hosts(), key, 1.0).tolist() == [3, 1]
    # A report that joins a new signature: the multiplier of its code is computed.
    snap.set_aggregates([Aggregate(id=1, name="x", hosts=("a",), metadata={key: "3"}),
                         Aggregate(id=2, name="y", hosts=("b",), metadata={key: "-1"})])
    assert snap.table_cached("probe", lambda: built.append(1) or object()) is not value
    assert weight_multipliers_all_hosts(WorkingSet(snap, NOW).hosts(), key, 1.0).tolist() == [3, -1]
    snap.upsert(HostRecord("c"))  # a new host, in no aggregate: a new signature
    assert weight_multipliers_all_hosts(WorkingSet(snap, NOW).hosts(), key, 1.0).tolist() == [
        3, -1, 1]
    assert len(built) == 2


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


# ---------------------------------------------------------------------- bulk build

_HOSTS = [f"h{i}" for i in range(6)]


@st.composite
def _messy_records(draw):
    """Records with the shapes the bulk build special-cases: None fields, shared and
    repeated values, lists vs tuples, explicit counters, service hosts with many nodes."""
    records = []
    for i in range(draw(st.integers(0, 7))):
        stats = draw(st.sampled_from([
            None, {}, {"num_instances": "2", "io_workload": "1"}, {"io_workload": "1", "num_instances": "2"},
            {"num_instances": 3, "failed_builds": "1"}, {"x": [1, 2]}, {"x": (1, 2)}]))
        si = draw(st.sampled_from([
            None, [], [["x86_64", "kvm", "hvm"]], [("x86_64", "kvm", "hvm")],
            [["aarch64", "kvm", "hvm"], ["x86_64", "qemu", "hvm"]], ["x86_64"], [["a", ["b"]]]]))
        records.append(HostRecord(
            host=draw(st.sampled_from(_HOSTS)),
            nodename=draw(st.sampled_from([None, "", f"n{i}"])),
            cell_uuid=draw(st.sampled_from([None, "c1", "c2"])),
            free_ram_mb=draw(st.sampled_from([0, 1024, None])),
            hypervisor_version=draw(st.sampled_from([None, 6000000])),
            hypervisor_hostname=draw(st.sampled_from([None, "", f"hh{i}"])),
            num_instances=draw(st.sampled_from([None, None, 5])),
            num_io_ops=draw(st.sampled_from([None, 2])),
            cpu_info=draw(st.sampled_from([None, "{}", '{"a": 1}'])),
            supported_instances=si,  # type: ignore[arg-type]
            stats=stats,  # type: ignore[arg-type]
            metrics=draw(st.sampled_from([None, [], [MetricItem("cpu", 1.0)]])),  # type: ignore[arg-type]
            service=draw(st.sampled_from([None, ServiceRecord(host="s", disabled=True),
                                          ServiceRecord(host="s", created_at=5.0)])),
            instances=draw(st.sampled_from([None, {}, {"i1": Instance("i1")}])),  # type: ignore[arg-type]
            updated=draw(st.sampled_from([None, 1.5])),
        ))
    keys = [r.key for r in records]
    return [r for k, r in zip(keys, records) if keys.count(k) == 1]


@st.composite
def _aggregate_lists(draw):
    count = draw(st.sampled_from([0, 1, 3, 70]))  # past 64: more than one mask word
    repeats = draw(st.booleans())  # a host listed twice takes the row-by-row path
    aggs = []
    for i in range(count):
        hosts = draw(st.lists(st.sampled_from(_HOSTS + ["outside1", "outside2"]), max_size=4,
                              unique=not repeats))
        aggs.append(Aggregate(id=i + 1, name=f"a{i}", hosts=tuple(hosts), metadata={"k": str(i)}))
    return aggs


def _assert_same_snapshot(bulk: HostSnapshot, ref: HostSnapshot) -> None:
    assert len(bulk) == len(ref) and bulk._rows == ref._rows
    for name in bulk._num:
        np.testing.assert_array_equal(bulk.num(name), ref.num(name), err_msg=name)
    for name in bulk._interned:
        assert bulk.codes(name).tolist() == ref.codes(name).tolist(), name
        assert bulk.table(name) == ref.table(name), name
        assert [type(v) for v in bulk.table(name)] == [type(v) for v in ref.table(name)]
    for name in bulk._obj:
        assert bulk.obj(name).tolist() == ref.obj(name).tolist(), name
    for name in _HOSTS + ["outside1", "outside2", "nowhere"]:
        assert bulk._aggs_by_host.get(name, ()) == ref._aggs_by_host.get(name, ()), name


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(_messy_records(), _aggregate_lists(), _aggregate_lists())
def test_the_bulk_build_equals_a_row_by_row_build_on_messy_records(records, aggs, new_aggs):
    bulk = HostSnapshot.from_records(records, aggs)
    ref = HostSnapshot(aggs)
    for record in records:
        ref.upsert(record)
    _assert_same_snapshot(bulk, ref)
    # A member host that had no row reports later; then the aggregates change.
    for snap in (bulk, ref):
        snap.upsert(HostRecord("outside1", stats={"num_instances": "1"}))
    _assert_same_snapshot(bulk, ref)
    for snap in (bulk, ref):
        snap.set_aggregates(new_aggs)
    _assert_same_snapshot(bulk, ref)


def _assert_same_rows(snap: HostSnapshot, ref: HostSnapshot) -> None:
    """The same rows with the same values (interned codes may differ: a table keeps
    the values of rows removed, and a value equal to one interned before, once frozen,
    is that one)."""
    assert len(snap) == len(ref) and snap._rows == ref._rows
    for name in snap._num:
        np.testing.assert_array_equal(snap.num(name), ref.num(name), err_msg=name)
    for name in snap._interned:
        assert ([freeze(snap.table(name)[c]) for c in snap.codes(name).tolist()]
                == [freeze(ref.table(name)[c]) for c in ref.codes(name).tolist()]), name
    for name in snap._obj:
        assert snap.obj(name).tolist() == ref.obj(name).tolist(), name


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(_messy_records(), _aggregate_lists(), st.data())
def test_removing_rows_leaves_what_a_build_of_the_others_gives(records, aggs, data):
    snap = HostSnapshot.from_records(records, aggs)
    keys = [r.key for r in records]
    gone = data.draw(st.sets(st.sampled_from(keys))) if keys else set()
    generation = snap.structure_generation
    held = snap.num("free_ram_mb")  # a reader's view stays as it was
    before = held.copy()
    assert snap.remove([*gone, ("nowhere", "nowhere")]) == bool(gone)
    np.testing.assert_array_equal(held, before)
    assert (snap.structure_generation > generation) == bool(gone)
    ref = HostSnapshot.from_records([r for r in records if r.key not in gone], aggs)
    _assert_same_rows(snap, ref)
    for s in (snap, ref):  # and it goes on: a report, a new node, the aggregates change
        if records:
            s.upsert(records[0])
        s.upsert(HostRecord("outside1", stats={"num_instances": "1"}))
        s.set_aggregates(aggs[:1])
    _assert_same_rows(snap, ref)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(_messy_records(), st.data())
def test_a_row_cached_column_follows_every_change_as_a_fresh_build(records, data):
    """A column patched row by row after reports equals one built afresh, whatever the
    reports, new nodes, removals and aggregate changes in between."""
    def of(snap: HostSnapshot, row: int) -> float:
        return float(len(snap.obj("instances")[row]))

    def column(snap: HostSnapshot) -> np.ndarray:
        return snap.row_cached("n_instances", lambda: np.array(
            [of(snap, r) for r in range(len(snap))], dtype=float), lambda r: of(snap, r))

    snap = HostSnapshot.from_records(records)
    held = column(snap)
    as_handed = held.copy()
    for _ in range(data.draw(st.integers(1, 12))):
        action = data.draw(st.sampled_from(["report", "report", "report", "new", "remove",
                                            "aggregates", "read"]))
        keys = list(snap._rows)
        if action == "report" and keys:
            host, node = data.draw(st.sampled_from(keys))
            count = data.draw(st.integers(0, 3))
            snap.upsert(HostRecord(host, nodename=node, instances={
                f"i{k}": Instance(f"i{k}") for k in range(count)}))
        elif action == "new":
            snap.upsert(HostRecord(f"new{len(snap)}", instances={"x": Instance("x")}))
        elif action == "remove" and keys:
            snap.remove([data.draw(st.sampled_from(keys))])
        elif action == "aggregates":
            snap.set_aggregates([Aggregate(id=1, name="a", hosts=tuple(h for h, _ in keys[:1]))])
        got = column(snap)
        assert got.tolist() == [of(snap, r) for r in range(len(snap))]
    # A column handed out earlier is never changed under its reader.
    assert held.tolist() == as_handed.tolist()


def test_an_aggregate_listing_a_host_twice_keeps_both_entries():
    agg = Aggregate(id=1, name="twice", hosts=("a", "a", "b"))
    bulk = HostSnapshot.from_records([HostRecord("a"), HostRecord("b")], [agg])
    assert bulk.interned_value("aggregates", 0) == (0, 0)
    assert bulk.interned_value("aggregates", 1) == (0,)


def test_the_bulk_build_copies_what_a_caller_may_change_later():
    stats = {"num_instances": "1"}
    instances = {"i1": Instance("i1")}
    metrics = [MetricItem("cpu", 1.0)]
    si = [["x86_64", "kvm", "hvm"]]
    snap = HostSnapshot.from_records([HostRecord("a", stats=stats, instances=instances,
                                                 metrics=metrics, supported_instances=si)])
    stats["num_instances"] = "9"
    instances["i2"] = Instance("i2")
    metrics.append(MetricItem("mem", 2.0))
    si[0].append("extra")
    assert snap.interned_value("stats", 0) == {"num_instances": "1"}
    assert list(snap.obj("instances")[0]) == ["i1"]
    assert len(snap.obj("metrics")[0]) == 1
    assert snap.interned_value("supported_instances", 0) == [["x86_64", "kvm", "hvm"]]


@dataclass
class _ComputedRecord(HostRecord):
    """A record subclass whose ``cell_uuid`` is computed (not in ``__dict__``)."""

    @property  # type: ignore[override]
    def cell_uuid(self) -> str:
        return "computed-" + self.host

    @cell_uuid.setter
    def cell_uuid(self, value: str | None) -> None:
        pass


def test_records_with_properties_are_read_by_attribute():
    snap = HostSnapshot.from_records([_ComputedRecord("a"), HostRecord("b", cell_uuid="c")])
    assert [snap.interned_value("cell_uuid", r) for r in range(2)] == ["computed-a", "c"]


def test_fewer_aggregates_leave_no_signature_pointing_past_the_list():
    """An aggregate deleted (Nova's delete_aggregate cast, a cloud file edited) must not
    leave a membership signature that indexes past the new list: every per-signature
    evaluation (weigher multipliers, aggregate filters) visits all signatures."""
    from berth.weighers.utils import weight_multipliers_all_hosts

    aggs = [Aggregate(id=1, name="a", hosts=("h1",), metadata={"ram_weight_multiplier": "2"}),
            Aggregate(id=2, name="b", hosts=("h2",))]
    snap = HostSnapshot.from_records([HostRecord("h1"), HostRecord("h2")], aggs)
    snap.set_aggregates(aggs[1:])
    assert all(len(snap.aggregates_of_signature(code)) <= 1
               for code in range(len(snap.table("aggregates"))))
    from berth.host_state import Hosts

    hosts = Hosts(WorkingSet(snap, 0.0), np.arange(2))
    assert weight_multipliers_all_hosts(hosts, "ram_weight_multiplier", 1.0).tolist() == [1.0, 1.0]


def test_a_long_run_of_reports_keeps_the_stats_table_near_the_rows():
    """Every instance a host gains or loses gives it new ``stats``: the values no row
    holds any more are dropped once the table outgrows the rows, and every row, its
    counters and a filter reading stats still say what the last report said."""
    import random

    from berth.filters.compute_capabilities import ComputeCapabilitiesFilter
    from builders import passes_bulk, passes_per_host

    rng = random.Random(7)
    names = [f"h{i}" for i in range(5)]
    snap = cloud(*(host(n) for n in names))
    last: dict[str, dict[str, str]] = {}
    for step in range(3_000):
        name = rng.choice(names)
        stats = {"num_instances": str(step % 13), f"num_proj_{step % 40}": "1",
                 "io_workload": str(step % 3)}
        last[name] = stats
        snap.upsert(HostRecord(name, stats=stats, service=ServiceRecord(
            host=name, last_seen_up=NOW)))
        assert len(snap.table("stats")) <= 2 * len(snap) + 1024 + 1
    old_column = snap._interned["stats"]  # a reader's column stays consistent
    for row, name in enumerate(names):
        expected = last.get(name, {})
        assert snap.interned_value("stats", row) == expected
        assert snap.num("num_instances")[row] == int(expected.get("num_instances", 0))
        assert old_column.value(row) == expected
    fresh = HostSnapshot.from_records(
        [HostRecord(n, stats=last.get(n, {}), service=ServiceRecord(host=n, last_seen_up=NOW))
         for n in names])
    for key in ("num_proj_3", "io_workload", "num_instances"):
        req = spec(extra_specs={key: ">= 1"})
        for run in (passes_per_host, passes_bulk):
            assert run(ComputeCapabilitiesFilter(), snap, req) == run(
                ComputeCapabilitiesFilter(), fresh, req), key
