"""Per-aggregate weight multipliers (reference §7.1, §13 item 7): minimum of the float
values, no comma split, any bad value -> the configured value with a warning."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from berth.config import SchedulerConfig
from berth.weighers.utils import (
    get_weight_multiplier,
    uniform_weight_multiplier,
    weight_multipliers_all_hosts,
)
from builders import cloud, host, state, working_set

KEY = "ram_weight_multiplier"


def both(snap, conf=1.0):
    per_host = [get_weight_multiplier(state(snap, h), KEY, conf) for h in snap.obj("host")]
    bulk = weight_multipliers_all_hosts(working_set(snap).hosts(), KEY, conf).tolist()
    assert per_host == bulk
    return per_host


def test_hosts_in_no_aggregate_use_the_configured_value():
    assert both(cloud(host("a"), host("b")), conf=2.5) == [2.5, 2.5]


def test_an_aggregate_value_overrides_the_configured_value():
    snap = cloud(host("a").in_aggregate("agg", **{KEY: "-3.5"}), host("b"))
    assert both(snap, conf=1.0) == [-3.5, 1.0]


def test_several_aggregate_values_take_the_minimum():
    snap = cloud(host("a").in_aggregate("x", **{KEY: "2"}).in_aggregate("y", **{KEY: "0.5"}))
    assert both(snap) == [0.5]


def test_a_comma_list_is_not_split_and_falls_back_with_a_warning(caplog):
    snap = cloud(host("a").in_aggregate("x", **{KEY: "1,2"}))
    with caplog.at_level(logging.WARNING):
        assert both(snap, conf=7.0) == [7.0]
    assert KEY in caplog.text


def test_one_bad_value_discards_the_whole_override(caplog):
    snap = cloud(host("a").in_aggregate("x", **{KEY: "0.1"}).in_aggregate("y", **{KEY: "lots"}))
    with caplog.at_level(logging.WARNING):
        assert both(snap, conf=3.0) == [3.0]
    assert "lots" in caplog.text


def test_other_keys_do_not_matter():
    snap = cloud(host("a").in_aggregate("x", cpu_weight_multiplier="9"))
    assert both(snap, conf=1.0) == [1.0]


def test_bulk_multipliers_follow_a_host_subset_in_order():
    snap = cloud(host("a").in_aggregate("x", **{KEY: "4"}), host("b"), host("c").in_aggregate("x"))
    rows = np.array([2, 1, 0])
    got = weight_multipliers_all_hosts(working_set(snap).hosts(rows), KEY, 1.0).tolist()
    assert got == [4.0, 1.0, 4.0]


def test_aggregate_changes_are_seen_after_the_snapshot_changes():
    snap = cloud(host("a").in_aggregate("x", **{KEY: "4"}), host("b"))
    assert both(snap) == [4.0, 1.0]
    from berth.model import Aggregate

    snap.set_aggregates([Aggregate(id=9, name="z", hosts=("b",), metadata={KEY: "-2"})])
    assert both(snap) == [1.0, -2.0]


@pytest.mark.parametrize("value", ["-1e308", "0", "1e308"], ids=["huge negative", "zero", "huge"])
def test_any_finite_float_python_accepts_is_taken_as_is(value):
    snap = cloud(host("a").in_aggregate("x", **{KEY: value}))
    assert both(snap) == [float(value)]


def test_an_infinite_value_beside_a_finite_one_leaves_the_finite_minimum():
    snap = cloud(host("a").in_aggregate("x", **{KEY: "inf"}).in_aggregate("y", **{KEY: "2"}))
    assert both(snap, conf=7.0) == [2.0]


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e400"])
def test_a_value_that_is_no_finite_number_falls_back_with_a_warning(value, caplog):
    """A deliberate deviation: Nova takes it, and a NaN weight then leaves its order of
    hosts to their input order (found by a differential run against Nova 34)."""
    snap = cloud(host("a").in_aggregate("x", **{KEY: value}))
    with caplog.at_level(logging.WARNING):
        assert both(snap, conf=2.0) == [2.0]
    assert "not a finite number" in caplog.text


# ------------------------------------------------ one multiplier for every host
def uniform(snap, conf=1.0):
    return uniform_weight_multiplier(working_set(snap).hosts(), KEY, conf)


def test_without_overrides_every_host_has_the_configured_multiplier():
    assert uniform(cloud(host("a"), host("b").in_aggregate("x", other="1")), conf=2.5) == 2.5


def test_an_override_on_some_hosts_is_not_uniform():
    assert uniform(cloud(host("a").in_aggregate("x", **{KEY: "3"}), host("b"))) is None


def test_a_nan_override_is_the_configured_value_everywhere():
    assert uniform(cloud(host("a").in_aggregate("x", **{KEY: "nan"})), conf=2.0) == 2.0
    assert uniform(cloud(host("a").in_aggregate("x", **{KEY: "nan"}), host("b"))) == 1.0


def test_uniform_follows_the_aggregates_after_a_change():
    snap = cloud(host("a"), host("b"))
    assert uniform(snap) == 1.0
    from berth.model import Aggregate

    snap.set_aggregates([Aggregate(id=9, name="z", hosts=("b",), metadata={KEY: "-2"})])
    assert uniform(snap) is None


def test_a_subclass_with_its_own_multipliers_is_never_taken_as_uniform():
    from berth.weighers.ram import RAMWeigher

    class Halved(RAMWeigher):
        def weight_multiplier(self, host_state):
            return 0.5

    snap = cloud(host("a"), host("b"))
    hosts = working_set(snap).hosts()
    assert RAMWeigher(SchedulerConfig.default()).uniform_multiplier(hosts) == 1.0
    assert Halved(SchedulerConfig.default()).uniform_multiplier(hosts) is None


def test_a_uniform_zero_multiplier_adds_nothing_to_the_weights():
    """Skipped at once: zero times a finite normalized weight is zero on every host."""
    from berth.weighers.handler import WeigherRanker
    from berth.weighers.hypervisor_version import HypervisorVersionWeigher

    conf = SchedulerConfig.from_dict(
        {"filter_scheduler": {"hypervisor_version_weight_multiplier": 0.0}})
    snap = cloud(host("a", hypervisor_version=1), host("b", hypervisor_version=2))
    ranking = WeigherRanker([HypervisorVersionWeigher(conf)]).rank(
        working_set(snap).hosts(), None)
    assert ranking.weights.tolist() == [0.0, 0.0]


def test_build_failures_take_the_negated_uniform_multiplier():
    from berth.weighers.build_failure import BuildFailureWeigher

    weigher = BuildFailureWeigher(SchedulerConfig.default())
    plain = working_set(cloud(host("a"), host("b"))).hosts()
    assert weigher.uniform_multiplier(plain) == -1000000.0
    assert weigher.multipliers_all_hosts(plain).tolist() == [-1000000.0, -1000000.0]
    key = "build_failure_weight_multiplier"
    mixed = working_set(cloud(host("a").in_aggregate("x", **{key: "5"}), host("b"))).hosts()
    assert weigher.uniform_multiplier(mixed) is None

    class Own(BuildFailureWeigher):
        def multipliers_all_hosts(self, hosts):
            return np.full(len(hosts), 2.0)

    assert Own(SchedulerConfig.default()).uniform_multiplier(plain) is None


def test_the_ranker_asks_a_per_snapshot_answer_once_per_aggregates_epoch():
    """A built-in answer is kept until the aggregates change; a subclass that answers
    its own way (without declaring it per snapshot) is asked every ranking."""
    from berth.model import Aggregate
    from berth.weighers.base import uniform_per_snapshot
    from berth.weighers.handler import WeigherRanker
    from berth.weighers.ram import RAMWeigher

    asked: list[str] = []

    class Counted(RAMWeigher):
        def uniform_multiplier(self, hosts):
            asked.append("own")
            return super().uniform_multiplier(hosts)

    class Declared(Counted):
        uniform_per_snapshot = True

        def uniform_multiplier(self, hosts):
            asked.append("declared")
            return RAMWeigher.uniform_multiplier(self, hosts)

    conf = SchedulerConfig.default()
    assert uniform_per_snapshot(RAMWeigher(conf)) and not uniform_per_snapshot(Counted(conf))
    assert uniform_per_snapshot(Declared(conf))
    snap = cloud(host("a", free_ram_mb=10), host("b", free_ram_mb=20))
    ranker = WeigherRanker([Counted(conf), Declared(conf)])
    for _ in range(3):
        ranker.rank(working_set(snap).hosts(), None)
    assert asked.count("own") == 3 and asked.count("declared") == 1
    snap.set_aggregates([Aggregate(id=9, name="z", hosts=("b",),
                                   metadata={"ram_weight_multiplier": "-2"})])
    ranking = ranker.rank(working_set(snap).hosts(), None)
    assert asked.count("declared") == 2
    # b's multiplier is now -2 for both weighers: a is preferred.
    assert ranking.weights[0] > ranking.weights[1]
