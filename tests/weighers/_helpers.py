"""Shared helpers for the weigher tests: both paths of a weigher, and a per-host reference
handler written from reference §7.1 (pure Python, one host at a time, as Nova loops)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from berth.config import SchedulerConfig
from berth.host_state import WorkingSet
from berth.model.request import RequestSpec
from berth.snapshot import HostSnapshot
from berth.weighers.base import BaseHostWeigher, WeighedHost
from berth.weighers.handler import Ranking, WeigherRanker
from builders import NOW


def config(**groups: dict[str, Any]) -> SchedulerConfig:
    """``config(filter_scheduler={"ram_weight_multiplier": -1})``."""
    return SchedulerConfig.from_dict(groups)


def per_host_raw(weigher: BaseHostWeigher, ws: WorkingSet, spec: RequestSpec,
                 rows: Sequence[int] | None = None) -> list[float]:
    """``weigh_objects`` (per host, clamped) over ``rows`` (all by default)."""
    rows = range(len(ws.snapshot)) if rows is None else rows
    return weigher.weigh_objects([WeighedHost(ws.host_state(r)) for r in rows], spec)


def bulk_raw(weigher: BaseHostWeigher, ws: WorkingSet, spec: RequestSpec,
             rows: Sequence[int] | None = None) -> list[float]:
    """``weigh_all_hosts`` over ``rows`` (all by default)."""
    arr = np.arange(len(ws.snapshot)) if rows is None else np.asarray(rows, dtype=np.int64)
    return [float(x) for x in weigher.weigh_all_hosts(ws.hosts(arr), spec)]


def raw_both(weigher: BaseHostWeigher, snapshot: HostSnapshot, spec: RequestSpec,
             ws: WorkingSet | None = None) -> list[float]:
    """The raw weights, asserting first that the per-host and bulk paths agree."""
    ws = ws or WorkingSet(snapshot, NOW)
    per_host = per_host_raw(weigher, ws, spec)
    bulk = bulk_raw(weigher, ws, spec)
    assert np.allclose(per_host, bulk, rtol=0, atol=1e-9), (per_host, bulk)
    return [float(x) for x in per_host]


def multipliers_both(weigher: BaseHostWeigher, snapshot: HostSnapshot,
                     ws: WorkingSet | None = None) -> list[float]:
    """The multipliers of every host, asserting first that both paths agree."""
    ws = ws or WorkingSet(snapshot, NOW)
    per_host = [weigher.weight_multiplier(ws.host_state(r)) for r in range(len(snapshot))]
    bulk = weigher.multipliers_all_hosts(ws.hosts()).tolist()
    assert per_host == bulk, (per_host, bulk)
    return per_host


def reference_normalize(weights: Sequence[float], minval: float | None = None,
                        maxval: float | None = None) -> list[float]:
    """Reference §7.1's normalize, written out in plain Python."""
    if not weights:
        return []
    high = max(weights) if maxval is None else maxval
    low = min(weights) if minval is None else minval
    if low == high:
        return [0.0 for _ in weights]
    return [(w - low) / (high - low) for w in weights]


def reference_rank(weighers: Sequence[BaseHostWeigher], ws: WorkingSet, rows: Sequence[int],
                   spec: RequestSpec) -> tuple[list[float], list[int]]:
    """Nova's ``get_weighed_objects`` one host at a time: weights (in ``rows`` order) and
    the best-first order (positions into ``rows``)."""
    weighed = [WeighedHost(ws.host_state(r)) for r in rows]
    if len(weighed) > 1:
        for weigher in weighers:
            raw = weigher.weigh_objects(weighed, spec)
            normalized = reference_normalize(raw, weigher.minval, weigher.maxval)
            for i, obj in enumerate(weighed):
                obj.weight += weigher.weight_multiplier(obj.obj) * normalized[i]
    positions = sorted(range(len(weighed)), key=lambda i: weighed[i].weight, reverse=True)
    return [w.weight for w in weighed], positions


def bulk_rank(weighers: Sequence[BaseHostWeigher], ws: WorkingSet, rows: Sequence[int],
              spec: RequestSpec) -> Ranking:
    """The production handler over ``rows``."""
    return WeigherRanker(weighers).rank(ws.hosts(np.asarray(rows, dtype=np.int64)), spec)


def weights_of(weighers: Sequence[BaseHostWeigher], snapshot: HostSnapshot,
               spec: RequestSpec) -> list[float]:
    """Final weights of every host (bulk handler), checked against the reference loop."""
    ws = WorkingSet(snapshot, NOW)
    rows = list(range(len(snapshot)))
    expected, expected_order = reference_rank(weighers, ws, rows, spec)
    ranking = bulk_rank(weighers, ws, rows, spec)
    assert np.allclose(ranking.weights, expected, rtol=0, atol=1e-9)
    assert ranking.order.tolist() == expected_order
    return [float(w) for w in ranking.weights]


# ----------------------------------------------------------------------------- hypothesis
from hypothesis import strategies as st  # noqa: E402

from berth.model import (  # noqa: E402
    CellMapping,
    Destination,
    Instance,
    InstanceGroup,
    MetricItem,
)
from builders import cloud, host  # noqa: E402
from builders import spec as make_spec  # noqa: E402

MULTIPLIER_KEYS = (
    "ram_weight_multiplier", "cpu_weight_multiplier", "disk_weight_multiplier",
    "io_ops_weight_multiplier", "num_instances_weight_multiplier",
    "hypervisor_version_weight_multiplier", "build_failure_weight_multiplier",
    "cross_cell_move_weight_multiplier", "pci_weight_multiplier",
    "soft_affinity_weight_multiplier", "soft_anti_affinity_weight_multiplier",
    "metrics_weight_multiplier", "image_props_weight_multiplier",
)
CELLS = ("cell-a", "cell-b")
METRIC_NAMES = ("cpu.percent", "mem.free")
IMAGE_VALUES = {"hw_disk_bus": ["virtio", "scsi"], "os_distro": ["ubuntu", "rhel"],
                "architecture": ["x86_64"]}


class FakePools:
    """pci_stats as another module may shape it: only ``pools`` of dicts with ``count``."""

    def __init__(self, counts: list[int]) -> None:
        self.pools = [{"count": c, "vendor_id": "8086"} for c in counts]


class FakeFreeCount:
    """pci_stats offering ``free_count()``."""

    def __init__(self, free: int) -> None:
        self.free = free

    def free_count(self) -> int:
        return self.free


@st.composite
def image_props(draw: Any) -> dict[str, str]:
    keys = draw(st.lists(st.sampled_from(sorted(IMAGE_VALUES)), unique=True, max_size=3))
    return {k: draw(st.sampled_from(IMAGE_VALUES[k])) for k in keys}


@st.composite
def clouds(draw: Any, min_hosts: int = 2, max_hosts: int = 6) -> HostSnapshot:
    """Small random clouds exercising every field a built-in weigher reads."""
    n = draw(st.integers(min_hosts, max_hosts))
    builders = []
    for i in range(n):
        uuids = [f"inst-{i}-{k}" for k in range(draw(st.integers(0, 3)))]
        instances = {u: Instance(uuid=u, image_properties=draw(image_props())) for u in uuids}
        pci_kind = draw(st.sampled_from(["none", "pools", "free_count"]))
        pci: Any = None
        if pci_kind == "pools":
            pci = FakePools(draw(st.lists(st.integers(0, 80), max_size=3)))
        elif pci_kind == "free_count":
            pci = FakeFreeCount(draw(st.integers(0, 150)))
        metrics = [MetricItem(name, draw(st.floats(-100, 100, allow_nan=False)))
                   for name in METRIC_NAMES if draw(st.booleans())]
        b = host(
            f"h{i}",
            free_ram_mb=draw(st.integers(-2048, 16384)),
            free_disk_mb=draw(st.integers(-1024, 200_000)),
            vcpus_total=draw(st.integers(0, 64)),
            vcpus_used=draw(st.integers(0, 300)),
            cpu_allocation_ratio=draw(st.sampled_from([1.0, 1.5, 4.0, 16.0])),
            num_io_ops=draw(st.integers(0, 10)),
            num_instances=draw(st.integers(0, 40)),
            failed_builds=draw(st.integers(0, 3)),
            hypervisor_version=draw(st.one_of(st.none(), st.integers(0, 9_000_000))),
            cell_uuid=draw(st.sampled_from(CELLS + (None,))),
            instances=instances,
            metrics=metrics,
            pci_stats=pci,
        )
        for agg in draw(st.lists(st.sampled_from(["a1", "a2", "a3"]), unique=True, max_size=2)):
            b.in_aggregate(agg)
        builders.append(b)
    snap = cloud(*builders)
    # Aggregate metadata: per aggregate, a few multiplier overrides (some of them bad).
    from berth.model import Aggregate

    aggregates = []
    for agg in snap.aggregates:
        metadata = {}
        for key in draw(st.lists(st.sampled_from(MULTIPLIER_KEYS), unique=True, max_size=4)):
            metadata[key] = draw(st.sampled_from(["-2", "0", "0.5", "3", "1e6", "bad"]))
        aggregates.append(Aggregate(id=agg.id, name=agg.name, hosts=agg.hosts, metadata=metadata))
    snap.set_aggregates(aggregates)
    return snap


@st.composite
def requests(draw: Any, snap: HostSnapshot) -> RequestSpec:
    """A request with maybe a soft server group, a cross-cell destination and an image."""
    known = sorted(snap.instance_rows())
    group = None
    policy = draw(st.sampled_from([None, "soft-affinity", "soft-anti-affinity", "affinity"]))
    if policy is not None:
        members = draw(st.lists(st.sampled_from(known + ["stub-1", "stub-2", "gone"]),
                                max_size=6))
        group = InstanceGroup(policy=policy, members=members)
    dest = None
    if draw(st.booleans()):
        cell = draw(st.one_of(st.none(), st.sampled_from(CELLS)))
        dest = Destination(cell=CellMapping(cell) if cell else None,
                           allow_cross_cell_move=draw(st.booleans()))
    return make_spec(image_props=draw(image_props()), no_image=draw(st.booleans()), group=group,
                     requested_destination=dest)


def working_set_with_stubs(draw: Any, snap: HostSnapshot, spec: RequestSpec) -> WorkingSet:
    """A working set where this request already placed stubs and consumed on some rows."""
    ws = WorkingSet(snap, NOW)
    for uuid in ("stub-1", "stub-2"):
        if draw(st.booleans()):
            ws.add_instance(draw(st.integers(0, len(snap) - 1)), Instance(uuid=uuid))
    if draw(st.booleans()):
        ws.consume(draw(st.integers(0, len(snap) - 1)), spec)
    if draw(st.booleans()):
        # The request replaced a host's PCI stats and another's metrics (as consumption
        # or a custom filter may): both paths must see the replacement.
        ws.set_obj("pci_stats", draw(st.integers(0, len(snap) - 1)),
                   FakeFreeCount(draw(st.integers(0, 120))))
        ws.set_obj("metrics", draw(st.integers(0, len(snap) - 1)),
                   [MetricItem("mem.free", draw(st.floats(-5, 5, allow_nan=False)))])
    return ws


def property_configs() -> list[SchedulerConfig]:
    """Configurations the property tests sample (every weigher enabled in some of them)."""
    return _CONFIGS


_CONFIGS: list[SchedulerConfig] = []


def _build_configs() -> None:
    if _CONFIGS:
        return
    _CONFIGS.extend([
        config(metrics={"required": False}),
        config(
            filter_scheduler={"num_instances_weight_multiplier": -1.0,
                              "image_props_weight_multiplier": 1.5,
                              "image_props_weight_setting": ["os_distro=2", "hw_disk_bus=-1"]},
            metrics={"weight_setting": ["cpu.percent=1.0", "mem.free=-0.5"], "required": False},
        ),
        config(
            filter_scheduler={"ram_weight_multiplier": -1.0, "cpu_weight_multiplier": -2.0,
                              "io_ops_weight_multiplier": 3.0,
                              "image_props_weight_multiplier": -1.0},
            metrics={"weight_setting": ["cpu.percent=0", "mem.free=2", "mem.free=1"],
                     "required": False, "weight_of_unavailable": -5.0},
        ),
        config(
            filter_scheduler={"pci_weight_multiplier": 0.0, "build_failure_weight_multiplier": 0.5,
                              "cross_cell_move_weight_multiplier": 2.0,
                              "num_instances_weight_multiplier": 1.0},
            metrics={"weight_setting": ["cpu.percent=3"], "required": False,
                     "weight_multiplier": 0.0},
        ),
    ])


def check_paths_agree(weigher_classes: Sequence[type[BaseHostWeigher]], data: Any) -> None:
    """Draw a cloud, a request, a working set and a config; assert that each weigher's raw
    values and multipliers agree on both paths, and that the bulk handler gives the same
    weights (within 1e-9) and the same order as the per-host reference loop, on every
    host and on a random subset of hosts in random order."""
    _build_configs()
    snap = data.draw(clouds(), label="cloud")
    request = data.draw(requests(snap), label="request")
    ws = working_set_with_stubs(data.draw, snap, request)
    conf = data.draw(st.sampled_from(_CONFIGS), label="config")
    weighers = [cls(conf) for cls in weigher_classes]
    subset = data.draw(st.permutations(range(len(snap))), label="order")
    subset = subset[: data.draw(st.integers(0, len(subset)), label="size")]
    for rows in (list(range(len(snap))), list(subset)):
        for weigher in weighers:
            per_host = per_host_raw(weigher, ws, request, rows)
            bulk = bulk_raw(weigher, ws, request, rows)
            assert np.allclose(per_host, bulk, rtol=0, atol=1e-9), (type(weigher), per_host, bulk)
            mult_ph = [weigher.weight_multiplier(ws.host_state(r)) for r in rows]
            mult_bulk = weigher.multipliers_all_hosts(ws.hosts(np.asarray(rows, dtype=np.int64)))
            assert mult_ph == mult_bulk.tolist()
        expected, expected_order = reference_rank(weighers, ws, rows, request)
        ranking = bulk_rank(weighers, ws, rows, request)
        assert np.allclose(ranking.weights, expected, rtol=0, atol=1e-9)
        assert ranking.order.tolist() == expected_order
