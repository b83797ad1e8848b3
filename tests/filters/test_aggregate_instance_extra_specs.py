"""AggregateInstanceExtraSpecsFilter (reference §3.11)."""

from __future__ import annotations

import numpy as np
import pytest
from host_filter_strategies import both_paths, random_aggregate_specs, random_cloud, random_request
from hypothesis import given, settings
from hypothesis import strategies as st

from berth.errors import ExtraSpecError
from berth.filters.aggregate_instance_extra_specs import AggregateInstanceExtraSpecsFilter
from berth.filters.base import BaseHostFilter
from berth.host_state import WorkingSet
from berth.model import Aggregate
from berth.snapshot import HostRecord, HostSnapshot
from builders import NOW, cloud, host, passes_bulk, spec, state

# The verified setup: one host in {ssd: true, cpu: '8, 16'} and {ssd: false}.
SNAP = cloud(
    host("h1").in_aggregate("a", ssd="true", cpu="8, 16").in_aggregate("b", ssd="false"),
    host("h2"),
)


@pytest.mark.parametrize(
    ("extra_specs", "expected"),
    [
        ({}, [True, True]),
        ({"ssd": "true"}, [True, False]),
        ({"ssd": "false"}, [True, False]),
        ({"cpu": ">= 12"}, [True, False]),
        ({"cpu": ">= 17"}, [False, False]),
        ({"cpu": "= 16"}, [True, False]),
        ({"cpu": "8, 16"}, [False, False]),
        ({"aggregate_instance_extra_specs:ssd": "true"}, [True, False]),
        ({"hw:cpu_policy": "dedicated", "resources:VCPU": "1", "a:b:c": "x"}, [True, True]),
        ({"nokey": "x"}, [False, False]),
        ({"ssd": "<or> nope <or> true"}, [True, False]),
        ({"ssd": "true", "cpu": "<in> 1"}, [True, False]),
    ],
    ids=[
        "no extra specs pass every host",
        "an unscoped key matches an aggregate value; a host in no aggregate fails",
        "any of the values of several aggregates may match",
        "a numeric operator matches any comma-split value",
        "no value satisfies a higher bound",
        "= means at least",
        "the requirement is not split, so the raw list never equals one value",
        "the filter's own scope is stripped",
        "other scopes are ignored",
        "a key missing from the metadata fails",
        "operators apply",
        "every spec must match",
    ],
)
def test_the_verified_examples_hold(extra_specs: dict[str, str], expected: list[bool]) -> None:
    assert both_paths(AggregateInstanceExtraSpecsFilter(), SNAP, spec(extra_specs=extra_specs)) == expected


def test_the_key_is_split_on_the_first_colon_only() -> None:
    snap = cloud(host("h1").in_aggregate("a", **{"a:b": "x"}))
    f = AggregateInstanceExtraSpecsFilter()
    assert both_paths(f, snap, spec(extra_specs={"aggregate_instance_extra_specs:a:b": "x"})) == [True]
    # "a:b" alone has scope "a" and is ignored, even though the metadata key exists.
    assert both_paths(f, snap, spec(extra_specs={"a:b": "y"})) == [True]


def test_a_non_numeric_aggregate_value_is_an_error_naming_key_host_and_value() -> None:
    # Nova raises ValueError here (ssd='>= 1' against 'true'/'false').
    f = AggregateInstanceExtraSpecsFilter()
    req = spec(extra_specs={"ssd": ">= 1"})
    assert both_paths(f, SNAP, req) == "error"
    with pytest.raises(ExtraSpecError) as err:
        f.check(state(SNAP, "h1"), req)
    assert "'ssd'" in str(err.value) and "'h1'" in str(err.value) and "'false'" in str(err.value)


def test_a_numeric_match_among_values_wins_over_a_bad_value() -> None:
    snap = cloud(host("h1").in_aggregate("a", cpu="abc, 16"))
    f = AggregateInstanceExtraSpecsFilter()
    assert both_paths(f, snap, spec(extra_specs={"cpu": ">= 12"})) == [True]
    assert both_paths(f, snap, spec(extra_specs={"cpu": ">= 20"})) == "error"


@pytest.mark.parametrize(
    "extra_specs",
    [{"cpu": ">= many"}, {"aggregate_instance_extra_specs:x": "<or>"}, {"ssd": "= yes"}],
    ids=["a non-numeric operand", "a bare <or>", "= with a word"],
)
def test_malformed_requirements_are_rejected_up_front(extra_specs: dict[str, str]) -> None:
    with pytest.raises(ExtraSpecError, match=next(iter(extra_specs))):
        AggregateInstanceExtraSpecsFilter().validate_request(spec(extra_specs=extra_specs))


def test_malformed_requirements_of_other_scopes_are_not_this_filters_business() -> None:
    AggregateInstanceExtraSpecsFilter().validate_request(spec(extra_specs={"capabilities:x": "= yes"}))


def test_the_reason_names_the_key_and_the_values() -> None:
    f = AggregateInstanceExtraSpecsFilter()
    reject = f.check(state(SNAP, "h1"), spec(extra_specs={"cpu": ">= 17"}))
    assert reject is not None
    # The aggregates named are those holding the key ("b" has none).
    assert reject.render() == ("aggregate extra spec mismatch (key cpu, requested >= 17, "
                               "aggregate values 16,8, aggregates a)")
    reject = f.check(state(SNAP, "h2"), spec(extra_specs={"cpu": ">= 17"}))
    assert reject is not None and reject.numbers["aggregate_values"] == "(none)"
    assert reject.numbers["aggregates"] == "(none)"
    reject = f.check(state(SNAP, "h1"), spec(extra_specs={"gpu": "true"}))
    assert reject is not None and reject.numbers["aggregates"] == "a, b"


def test_class_attributes_match_nova() -> None:
    assert AggregateInstanceExtraSpecsFilter.run_filter_once_per_request is True
    assert AggregateInstanceExtraSpecsFilter.RUN_ON_REBUILD is False


@settings(max_examples=60, deadline=None)
@given(snap=st.one_of(random_cloud(), random_cloud(agg_keys=("ssd", "cpu", "a:b"))),
       req=st.one_of(random_request(), random_aggregate_specs()))
def test_the_bulk_path_agrees_with_the_per_host_path(snap: HostSnapshot, req: object) -> None:
    both_paths(AggregateInstanceExtraSpecsFilter(), snap, req)


def _cached_verdicts(snap: HostSnapshot) -> list[object]:
    return [v for k, v in snap._table_cache.items()
            if isinstance(k, tuple) and k[0] == "AggregateInstanceExtraSpecsFilter"]


def test_signature_verdicts_are_kept_until_the_aggregates_change() -> None:
    snap = cloud(host("h1").in_aggregate("a", ssd="true"), host("h2"))
    f = AggregateInstanceExtraSpecsFilter()
    req = spec(extra_specs={"ssd": "true"})
    assert passes_bulk(f, snap, req) == [True, False]
    [verdicts] = _cached_verdicts(snap)
    snap.update_host(0, free_ram_mb=1.0)  # a claim: numbers only, the verdicts stay
    assert passes_bulk(f, snap, req) == [True, False]
    assert _cached_verdicts(snap) == [verdicts]
    snap.upsert(HostRecord("h2"))  # a report in the same signature: they stay too
    assert passes_bulk(f, snap, req) == [True, False]
    assert _cached_verdicts(snap) == [verdicts]
    snap.set_aggregates([Aggregate(1, "a", hosts=("h1", "h2"), metadata={"ssd": "false"})])
    assert _cached_verdicts(snap) == []
    assert passes_bulk(f, snap, req) == [False, False]
    snap.set_aggregates([Aggregate(1, "a", hosts=("h3",), metadata={"ssd": "true"})])
    assert passes_bulk(f, snap, req) == [False, False]
    snap.upsert(HostRecord("h3"))  # a new host reports, in the aggregate
    assert passes_bulk(f, snap, req) == [False, False, True]


def test_the_bulk_error_names_the_first_host_in_order_as_the_per_host_path_does() -> None:
    snap = cloud(host("h1").in_aggregate("a", cpu="many"), host("h2").in_aggregate("b", cpu="lots"),
                 host("h3").in_aggregate("c", cpu="32"))
    f = AggregateInstanceExtraSpecsFilter()
    req = spec(extra_specs={"cpu": ">= 12"})
    for order in ([0, 1, 2], [2, 1, 0]):
        hosts = WorkingSet(snap, NOW).hosts(np.array(order))
        errors = []
        for run in (f.filter_all_hosts, lambda h, r: BaseHostFilter.filter_all_hosts(f, h, r)):
            with pytest.raises(ExtraSpecError) as caught:
                run(hosts, req)
            errors.append(str(caught.value))
        assert errors[0] == errors[1]
        assert ("'h1'" if order[0] == 0 else "'h2'") in errors[0]
