"""The instance -> row index kept report by report (berth.instance_index)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from berth.instance_index import InstanceIndex

UUIDS = [f"i{n}" for n in range(40)]


def _walk(column: list[dict[str, None]]) -> dict[str, int]:
    """The reference: a walk of the rows, the later row winning."""
    return {uuid: row for row, on_row in enumerate(column) for uuid in on_row}


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 5), st.lists(st.sampled_from(UUIDS),
                                                               max_size=6)), max_size=4),
                max_size=30))
def test_updates_agree_with_a_walk_of_the_rows_and_leave_older_indexes_alone(rounds):
    column: list[dict[str, None]] = [{} for _ in range(6)]
    index = InstanceIndex.build(column)
    seen: list[tuple[InstanceIndex, dict[str, int]]] = []
    for reports in rounds:
        for row, uuids in reports:
            column[row] = dict.fromkeys(uuids)
        index = index.updated(column, [row for row, _ in reports])
        expected = _walk(column)
        assert dict(index) == expected
        assert len(index) == len(expected)
        assert all(index.get(u) == expected.get(u) for u in UUIDS)
        assert all((u in index) == (u in expected) for u in UUIDS)
        seen.append((index, expected))
    for old, expected in seen:
        assert dict(old) == expected


def test_a_large_overlay_is_folded_into_a_new_base():
    column = [dict.fromkeys(f"r{row}-{k}" for k in range(4)) for row in range(100)]
    index = InstanceIndex.build(column)
    for row in range(100):  # 400 instances replaced: past max(256, 400 / 4)
        column[row] = dict.fromkeys(f"r{row}-new{k}" for k in range(4))
        index = index.updated(column, [row])
    assert dict(index) == _walk(column)
    assert len(index._over) < 256  # noqa: SLF001  (the fold happened)
