"""Nova's normalization (reference §7.1 "Verified" values, §13 item 9) and the handler's
0-or-1-host rule, plus property tests of :func:`berth.weighers.normalize`."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from berth.weighers import normalize
from berth.weighers.base import BaseHostWeigher
from berth.weighers.ram import RAMWeigher
from builders import cloud, host, spec, working_set

from ._helpers import reference_normalize, weights_of


@pytest.mark.parametrize(
    ("weights", "minval", "maxval", "expected"),
    [
        pytest.param([1, 2, 3], None, None, [0.0, 0.5, 1.0], id="min-max spreads 1,2,3 over 0..1"),
        pytest.param([5, 5], None, None, [0.0, 0.0], id="all equal become 0"),
        pytest.param([5, 5], 0, None, [1.0, 1.0], id="all equal positive with minval 0 become 1"),
        pytest.param([-5, 5, 10], 0, None, [-0.5, 0.5, 1.0],
                     id="minval 0 divides by the maximum and does not clamp by itself"),
        pytest.param([0, 0], 0, None, [0.0, 0.0], id="all zero with minval 0 become 0"),
        pytest.param([3, 7], None, 10, [0.0, 4 / 7], id="an explicit maxval replaces the maximum"),
        pytest.param([], None, None, [], id="an empty list gives an empty result"),
    ],
)
def test_verified_values(weights, minval, maxval, expected):
    assert normalize(weights, minval, maxval).tolist() == pytest.approx(expected)


def test_ram_free_values_with_a_negative_host_clamp_to_zero_first():
    # RAMWeigher has minval 0: raw [512, 1024, -100] is clamped to [512, 1024, 0], then
    # divided by the maximum 1024 -> [0.5, 1.0, 0.0] (reference §7.1).
    snap = cloud(host("a", free_ram_mb=512), host("b", free_ram_mb=1024),
                 host("c", free_ram_mb=-100))
    weigher = RAMWeigher()
    raw = weigher.weigh_all_hosts(working_set(snap).hosts(), spec())
    assert normalize(raw, weigher.minval).tolist() == [0.5, 1.0, 0.0]


def test_all_negative_ram_with_minval_zero_weighs_every_host_zero():
    # Clamped to [0, 0]: minval == maxval == 0, so every host gets 0.
    snap = cloud(host("a", free_ram_mb=-5), host("b", free_ram_mb=-10))
    assert weights_of([RAMWeigher()], snap, spec()) == [0.0, 0.0]


def test_all_equal_positive_ram_weighs_one_because_of_minval_zero():
    snap = cloud(host("a", free_ram_mb=2048), host("b", free_ram_mb=2048))
    assert weights_of([RAMWeigher()], snap, spec()) == [1.0, 1.0]


class _Exploding(BaseHostWeigher):
    """A weigher that must never run."""

    def _weigh_object(self, host_state, weight_properties):
        raise AssertionError("weighed a single host")


def test_a_single_host_is_not_weighed_at_all():
    # With 0 or 1 hosts the handler returns before any weigher runs (weight 0.0).
    snap = cloud(host("only"))
    assert weights_of([_Exploding()], snap, spec()) == [0.0]


def test_no_hosts_rank_to_an_empty_list():
    from berth.host_state import WorkingSet
    from berth.weighers.handler import WeigherRanker

    snap = cloud(host("a"))
    ranking = WeigherRanker([_Exploding()]).rank(
        WorkingSet(snap, 0.0).hosts(np.zeros(0, dtype=np.int64)), spec())
    assert ranking.weights.tolist() == [] and ranking.order.tolist() == []


finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(finite, max_size=12), st.one_of(st.none(), finite), st.one_of(st.none(), finite))
def test_normalize_matches_the_plain_python_rule(weights, minval, maxval):
    got = normalize(weights, minval, maxval).tolist()
    assert got == pytest.approx(reference_normalize(weights, minval, maxval), abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.lists(finite, min_size=1, max_size=12))
def test_normalized_values_span_zero_to_one_unless_all_equal(weights):
    got = normalize(weights)
    if min(weights) == max(weights):
        assert got.tolist() == [0.0] * len(weights)
    else:
        assert got.min() == 0.0 and got.max() == pytest.approx(1.0)
