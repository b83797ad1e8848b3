"""RetryFilter (reference §12.5)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from misc_filter_strategies import random_cloud

from berth.filters.retry import RetryFilter
from berth.model import ComputeNodeRef, SchedulerRetries
from builders import cloud, host, passes_bulk, passes_per_host, spec, state


def test_no_retry_passes_every_host() -> None:
    snap = cloud(host("h1"), host("h2"))
    assert passes_bulk(RetryFilter(), snap, spec()) == [True, True]
    assert passes_per_host(RetryFilter(), snap, spec()) == [True, True]


def test_an_empty_retry_passes_every_host() -> None:
    snap = cloud(host("h1"))
    req = spec(retry=SchedulerRetries(num_attempts=1))
    assert passes_bulk(RetryFilter(), snap, req) == [True]


def test_nodes_already_tried_fail() -> None:
    snap = cloud(host("h1", node="n1"), host("h1", node="n2"), host("h2"))
    req = spec(retry=SchedulerRetries(num_attempts=2, hosts=[ComputeNodeRef("h1", "n1"),
                                                             ComputeNodeRef("h2", "h2")]))
    assert passes_per_host(RetryFilter(), snap, req) == [False, True, False]
    assert passes_bulk(RetryFilter(), snap, req) == [False, True, False]


def test_the_pair_must_match_not_just_the_host() -> None:
    snap = cloud(host("h1", node="n1"))
    req = spec(retry=SchedulerRetries(1, [ComputeNodeRef("h1", "other"), ComputeNodeRef("x", "n1")]))
    assert passes_bulk(RetryFilter(), snap, req) == [True]


def test_reason_is_already_tried_with_the_attempt_count() -> None:
    snap = cloud(host("h1"))
    req = spec(retry=SchedulerRetries(3, [ComputeNodeRef("h1", "h1")]))
    reject = RetryFilter().check(state(snap, "h1"), req)
    assert reject is not None and reject.reason == "already tried"
    assert reject.numbers == {"num_attempts": 3}


def test_flags_are_novas() -> None:
    assert RetryFilter.RUN_ON_REBUILD is False
    assert RetryFilter.run_filter_once_per_request is False


@settings(max_examples=50, deadline=None)
@given(
    snap=random_cloud(),
    tried=st.lists(st.tuples(st.sampled_from(["h0", "h1", "h2", "h9"]),
                             st.sampled_from(["h0", "h1", "n0", "n1", "n2"])), max_size=4),
)
def test_bulk_and_per_host_paths_agree(snap, tried) -> None:  # type: ignore[no-untyped-def]
    req = spec(retry=SchedulerRetries(len(tried), [ComputeNodeRef(h, n) for h, n in tried]))
    assert passes_bulk(RetryFilter(), snap, req) == passes_per_host(RetryFilter(), snap, req)
