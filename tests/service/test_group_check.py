"""The late server-group check: a build that would break a hard group policy when it
reaches its host (two boots racing into one group) is rescheduled onto an alternate.

Each race is forced deterministically: both boots are scheduled before either is built,
so both decisions were taken before the other's instance existed, exactly what the
late check is for.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from berth.config import SchedulerConfig
from berth.errors import MaxRetriesExceeded
from berth.model.request import Flavor, InstanceGroup, RequestSpec
from berth.model.selection import Selection
from berth.pipeline import Decision
from berth.service.api import SchedulerApp
from berth.service.conductor import BuildOutcome, Conductor, FakeDriver
from berth.service.records import RunningInstances
from berth.service.stack import Stack

from .builders import node
from .conftest import fresh_stack

#: The noauth2 token of the administrator (the servers run --auth-strategy noauth2).
ADMIN = {"X-Auth-Token": "admin"}

TINY = Flavor(name="tiny", vcpus=1, memory_mb=512, root_gb=1, id=1)
GROUP_UUID = "aaaaaaaa-0000-4000-8000-0000000000a1"
GHOST = "00000000-0000-4000-8000-0000000000ff"

GROUPS_CONFIG = SchedulerConfig.from_dict({"filter_scheduler": {
    "enabled_filters": ["ComputeFilter", "ServerGroupAffinityFilter",
                        "ServerGroupAntiAffinityFilter"],
    "weight_classes": ["RAMWeigher", "ServerGroupSoftAffinityWeigher",
                       "ServerGroupSoftAntiAffinityWeigher"]}})


def _stack(template_db: Path, tmp_path: Path, config: SchedulerConfig = GROUPS_CONFIG) -> Stack:
    """Three equal hosts h0-h2, so nothing but the group tells them apart."""
    st = fresh_stack(template_db, tmp_path, config)
    st.register_hosts([node(f"h{i}") for i in range(3)])
    return st


@pytest.fixture
def grouped(template_db: Path, tmp_path: Path) -> Iterator[Stack]:
    st = _stack(template_db, tmp_path)
    yield st
    st.close()


class Boot:
    """One boot into the group, done in the conductor's steps so that several boots can
    be interleaved (as ``schedule_and_build`` does them): resolve the group, record the
    build, join the group; schedule (on first need); build.

    Boots made together resolve the group before any of them is scheduled, as two API
    processes do when their requests arrive together: none sees the others' claims."""

    def __init__(self, stack: Stack, conductor: Conductor) -> None:
        service = conductor.scheduler
        self.conductor = conductor
        self.spec = RequestSpec(flavor=TINY, num_instances=1,
                                instance_group=stack.groups.resolve(GROUP_UUID))
        (self.uuid,) = service.new_instance_uuids(1)
        stack.builds.begin([self.uuid], "req-test", GROUP_UUID)
        stack.groups.add_members(GROUP_UUID, [self.uuid])
        self._decision: Decision | None = None

    @property
    def decision(self) -> Decision:
        if self._decision is None:
            self._decision = self.conductor.select_destinations(self.spec, [self.uuid])
        return self._decision

    @property
    def chosen(self) -> str:
        return self.decision.selections[0][0].service_host

    def build(self) -> BuildOutcome:
        return self.conductor.build_all(self.decision, self.spec)


def _group(stack: Stack, policy: str, **rules: Any) -> None:
    stack.groups.put(InstanceGroup(policy=policy, uuid=GROUP_UUID, name="g", rules=rules))


def _members_by_host(stack: Stack) -> dict[str, int]:
    group = stack.groups.get(GROUP_UUID)
    assert group is not None
    hosts = RunningInstances(stack.records).hosts_of(group.members).values()
    return {h: list(hosts).count(h) for h in sorted(set(hosts))}


def _vcpus_used(stack: Stack) -> dict[str, int]:
    return {host: stack.client.provider_usages(agent.uuid).get("VCPU", 0)
            for host, agent in sorted(stack.agents.items())}


def test_two_boots_into_an_anti_affinity_group_sent_to_one_host_end_on_two_hosts(
        grouped: Stack, caplog: pytest.LogCaptureFixture) -> None:
    _group(grouped, "anti-affinity")
    conductor = grouped.conductor(grouped.scheduler(seed=1))
    first, second = Boot(grouped, conductor), Boot(grouped, conductor)
    assert first.chosen == second.chosen  # the race: one host for both
    (built_first,) = first.build().built
    with caplog.at_level(logging.INFO, logger="berth.service.conductor"):
        (built_second,) = second.build().built
    assert built_first.host == first.chosen and built_first.tried == [first.chosen]
    assert built_second.tried[0] == first.chosen and built_second.host != first.chosen
    assert f"Build of instance {second.uuid} was re-scheduled: Anti-affinity instance " \
           "group policy was violated" in caplog.text
    assert _members_by_host(grouped) == {built_first.host: 1, built_second.host: 1}
    # The refused host's claim went with the reschedule; the host is not blamed for it.
    assert sum(_vcpus_used(grouped).values()) == 2
    assert all(agent.failed_builds == 0 for agent in grouped.agents.values())


def test_two_boots_into_an_affinity_group_sent_to_two_hosts_end_on_one(
        grouped: Stack) -> None:
    _group(grouped, "affinity")
    # Two scheduler services (two processes) walk equal hosts in their own orders.
    first = Boot(grouped, grouped.conductor(grouped.scheduler(seed=1)))
    second = Boot(grouped, grouped.conductor(grouped.scheduler(seed=3)))
    assert first.chosen != second.chosen
    (built_first,) = first.build().built
    (built_second,) = second.build().built
    assert built_second.tried[0] == second.chosen and built_second.host == built_first.host
    assert _members_by_host(grouped) == {built_first.host: 2}
    assert sum(_vcpus_used(grouped).values()) == 2


def test_max_server_per_host_lets_that_many_members_share_a_host(grouped: Stack) -> None:
    _group(grouped, "anti-affinity", max_server_per_host=2)
    conductor = grouped.conductor(grouped.scheduler(seed=1))
    boots = [Boot(grouped, conductor) for _ in range(3)]
    assert len({b.chosen for b in boots}) == 1
    hosts = [b.build().built[0].host for b in boots]
    assert hosts[0] == hosts[1] == boots[0].chosen and hosts[2] != hosts[0]
    assert _members_by_host(grouped) == {hosts[0]: 2, hosts[2]: 1}


@pytest.mark.parametrize("policy", ["soft-anti-affinity", "soft-affinity"])
def test_soft_policies_are_not_checked_when_the_build_reaches_its_host(
        grouped: Stack, policy: str) -> None:
    _group(grouped, policy)
    first = Boot(grouped, grouped.conductor(grouped.scheduler(seed=1)))
    # For soft-affinity a second scheduler sends the other boot elsewhere.
    seed = 3 if policy == "soft-affinity" else 1
    second = Boot(grouped, grouped.conductor(grouped.scheduler(seed=seed)))
    for boot in (first, second):
        (built,) = boot.build().built
        assert built.tried == [boot.chosen]


def test_the_workaround_option_turns_the_check_off(template_db: Path, tmp_path: Path) -> None:
    config = GROUPS_CONFIG.replace("workarounds", disable_group_policy_check_upcall=True)
    st = _stack(template_db, tmp_path, config)
    try:
        _group(st, "anti-affinity")
        conductor = st.conductor(st.scheduler(seed=1))
        first, second = Boot(st, conductor), Boot(st, conductor)
        assert first.chosen == second.chosen
        assert [b.build().built[0].host for b in (first, second)] == [first.chosen] * 2
        assert _members_by_host(st) == {first.chosen: 2}  # what Nova lets happen too
    finally:
        st.close()


def test_a_member_that_runs_nowhere_does_not_count(grouped: Stack) -> None:
    # A member that was never built (its boot failed, or has not built it yet).
    grouped.groups.put(InstanceGroup(policy="affinity", uuid=GROUP_UUID, name="g",
                                     members=[GHOST]))
    boot = Boot(grouped, grouped.conductor(grouped.scheduler(seed=1)))
    (built,) = boot.build().built
    assert built.tried == [boot.chosen]


def test_a_build_that_failed_on_a_host_does_not_count_there(grouped: Stack) -> None:
    _group(grouped, "anti-affinity")
    service = grouped.scheduler(seed=1)
    driver = FakeDriver(agents=grouped.agents)
    # The first boot has no alternate to go to: its build fails for good.
    no_retry = Conductor(service, driver, config=GROUPS_CONFIG.replace("scheduler", max_attempts=1),
                         groups=grouped.groups, group_check=grouped.group_check)
    first = Boot(grouped, no_retry)
    second = Boot(grouped, grouped.conductor(service))
    driver.fail_hosts.add(first.chosen)
    (failed,) = first.build().failed
    assert failed.tried == [first.chosen]
    driver.fail_hosts.clear()
    # Still a member, but it runs nowhere: the second is built where both were sent.
    (built_second,) = second.build().built
    assert built_second.tried == [first.chosen]


def test_the_instances_a_boot_did_not_build_leave_the_group(grouped: Stack) -> None:
    _group(grouped, "affinity")
    service = grouped.scheduler(seed=1)
    failing = grouped.conductor(service, FakeDriver(fail_hosts={"h0", "h1", "h2"},
                                                    agents=grouped.agents))
    spec = RequestSpec(flavor=TINY, num_instances=2,
                       instance_group=grouped.groups.resolve(GROUP_UUID))
    with pytest.raises(MaxRetriesExceeded):
        failing.build_instances(spec)
    group = grouped.groups.get(GROUP_UUID)
    assert group is not None and group.members == []


# ----------------------------------------------------------------- through the API
class RacingDriver(FakeDriver):
    """Runs ``meanwhile`` (another boot) while its first build is in progress: that
    build has passed the check and its host has not reported the instance yet."""

    meanwhile: Callable[[], None] | None = None

    def spawn(self, selection: Selection, instance_uuid: str, spec: RequestSpec) -> None:
        meanwhile, self.meanwhile = self.meanwhile, None
        if meanwhile is not None:
            meanwhile()
        super().spawn(selection, instance_uuid, spec)


@pytest.mark.parametrize("sees_the_claim", [False, True])
def test_a_boot_racing_another_into_an_anti_affinity_group_is_rescheduled(
        grouped: Stack, sees_the_claim: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A boot runs while another of the same group builds. One that read the group
    before the other's claim was written (``sees_the_claim`` false) is sent to the
    other's host and turned back by the late check; one that reads the claim avoids
    that host from the start."""
    _group(grouped, "anti-affinity")
    if not sees_the_claim:
        monkeypatch.setattr(grouped.groups.placements, "hosts_of", lambda members: {})
    driver = RacingDriver(agents=grouped.agents)
    service = grouped.scheduler(seed=3)
    app = SchedulerApp(service, grouped.conductor(service, driver), grouped.placement_app,
                       groups=grouped.groups)
    answers: list[dict[str, Any]] = []
    body = {"flavor": "m1.tiny", "hints": {"group": "g"}}
    with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://b", headers=ADMIN) as http:
        def boot() -> None:
            resp = http.post("/boot", json=body)
            assert resp.status_code == 200, resp.text
            answers.append(resp.json()["instances"][0])

        driver.meanwhile = boot
        boot()
    inner, outer = answers  # the racing boot finished first
    assert inner["host"] != outer["host"]
    if sees_the_claim:
        assert inner["tried"] == [inner["host"]]
    else:
        assert inner["tried"][0] == outer["host"]
    group = grouped.groups.get(GROUP_UUID)
    assert group is not None
    assert sorted(group.members) == sorted([inner["instance_uuid"], outer["instance_uuid"]])
    assert _members_by_host(grouped) == {inner["host"]: 1, outer["host"]: 1}


class SlowDriver(FakeDriver):
    """Builds take a while, so boots in threads overlap."""

    def spawn(self, selection: Selection, instance_uuid: str, spec: RequestSpec) -> None:
        time.sleep(0.05)
        super().spawn(selection, instance_uuid, spec)


def test_concurrent_boots_into_an_anti_affinity_group_end_one_per_host(grouped: Stack) -> None:
    _group(grouped, "anti-affinity")
    service = grouped.scheduler(seed=1)
    app = SchedulerApp(service, grouped.conductor(service, SlowDriver(agents=grouped.agents)),
                       grouped.placement_app, groups=grouped.groups)
    statuses: list[int] = []

    def boot() -> None:
        with httpx.Client(transport=httpx.WSGITransport(app=app), base_url="http://b", headers=ADMIN) as http:
            statuses.append(http.post("/boot", json={"flavor": "m1.tiny",
                                                     "hints": {"group": "g"}}).status_code)

    threads = [threading.Thread(target=boot) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == [200] * 3
    assert _members_by_host(grouped) == {"h0": 1, "h1": 1, "h2": 1}
