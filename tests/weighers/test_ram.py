"""RAMWeigher (reference §7.2): free_ram_mb, minval 0, ram_weight_multiplier (1.0)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from berth.weighers.ram import RAMWeigher
from builders import cloud, host, spec

from ._helpers import check_paths_agree, config, multipliers_both, raw_both, weights_of


def test_raw_value_is_free_ram_clamped_at_zero():
    snap = cloud(host("a", free_ram_mb=512), host("b", free_ram_mb=-100))
    assert raw_both(RAMWeigher(), snap, spec()) == [512, 0]


def test_more_free_ram_wins_by_default():
    # normalized: 1024/2048 = 0.5 and 2048/2048 = 1.0, times multiplier 1.0
    snap = cloud(host("a", free_ram_mb=1024), host("b", free_ram_mb=2048))
    assert weights_of([RAMWeigher()], snap, spec()) == [0.5, 1.0]


def test_a_negative_multiplier_stacks():
    # -1 * [0.5, 1.0]: the host with less free RAM now wins
    snap = cloud(host("a", free_ram_mb=1024), host("b", free_ram_mb=2048))
    weigher = RAMWeigher(config(filter_scheduler={"ram_weight_multiplier": -1.0}))
    assert weights_of([weigher], snap, spec()) == [-0.5, -1.0]


def test_the_aggregate_override_takes_the_minimum_per_host():
    snap = cloud(host("a").in_aggregate("x", ram_weight_multiplier="2").in_aggregate(
        "y", ram_weight_multiplier="-1.5"), host("b"))
    assert multipliers_both(RAMWeigher(), snap) == [-1.5, 1.0]


def test_a_bad_aggregate_value_falls_back_to_the_option():
    snap = cloud(host("a").in_aggregate("x", ram_weight_multiplier="two"))
    weigher = RAMWeigher(config(filter_scheduler={"ram_weight_multiplier": 3.0}))
    assert multipliers_both(weigher, snap) == [3.0]


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_bulk_and_per_host_paths_agree(data):
    check_paths_agree([RAMWeigher], data)
