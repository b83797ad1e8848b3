"""Legacy least-cost ranking (reference §12.10, seeds 001-002 "Costs and weights"):
cost = Σ weight × fn(host), no normalization, lowest cost wins (first minimum on ties)."""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from berth.config import SchedulerConfig
from berth.errors import ConfigError
from berth.pipeline import Scheduler
from berth.weighers.least_cost import (
    LeastCostRanker,
    SchedulerCostFunctionNotFound,
    SchedulerWeightFlagNotFound,
)
from builders import NOW, cloud, host, spec, working_set

from ._helpers import clouds, config

FILL_FIRST = "nova.scheduler.least_cost.compute_fill_first_cost_fn"
NOOP = "nova.scheduler.least_cost.noop_cost_fn"


def compute_vcpu_cost_fn(host_state, weighing_properties):
    """A custom cost function: vCPUs in use."""
    return host_state.vcpus_used


def compute_broken_cost_fn(host_state, weighing_properties):
    """A custom cost function that returns no number."""
    return "lots"


def ranker(functions, **weights):
    return LeastCostRanker.from_config(
        config(DEFAULT={"least_cost_functions": functions, **weights}))


def rank(r, snap):
    return r.rank(working_set(snap).hosts(), spec())


def test_the_default_spreads_by_free_ram():
    # cost = -1.0 * free_ram: a -512, b -2048, c -1024 -> b costs least
    snap = cloud(host("a", free_ram_mb=512), host("b", free_ram_mb=2048),
                 host("c", free_ram_mb=1024))
    ranking = rank(LeastCostRanker.from_config(SchedulerConfig.default()), snap)
    assert ranking.weights.tolist() == [512.0, 2048.0, 1024.0]  # weight = -cost
    assert ranking.order.tolist() == [1, 2, 0]


def test_a_positive_weight_fills_hosts_first():
    snap = cloud(host("a", free_ram_mb=512), host("b", free_ram_mb=2048))
    ranking = rank(ranker([FILL_FIRST], compute_fill_first_cost_fn_weight=1.0), snap)
    assert ranking.order.tolist() == [0, 1]


def test_costs_are_not_normalized_and_functions_add_up():
    # cost = -1.0*free_ram + 3.0*1 + 2.0*vcpus_used
    #   a: -1000 + 3 + 2*300 = -397 ; b: -600 + 3 + 2*0 = -597 -> b wins
    snap = cloud(host("a", free_ram_mb=1000, vcpus_used=300), host("b", free_ram_mb=600))
    r = ranker([FILL_FIRST, NOOP, f"{__name__}.compute_vcpu_cost_fn"],
               noop_cost_fn_weight=3.0, compute_vcpu_cost_fn_weight=2.0)
    ranking = rank(r, snap)
    assert ranking.weights.tolist() == [397.0, 597.0]
    assert ranking.order.tolist() == [1, 0]


def test_the_first_minimum_wins_ties():
    snap = cloud(host("a", free_ram_mb=100), host("b", free_ram_mb=900),
                 host("c", free_ram_mb=900))
    assert rank(LeastCostRanker.from_config(SchedulerConfig.default()), snap).order.tolist() == [
        1, 2, 0]


def test_explanation_columns_show_the_cost_grid():
    snap = cloud(host("a", free_ram_mb=1000), host("b", free_ram_mb=600))
    ranking = rank(ranker([FILL_FIRST, NOOP], noop_cost_fn_weight=3.0), snap)
    fill, noop = ranking.columns
    assert (fill.name, fill.raw.tolist(), fill.multiplier.tolist()) == (
        "compute_fill_first_cost_fn", [1000.0, 600.0], [-1.0, -1.0])
    assert (noop.name, noop.raw.tolist(), noop.multiplier.tolist()) == (
        "noop_cost_fn", [1.0, 1.0], [3.0, 3.0])
    # Σ multiplier × value is each host's cost, which is minus its ranking weight
    costs = sum(c.multiplier * c.normalized for c in ranking.columns)
    assert costs.tolist() == (-ranking.weights).tolist() == [-997.0, -597.0]


@pytest.mark.parametrize(
    "path",
    ["noop_cost_fn", "berth.weighers.least_cost.noop_cost_fn", NOOP],
    ids=["bare name", "berth path", "nova path"],
)
def test_built_ins_are_addressable_by_every_name(path):
    r = ranker([path])
    assert [(f.name, f.weight) for f in r.functions] == [("noop_cost_fn", 1.0)]


def test_functions_not_named_compute_or_noop_are_ignored_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        r = ranker(["nova.scheduler.least_cost.volume_cost_fn", FILL_FIRST])
    assert [f.name for f in r.functions] == ["compute_fill_first_cost_fn"]
    assert "volume_cost_fn" in caplog.text


def test_an_unimportable_function_fails_at_start_up():
    with pytest.raises(SchedulerCostFunctionNotFound, match="no_such_module"):
        ranker(["no_such_module.compute_x_cost_fn"], compute_x_cost_fn_weight=1.0)
    with pytest.raises(SchedulerCostFunctionNotFound, match="compute_nope"):
        ranker(["nova.scheduler.least_cost.compute_nope"], compute_nope_weight=1.0)
    with pytest.raises(SchedulerCostFunctionNotFound, match="is not a function"):
        ranker([f"{__name__}.compute_missing_fn"], compute_missing_fn_weight=1.0)


def test_a_function_without_a_weight_fails_at_start_up():
    with pytest.raises(SchedulerWeightFlagNotFound, match=r"\[DEFAULT\] compute_vcpu_cost_fn_weight"):
        ranker([f"{__name__}.compute_vcpu_cost_fn"])
    assert issubclass(SchedulerWeightFlagNotFound, ConfigError)


def test_a_custom_function_returning_no_number_is_a_clear_error():
    r = ranker([f"{__name__}.compute_broken_cost_fn"], compute_broken_cost_fn_weight=1.0)
    with pytest.raises(ConfigError, match="returned 'lots' for host a/a"):
        rank(r, cloud(host("a"), host("b")))


def test_the_seed_flag_file_configures_it(tmp_path):
    flags = tmp_path / "nova.conf"
    flags.write_text(f"--least_cost_functions={FILL_FIRST}\n"
                     "--compute_fill_first_cost_fn_weight=-1.0\n"
                     "--filter_scheduler.weighing_strategy=least_cost\n")
    conf = SchedulerConfig.from_files([flags])
    r = LeastCostRanker.from_config(conf)
    assert [(f.name, f.weight) for f in r.functions] == [("compute_fill_first_cost_fn", -1.0)]


def test_the_pipeline_uses_it_and_consumes_between_instances():
    # Spreading by free RAM: b (4096) first; after consuming 3000 MB b has 1096 < a's 2048.
    conf = config(DEFAULT={"compute_fill_first_cost_fn_weight": -1.0},
                  filter_scheduler={"weighing_strategy": "least_cost"})
    sched = Scheduler(conf, filters=[])
    assert isinstance(sched.ranker, LeastCostRanker) and sched.weighers == []
    snap = cloud(host("a", free_ram_mb=2048), host("b", free_ram_mb=4096))
    decision = sched.select_destinations(spec(memory_mb=3000, num_instances=2), snap, now=NOW,
                                         rng=random.Random(1), return_alternates=False)
    assert [h for h, _ in decision.hosts] == ["b", "a"]


@settings(max_examples=40, deadline=None)
@given(clouds(min_hosts=1), st.sampled_from([-1.0, 0.5, 2.0]))
def test_bulk_costs_equal_the_per_host_costs(snap, weight):
    r = ranker([FILL_FIRST, NOOP, f"{__name__}.compute_vcpu_cost_fn"],
               compute_fill_first_cost_fn_weight=weight, compute_vcpu_cost_fn_weight=-weight)
    ws = working_set(snap)
    ranking = r.rank(ws.hosts(), spec())
    per_host = [r.cost(ws.host_state(row), spec()) for row in range(len(snap))]
    assert np.allclose(-ranking.weights, per_host, rtol=0, atol=1e-9)
    assert ranking.order.tolist() == sorted(range(len(snap)), key=lambda i: per_host[i])


def test_the_pipeline_explains_the_cost_grid():
    conf = config(DEFAULT={"least_cost_functions": [FILL_FIRST, NOOP], "noop_cost_fn_weight": 2.0},
                  filter_scheduler={"weighing_strategy": "least_cost"})
    snap = cloud(host("a", free_ram_mb=2048), host("b", free_ram_mb=4096))
    decision = Scheduler(conf, filters=[]).select_destinations(
        spec(), snap, now=NOW, rng=random.Random(1), explain=True, return_alternates=False)
    weighing = decision.diagnosis.instances[0].weighing
    # b: -1.0 * 4096 + 2.0 * 1 = -4094 (the lowest cost) ; a: -2048 + 2 = -2046
    assert [(w.host, w.weight) for w in weighing] == [("b", 4094.0), ("a", 2046.0)]
    for w in weighing:
        assert [(t.weigher, t.multiplier) for t in w.terms] == [
            ("compute_fill_first_cost_fn", -1.0), ("noop_cost_fn", 2.0)]
        # the terms are the cost grid: they add up to the cost, i.e. minus the weight
        assert sum(t.contribution for t in w.terms) == -w.weight


def test_the_scheduler_fails_at_start_up_not_at_the_first_request():
    from berth.errors import exit_code_for

    conf = config(DEFAULT={"least_cost_functions": [f"{__name__}.compute_vcpu_cost_fn"]},
                  filter_scheduler={"weighing_strategy": "least_cost"})
    with pytest.raises(SchedulerWeightFlagNotFound) as err:
        Scheduler(conf, filters=[])
    assert err.value.code == "berth.config.cost_weight_not_found"
    assert exit_code_for(err.value) == 2


def test_seed_001s_flag_file_alone_selects_least_cost_with_a_notice(tmp_path, caplog):
    flags = tmp_path / "nova.conf"
    flags.write_text(f"--least_cost_functions={FILL_FIRST}\n"
                     "--compute_fill_first_cost_fn_weight=-1.0\n")
    with caplog.at_level(logging.WARNING):
        conf = SchedulerConfig.from_files([flags])
    assert conf.filter_scheduler.weighing_strategy == "least_cost"
    assert "hosts are ranked by least cost" in caplog.text
    assert isinstance(Scheduler(conf, filters=[]).ranker, LeastCostRanker)


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, "weighers"),
        ({"filter_scheduler": {"weighing_strategy": "weighers"},
          "DEFAULT": {"least_cost_functions": [FILL_FIRST]}}, "weighers"),
        ({"DEFAULT": {"compute_fill_first_cost_fn_weight": 1.0}}, "weighers"),
    ],
    ids=["nothing set keeps the weighers", "an explicit strategy wins over the function list",
         "a weight alone names no function"],
)
def test_only_a_named_function_list_implies_least_cost(values, expected):
    assert config(**values).filter_scheduler.weighing_strategy == expected


def test_the_explain_table_shows_costs_with_the_seeds_signs():
    from berth.explain import diagnosis_lines

    conf = config(DEFAULT={"least_cost_functions": [FILL_FIRST, NOOP], "noop_cost_fn_weight": 2.0})
    snap = cloud(host("a", free_ram_mb=2048), host("b", free_ram_mb=4096))
    decision = Scheduler(conf, filters=[]).select_destinations(
        spec(), snap, now=NOW, rng=random.Random(1), explain=True, return_alternates=False)
    instance = decision.diagnosis.instances[0]
    assert instance.ranked_by == "cost"
    lines = diagnosis_lines(decision.diagnosis, verbose=True)
    table = lines[lines.index(next(x for x in lines if "top hosts by cost" in x)):]
    assert "lower is better" in table[0]
    # cost = -1.0 x free RAM + 2.0 x 1: b -4094 (lowest, first), a -2046
    assert table[1].split() == ["host", "cost", "compute_fill_first_cost_fn", "noop_cost_fn"]
    assert table[2].split() == ["b", "-4094.0000", "-4096.000", "+2.000"]
    assert table[3].split() == ["a", "-2046.0000", "-2048.000", "+2.000"]
    assert "    b compute_fill_first_cost_fn: value 4096 x weight -1 = cost -4096.0000" in lines
    as_json = instance.to_dict()
    assert as_json["ranked_by"] == "cost"
    assert [w["cost"] for w in as_json["weighing"]] == [-4094.0, -2046.0]
