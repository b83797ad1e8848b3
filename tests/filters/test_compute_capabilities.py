"""ComputeCapabilitiesFilter (reference §3.3, §5)."""

from __future__ import annotations

import pytest
from host_filter_strategies import both_paths, random_cloud, random_request
from hypothesis import given, settings

from berth.errors import ExtraSpecError
from berth.filters.compute_capabilities import ComputeCapabilitiesFilter, capability_specs
from berth.model import Flavor, RequestSpec
from berth.snapshot import HostSnapshot
from builders import cloud, host, spec, state

CPU_INFO = '{"features":["aes","mmx"],"maxphysaddr":{"bits":46},"vendor":"Intel"}'
# The verified host: stats {foo: bar, num: '5'}, that cpu_info, free_ram_mb 1024.
SNAP = cloud(host("h1", stats={"foo": "bar", "num": "5"}, cpu_info=CPU_INFO, free_ram_mb=1024))


@pytest.mark.parametrize(
    ("extra_specs", "expected"),
    [
        ({"foo": "bar"}, True),
        ({"capabilities:foo": "bar"}, True),
        ({"nokey": "x"}, True),
        ({"capabilities:nokey": "x"}, False),
        ({"capabilities:cpu_info:features": "<all-in> aes"}, True),
        ({"capabilities:cpu_info:maxphysaddr:bits": ">= 40"}, True),
        ({"hw:maxphysaddr_bits": "48"}, False),
        ({"hw:maxphysaddr_bits": "46"}, True),
        ({"capabilities:cpu_info:vendor:x": "Intel"}, False),
        ({"capabilities:stats:foo": "bar"}, True),
        ({"capabilities:cpu_info": "<in> aes"}, True),
        ({"XXYY": "1"}, True),
        ({"free_ram_mb": ">= 300"}, True),
        ({"free_ram_mb": ">= 2048"}, False),
        ({"capabilities:free_ram_mb": "s== 1024"}, True),
        ({"capabilities:cpu_info:features": "['aes', 'mmx']"}, True),
        ({"capabilities:cpu_info:maxphysaddr": "{'bits': 46}"}, True),
        ({"capabilities:cpu_info:features": "<in> 'mmx']"}, True),
        ({"hw:cpu_policy": "dedicated", "trust:trusted_host": "trusted"}, True),
        ({"host": "<in> h", "hypervisor_type": "s== QEMU"}, True),
        ({"num_instances": "<= 10", "vcpus_used": "= 0"}, True),
        ({"capabilities:num": "= 3"}, True),
        ({"capabilities:hypervisor_version": "== 6000000"}, True),
        ({"capabilities:hypervisor_type:x": "QEMU"}, False),
    ],
    ids=[
        "an unscoped stats key is a capability",
        "a capabilities-scoped stats key",
        "an unscoped unknown key is ignored",
        "a scoped unknown key fails",
        "all-in is a substring test on the repr of the features list",
        "a nested JSON number compares numerically",
        "hw:maxphysaddr_bits is rewritten to at-least on cpu_info bits (fails)",
        "hw:maxphysaddr_bits equal to the host bits passes",
        "a path below a non-JSON string fails",
        "capabilities:stats: enters the stats dict",
        "the raw cpu_info JSON string can be matched",
        "an unrelated unscoped key passes",
        "a legacy unscoped attribute with a numeric operator",
        "a legacy attribute below the bound fails",
        "an attribute is matched as its str()",
        "a decoded list is its Python repr",
        "a decoded dict is its Python repr",
        "in on a repr",
        "other scopes are ignored",
        "HostState string attributes",
        "HostState counters",
        "a stats string compares numerically",
        "hypervisor_version is an attribute",
        "a path below a plain attribute string fails",
    ],
)
def test_the_verified_table_holds(extra_specs: dict[str, str], expected: bool) -> None:
    assert both_paths(ComputeCapabilitiesFilter(), SNAP, spec(extra_specs=extra_specs)) == [expected]


def test_a_non_numeric_host_value_under_a_numeric_operator_names_key_host_and_value() -> None:
    # Nova raises ValueError for foo='= 3' against stats foo=bar.
    f = ComputeCapabilitiesFilter()
    req = spec(extra_specs={"foo": "= 3"})
    f.validate_request(req)  # foo is not a HostState field: only the host can tell
    assert both_paths(f, SNAP, req) == "error"
    with pytest.raises(ExtraSpecError) as err:
        f.check(state(SNAP, "h1"), req)
    assert "'foo'" in str(err.value) and "'h1'" in str(err.value) and "'bar'" in str(err.value)


@pytest.mark.parametrize(
    ("extra_specs", "key"),
    [
        ({"capabilities:foo": "= many"}, "capabilities:foo"),
        ({"free_ram_mb": ">= lots"}, "free_ram_mb"),
        ({"hw:maxphysaddr_bits": "wide"}, "hw:maxphysaddr_bits"),
        ({"capabilities:cpu_info:vendor": "<or>"}, "capabilities:cpu_info:vendor"),
    ],
    ids=[
        "a non-numeric operand of a capability",
        "a non-numeric operand of a legacy attribute",
        "a non-numeric hw:maxphysaddr_bits names the flavor's key",
        "a bare <or>",
    ],
)
def test_malformed_requirements_are_rejected_up_front(extra_specs: dict[str, str], key: str) -> None:
    with pytest.raises(ExtraSpecError, match=key):
        ComputeCapabilitiesFilter().validate_request(spec(extra_specs=extra_specs))


def test_nested_stats_are_walked() -> None:
    snap = cloud(host("h1", stats={"opt1": {"b": {"aa": 2}}}))
    f = ComputeCapabilitiesFilter()
    assert both_paths(f, snap, spec(extra_specs={"capabilities:opt1:b:aa": "2"})) == [True]
    assert both_paths(f, snap, spec(extra_specs={"capabilities:opt1:b:zz": "2"})) == [False]


def test_a_missing_attribute_falls_back_to_stats() -> None:
    snap = cloud(host("h1", hypervisor_version=None, stats={"hypervisor_version": "7"}),
                 host("h2", hypervisor_version=None), host("h3", hypervisor_version=5))
    f = ComputeCapabilitiesFilter()
    assert both_paths(f, snap, spec(extra_specs={"hypervisor_version": ">= 6"})) == [True, False, False]


def test_a_flavor_without_extra_specs_passes() -> None:
    req = RequestSpec(flavor=Flavor(name="f", vcpus=1, memory_mb=1, extra_specs=None))  # type: ignore[arg-type]
    assert both_paths(ComputeCapabilitiesFilter(), SNAP, req) == [True]


def test_the_maxphysaddr_rewrite_replaces_an_explicit_capability() -> None:
    specs = capability_specs({"capabilities:cpu_info:maxphysaddr:bits": "1", "hw:maxphysaddr_bits": "40"})
    assert [(s.key, s.requirement.req) for s in specs] == [("hw:maxphysaddr_bits", ">= 40")]


def test_the_reason_names_key_requirement_and_host_value() -> None:
    f = ComputeCapabilitiesFilter()
    reject = f.check(state(SNAP, "h1"), spec(extra_specs={"capabilities:cpu_info:vendor": "AMD"}))
    assert reject is not None
    assert reject.render() == "capability mismatch (key capabilities:cpu_info:vendor, requested AMD, host value Intel)"
    reject = f.check(state(SNAP, "h1"), spec(extra_specs={"capabilities:nokey": "x"}))
    assert reject is not None and reject.numbers["host_value"] == "(missing)"


def test_class_attributes_match_nova() -> None:
    assert ComputeCapabilitiesFilter.run_filter_once_per_request is True
    assert ComputeCapabilitiesFilter.RUN_ON_REBUILD is False


def test_bulk_evaluates_a_shared_cpu_info_once_for_many_hosts() -> None:
    snap = cloud(*[host(f"h{i}", free_ram_mb=i * 100) for i in range(50)])
    req = spec(extra_specs={"capabilities:cpu_info:vendor": "Intel", "free_ram_mb": ">= 2500"})
    assert both_paths(ComputeCapabilitiesFilter(), snap, req) == [i >= 25 for i in range(50)]


@settings(max_examples=60, deadline=None)
@given(snap=random_cloud(), req=random_request())
def test_the_bulk_path_agrees_with_the_per_host_path(snap: HostSnapshot, req: object) -> None:
    both_paths(ComputeCapabilitiesFilter(), snap, req)


def test_both_paths_see_this_requests_virtual_consumption() -> None:
    import numpy as np

    from berth.host_state import WorkingSet
    from builders import NOW

    snap = cloud(host("h1", free_ram_mb=4096), host("h2", free_ram_mb=4096))
    ws = WorkingSet(snap, NOW)
    ws.consume(0, spec(memory_mb=1024))
    req = spec(extra_specs={"free_ram_mb": ">= 4000", "vcpus_used": "s== 0"})
    f = ComputeCapabilitiesFilter()
    bulk = f.filter_all_hosts(ws.hosts(np.arange(2)), req).tolist()
    assert bulk == [f.host_passes(ws.host_state(r), req) for r in range(2)] == [False, True]


def test_reports_that_keep_changing_stats_leave_no_table_entries_behind() -> None:
    """Every report extends the stats table; what the filter derives from it must not
    be kept once per table length (that would grow with every report)."""
    from berth.host_state import WorkingSet
    from berth.snapshot import HostRecord
    from builders import NOW

    snap = cloud(host("a", stats={"gpu": "1"}), host("b"))
    f = ComputeCapabilitiesFilter()
    req = spec(extra_specs={"capabilities:gpu": "1"})
    for n in range(50):
        snap.upsert(HostRecord("b", stats={"gpu": "1", "num_instances": str(n)}))
        hosts = WorkingSet(snap, NOW).hosts()
        assert f.filter_all_hosts(hosts, req).tolist() == [True, True]
    assert len(snap.table("stats")) > 50
    assert len(snap._table_cache) <= 2


def test_keys_under_service_fail_as_in_nova() -> None:
    """Nova's host state keeps its service as a ReadOnlyDict (a UserDict, not a dict):
    the filter looks a key up as an attribute, then in the dict's `stats` (an
    AttributeError), and fails every host; only the UserDict's own `data` resolves
    (found by a differential run against Nova 34)."""
    snap = cloud(host("h1"), host("h2"))
    f = ComputeCapabilitiesFilter()
    for value in ("False", "True"):
        req = spec(extra_specs={"capabilities:service:disabled": value})
        assert both_paths(f, snap, req) == [False, False]
    req = spec(extra_specs={"capabilities:service:data:disabled": "False"})
    assert both_paths(f, snap, req) == [True, True]


def test_updated_shows_as_nova_s_datetime() -> None:
    snap = cloud(host("h1", updated=1.7e9))  # 2023-11-14 22:13:20 UTC
    f = ComputeCapabilitiesFilter()
    assert both_paths(f, snap, spec(extra_specs={"capabilities:updated": "<in> 2023-11-14"})) \
        == [True]
    assert both_paths(f, snap, spec(extra_specs={"capabilities:updated": "<in> 1700"})) \
        == [False]


def test_supported_instances_show_as_nova_s_canonical_triples() -> None:
    """Nova's host state holds the canonical triples (HVSpec), for every filter that
    reads them; Berth's held the raw ones (found by a review)."""
    snap = cloud(host("h1", supported_instances=[["x86_64", "QEMU", "hvm"]]),
                 host("h2", supported_instances=[["amd64", "qemu", "hvm"]]))
    f = ComputeCapabilitiesFilter()
    for value, expected in (("<in> qemu", [True, True]), ("<in> x86_64", [True, True]),
                            ("<in> amd64", [False, False])):
        req = spec(extra_specs={"capabilities:supported_instances": value})
        assert both_paths(f, snap, req) == expected, value
