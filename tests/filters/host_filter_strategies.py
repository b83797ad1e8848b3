"""Hypothesis strategies for the capability/isolation filter tests: small random clouds.

Hosts get random services (disabled, forced down, old heartbeats), ``cpu_info`` JSON
(sometimes not JSON), ``stats``, ``supported_instances``, hypervisor versions and
aggregate memberships whose metadata mixes availability zones, tenants, image properties
and extra-spec keys (sometimes non-numeric). Requests get random extra specs and images.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from berth.model import ServiceRecord
from berth.snapshot import HostSnapshot
from builders import NOW, HostBuilder, cloud, host, spec

CPU_INFOS = [
    '{"vendor": "Intel", "features": ["aes", "mmx"], "maxphysaddr": {"bits": 46}}',
    '{"vendor": "AMD", "features": ["sse"], "maxphysaddr": {"bits": 48}, "arch": "x86_64"}',
    '{"vendor": "Intel"}',
    "{}",
    "not json",
    '{"maxphysaddr": {"bits": 0}}',
]
STATS = [
    {},
    {"foo": "bar", "num": "5"},
    {"foo": "baz", "num": "x"},
    {"opt1": {"b": {"aa": 2}}},
    {"hypervisor_version": "7"},
    {"foo": "bar", "other": "1"},
    {"num": 5},
    {"num": 5.0, "foo": True},
]
SUPPORTED = [
    [],
    [["x86_64", "kvm", "hvm"]],
    [["x86_64", "qemu", "hvm"], ["i686", "qemu", "hvm"]],
    [["aarch64", "kvm", "hvm"]],
    [["x86_64", "xen", "xen"]],
]
#: Aggregate metadata the random clouds draw from, key -> candidate values.
AGG_METADATA: dict[str, list[str]] = {
    "availability_zone": ["az1", "az2", "nova"],
    "filter_tenant_id": ["p1", "p1,p2", "p3"],
    "filter_tenant_id2": ["p2"],
    "hw_vm_mode": ["hvm, xen", "hvm", "exe"],
    "hw_cpu_cores": ["2", "4"],
    "os": ["linux"],
    "ssd": ["true", "false"],
    "cpu": ["8, 16", "4", "abc"],
    "a:b": ["x"],
}


@st.composite
def random_cloud(draw: Any, agg_keys: tuple[str, ...] | None = None) -> HostSnapshot:
    """1-6 hosts with random services, capabilities and aggregates (whose metadata keys
    come from ``agg_keys``, default every key of :data:`AGG_METADATA`)."""
    n = draw(st.integers(1, 6))
    agg_count = draw(st.integers(0, 3))
    aggs = []
    pool = sorted(agg_keys or AGG_METADATA)
    for i in range(agg_count):
        keys = draw(st.lists(st.sampled_from(pool), max_size=3, unique=True))
        aggs.append((f"agg{i}", {k: draw(st.sampled_from(AGG_METADATA[k])) for k in keys}))
    builders: list[HostBuilder] = []
    for i in range(n):
        service = ServiceRecord(
            host=f"h{i}",
            disabled=draw(st.booleans()) and draw(st.booleans()),
            forced_down=draw(st.booleans()) and draw(st.booleans()),
            last_seen_up=draw(st.sampled_from([None, NOW, NOW - 30, NOW - 61, NOW + 90])),
            created_at=draw(st.sampled_from([None, NOW - 10, NOW - 1000])),
        )
        b = host(
            f"h{i}",
            free_ram_mb=draw(st.sampled_from([-512, 0, 1024, 4096])),
            num_instances=draw(st.integers(0, 5)),
            hypervisor_type=draw(st.sampled_from(["QEMU", "kvm", None])),
            hypervisor_version=draw(st.sampled_from([None, 6000000, 7001000, 5002003])),
            cpu_info=draw(st.sampled_from(CPU_INFOS)),
            stats=dict(draw(st.sampled_from(STATS))),
            supported_instances=draw(st.sampled_from(SUPPORTED)),
            service=service,
        )
        for name, md in aggs:
            if draw(st.booleans()):
                b.in_aggregate(name, **md)
        builders.append(b)
    return cloud(*builders)


EXTRA_SPECS: dict[str, list[str]] = {
    "ssd": ["true", "<or> true <or> false", "s!= true"],
    "cpu": [">= 12", "= 4", "<in> 1"],
    "aggregate_instance_extra_specs:ssd": ["true", "false"],
    "aggregate_instance_extra_specs:a:b": ["x"],
    "a:b": ["x"],
    "hw:cpu_policy": ["dedicated"],
    "foo": ["bar", "<in> ba", "s> a"],
    "capabilities:foo": ["bar"],
    "capabilities:cpu_info:vendor": ["Intel", "s== AMD"],
    "capabilities:cpu_info:features": ["<all-in> aes", "<in> sse"],
    "capabilities:cpu_info:maxphysaddr:bits": [">= 47", "= 40"],
    "capabilities:hypervisor_type": ["QEMU", "<in> k"],
    "free_ram_mb": [">= 1000", "s== 1024", "<= 0"],
    "num_instances": ["<= 2", "= 3"],
    "hypervisor_version": [">= 6000000"],
    "capabilities:opt1:b:aa": ["2"],
    "capabilities:stats:foo": ["bar"],
    "hw:maxphysaddr_bits": ["46", "48"],
    "host": ["<in> h1", "s== h0"],
    "XXYY": ["1"],
    "num": ["= 3", ">= 6", "<or> 5"],
    "capabilities:supported_instances": ["<in> kvm"],
    "capabilities:cell_uuid": ["x"],
}


@st.composite
def random_extra_specs(draw: Any) -> dict[str, str]:
    """Up to four extra specs from :data:`EXTRA_SPECS`."""
    keys = draw(st.lists(st.sampled_from(sorted(EXTRA_SPECS)), max_size=4, unique=True))
    return {k: draw(st.sampled_from(EXTRA_SPECS[k])) for k in keys}


#: Extra specs AggregateInstanceExtraSpecsFilter evaluates against :data:`AGG_METADATA`.
AGGREGATE_SPECS: dict[str, list[str]] = {
    "ssd": ["true", "<or> true <or> false", "s!= true", "= 1"],
    "cpu": [">= 12", "= 4", "<in> 1", "8"],
    "aggregate_instance_extra_specs:ssd": ["true", "false"],
    "aggregate_instance_extra_specs:cpu": ["<= 8", "16"],
    "aggregate_instance_extra_specs:a:b": ["x"],
    "availability_zone": ["az1"],
    "hw:cpu_policy": ["dedicated"],
}


@st.composite
def random_aggregate_specs(draw: Any) -> Any:
    """A request whose extra specs mostly name aggregate metadata keys."""
    keys = draw(st.lists(st.sampled_from(sorted(AGGREGATE_SPECS)), max_size=2, unique=True))
    return spec(extra_specs={k: draw(st.sampled_from(AGGREGATE_SPECS[k])) for k in keys})


IMAGE_PROPS: dict[str, list[Any]] = {
    "hw_architecture": ["x86_64", "AMD64", "aarch64", "i386"],
    "img_hv_type": ["kvm", "qemu", "xapi", "KVM"],
    "hw_vm_mode": ["hvm", "xen", "exe", "HV"],
    "img_hv_requested_version": [">=6.0", ">=6.1,<8", "<6"],
    "hw_maxphysaddr_bits": [40, 47],
    "hw_cpu_cores": ["2", "4"],
}


@st.composite
def random_request(draw: Any) -> Any:
    """A request with random extra specs, image properties, project and zone."""
    props = {
        k: draw(st.sampled_from(v))
        for k, v in IMAGE_PROPS.items()
        if draw(st.booleans()) and draw(st.booleans())
    }
    return spec(
        extra_specs=draw(random_extra_specs()),
        image_props=props,
        image_id=draw(st.sampled_from(["image-1", "image-iso", None])),
        no_image=draw(st.booleans()) and draw(st.booleans()),
        project_id=draw(st.sampled_from([None, "p1", "p2", "p9"])),
        availability_zone=draw(st.sampled_from([None, "", "az1", "nova", "az1,az2", "az3"])),
    )


def both_paths(f: Any, snap: HostSnapshot, req: Any) -> list[bool] | str:
    """The per-host and the bulk verdicts, asserted equal ("error" if both raise an
    ExtraSpecError). The bulk path is also run on a reversed subset of the rows, as the
    pipeline calls it on the hosts still in play."""
    import numpy as np

    from berth.errors import ExtraSpecError
    from berth.host_state import WorkingSet
    from builders import NOW, passes_bulk, passes_per_host

    results: list[list[bool] | str] = []
    for run in (passes_per_host, passes_bulk):
        try:
            results.append(run(f, snap, req))
        except ExtraSpecError:
            results.append("error")
    assert results[0] == results[1], results
    rows = np.arange(len(snap))[::-1][::2]
    if isinstance(results[0], list):
        ws = WorkingSet(snap, NOW)
        subset = [bool(x) for x in f.filter_all_hosts(ws.hosts(rows), req)]
        assert subset == [results[0][r] for r in rows.tolist()]
    return results[0]
