"""NumInstancesWeigher (reference §7.2): num_instances, min/max normalized,
num_instances_weight_multiplier (0.0: disabled by default)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from berth.weighers.num_instances import NumInstancesWeigher
from builders import cloud, host, spec

from ._helpers import check_paths_agree, config, multipliers_both, raw_both, weights_of


def test_raw_value_is_the_number_of_instances():
    snap = cloud(host("a", num_instances=3), host("b", num_instances=1))
    assert raw_both(NumInstancesWeigher(), snap, spec()) == [3, 1]


def test_disabled_by_default():
    snap = cloud(host("a", num_instances=3), host("b", num_instances=1))
    assert weights_of([NumInstancesWeigher()], snap, spec()) == [0.0, 0.0]


def test_a_negative_multiplier_spreads_with_min_max_normalization():
    # (3-1)/(3-1) = 1 and (1-1)/2 = 0, then (2-1)/2 = 0.5 for a third host; times -1
    snap = cloud(host("a", num_instances=3), host("b", num_instances=1),
                 host("c", num_instances=2))
    weigher = NumInstancesWeigher(config(filter_scheduler={"num_instances_weight_multiplier": -1}))
    assert weights_of([weigher], snap, spec()) == [-1.0, 0.0, -0.5]


def test_an_aggregate_can_enable_it_for_its_hosts():
    snap = cloud(host("a").in_aggregate("x", num_instances_weight_multiplier="1.5"), host("b"))
    assert multipliers_both(NumInstancesWeigher(), snap) == [1.5, 0.0]


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_bulk_and_per_host_paths_agree(data):
    check_paths_agree([NumInstancesWeigher], data)
