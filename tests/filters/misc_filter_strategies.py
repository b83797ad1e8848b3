"""Hypothesis strategies shared by the tests of the misc/legacy filters: small random clouds.

Hosts get random numbers, aggregate memberships with random (sometimes bad) metadata,
instances with unique uuids, metrics and host IPs; requests get random flavors and hints.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from berth.host_state import WorkingSet
from berth.model import Instance, MetricItem
from berth.snapshot import HostSnapshot
from builders import NOW, HostBuilder, cloud, host

#: Instance uuids the random clouds draw from (each used on at most one host).
UUIDS = [f"inst-{i}" for i in range(12)]
#: Aggregate metadata values: good ints, a float-looking string, junk, spaces.
AGG_VALUES = ["0", "1", "2", "3", "5", "8", "2.5", "abc", " 4 ", "1.5", "-1"]
FLAVOR_IDS = [1, 2, 3]
METRIC_NAMES = ["cpu.percent", "cpu.frequency", "mem.used"]
HOST_IPS = [None, "10.0.0.5", "10.0.1.7", "10.1.0.9", "192.168.1.20", "fe80::1", "2001:db8::5"]


@st.composite
def random_cloud(draw: Any, agg_keys: tuple[str, ...] = ()) -> HostSnapshot:
    """A cloud of 1-7 hosts with random resources, aggregates, instances and metrics."""
    n = draw(st.integers(1, 7))
    uuids = draw(st.permutations(UUIDS))
    # Split the uuid pool into per-host slices so an instance is on one host only.
    cuts = sorted(draw(st.lists(st.integers(0, len(uuids)), min_size=n - 1, max_size=n - 1)))
    bounds = [0, *cuts, len(uuids)]
    agg_count = draw(st.integers(0, 3))
    agg_md = [
        {key: draw(st.sampled_from(AGG_VALUES)) for key in agg_keys if draw(st.booleans())}
        for _ in range(agg_count)
    ]
    builders: list[HostBuilder] = []
    for i in range(n):
        total_ram = draw(st.sampled_from([0, 1024, 4096, 8192]))
        total_disk = draw(st.sampled_from([0, 10, 40, 100]))
        vcpus_total = draw(st.sampled_from([0, 1, 2, 4, 8]))
        mine = uuids[bounds[i]:bounds[i + 1]] if draw(st.booleans()) else []
        instances = {
            u: Instance(uuid=u, instance_type_id=draw(st.sampled_from([*FLAVOR_IDS, None])))
            for u in mine
        }
        metrics = [MetricItem(name=m, value=1.0) for m in METRIC_NAMES if draw(st.booleans())]
        b = host(
            f"h{i}", node=draw(st.sampled_from([None, f"n{i}"])),
            total_usable_ram_mb=total_ram,
            free_ram_mb=draw(st.integers(-2048, total_ram)),
            total_usable_disk_gb=total_disk,
            free_disk_mb=draw(st.integers(-4096, total_disk * 1024)),
            vcpus_total=vcpus_total,
            vcpus_used=draw(st.integers(0, 20)),
            num_io_ops=draw(st.integers(0, 10)),
            num_instances=draw(st.integers(0, 60)),
            cpu_allocation_ratio=draw(st.sampled_from([0.5, 1.0, 4.0, 16.0])),
            ram_allocation_ratio=draw(st.sampled_from([0.5, 1.0, 1.5])),
            disk_allocation_ratio=draw(st.sampled_from([0.5, 1.0, 2.0])),
            instances=instances,
            metrics=metrics,
            host_ip=draw(st.sampled_from(HOST_IPS)),
            stats={"num_instances": "3", "io_workload": "1", "flavor": draw(st.sampled_from(["a", "b"]))},
        )
        for a in range(agg_count):
            if draw(st.booleans()):
                b.in_aggregate(f"agg{a}", **agg_md[a])
        builders.append(b)
    return cloud(*builders)


def run_both(f, snap, req):  # type: ignore[no-untyped-def]
    """(per-host passes, per-host limits, bulk passes, bulk limits) in fresh working sets."""
    ws1 = WorkingSet(snap, NOW)
    per_host = [f.host_passes(ws1.host_state(r), req) for r in range(len(snap))]
    per_host_limits = [dict(ws1.limits(r)) for r in range(len(snap))]
    ws2 = WorkingSet(snap, NOW)
    bulk = [bool(x) for x in f.filter_all_hosts(ws2.hosts(), req)]
    bulk_limits = [dict(ws2.limits(r)) for r in range(len(snap))]
    return per_host, per_host_limits, bulk, bulk_limits
