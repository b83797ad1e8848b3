"""Draining a host through the service (:mod:`berth.service.drain`): every instance is
moved off one after another, each seeing where the ones before went; one that cannot
move stays with its reason; the claims are checked in Placement."""

from __future__ import annotations

import pytest

from berth.errors import InputError
from berth.model.request import Flavor, RequestSpec
from berth.service.conductor import FakeDriver
from berth.service.drain import drain_host, drain_lines, drain_status, parse_drain
from berth.service.moves import MoveService
from berth.service.stack import Stack

from .builders import node

TINY = Flavor(name="tiny", vcpus=1, memory_mb=512, root_gb=1, id=1)
BIG = Flavor(name="big", vcpus=1, memory_mb=5000, root_gb=1, id=2)


def _moves(stack: Stack, driver: FakeDriver | None = None) -> MoveService:
    service = stack.scheduler(seed=1)
    return stack.moves(stack.conductor(service, driver or FakeDriver(agents=stack.agents)))


def _boot_on(moves: MoveService, host: str, flavor: Flavor = TINY) -> str:
    (built,) = moves.conductor.build_instances(RequestSpec(flavor=flavor, force_hosts=[host]))
    return built.instance_uuid


def _memory_used(stack: Stack) -> dict[str, int]:
    return {host: stack.client.provider_usages(agent.uuid).get("MEMORY_MB", 0)
            for host, agent in stack.agents.items()}


@pytest.fixture
def cloud(stack: Stack) -> Stack:
    """h1 and h2 of 8 GiB (7680 MB usable), h3 of 16 GiB."""
    stack.register_hosts([node("h1"), node("h2"), node("h3", memory_mb=16384)])
    return stack


def test_a_drain_live_migrates_every_instance_off_the_host(cloud: Stack) -> None:
    moves = _moves(cloud)
    booted = [_boot_on(moves, "h3") for _ in range(3)]
    answer = drain_host(moves, "h3")
    assert drain_status(answer) == 200 and "error" not in answer
    assert sorted(m["instance_uuid"] for m in answer["moved"]) == sorted(booted)
    assert {m["host"] for m in answer["moved"]} <= {"h1", "h2"}
    # Each saw where the ones before went: RAMWeigher spreads them over h1 and h2.
    assert {m["host"] for m in answer["moved"]} == {"h1", "h2"}
    assert _memory_used(cloud)["h3"] == 0 and sum(_memory_used(cloud).values()) == 3 * 512
    assert all(r.host != "h3" and r.status == "ACTIVE" for r in moves.instances.all())
    for uuid in booted:
        assert [m.status for m in moves.instances.migrations(uuid)] == ["completed"]
    assert drain_lines(answer)[-1] == "3 moved, 0 left on h3"


def test_an_instance_that_cannot_move_stays_with_its_reason(cloud: Stack) -> None:
    moves = _moves(cloud)
    small = _boot_on(moves, "h3")
    big = [_boot_on(moves, "h3", BIG) for _ in range(3)]  # h1 and h2 take one each at most
    answer = drain_host(moves, "h3", "migrate")
    assert drain_status(answer) == 409
    assert answer["error"] == {"code": "berth.scheduling.drain_incomplete",
                               "message": "1 of 4 instances could not be moved off h3"}
    (failed,) = answer["failed"]
    assert failed["instance_uuid"] in big and failed["error"]["code"] == \
        "berth.scheduling.no_valid_host"
    assert small in {m["instance_uuid"] for m in answer["moved"]}
    # Cold migrations are confirmed at once: no migration consumer keeps the source.
    for entry in answer["moved"]:
        assert cloud.client.get_allocations(entry["migration_uuid"]).allocations == {}
    assert _memory_used(cloud)["h3"] == 5000
    stays = next(line for line in drain_lines(answer) if "stays" in line)
    assert failed["instance_uuid"] in stays and "No valid host was found" in stays


def test_a_drain_refuses_an_unknown_host_and_a_bad_body(cloud: Stack) -> None:
    moves = _moves(cloud)
    with pytest.raises(InputError, match="compute host 'h9' could not be found"):
        drain_host(moves, "h9")
    assert parse_drain(None) == "live-migrate" and parse_drain({"operation": "migrate"}) == "migrate"
    for body, message in (([], "body: expected a JSON object"),
                          ({"operation": "evacuate"}, "operation: expected one of"),
                          ({"host": "h1"}, r"unknown field\(s\) host")):
        with pytest.raises(InputError, match=message):
            parse_drain(body)
    # A host with nothing on it: nothing to do, nothing left.
    assert drain_host(moves, "h1") == {"host": "h1", "operation": "live-migrate", "moved": [],
                                       "failed": [], "left": [], "awaiting_confirmation": [],
                                       "unknown_instances": 0}


def test_a_move_from_the_host_awaiting_confirmation_is_not_an_empty_host(cloud: Stack) -> None:
    """A resize from the host waits for confirmation: the source allocation stays on
    the host (and a revert would bring the instance back), so the drain says so."""
    from berth.moves import MoveRequest

    moves = _moves(cloud)
    uuid = _boot_on(moves, "h3")
    small = Flavor(name="small", vcpus=2, memory_mb=1024, root_gb=2, id=3)
    migration = moves.move(uuid, MoveRequest("resize", flavor=small))["migration_uuid"]
    answer = drain_host(moves, "h3")
    assert answer["moved"] == [] and answer["awaiting_confirmation"] == [
        {"instance_uuid": uuid, "migration_uuid": migration}]
    assert drain_status(answer) == 409
    assert answer["error"]["message"].endswith("1 move(s) from it await confirmation")
    assert any("awaits confirmation" in line for line in drain_lines(answer))
    moves.confirm(uuid)
    assert drain_status(drain_host(moves, "h3")) == 200
