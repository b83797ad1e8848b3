"""BuildFailureWeigher (reference §7.2, §13 item 10): failed_builds, min/max normalized,
multiplier = minus build_failure_weight_multiplier (1e6), negated for overrides too."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from berth.weighers.build_failure import BuildFailureWeigher
from builders import cloud, host, spec

from ._helpers import check_paths_agree, config, multipliers_both, raw_both, weights_of


def test_raw_value_is_the_failed_builds_counter():
    snap = cloud(host("a", failed_builds=2), host("b", failed_builds=0))
    assert raw_both(BuildFailureWeigher(), snap, spec()) == [2, 0]


def test_the_effective_multiplier_is_minus_one_million():
    # normalized [1, 0] times -1e6
    snap = cloud(host("a", failed_builds=2), host("b", failed_builds=0))
    assert multipliers_both(BuildFailureWeigher(), snap) == [-1e6, -1e6]
    assert weights_of([BuildFailureWeigher()], snap, spec()) == [-1e6, 0.0]


def test_the_aggregate_override_is_negated_too():
    snap = cloud(host("a").in_aggregate("x", build_failure_weight_multiplier="10"),
                 host("b").in_aggregate("y", build_failure_weight_multiplier="-3"))
    assert multipliers_both(BuildFailureWeigher(), snap) == [-10.0, 3.0]


def test_a_configured_zero_disables_it():
    snap = cloud(host("a", failed_builds=5), host("b"))
    weigher = BuildFailureWeigher(config(filter_scheduler={"build_failure_weight_multiplier": 0}))
    assert [abs(w) for w in weights_of([weigher], snap, spec())] == [0.0, 0.0]


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_bulk_and_per_host_paths_agree(data):
    check_paths_agree([BuildFailureWeigher], data)
