"""DiskWeigher (reference §7.2): free_disk_mb, minval 0, disk_weight_multiplier (1.0)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from berth.weighers.disk import DiskWeigher
from builders import cloud, host, spec

from ._helpers import check_paths_agree, config, multipliers_both, raw_both, weights_of


def test_raw_value_is_free_disk_clamped_at_zero():
    snap = cloud(host("a", free_disk_mb=1000), host("b", free_disk_mb=-1))
    assert raw_both(DiskWeigher(), snap, spec()) == [1000, 0]


def test_more_free_disk_wins():
    # 500/1000 = 0.5, 1000/1000 = 1.0
    snap = cloud(host("a", free_disk_mb=500), host("b", free_disk_mb=1000))
    assert weights_of([DiskWeigher()], snap, spec()) == [0.5, 1.0]


def test_a_negative_multiplier_and_an_aggregate_override():
    snap = cloud(host("a", free_disk_mb=500).in_aggregate("x", disk_weight_multiplier="4"),
                 host("b", free_disk_mb=1000))
    weigher = DiskWeigher(config(filter_scheduler={"disk_weight_multiplier": -1.0}))
    assert multipliers_both(weigher, snap) == [4.0, -1.0]
    # 4 * 0.5 = 2.0 ; -1 * 1.0
    assert weights_of([weigher], snap, spec()) == [2.0, -1.0]


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_bulk_and_per_host_paths_agree(data):
    check_paths_agree([DiskWeigher], data)
