"""CPUWeigher (reference §7.2): vcpus_total * cpu_allocation_ratio - vcpus_used, minval 0,
cpu_weight_multiplier (1.0)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from berth.errors import InputError
from berth.weighers.cpu import CPUWeigher, MissingAllocationRatio
from builders import cloud, host, spec, working_set

from ._helpers import check_paths_agree, config, multipliers_both, raw_both, weights_of


def test_raw_value_is_free_vcpus_with_the_allocation_ratio():
    # 4 * 4.0 - 2 = 14 ; 16 * 1.5 - 30 = -6, clamped to 0
    snap = cloud(host("a", vcpus_total=4, cpu_allocation_ratio=4.0, vcpus_used=2),
                 host("b", vcpus_total=16, cpu_allocation_ratio=1.5, vcpus_used=30))
    assert raw_both(CPUWeigher(), snap, spec()) == [14.0, 0.0]


def test_more_free_vcpus_win_and_all_equal_positive_weigh_one():
    # 14/16 = 0.875 and 16/16 = 1.0 ; equal positive values both become 1.0 (minval 0)
    snap = cloud(host("a", vcpus_total=4, vcpus_used=2), host("b", vcpus_total=4))
    assert weights_of([CPUWeigher()], snap, spec()) == [0.875, 1.0]
    same = cloud(host("a", vcpus_total=4), host("b", vcpus_total=4))
    assert weights_of([CPUWeigher()], same, spec()) == [1.0, 1.0]


def test_a_negative_multiplier_stacks():
    snap = cloud(host("a", vcpus_total=4, vcpus_used=2), host("b", vcpus_total=4))
    weigher = CPUWeigher(config(filter_scheduler={"cpu_weight_multiplier": -2.0}))
    assert weights_of([weigher], snap, spec()) == [-1.75, -2.0]


def test_the_aggregate_override_takes_the_minimum():
    snap = cloud(host("a").in_aggregate("x", cpu_weight_multiplier="5").in_aggregate(
        "y", cpu_weight_multiplier="0.25"))
    assert multipliers_both(CPUWeigher(), snap) == [0.25]


def test_a_host_without_an_allocation_ratio_is_a_clear_error_on_both_paths():
    snap = cloud(host("a"), host("b", cpu_allocation_ratio=None))
    ws = working_set(snap)
    with pytest.raises(MissingAllocationRatio, match="b/b reports no cpu_allocation_ratio"):
        CPUWeigher()._weigh_object(ws.host_state(1), spec())
    with pytest.raises(InputError, match="cpu_allocation_ratio"):
        CPUWeigher().weigh_all_hosts(ws.hosts(), spec())
    assert math.isnan(snap.num("cpu_allocation_ratio")[1])


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_bulk_and_per_host_paths_agree(data):
    check_paths_agree([CPUWeigher], data)
