"""In-process candidates: the flat answer maps to the same rows and requests as the API's."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np

from berth.placement.client import PlacementClient
from berth.service.compute import ComputeNodeSpec, RowIndex
from berth.service.placement import (
    CandidatesAnswer,
    FlatRequests,
    PlacementCandidates,
    candidate_set,
    graph_rows,
)
from berth.service.stack import Stack

from .conftest import fresh_stack

QUERY = [("resources", "VCPU:2,MEMORY_MB:1024,DISK_GB:10"), ("limit", "1000")]


def _stack(template_db: Path, tmp_path: Path, hosts: int) -> Stack:
    stack = fresh_stack(template_db, tmp_path)
    stack.register_hosts([ComputeNodeSpec(host=f"h{i}", vcpus=8, memory_mb=8192 + 512,
                                          local_gb=100) for i in range(hosts)])
    return stack


def test_a_flat_answer_gives_the_rows_and_requests_of_the_rendered_one(
        template_db: Path, tmp_path: Path) -> None:
    stack = _stack(template_db, tmp_path, 6)
    feed = stack.scheduler().feed
    snapshot = feed.refresh()
    answer = PlacementCandidates(stack.candidates_client).get(QUERY)
    assert answer.flat is not None and not answer.empty
    fast = candidate_set(snapshot, answer, feed.uuid_rows)
    assert isinstance(fast.by_row, FlatRequests)
    rendered = CandidatesAnswer(flat=answer.flat)
    rendered.materialize()
    with PlacementClient("http://placement.local", microversion="1.36",
                         transport=httpx.WSGITransport(app=stack.placement_app)) as api:
        body = api.allocation_candidates(dict(QUERY))
    assert rendered.allocation_requests == body["allocation_requests"]
    assert rendered.provider_summaries == body["provider_summaries"]
    slow = candidate_set(snapshot, rendered, feed.uuid_rows)
    assert list(fast.by_row) == list(slow.by_row)
    assert {row: fast.by_row[row] for row in fast.by_row} == slow.by_row
    assert 10**6 not in fast.by_row and fast.by_row.get(10**6) is None
    stack.close()


def test_merging_a_flat_answer_renders_it(template_db: Path, tmp_path: Path) -> None:
    stack = _stack(template_db, tmp_path, 2)
    source = PlacementCandidates(stack.candidates_client)
    first, second = source.get(QUERY), source.get([("resources", "VCPU:1")])
    first.merge(second)
    assert first.flat is None and len(first.allocation_requests) == 4
    assert len(first.provider_summaries) == 2
    stack.close()


def test_graph_rows_follow_the_row_index(template_db: Path, tmp_path: Path) -> None:
    stack = _stack(template_db, tmp_path, 3)
    answer = PlacementCandidates(stack.candidates_client).get(QUERY)
    assert answer.flat is not None
    graph = answer.flat.graph
    index = RowIndex()
    assert (graph_rows(graph, index) == -1).all()
    uuid = graph.uuids[1]
    index[uuid] = 7
    rows = graph_rows(graph, index)
    assert rows[1] == 7 and (np.delete(rows, 1) == -1).all()
    index[uuid] = 7  # unchanged: same version, same array
    assert graph_rows(graph, index) is rows
    index[uuid] = 2
    assert graph_rows(graph, index)[1] == 2
    # A plain dict has no version: read afresh each time.
    assert graph_rows(graph, {uuid: 5})[1] == 5
    stack.close()
