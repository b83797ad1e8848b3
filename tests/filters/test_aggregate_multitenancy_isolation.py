"""AggregateMultiTenancyIsolation (reference §3.12)."""

from __future__ import annotations

import pytest
from host_filter_strategies import both_paths, random_cloud, random_request
from hypothesis import given, settings

from berth.filters.aggregate_multitenancy_isolation import AggregateMultiTenancyIsolation
from berth.snapshot import HostSnapshot
from builders import cloud, host, spec, state


@pytest.mark.parametrize(
    ("metadata", "project", "expected"),
    [
        (None, "p1", True),
        ({}, "p1", True),
        ({"other": "x"}, "p1", True),
        ({"filter_tenant_id": "p1"}, "p1", True),
        ({"filter_tenant_id": "p1"}, "p2", False),
        ({"filter_tenant_id": "p1, p2"}, "p2", True),
        ({"filter_tenant_id2": "p2"}, "p2", True),
        ({"filter_tenant_id:x": "p3"}, "p2", False),
        ({"filter_tenant_id": "p1", "filter_tenant_idX": "p2"}, "p2", True),
        ({"my_filter_tenant_id": "p1"}, "p2", True),
        ({"filter_tenant_id": "p1"}, None, False),
    ],
    ids=[
        "a host in no aggregate takes every project",
        "an aggregate without metadata restricts nothing",
        "unrelated keys restrict nothing",
        "the listed project passes",
        "another project fails",
        "comma-separated projects are stripped",
        "every key starting with filter_tenant_id counts",
        "a key with a colon suffix counts",
        "values of several tenant keys are united",
        "a key that only contains the prefix does not count",
        "a request without a project fails a restricted host",
    ],
)
def test_tenant_keys_restrict_projects(metadata: dict[str, str] | None, project: str | None, expected: bool) -> None:
    b = host("h1")
    if metadata is not None:
        b.in_aggregate("a", **metadata)
    snap = cloud(b)
    assert both_paths(AggregateMultiTenancyIsolation(), snap, spec(project_id=project)) == [expected]


def test_several_aggregates_unite_their_projects() -> None:
    snap = cloud(host("h1").in_aggregate("a", filter_tenant_id="p1").in_aggregate("b", filter_tenant_id="p2"))
    assert both_paths(AggregateMultiTenancyIsolation(), snap, spec(project_id="p2")) == [True]


def test_the_reason_names_the_aggregates_the_project_and_the_allowed_ones() -> None:
    snap = cloud(host("h1").in_aggregate("tenant-b", filter_tenant_id2="p3")
                 .in_aggregate("zone", availability_zone="az1")
                 .in_aggregate("tenant-a", filter_tenant_id="p2,p1"))
    reject = AggregateMultiTenancyIsolation().check(state(snap, "h1"), spec(project_id="p9"))
    assert reject is not None
    assert reject.render() == ("tenant not allowed in aggregate (aggregate tenant-a, "
                               "tenant-b, project p9, allowed p1,p2,p3)")


def test_class_attributes_match_nova() -> None:
    assert AggregateMultiTenancyIsolation.run_filter_once_per_request is True
    assert AggregateMultiTenancyIsolation.RUN_ON_REBUILD is False


@settings(max_examples=60, deadline=None)
@given(snap=random_cloud(), req=random_request())
def test_the_bulk_path_agrees_with_the_per_host_path(snap: HostSnapshot, req: object) -> None:
    both_paths(AggregateMultiTenancyIsolation(), snap, req)
