"""IsolatedHostsFilter (reference §3.15)."""

from __future__ import annotations

import pytest
from host_filter_strategies import both_paths, random_cloud, random_request
from hypothesis import given, settings
from hypothesis import strategies as st

from berth.config import SchedulerConfig
from berth.filters.isolated_hosts import IsolatedHostsFilter
from berth.snapshot import HostSnapshot
from builders import cloud, host, spec, state


def make(restrict: bool, images: list[str] | None = None, hosts: list[str] | None = None) -> IsolatedHostsFilter:
    return IsolatedHostsFilter(SchedulerConfig.from_dict({"filter_scheduler": {
        "isolated_hosts": ["iso"] if hosts is None else hosts,
        "isolated_images": ["img-iso"] if images is None else images,
        "restrict_isolated_hosts_to_isolated_images": restrict,
    }}))


SNAP = cloud(host("iso"), host("other"))
REQUESTS = {
    "isolated image": spec(image_id="img-iso"),
    "other image": spec(image_id="img-other"),
    "no image": spec(no_image=True),
}


# The verified matrix: (restrict, request) -> [isolated host, other host].
@pytest.mark.parametrize(
    ("restrict", "request_name", "expected"),
    [
        (True, "isolated image", [True, False]),
        (True, "other image", [False, True]),
        (True, "no image", [False, True]),
        (False, "isolated image", [True, False]),
        (False, "other image", [True, True]),
        (False, "no image", [True, True]),
    ],
    ids=lambda v: str(v),
)
def test_the_verified_matrix_holds(restrict: bool, request_name: str, expected: list[bool]) -> None:
    assert both_paths(make(restrict), SNAP, REQUESTS[request_name]) == expected


def test_a_volume_backed_request_with_an_image_without_id_counts_as_not_isolated() -> None:
    assert both_paths(make(True), SNAP, spec(image_id=None)) == [False, True]


@pytest.mark.parametrize(
    ("restrict", "expected"),
    [(True, [False, True]), (False, [True, True])],
    ids=["with restriction isolated hosts take nothing", "without restriction every host passes"],
)
def test_without_isolated_images_only_the_restriction_applies(restrict: bool, expected: list[bool]) -> None:
    assert both_paths(make(restrict, images=[]), SNAP, REQUESTS["isolated image"]) == expected


def test_host_names_match_exactly_and_case_sensitively() -> None:
    snap = cloud(host("ISO"), host("iso2"))
    assert both_paths(make(True), snap, REQUESTS["other image"]) == [True, True]


def test_reasons_name_the_image() -> None:
    f = make(True)
    reject = f.check(state(SNAP, "iso"), REQUESTS["other image"])
    assert reject is not None and reject.render() == "isolated host (image img-other)"
    reject = f.check(state(SNAP, "other"), REQUESTS["isolated image"])
    assert reject is not None and reject.reason == "host not isolated"


def test_class_attributes_match_nova() -> None:
    assert IsolatedHostsFilter.run_filter_once_per_request is True
    assert IsolatedHostsFilter.RUN_ON_REBUILD is True


@settings(max_examples=60, deadline=None)
@given(snap=random_cloud(), req=random_request(), restrict=st.booleans(),
       images=st.sampled_from([[], ["image-iso"], ["image-1", "image-iso"]]),
       hosts=st.sampled_from([[], ["h0"], ["h1", "h3"]]))
def test_the_bulk_path_agrees_with_the_per_host_path(
    snap: HostSnapshot, req: object, restrict: bool, images: list[str], hosts: list[str]
) -> None:
    both_paths(make(restrict, images, hosts), snap, req)
