"""MetricsWeigher (reference §7.2, §11.3): Σ value × ratio over [metrics] weight_setting,
min/max normalized; missing metrics raise (required) or weigh weight_of_unavailable;
[metrics] weight_multiplier with aggregate key metrics_weight_multiplier."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from berth.errors import SchedulingError
from berth.model import MetricItem
from berth.weighers.metrics import ComputeHostMetricNotFound, MetricsWeigher
from builders import cloud, host, spec, working_set

from ._helpers import check_paths_agree, config, multipliers_both, raw_both, weights_of


def metrics(**values):
    return [MetricItem(name.replace("_", "."), value) for name, value in values.items()]


def weigher(**opts):
    return MetricsWeigher(config(metrics=opts))


def test_weighted_sum_of_the_configured_metrics():
    # a: 50*1 + 1000*-0.01 = 40 ; b: 10*1 + 500*-0.01 = 5
    snap = cloud(host("a", metrics=metrics(cpu_percent=50, mem_free=1000)),
                 host("b", metrics=metrics(cpu_percent=10, mem_free=500)))
    w = weigher(weight_setting=["cpu.percent=1", "mem.free=-0.01"])
    assert raw_both(w, snap, spec()) == pytest.approx([40.0, 5.0])
    # min/max normalized: [1, 0]
    assert weights_of([w], snap, spec()) == [1.0, 0.0]


def test_duplicate_setting_names_each_count():
    # 50*1 + 50*2 = 150
    snap = cloud(host("a", metrics=metrics(cpu_percent=50)), host("b"))
    w = weigher(weight_setting=["cpu.percent=1", "cpu.percent=2"], required=False)
    assert raw_both(w, snap, spec())[0] == 150.0


def test_bad_setting_items_are_dropped_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        w = weigher(weight_setting=["cpu.percent", "=5", "mem.free=2.0t", "cpu.percent=3"])
    assert w.setting == [("cpu.percent", 3.0)]
    assert "mem.free=2.0t" in caplog.text


def test_no_setting_weighs_every_host_zero():
    snap = cloud(host("a"), host("b"))
    assert raw_both(weigher(), snap, spec()) == [0.0, 0.0]


def test_a_missing_metric_is_an_error_when_required():
    snap = cloud(host("a", metrics=metrics(cpu_percent=5)), host("b"))
    w = weigher(weight_setting=["cpu.percent=1"])
    ws = working_set(snap)
    with pytest.raises(ComputeHostMetricNotFound, match="'cpu.percent' not found on host b/b"):
        w.weigh_all_hosts(ws.hosts(), spec())
    with pytest.raises(SchedulingError) as err:
        w._weigh_object(ws.host_state(1), spec())
    assert err.value.code == "berth.scheduling.metric_not_found"
    assert err.value.details == {"host": "b", "nodename": "b", "metric": "cpu.percent"}


def test_a_single_host_is_never_weighed_so_it_cannot_raise():
    snap = cloud(host("b"))
    assert weights_of([weigher(weight_setting=["cpu.percent=1"])], snap, spec()) == [0.0]


def test_a_missing_metric_weighs_weight_of_unavailable_when_not_required():
    snap = cloud(host("a", metrics=metrics(cpu_percent=5)), host("b"))
    w = weigher(weight_setting=["cpu.percent=1"], required=False)
    assert raw_both(w, snap, spec()) == [5.0, -10000.0]


def test_a_missing_metric_with_a_zero_ratio_is_skipped():
    # mem.free has ratio 0, so its absence does not matter: b = 2*1 + (skipped)
    snap = cloud(host("a", metrics=metrics(cpu_percent=5, mem_free=1)),
                 host("b", metrics=metrics(cpu_percent=2)))
    w = weigher(weight_setting=["cpu.percent=1", "mem.free=0"], required=False)
    assert raw_both(w, snap, spec()) == [5.0, 2.0]


def test_a_missing_metric_is_skipped_on_hosts_whose_multiplier_is_zero():
    # the aggregate sets b's multiplier to 0: ratio * 0 == 0, so the metric is skipped there
    snap = cloud(host("a"), host("b").in_aggregate("x", metrics_weight_multiplier="0"))
    w = weigher(weight_setting=["cpu.percent=1"], required=False, weight_of_unavailable=-7.0)
    assert raw_both(w, snap, spec()) == [-7.0, 0.0]
    assert multipliers_both(w, snap) == [1.0, 0.0]


def test_the_multiplier_option_and_its_aggregate_key():
    snap = cloud(host("a").in_aggregate("x", metrics_weight_multiplier="-2",
                                        weight_multiplier="99"), host("b"))
    assert multipliers_both(weigher(weight_multiplier=3.0), snap) == [-2.0, 3.0]


def test_the_last_reported_value_of_a_repeated_metric_wins():
    snap = cloud(host("a", metrics=[MetricItem("m", 1.0), MetricItem("m", 4.0)]), host("b"))
    w = weigher(weight_setting=["m=1"], required=False)
    assert raw_both(w, snap, spec())[0] == 4.0


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_bulk_and_per_host_paths_agree(data):
    check_paths_agree([MetricsWeigher], data)
