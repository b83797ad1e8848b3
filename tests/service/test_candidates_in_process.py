"""In-process candidates: the flat answer maps to the same rows and requests as the API's."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from berth.errors import NoValidHost
from berth.model.request import Flavor, RequestSpec
from berth.placement.client import PlacementClient
from berth.placement.local import LocalPlacement
from berth.service.compute import ComputeNodeSpec
from berth.service.placement import (
    CandidatesAnswer,
    FlatRequests,
    PlacementCandidates,
    candidate_set,
    graph_rows,
)
from berth.service.records import RowIndex
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


def _placement_reasons(diagnosis: object) -> dict[str, str]:
    step = diagnosis.instances[0].steps[0]  # type: ignore[attr-defined]
    assert step.name == "placement"
    return {r.host: r.reject.render() for r in step.rejections}


def test_an_explained_request_says_why_placement_left_nodes_out(stack: Stack) -> None:
    stack.register_hosts([ComputeNodeSpec(host="big", vcpus=8, memory_mb=8192 + 512, local_gb=100),
                          ComputeNodeSpec(host="small", vcpus=8, memory_mb=1024 + 512,
                                          local_gb=100)])
    service = stack.scheduler(seed=1)
    spec = RequestSpec(flavor=Flavor(name="f", vcpus=1, memory_mb=2048, root_gb=1, id=1),
                       project_id="p", user_id="u")
    decision = service.select_destinations(spec, explain=True)
    assert decision.selections[0][0].service_host == "big"
    reasons = _placement_reasons(decision.diagnosis)
    if isinstance(stack.candidates_client, LocalPlacement):
        # The engine's own reason and numbers (1,024 MB usable: 1,536 less 512 reserved).
        assert reasons == {"small": "insufficient MEMORY_MB in placement "
                                    "(requested 2048, free 1024, capacity 1024)"}
    else:
        # Through the API there are no reasons: an estimate from the host's report.
        assert reasons == {"small": "insufficient MEMORY_MB in placement (requested 2048, "
                                    "free 1024)"}
    huge = RequestSpec(flavor=Flavor(name="h", vcpus=64, memory_mb=1, root_gb=1, id=2),
                       project_id="p", user_id="u")
    with pytest.raises(NoValidHost) as info:
        service.select_destinations(huge, explain=True)
    assert info.value.reason == ""  # Nova's empty reason; the explanation has the rest
    reasons = _placement_reasons(info.value.diagnosis)
    assert set(reasons) == {"big", "small"}
    if isinstance(stack.candidates_client, LocalPlacement):
        assert reasons["big"].startswith("insufficient VCPU in placement (requested 64")


def test_the_service_freezes_its_long_lived_heap_unless_told_not_to(
        template_db: Path, tmp_path: Path) -> None:
    import gc

    from berth.service.placement import PlacementClaimer
    from berth.service.records import SnapshotFeed
    from berth.service.scheduler import SchedulerService

    stack = _stack(template_db, tmp_path, 2)
    spec = RequestSpec(flavor=Flavor(name="f", vcpus=1, memory_mb=256, root_gb=1, id=1),
                       project_id="p", user_id="u")
    gc.unfreeze()
    try:
        quiet = SchedulerService(stack.config, SnapshotFeed(stack.records),
                                 PlacementCandidates(stack.candidates_client),
                                 PlacementClaimer(stack.claims_client or stack.client),
                                 freeze_heap=False)
        quiet.select_destinations(spec)
        assert gc.get_freeze_count() == 0
        stack.scheduler().select_destinations(spec)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        stack.close()


def test_a_disabled_compute_is_explained_as_disabled_both_ways(stack: Stack) -> None:
    """Placement leaves a disabled compute out for its COMPUTE_STATUS_DISABLED trait;
    through the API, where placement gives no reasons, the explanation says so too
    rather than guessing at capacity."""
    agents = stack.register_hosts([
        ComputeNodeSpec(host="on", vcpus=8, memory_mb=8192, local_gb=100),
        ComputeNodeSpec(host="off", vcpus=8, memory_mb=8192, local_gb=100)])
    agents[1].set_disabled(True, "maintenance")
    service = stack.scheduler(seed=1)
    spec = RequestSpec(flavor=Flavor(name="f", vcpus=1, memory_mb=512, root_gb=1, id=1),
                       project_id="p", user_id="u")
    decision = service.select_destinations(spec, explain=True)
    assert decision.selections[0][0].service_host == "on"
    assert _placement_reasons(decision.diagnosis) == {
        "off": "compute service disabled (trait COMPUTE_STATUS_DISABLED)"}
