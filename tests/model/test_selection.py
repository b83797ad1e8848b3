"""Selection: what the scheduler hands the conductor per host (reference §8.4)."""

from __future__ import annotations

import json
import random

import pytest

from berth.filters.ram import RamFilter
from berth.hardware.numa import NUMATopologyLimits
from berth.model.selection import Selection, scheduler_limits
from berth.pipeline import Scheduler
from builders import NOW, cloud, host, spec


def test_limits_keep_only_the_scheduler_limits_fields_that_are_set() -> None:
    assert scheduler_limits({"memory_mb": 1500.0, "vcpu": None, "custom": 1}) == {"memory_mb": 1500}


@pytest.mark.parametrize(("value", "expected"), [
    pytest.param(1501.5, 1501, id="a fractional limit is truncated as Nova's IntegerField does"),
    pytest.param(64.0, 64, id="a whole float becomes an int"),
    pytest.param(7, 7, id="an int stays as it is"),
])
def test_integer_limits_are_integers(value: float, expected: int) -> None:
    limits = scheduler_limits({"memory_mb": value, "vcpu": value, "disk_gb": value})
    assert limits == {"memory_mb": expected, "vcpu": expected, "disk_gb": expected}
    assert all(type(v) is int for v in limits.values())


def test_to_dict_renders_numa_limits_as_a_primitive_and_is_json_serializable() -> None:
    numa = NUMATopologyLimits(16.0, 1.5)
    s = Selection("u", "h", "n", None, limits={"numa_topology": numa, "custom": object()})
    data = s.to_dict()
    assert data == {"host": "h", "nodename": "n", "limits": {"numa_topology": numa.to_dict()}}
    json.dumps(data)


def test_the_pipelines_selection_carries_integer_scheduler_limits() -> None:
    # RamFilter sets limits["memory_mb"] = total * ratio = 1001 * 1.5 = 1501.5.
    snap = cloud(host("a", total_usable_ram_mb=1001, free_ram_mb=1001, ram_allocation_ratio=1.5))
    decision = Scheduler(filters=[RamFilter()], weighers=[]).select_destinations(
        spec(memory_mb=100), snap, now=NOW, rng=random.Random(0))
    selection = decision.selections[0][0]
    assert selection.limits == {"memory_mb": 1501}
    assert selection.to_dict()["limits"] == {"memory_mb": 1501}


@pytest.mark.parametrize(("metadata", "zone"), [
    pytest.param({"availability_zone": " az1 "}, "az1", id="the value is stripped as Nova splits and strips it"),
    pytest.param({"availability_zone": "az1, az2"}, "az1", id="of a comma list the first piece is taken"),
    pytest.param({"other": "x"}, "nova", id="without the key it is default_availability_zone"),
])
def test_the_selections_zone_is_read_from_aggregate_metadata_like_nova(metadata, zone) -> None:
    snap = cloud(host("a").in_aggregate("agg", **metadata))
    decision = Scheduler(filters=[], weighers=[]).select_destinations(
        spec(), snap, now=NOW, rng=random.Random(0))
    assert decision.selections[0][0].availability_zone == zone
