"""HypervisorVersionWeigher (reference §7.2): hypervisor_version or 0, min/max normalized,
hypervisor_version_weight_multiplier (1.0)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from berth.weighers.hypervisor_version import HypervisorVersionWeigher
from builders import cloud, host, spec

from ._helpers import check_paths_agree, config, multipliers_both, raw_both, weights_of


def test_an_unreported_version_counts_as_zero():
    snap = cloud(host("a", hypervisor_version=8000000), host("b", hypervisor_version=None))
    assert raw_both(HypervisorVersionWeigher(), snap, spec()) == [8000000, 0]


def test_newer_hypervisors_win():
    # (6e6 - 6e6)/(8e6 - 6e6) = 0, then 1.0, then 0.5
    snap = cloud(host("a", hypervisor_version=6000000), host("b", hypervisor_version=8000000),
                 host("c", hypervisor_version=7000000))
    assert weights_of([HypervisorVersionWeigher()], snap, spec()) == [0.0, 1.0, 0.5]


def test_a_negative_multiplier_prefers_older_ones_and_aggregates_override():
    conf = config(filter_scheduler={"hypervisor_version_weight_multiplier": -1.0})
    snap = cloud(host("a", hypervisor_version=6000000),
                 host("b", hypervisor_version=8000000).in_aggregate(
                     "x", hypervisor_version_weight_multiplier="2"))
    assert multipliers_both(HypervisorVersionWeigher(conf), snap) == [-1.0, 2.0]


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_bulk_and_per_host_paths_agree(data):
    check_paths_agree([HypervisorVersionWeigher], data)
