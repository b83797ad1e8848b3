"""IoOpsWeigher (reference §7.2, §13 item 10): num_io_ops, minval 0, negative only by its
default multiplier io_ops_weight_multiplier (-1.0)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from berth.weighers.io_ops import IoOpsWeigher
from builders import cloud, host, spec

from ._helpers import check_paths_agree, config, multipliers_both, raw_both, weights_of


def test_raw_value_is_the_number_of_io_operations():
    snap = cloud(host("a", num_io_ops=3), host("b", num_io_ops=0))
    assert raw_both(IoOpsWeigher(), snap, spec()) == [3, 0]


def test_the_default_multiplier_prefers_idle_hosts():
    # normalized 3/3 = 1 and 0/3 = 0, times -1.0
    snap = cloud(host("a", num_io_ops=3), host("b", num_io_ops=0))
    assert weights_of([IoOpsWeigher()], snap, spec()) == [-1.0, 0.0]


def test_a_positive_multiplier_prefers_busy_hosts():
    snap = cloud(host("a", num_io_ops=3), host("b", num_io_ops=0))
    weigher = IoOpsWeigher(config(filter_scheduler={"io_ops_weight_multiplier": 2.0}))
    assert weights_of([weigher], snap, spec()) == [2.0, 0.0]


def test_all_equal_positive_io_ops_weigh_the_full_multiplier():
    # minval 0: [2, 2] -> [1, 1], times -1
    snap = cloud(host("a", num_io_ops=2), host("b", num_io_ops=2))
    assert weights_of([IoOpsWeigher()], snap, spec()) == [-1.0, -1.0]


def test_the_aggregate_override():
    snap = cloud(host("a").in_aggregate("x", io_ops_weight_multiplier="-10"), host("b"))
    assert multipliers_both(IoOpsWeigher(), snap) == [-10.0, -1.0]


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_bulk_and_per_host_paths_agree(data):
    check_paths_agree([IoOpsWeigher], data)
