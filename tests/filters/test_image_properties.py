"""ImagePropertiesFilter (reference §3.4)."""

from __future__ import annotations

import numpy as np
import pytest
from host_filter_strategies import both_paths, random_cloud, random_request
from hypothesis import given, settings
from hypothesis import strategies as st

from berth.config import SchedulerConfig
from berth.errors import InputError
from berth.filters.base import BaseHostFilter
from berth.filters.image_properties import (
    ImagePropertiesFilter,
    canonical_architecture,
    canonical_hv_type,
    canonical_vm_mode,
    parse_version_predicate,
    version_to_str,
)
from berth.host_state import WorkingSet
from berth.snapshot import HostRecord, HostSnapshot
from builders import NOW, cloud, host, passes_bulk, spec, state

# The verified host: [['x86_64','kvm','hvm']], hypervisor_version 6000000.
SNAP = cloud(host("h1", supported_instances=[["x86_64", "kvm", "hvm"]], hypervisor_version=6000000))


@pytest.mark.parametrize(
    ("props", "expected"),
    [
        ({}, True),
        ({"hw_architecture": "aarch64"}, False),
        ({"img_hv_type": "qemu"}, False),
        ({"img_hv_requested_version": ">=6.0"}, True),
        ({"img_hv_requested_version": "<1"}, True),
        ({"hw_architecture": "x86_64", "img_hv_requested_version": ">=6.1"}, False),
        ({"hw_architecture": "x86_64", "img_hv_requested_version": ">=6.0,<7"}, True),
        ({"hw_architecture": "x86_64", "img_hv_requested_version": "== 6.0.0"}, True),
        ({"hw_architecture": "X86_64", "img_hv_type": "KVM", "hw_vm_mode": "HV"}, True),
        ({"hw_architecture": "amd64"}, True),
        ({"architecture": "x86_64", "hypervisor_type": "kvm", "vm_mode": "hvm"}, True),
        ({"hw_vm_mode": "xen"}, False),
        ({"img_hv_type": "hvm"}, False),
        ({"hw_architecture": "x86_64", "hw_maxphysaddr_bits": 46}, True),
        ({"hw_architecture": "x86_64", "hw_maxphysaddr_bits": "47"}, False),
        ({"hw_maxphysaddr_bits": 99}, True),
    ],
    ids=[
        "an image asking nothing passes",
        "another architecture fails",
        "another hypervisor type fails",
        "a version alone is not checked",
        "even an unsatisfiable version alone is not checked",
        "a version above the host's fails",
        "a range containing the host passes",
        "equal versions with a different number of parts match",
        "values are canonicalized case-insensitively",
        "amd64 is x86_64",
        "legacy property names are read",
        "xen mode is not supported",
        "hypervisor type hvm is not a valid type",
        "enough physical address bits pass",
        "too few physical address bits fail",
        "bits alone are not checked",
    ],
)
def test_the_verified_examples_hold(props: dict[str, object], expected: bool) -> None:
    f = ImagePropertiesFilter()
    if props.get("img_hv_type") == "hvm":
        # Nova's typed ImageMetaProps refuses the image before any filter runs.
        with pytest.raises(InputError, match="img_hv_type: expected one of .*, got 'hvm'"):
            spec(image_props=props)
        return
    assert both_paths(f, SNAP, spec(image_props=props)) == [expected]


def test_membership_is_in_the_triple_not_by_position() -> None:
    snap = cloud(host("h1", supported_instances=[["kvm", "hvm", "x86_64"]]))
    req = spec(image_props={"hw_architecture": "x86_64", "img_hv_type": "kvm"})
    assert both_paths(ImagePropertiesFilter(), snap, req) == [True]


def test_a_host_s_triples_are_canonicalized_as_nova_loads_them() -> None:
    """Nova's HVSpec fields canonicalize what a compute reported (found by a differential
    run against Nova 34: Berth compared canonical image values with raw host values)."""
    snap = cloud(host("h1", supported_instances=[["X86_64", "QEMU", "HVM"]]),
                 host("h2", supported_instances=[["amd64", "kvm", "pv"]]))
    f = ImagePropertiesFilter()
    assert both_paths(f, snap, spec(image_props={"img_hv_type": "qemu"})) == [True, False]
    assert both_paths(f, snap, spec(image_props={"hw_vm_mode": "xen"})) == [False, True]
    assert both_paths(f, snap, spec(image_props={"hw_architecture": "x86_64"})) == [True, True]


def test_all_requested_values_must_be_in_one_triple() -> None:
    snap = cloud(host("h1", supported_instances=[["x86_64", "qemu", "hvm"], ["aarch64", "kvm", "hvm"]]))
    f = ImagePropertiesFilter()
    assert both_paths(f, snap, spec(image_props={"hw_architecture": "x86_64", "img_hv_type": "kvm"})) == [False]
    assert both_paths(f, snap, spec(image_props={"hw_architecture": "aarch64", "img_hv_type": "kvm"})) == [True]


def test_a_host_without_supported_instances_fails_any_request() -> None:
    snap = cloud(host("h1", supported_instances=[]))
    f = ImagePropertiesFilter()
    assert both_paths(f, snap, spec(image_props={"hw_vm_mode": "hvm"})) == [False]
    assert both_paths(f, snap, spec(image_props={})) == [True]


def test_no_image_passes() -> None:
    snap = cloud(host("h1", supported_instances=[]))
    assert both_paths(ImagePropertiesFilter(), snap, spec(no_image=True)) == [True]


def test_the_default_architecture_applies_to_images_without_one() -> None:
    f = ImagePropertiesFilter(SchedulerConfig.from_dict(
        {"filter_scheduler": {"image_properties_default_architecture": "aarch64"}}))
    assert both_paths(f, SNAP, spec(image_props={})) == [False]
    assert both_paths(f, SNAP, spec(no_image=True)) == [False]
    assert both_paths(f, SNAP, spec(image_props={"hw_architecture": "x86_64"})) == [True]


def test_a_host_without_a_version_skips_the_version_check() -> None:
    snap = cloud(host("h1", hypervisor_version=None), host("h2", hypervisor_version=0))
    req = spec(image_props={"hw_architecture": "x86_64", "img_hv_requested_version": ">=99"})
    assert both_paths(ImagePropertiesFilter(), snap, req) == [True, True]


@pytest.mark.parametrize(
    "cpu_info",
    ["not json", "[]", "{}", '{"maxphysaddr": {}}', '{"maxphysaddr": {"bits": 0}}', '{"maxphysaddr": 5}'],
    ids=["not JSON", "not an object", "no maxphysaddr", "no bits", "zero bits", "maxphysaddr not an object"],
)
def test_unknown_host_bits_skip_the_bits_check(cpu_info: str) -> None:
    snap = cloud(host("h1", cpu_info=cpu_info))
    req = spec(image_props={"hw_architecture": "x86_64", "hw_maxphysaddr_bits": 64})
    assert both_paths(ImagePropertiesFilter(), snap, req) == [True]


def test_non_numeric_host_bits_are_an_input_error_naming_the_host() -> None:
    snap = cloud(host("h1", cpu_info='{"maxphysaddr": {"bits": "wide"}}'))
    req = spec(image_props={"hw_architecture": "x86_64", "hw_maxphysaddr_bits": 40})
    with pytest.raises(InputError, match="'h1'.*'wide'"):
        ImagePropertiesFilter().check(state(snap, "h1"), req)


@pytest.mark.parametrize(
    ("props", "field"),
    [
        ({"hw_architecture": "z80"}, "hw_architecture"),
        ({"img_hv_type": "hyper"}, "img_hv_type"),
        ({"hw_vm_mode": "vm"}, "hw_vm_mode"),
        ({"hw_architecture": "x86_64", "img_hv_requested_version": "~6"}, "img_hv_requested_version"),
        ({"hw_architecture": "x86_64", "img_hv_requested_version": ">=six"}, "img_hv_requested_version"),
        ({"hw_architecture": "x86_64", "img_hv_requested_version": ">=6,"}, "img_hv_requested_version"),
        ({"hw_architecture": "x86_64", "hw_maxphysaddr_bits": "many"}, "hw_maxphysaddr_bits"),
    ],
    ids=["an unknown architecture", "an unknown hypervisor type", "an unknown VM mode",
         "a predicate without operator", "a predicate with a bad version",
         "a predicate with an empty part", "non-integer bits"],
)
def test_invalid_image_properties_are_rejected_up_front(props: dict[str, object], field: str) -> None:
    with pytest.raises(InputError, match=field):
        ImagePropertiesFilter().validate_request(spec(image_props=props))


def test_canonicalization_rules() -> None:
    assert [canonical_architecture(a) for a in ("i386", "i486", "i586", "x86_32", "x86_32p", "AMD64", None)] == \
        ["i686"] * 5 + ["x86_64", None]
    assert canonical_hv_type("XAPI") == "xen"
    assert [canonical_vm_mode(m) for m in ("pv", "hv", "baremetal", "EXE")] == ["xen", "hvm", "hvm", "exe"]


def test_versions_are_base_1000_groups() -> None:
    assert version_to_str(6000000) == "6.0.0"
    assert version_to_str(2011001) == "2.11.1"
    assert version_to_str(5) == "5"
    assert [op for op, _ in parse_version_predicate(">=6.0, <7 ,!=6.5")] == [">=", "<", "!="]


def test_reasons_say_what_did_not_fit() -> None:
    f = ImagePropertiesFilter()
    hs = state(SNAP, "h1")
    reject = f.check(hs, spec(image_props={"hw_architecture": "aarch64"}))
    assert reject is not None
    assert reject.render() == "image properties unsupported (requested aarch64,-,-, supported x86_64,kvm,hvm)"
    reject = f.check(hs, spec(image_props={"hw_architecture": "x86_64", "img_hv_requested_version": ">=6.1"}))
    assert reject is not None
    assert reject.numbers == {"requested_version": ">=6.1", "hypervisor_version": "6.0.0"}
    reject = f.check(hs, spec(image_props={"hw_architecture": "x86_64", "hw_maxphysaddr_bits": 50}))
    assert reject is not None
    assert reject.numbers == {"requested_bits": 50, "host_bits": 46.0}


def test_class_attributes_match_nova() -> None:
    assert ImagePropertiesFilter.run_filter_once_per_request is True
    assert ImagePropertiesFilter.RUN_ON_REBUILD is True


@settings(max_examples=60, deadline=None)
@given(snap=random_cloud(), req=random_request(),
       default_arch=st.sampled_from([None, "x86_64", "aarch64"]))
def test_the_bulk_path_agrees_with_the_per_host_path(
    snap: HostSnapshot, req: object, default_arch: str | None
) -> None:
    f = ImagePropertiesFilter(SchedulerConfig.from_dict(
        {"filter_scheduler": {"image_properties_default_architecture": default_arch}}))
    both_paths(f, snap, req)


def test_triple_verdicts_are_kept_per_table_and_follow_a_new_signature() -> None:
    snap = cloud(host("h1", supported_instances=[["x86_64", "kvm", "hvm"]]),
                 host("h2", supported_instances=[["aarch64", "kvm", "hvm"]]))
    f = ImagePropertiesFilter()
    req = spec(image_props={"hw_architecture": "x86_64"})
    assert passes_bulk(f, snap, req) == [True, False]
    cached = dict(snap._table_cache)
    assert any(isinstance(k, tuple) and k[0] == "ImagePropertiesFilter.triples" for k in cached)
    snap.update_host(1, hypervisor_version=7000000.0)  # numbers only: the index stays
    snap.upsert(HostRecord("h1", supported_instances=[["x86_64", "kvm", "hvm"]]))  # same one
    assert passes_bulk(f, snap, req) == [True, False]
    assert snap._table_cache == cached
    snap.upsert(HostRecord("h2", supported_instances=[["x86_64", "qemu", "hvm"]]))
    assert passes_bulk(f, snap, req) == [True, True]


def test_versions_and_bits_are_read_from_the_current_numbers() -> None:
    snap = cloud(host("h1", hypervisor_version=6000000), host("h2", hypervisor_version=7000000))
    f = ImagePropertiesFilter()
    req = spec(image_props={"hw_architecture": "x86_64", "img_hv_requested_version": ">=7.0"})
    assert passes_bulk(f, snap, req) == [False, True]
    snap.update_host(0, hypervisor_version=7001000.0)  # a partial report: numbers in place
    assert passes_bulk(f, snap, req) == [True, True]


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [3, 2, 1, 0], [1, 3]])
def test_the_bulk_error_names_the_first_host_in_order_as_the_per_host_path_does(
    order: list[int],
) -> None:
    snap = cloud(host("h1", hypervisor_version=6000000),
                 host("h2", cpu_info='{"maxphysaddr": {"bits": "wide"}}'),
                 host("h3", hypervisor_version=-5),
                 host("h4", cpu_info='{"maxphysaddr": {"bits": "many"}}'))
    f = ImagePropertiesFilter()
    req = spec(image_props={"hw_architecture": "x86_64", "img_hv_requested_version": ">=1.0",
                            "hw_maxphysaddr_bits": 40})
    hosts = WorkingSet(snap, NOW).hosts(np.array(order))
    errors = []
    for run in (f.filter_all_hosts, lambda h, r: BaseHostFilter.filter_all_hosts(f, h, r)):
        with pytest.raises(InputError) as caught:
            run(hosts, req)
        errors.append(str(caught.value))
    assert errors[0] == errors[1]
    assert f"'h{order[1] + 1 if order[0] == 0 else order[0] + 1}'" in errors[0]


def test_maxphysaddr_bits_are_compared_where_nova_would_raise_a_documented_deviation() -> None:
    # Nova 34 calls .get on the cpu_info JSON string and raises AttributeError at the first
    # host whose triple matches; Berth decodes cpu_info and compares the bits
    # (docs/architecture.md, "Deliberate deviations from Nova").
    snap = cloud(host("wide", cpu_info='{"maxphysaddr": {"bits": 46}}'),
                 host("narrow", cpu_info='{"maxphysaddr": {"bits": 39}}'))
    req = spec(image_props={"hw_architecture": "x86_64", "hw_maxphysaddr_bits": 42})
    assert both_paths(ImagePropertiesFilter(), snap, req) == [True, False]
