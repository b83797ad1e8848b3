"""CrossCellWeigher (reference §7.2): 1 in requested_destination.cell, -1 elsewhere, 0
unless the destination has a cell and allow_cross_cell_move; multiplier 1e6."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from berth.model import CellMapping, Destination
from berth.weighers.cross_cell import CrossCellWeigher
from builders import cloud, host, spec

from ._helpers import check_paths_agree, multipliers_both, raw_both, weights_of


def snap():
    return cloud(host("a", cell_uuid="cell-1"), host("b", cell_uuid="cell-2"),
                 host("c", cell_uuid=None))


def test_a_cross_cell_move_prefers_the_source_cell():
    req = spec(requested_destination=Destination(cell=CellMapping("cell-1"),
                                                 allow_cross_cell_move=True))
    assert raw_both(CrossCellWeigher(), snap(), req) == [1, -1, -1]
    # normalized [1, 0, 0] times 1e6
    assert weights_of([CrossCellWeigher()], snap(), req) == [1e6, 0.0, 0.0]


@pytest.mark.parametrize(
    "destination",
    [
        pytest.param(None, id="no requested destination"),
        pytest.param(Destination(cell=None, allow_cross_cell_move=True), id="no cell"),
        pytest.param(Destination(cell=CellMapping("cell-1"), allow_cross_cell_move=False),
                     id="cross-cell move not allowed"),
    ],
)
def test_every_other_request_weighs_zero(destination):
    req = spec(requested_destination=destination)
    assert raw_both(CrossCellWeigher(), snap(), req) == [0, 0, 0]


def test_a_cell_no_host_is_in_makes_every_host_minus_one():
    req = spec(requested_destination=Destination(cell=CellMapping("cell-9"),
                                                 allow_cross_cell_move=True))
    assert raw_both(CrossCellWeigher(), snap(), req) == [-1, -1, -1]


def test_the_aggregate_override():
    s = cloud(host("a").in_aggregate("x", cross_cell_move_weight_multiplier="7"), host("b"))
    assert multipliers_both(CrossCellWeigher(), s) == [7.0, 1e6]


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_bulk_and_per_host_paths_agree(data):
    check_paths_agree([CrossCellWeigher], data)
