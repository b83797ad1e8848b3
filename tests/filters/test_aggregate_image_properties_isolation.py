"""AggregateImagePropertiesIsolation (reference §3.14)."""

from __future__ import annotations

import logging

import pytest
from host_filter_strategies import both_paths, random_cloud, random_request
from hypothesis import given, settings
from hypothesis import strategies as st

from berth.config import SchedulerConfig
from berth.errors import InputError
from berth.filters.aggregate_image_properties_isolation import AggregateImagePropertiesIsolation
from berth.snapshot import HostSnapshot
from builders import cloud, host, spec, state

SNAP = cloud(host("h1").in_aggregate("a", hw_vm_mode="hvm, xen", hw_cpu_cores="2"))


@pytest.mark.parametrize(
    ("props", "no_image", "expected"),
    [
        ({"hw_vm_mode": "exe"}, False, False),
        ({"hw_cpu_cores": "2"}, False, True),
        ({"hw_cpu_cores": 2}, False, True),
        ({"hw_cpu_cores": "4"}, False, False),
        ({"hw_vm_mode": "xen"}, False, True),
        ({}, True, True),
        ({}, False, True),
        ({"hw_cpu_cores": "0"}, False, True),
        ({"hw_cpu_cores": " 2 "}, False, True),
    ],
    ids=[
        "a property value outside the options fails",
        "a listed value passes",
        "the property is compared as str()",
        "another value fails",
        "any comma-separated option passes after stripping",
        "no image passes",
        "an image without the properties passes",
        "a falsy typed property (the integer 0) is ignored",
        "the property is compared as str() of its typed value",
    ],
)
def test_the_verified_examples_hold(props: dict[str, object], no_image: bool, expected: bool) -> None:
    req = spec(image_props=props, no_image=no_image)
    assert both_paths(AggregateImagePropertiesIsolation(), SNAP, req) == [expected]


def test_the_image_value_is_not_split() -> None:
    snap = cloud(host("h1").in_aggregate("a", os_distro="windows, linux"))
    f = AggregateImagePropertiesIsolation()
    assert both_paths(f, snap, spec(image_props={"os_distro": "windows,"})) == [False]
    assert both_paths(f, snap, spec(image_props={"os_distro": "linux"})) == [True]


def test_keys_that_are_not_image_properties_never_fail() -> None:
    snap = cloud(host("h1").in_aggregate("a", os="linux", foo="bar"))
    req = spec(image_props={"os": "windows", "foo": "baz", "os_type": "windows"})
    assert both_paths(AggregateImagePropertiesIsolation(), snap, req) == [True]


def test_the_legacy_property_name_is_read_through_its_new_name() -> None:
    snap = cloud(host("h1").in_aggregate("a", hw_architecture="x86_64"))
    req = spec(image_props={"architecture": "aarch64"})
    assert both_paths(AggregateImagePropertiesIsolation(), snap, req) == [False]


def test_enum_properties_are_compared_in_canonical_form_as_nova_stores_them() -> None:
    snap = cloud(host("h1").in_aggregate("a", hw_architecture="x86_64", hw_vm_mode="hvm"))
    f = AggregateImagePropertiesIsolation()
    assert both_paths(f, snap, spec(image_props={"hw_architecture": "AMD64", "hw_vm_mode": "HV"})) == [True]
    assert both_paths(f, snap, spec(image_props={"hw_architecture": "i386"})) == [False]


def test_an_invalid_enum_property_is_rejected_up_front() -> None:
    with pytest.raises(InputError, match="hw_vm_mode: expected one of exe, hvm, uml, xen, got 'warp'"):
        spec(image_props={"hw_vm_mode": "warp"})
    with pytest.raises(InputError, match="hw_vm_mode: expected one of .*, got ''"):
        spec(image_props={"hw_vm_mode": ""})


def test_booleans_compare_as_nova_writes_them() -> None:
    # Nova compares str() of the typed value: a true boolean is 'True', so an aggregate
    # listing 'true' rejects it, and a false one ('0', 'no', 'off') is ignored.
    snap = cloud(host("h1").in_aggregate("a", hw_boot_menu="true"))
    f = AggregateImagePropertiesIsolation()
    assert both_paths(f, snap, spec(image_props={"hw_boot_menu": "yes"})) == [False]
    assert both_paths(f, snap, spec(image_props={"hw_boot_menu": "0"})) == [True]
    snap = cloud(host("h1").in_aggregate("a", hw_boot_menu="True"))
    assert both_paths(f, snap, spec(image_props={"hw_boot_menu": "on"})) == [True]


def test_options_of_several_aggregates_are_united() -> None:
    snap = cloud(host("h1").in_aggregate("a", hw_vm_mode="hvm").in_aggregate("b", hw_vm_mode="xen"))
    req = spec(image_props={"hw_vm_mode": "xen"})
    assert both_paths(AggregateImagePropertiesIsolation(), snap, req) == [True]


def namespaced(namespace: str, separator: str = ".") -> AggregateImagePropertiesIsolation:
    return AggregateImagePropertiesIsolation(SchedulerConfig.from_dict({"filter_scheduler": {
        "aggregate_image_properties_isolation_namespace": namespace,
        "aggregate_image_properties_isolation_separator": separator,
    }}))


def test_with_a_namespace_only_keys_under_it_count(caplog: pytest.LogCaptureFixture) -> None:
    # Keys are looked up whole, so "hw" + "_" selects hw_* properties; "ns." keys are not
    # image properties and never fail.
    snap = cloud(host("h1").in_aggregate("a", hw_vm_mode="hvm", img_hv_type="kvm"))
    req = spec(image_props={"hw_vm_mode": "xen", "img_hv_type": "qemu"})
    with caplog.at_level(logging.WARNING):
        f = namespaced("hw", "_")
    assert "deprecated" in caplog.text
    assert both_paths(f, snap, req) == [False]
    assert both_paths(namespaced("img", "_"), snap, req) == [False]
    assert both_paths(namespaced("os", "_"), snap, req) == [True]
    snap2 = cloud(host("h1").in_aggregate("a", **{"ns.hw_vm_mode": "hvm"}))
    assert both_paths(namespaced("ns"), snap2, req) == [True]


def test_the_reason_names_the_property_and_the_options() -> None:
    reject = AggregateImagePropertiesIsolation().check(state(SNAP, "h1"), spec(image_props={"hw_vm_mode": "exe"}))
    assert reject is not None
    assert reject.render() == "image property not allowed in aggregate (property hw_vm_mode, image value exe, allowed hvm,xen)"


def test_class_attributes_match_nova() -> None:
    assert AggregateImagePropertiesIsolation.run_filter_once_per_request is True
    assert AggregateImagePropertiesIsolation.RUN_ON_REBUILD is True


@settings(max_examples=60, deadline=None)
@given(snap=random_cloud(), req=random_request(), ns=st.sampled_from([None, "hw"]))
def test_the_bulk_path_agrees_with_the_per_host_path(snap: HostSnapshot, req: object, ns: str | None) -> None:
    f = namespaced(ns, "_") if ns else AggregateImagePropertiesIsolation()
    both_paths(f, snap, req)
