"""PlacementClaimer: retries on placement races, refusals, consumer generations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from berth.claims import ClaimRefusal
from berth.errors import ServiceUnavailable
from berth.model.request import Flavor, RequestSpec
from berth.placement import db
from berth.placement.client import ConflictError, ConsumerAllocations
from berth.placement.local import LocalProviders
from berth.placement.store import PlacementStore
from berth.service.placement import CLAIM_ATTEMPTS, PlacementClaimer
from berth.webauth.client import KeystoneUnavailable

SPEC = RequestSpec(flavor=Flavor(name="f", vcpus=1, memory_mb=1), project_id="p", user_id="u")
REQ = {"allocations": {"rp": {"resources": {"VCPU": 1}}}}
RACE = ConflictError(409, "placement.concurrent_update",
                     "Inventory and/or allocations changed while attempting to allocate", None)
FULL = ConflictError(409, "placement.undefined_code", "Unable to allocate inventory", None)
CONSUMER = ConflictError(409, "placement.concurrent_update",
                         "consumer generation conflict - expected 3 but got None", None)


class FakeClient:
    """Answers PUTs from a script of errors (None = success)."""

    def __init__(self, script: list[Exception | None], held: dict[str, dict[str, int]] | None = None):
        self.script = list(script)
        self.held = held or {}
        self.puts: list[tuple[dict[str, Any], int | None]] = []

    def get_allocations(self, consumer: str) -> ConsumerAllocations:
        return ConsumerAllocations(self.held, 3 if self.held else None, "p", "u", "INSTANCE")

    def put_allocations(self, consumer: str, allocations: dict[str, Any], *,
                        consumer_generation: int | None, **_: Any) -> None:
        self.puts.append((allocations, consumer_generation))
        outcome = self.script.pop(0) if self.script else None
        if outcome is not None:
            raise outcome


def test_placement_races_are_retried_and_counted() -> None:
    client = FakeClient([RACE, RACE, None])
    claimer = PlacementClaimer(client)  # type: ignore[arg-type]
    assert claimer.claim("c", REQ, SPEC, "1.36")
    assert claimer.stats.conflict_retries == 2 and claimer.stats.successes == 1


def test_retries_are_bounded() -> None:
    client = FakeClient([RACE] * 10)
    claimer = PlacementClaimer(client)  # type: ignore[arg-type]
    assert not claimer.claim("c", REQ, SPEC, "1.36")
    assert len(client.puts) == CLAIM_ATTEMPTS
    assert claimer.stats.exhausted == 1 and claimer.stats.conflict_retries == CLAIM_ATTEMPTS - 1


def test_a_capacity_refusal_is_false_without_retry() -> None:
    client = FakeClient([FULL])
    claimer = PlacementClaimer(client)  # type: ignore[arg-type]
    assert not claimer.claim("c", REQ, SPEC, "1.36")
    assert len(client.puts) == 1 and claimer.stats.refusals == 1


def test_an_existing_consumer_is_refused_never_merged() -> None:
    # The consumer belongs to another instance: placement's consumer-generation conflict
    # on a new-consumer PUT is a refusal; nothing is read, merged or sent again.
    client = FakeClient([CONSUMER, None], held={"old": {"VCPU": 2}})
    claimer = PlacementClaimer(client)  # type: ignore[arg-type]
    assert not claimer.claim("c", REQ, SPEC, "1.36")
    assert client.puts == [({"rp": {"VCPU": 1}}, None)]
    assert claimer.stats.consumer_conflicts == 1 and claimer.stats.conflict_retries == 0


def test_a_move_s_consumer_keeps_its_source_and_adds_the_destination_as_nova_claims() -> None:
    """The scheduler of a real Nova (``merge_existing``): an evacuated instance's
    consumer holds its source's allocations, and the claim doubles them up with the
    destination's, written with the consumer generation read (Nova's claim_resources);
    a provider it holds already (sharing storage) keeps its amounts."""
    client = FakeClient([CONSUMER, None], held={"src": {"VCPU": 2}, "shared": {"DISK_GB": 10}})
    claimer = PlacementClaimer(client, merge_existing=True)  # type: ignore[arg-type]
    request = {"allocations": {"rp": {"resources": {"VCPU": 1}},
                               "shared": {"resources": {"DISK_GB": 10}}}}
    assert claimer.claim("c", request, SPEC, "1.36") is True
    assert client.puts[1] == ({"src": {"VCPU": 2}, "shared": {"DISK_GB": 10},
                               "rp": {"VCPU": 1}}, 3)
    # The request fails after the claim: the source's allocations are put back, not
    # taken away with the destination's.
    claimer.rollback(["c"])
    assert client.puts[2] == ({"src": {"VCPU": 2}, "shared": {"DISK_GB": 10}}, 3)
    # A later claim of the consumer as new (its allocations moved away meanwhile) forgets
    # what the merged one found: its rollback deletes.
    assert claimer.claim("c", request, SPEC, "1.36") is True  # merged again
    client.held = {}
    assert claimer.claim("c", REQ, SPEC, "1.36") is True  # a fresh claim
    deleted: list[str] = []
    client.delete_allocations = deleted.append  # type: ignore[attr-defined]
    claimer.rollback(["c"])
    assert deleted == ["c"]
    # The consumer changed between the read and the write: this host is refused.
    changed = FakeClient([CONSUMER, CONSUMER], held={"src": {"VCPU": 2}})
    claimer = PlacementClaimer(changed, merge_existing=True)  # type: ignore[arg-type]
    refusal = claimer.claim("c", REQ, SPEC, "1.36")
    assert isinstance(refusal, ClaimRefusal) and "changed" in refusal.reason
    assert len(changed.puts) == 2


def test_a_consumer_holding_exactly_this_claim_is_this_claim_committed_before() -> None:
    # The first attempt committed, its answer was lost, the retry met the consumer.
    client = FakeClient([CONSUMER], held={"rp": {"VCPU": 1}})
    claimer = PlacementClaimer(client)  # type: ignore[arg-type]
    assert claimer.claim("c", REQ, SPEC, "1.36")
    assert claimer.stats.consumer_conflicts == 0 and claimer.stats.successes == 1


def test_an_unreachable_placement_is_a_failed_claim() -> None:
    class Down(FakeClient):
        def put_allocations(self, *a: Any, **k: Any) -> None:
            raise httpx.ConnectError("refused")

    claimer = PlacementClaimer(Down([]))  # type: ignore[arg-type]
    assert not claimer.claim("c", REQ, SPEC, "1.36") and claimer.stats.errors == 1


def test_a_capacity_refusal_says_what_did_not_fit(tmp_path: Path) -> None:
    engine = db.prepare(f"sqlite:///{tmp_path / 'p.sqlite'}")
    local = LocalProviders(PlacementStore(engine))
    rp = "6f2f3c1e-0000-4000-8000-000000000001"
    local.create_provider("n1", uuid=rp)
    local.set_inventories(rp, 0, {"MEMORY_MB": {"total": 4096, "reserved": 512},
                                  "VCPU": {"total": 8}})
    local.put_allocations("6f2f3c1e-0000-4000-8000-00000000000a", {rp: {"MEMORY_MB": 2560}},
                          project_id="p", user_id="u", consumer_generation=None)
    claimer = PlacementClaimer(local)
    got = claimer.claim("6f2f3c1e-0000-4000-8000-00000000000b",
                        {"allocations": {rp: {"resources": {"VCPU": 1, "MEMORY_MB": 2048}}}},
                        SPEC, "1.36")
    assert not got and isinstance(got, ClaimRefusal)
    assert (got.resource_class, got.provider, got.requested, got.free_amount()) == \
        ("MEMORY_MB", rp, 2048, 1024)
    assert got.render() == "insufficient MEMORY_MB (requested 2048, free 1024)"
    engine.dispose()


def test_refusals_without_amounts_still_say_why() -> None:
    assert PlacementClaimer(FakeClient([CONSUMER])).claim(  # type: ignore[arg-type]
        "c", REQ, SPEC, "1.36") == ClaimRefusal("the consumer exists already")
    refused = PlacementClaimer(FakeClient([RACE] * 10)).claim(  # type: ignore[arg-type]
        "c", REQ, SPEC, "1.36")
    assert not refused and "concurrent updates" in refused.render()  # type: ignore[union-attr]


class LostAnswer(FakeClient):
    """The PUT reaches placement (or not: ``commits``) and its answer is lost."""

    def __init__(self, commits: bool, readable: bool = True,
                 error: Exception | None = None) -> None:
        super().__init__([])
        self.commits, self.readable, self.reads = commits, readable, 0
        self.error = error or httpx.ReadTimeout("no answer within 30 s")

    def get_allocations(self, consumer: str) -> ConsumerAllocations:
        self.reads += 1
        if not self.readable:
            raise httpx.ConnectError("refused")
        return super().get_allocations(consumer)

    def put_allocations(self, consumer: str, allocations: dict[str, Any], *,
                        consumer_generation: int | None, **_: Any) -> None:
        self.puts.append((allocations, consumer_generation))
        if self.commits and len(self.puts) == 1:
            self.held = {rp: dict(res) for rp, res in allocations.items()}
        raise self.error


def test_a_claim_whose_answer_was_lost_is_read_back_before_the_next_host() -> None:
    # Committed: this host's claim; with a Nova scheduler's merging claimer too, so the
    # next host's claim is never added to it (allocations on two hosts).
    for merge in (False, True):
        client = LostAnswer(commits=True)
        claimer = PlacementClaimer(client, merge_existing=merge)  # type: ignore[arg-type]
        assert claimer.claim("c", REQ, SPEC, "1.36") is True
        assert client.reads == 1 and claimer.stats.successes == 1
    # Not committed: refused, and the next host may be tried.
    client = LostAnswer(commits=False, error=httpx.RemoteProtocolError("the connection broke"))
    got = PlacementClaimer(client).claim("c", REQ, SPEC, "1.36")  # type: ignore[arg-type]
    assert isinstance(got, ClaimRefusal) and got.reason == "placement unreachable"
    assert client.reads == 1


def test_a_claim_whose_answer_was_lost_and_cannot_be_read_stops_the_request() -> None:
    client = LostAnswer(commits=True, readable=False)
    with pytest.raises(ServiceUnavailable, match="no answer to the claim for c"):
        PlacementClaimer(client).claim("c", REQ, SPEC, "1.36")  # type: ignore[arg-type]


def test_a_claim_never_sent_is_refused_without_reading_it_back() -> None:
    for error in (httpx.ConnectError("refused"), httpx.ConnectTimeout("no connection"),
                  KeystoneUnavailable("[placement] credentials: no token from Keystone")):
        client = LostAnswer(commits=False, error=error)
        got = PlacementClaimer(client).claim("c", REQ, SPEC, "1.36")  # type: ignore[arg-type]
        assert isinstance(got, ClaimRefusal) and client.reads == 0


def test_keystone_failing_is_no_candidates_and_no_claim_as_nova_s_safe_connect() -> None:
    """Keystone unreachable or refusing the credentials: the query answers nothing (the
    scheduler's NoValidHost), a claim is refused and a rollback gives up; nothing
    raises a configuration error into the scheduler."""
    from keystoneauth1 import exceptions as ks_exc

    from berth.placement.client import PlacementClient
    from berth.service.placement import PlacementCandidates
    from berth.webauth.client import KeystoneAuth

    class Plugin:
        def __init__(self, failure: Exception) -> None:
            self.failure = failure

        def get_token(self, session: Any) -> str:
            raise self.failure

        def invalidate(self) -> None:
            pass

    for failure in (ks_exc.ConnectFailure("keystone down"), ks_exc.Unauthorized("refused")):
        client = PlacementClient("http://127.0.0.1:9", auth=KeystoneAuth(Plugin(failure), None),
                                 microversion="1.36")
        answer = PlacementCandidates(client).get([("resources", "VCPU:1")])
        assert answer.error is not None and "no token from Keystone" in answer.error
        claimer = PlacementClaimer(client)
        assert not claimer.claim("c", REQ, SPEC, "1.36")
        assert claimer.delete("c") is False
        client.close()
