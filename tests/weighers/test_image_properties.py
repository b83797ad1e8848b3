"""ImagePropertiesWeigher (reference §7.2): for each requested (property, str(value)) that
instances on the host share, add how many instances have it (times its ratio from
image_props_weight_setting when that is set); disabled when the configured
image_props_weight_multiplier is 0.0, whatever the aggregates say."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from berth.model import Instance
from berth.weighers.image_properties import ImagePropertiesWeigher
from builders import cloud, host, spec, working_set

from ._helpers import check_paths_agree, config, multipliers_both, raw_both, weights_of


def inst(uuid, **props):
    return Instance(uuid=uuid, image_properties=props)


def snap():
    return cloud(
        host("a", instances={
            "1": inst("1", os_distro="ubuntu", hw_disk_bus="virtio"),
            "2": inst("2", os_distro="ubuntu"),
            "3": inst("3", os_distro="rhel", hw_disk_bus="virtio"),
        }),
        host("b", instances={"4": inst("4", os_distro="rhel")}),
        host("c"),
    )


def weigher(multiplier=1.0, setting=()):
    return ImagePropertiesWeigher(config(filter_scheduler={
        "image_props_weight_multiplier": multiplier,
        "image_props_weight_setting": list(setting)}))


REQUEST = {"os_distro": "ubuntu", "hw_disk_bus": "virtio"}


def test_counts_instances_sharing_each_requested_property():
    # a: os_distro=ubuntu on 2 instances + hw_disk_bus=virtio on 2 -> 4 ; b and c: 0
    assert raw_both(weigher(), snap(), spec(image_props=REQUEST)) == [4.0, 0.0, 0.0]
    # normalized [1, 0, 0]
    assert weights_of([weigher()], snap(), spec(image_props=REQUEST)) == [1.0, 0.0, 0.0]


def test_the_setting_weighs_each_property_and_unlisted_ones_count_zero():
    # a: ubuntu 2 instances * 2.5 + virtio 2 instances * 0 (unlisted) = 5
    w = weigher(setting=["os_distro=2.5"])
    assert raw_both(w, snap(), spec(image_props=REQUEST)) == [5.0, 0.0, 0.0]


def test_a_repeated_setting_name_keeps_the_last_ratio():
    w = weigher(setting=["os_distro=2.5", "os_distro=-1"])
    assert raw_both(w, snap(), spec(image_props=REQUEST)) == [-2.0, 0.0, 0.0]


def test_values_compare_as_strings_and_legacy_names_are_translated():
    # "architecture" is the legacy name of hw_architecture on both sides
    s = cloud(host("a", instances={"1": inst("1", architecture="x86_64")}), host("b"))
    req = spec(image_props={"hw_architecture": "x86_64"})
    assert raw_both(weigher(), s, req) == [1.0, 0.0]


def test_a_request_without_an_image_weighs_zero():
    assert raw_both(weigher(), snap(), spec(no_image=True)) == [0.0, 0.0, 0.0]


def test_a_configured_zero_multiplier_disables_it_even_with_an_aggregate_override():
    s = cloud(host("a", instances={"1": inst("1", os_distro="ubuntu")}).in_aggregate(
        "x", image_props_weight_multiplier="5"), host("b"))
    w = weigher(multiplier=0.0)
    assert multipliers_both(w, s) == [5.0, 0.0]
    assert raw_both(w, s, spec(image_props=REQUEST)) == [0.0, 0.0]
    assert weights_of([w], s, spec(image_props=REQUEST)) == [0.0, 0.0]


def test_a_negative_multiplier_spreads_alike_images():
    w = weigher(multiplier=-1.0)
    assert weights_of([w], snap(), spec(image_props=REQUEST)) == [-1.0, 0.0, 0.0]


def test_instances_placed_earlier_in_the_request_count():
    s = snap()
    ws = working_set(s)
    ws.add_instance(1, inst("new", os_distro="ubuntu"))
    assert raw_both(weigher(), s, spec(image_props=REQUEST), ws) == [4.0, 1.0, 0.0]


def test_bad_setting_items_are_dropped_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        w = weigher(setting=["os_distro", "hw_disk_bus=x"])
    assert w.setting == {}
    assert "image_props_weight_setting" in caplog.text


@pytest.mark.parametrize("multiplier", [1.0, -2.0], ids=["packing", "spreading"])
def test_the_cached_pair_counts_follow_snapshot_changes(multiplier):
    s = snap()
    w = weigher(multiplier=multiplier)
    assert raw_both(w, s, spec(image_props=REQUEST))[1] == 0.0
    from berth.snapshot import HostRecord

    s.upsert(HostRecord(host="b", instances={"9": inst("9", os_distro="ubuntu")}))
    assert raw_both(w, s, spec(image_props=REQUEST))[1] == 1.0


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_bulk_and_per_host_paths_agree(data):
    check_paths_agree([ImagePropertiesWeigher], data)
