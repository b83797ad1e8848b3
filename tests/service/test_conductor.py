"""The conductor builds each instance on its own and leaves no claim behind for an
instance it did not build; the fake driver fails as told and on hosts that are down."""

from __future__ import annotations

from pathlib import Path

import pytest

from berth.errors import MaxRetriesExceeded, NoValidHost
from berth.model.request import Flavor, RequestSpec
from berth.model.selection import Selection
from berth.service.conductor import BuildFailed, FakeDriver
from berth.service.stack import Stack

from .builders import node
from .conftest import TEST_CONFIG, fresh_stack

TINY = Flavor(name="tiny", vcpus=1, memory_mb=512, root_gb=1, id=1)


def _spec(num: int = 1, **fields: object) -> RequestSpec:
    return RequestSpec(flavor=TINY, num_instances=num, **fields)  # type: ignore[arg-type]


def _usage(stack: Stack) -> dict[str, int]:
    """VCPU used per host in placement."""
    return {host: stack.client.provider_usages(agent.uuid).get("VCPU", 0)
            for host, agent in stack.agents.items()}


class ExplodingDriver(FakeDriver):
    """A driver with a bug on one host: it raises something that is not BuildFailed."""

    def spawn(self, selection: Selection, instance_uuid: str, spec: RequestSpec) -> None:
        if selection.service_host == "h1":
            raise RuntimeError("driver bug")
        super().spawn(selection, instance_uuid, spec)


def test_an_instance_out_of_hosts_does_not_stop_the_others_nor_leak_claims(
        one_attempt: Stack) -> None:
    service = one_attempt.scheduler(seed=1)
    conductor = one_attempt.conductor(service, FakeDriver(fail_hosts={"h2"},
                                                          agents=one_attempt.agents))
    uuids = service.new_instance_uuids(2)
    outcome = conductor.build_all(service.select_destinations(_spec(2), uuids), _spec(2))
    assert [(b.instance_uuid, b.host) for b in outcome.built] == [(uuids[1], "h1")]
    (failure,) = outcome.failed
    assert failure.instance_uuid == uuids[0] and failure.tried == ["h2"]
    assert isinstance(failure.error, MaxRetriesExceeded)
    # Placement holds exactly the built instance.
    assert _usage(one_attempt) == {"h0": 0, "h1": 1, "h2": 0}


def test_build_instances_builds_the_others_before_raising_the_failure(
        one_attempt: Stack) -> None:
    service = one_attempt.scheduler(seed=1)
    conductor = one_attempt.conductor(service, FakeDriver(fail_hosts={"h2"},
                                                          agents=one_attempt.agents))
    with pytest.raises(MaxRetriesExceeded) as caught:
        conductor.build_instances(_spec(2))
    built, failed = caught.value.details["built"], caught.value.details["failed"]
    assert len(built) == 1 and len(failed) == 1
    assert _usage(one_attempt) == {"h0": 0, "h1": 1, "h2": 0}


def test_an_unexpected_driver_error_releases_that_instance_claim_and_builds_the_rest(
        stack: Stack) -> None:
    # h1 first (8448 MB), then h0 (8192 against h1's 7936).
    stack.register_hosts([node(f"h{i}", memory_mb=8192 + i * 256) for i in range(2)])
    service = stack.scheduler(seed=1)
    conductor = stack.conductor(service, ExplodingDriver(agents=stack.agents))
    decision = service.select_destinations(_spec(2), service.new_instance_uuids(2))
    outcome = conductor.build_all(decision, _spec(2))
    assert [b.host for b in outcome.built] == ["h0"]
    (failure,) = outcome.failed
    assert "internal error" in failure.error.message
    assert _usage(stack) == {"h0": 1, "h1": 0}


def test_a_build_on_a_down_host_fails_and_does_not_bring_its_heartbeat_back(
        stack: Stack) -> None:
    (h0,) = stack.register_hosts([node("h0")])
    stale = h0.clock() - 3600
    h0.report(now=stale)
    h0.silent = True
    driver = FakeDriver(agents=stack.agents)
    selection = Selection(h0.uuid, "h0", "h0", None)
    with pytest.raises(BuildFailed, match="the host is down"):
        driver.spawn(selection, "00000000-0000-4000-8000-000000000001", _spec())
    assert h0.last_heartbeat == stale and h0.failed_builds == 0
    h0.silent, h0.forced_down = False, True
    with pytest.raises(BuildFailed, match="the host is down"):
        driver.spawn(selection, "00000000-0000-4000-8000-000000000001", _spec())


def test_a_successful_build_resets_the_host_failed_builds(stack: Stack) -> None:
    (h0,) = stack.register_hosts([node("h0")])
    driver = FakeDriver(fail_first={"h0": 2}, agents=stack.agents)
    selection = Selection(h0.uuid, "h0", "h0", None)
    for _ in range(2):
        with pytest.raises(BuildFailed):
            driver.spawn(selection, "00000000-0000-4000-8000-000000000001", _spec())
    assert h0.failed_builds == 2
    driver.spawn(selection, "00000000-0000-4000-8000-000000000001", _spec())
    assert h0.failed_builds == 0


def test_an_error_inside_the_scheduler_after_its_claims_releases_them(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    stack.register_hosts([node(f"h{i}") for i in range(2)])
    service = stack.scheduler(seed=1)
    conductor = stack.conductor(service)

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("alternates bug")

    # The core claims every instance before it picks the alternates.
    monkeypatch.setattr(service.scheduler, "_alternates", broken)
    with pytest.raises(RuntimeError, match="alternates bug"):
        conductor.build_instances(_spec(2))
    assert _usage(stack) == {"h0": 0, "h1": 0}


# ------------------------------------------------ RetryFilter: reschedule via the scheduler
RETRY_CONFIG = TEST_CONFIG.replace(
    "filter_scheduler", available_filters=["berth.filters.all_filters"],
    enabled_filters=["RetryFilter", "ComputeFilter"])


def _retry_stack(template_db: Path, tmp_path: Path, **scheduler: int) -> Stack:
    config = RETRY_CONFIG.replace("scheduler", **scheduler) if scheduler else RETRY_CONFIG
    st = fresh_stack(template_db, tmp_path, config)
    st.register_hosts([node(f"h{i}", memory_mb=8192 + i * 256) for i in range(3)])
    return st


def test_with_retry_filter_a_failed_build_asks_the_scheduler_again_with_the_tried_hosts(
        template_db: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    st = _retry_stack(template_db, tmp_path)
    try:
        service = st.scheduler(seed=1)
        conductor = st.conductor(service, FakeDriver(fail_hosts={"h2", "h1"}, agents=st.agents))
        asked: list[object] = []
        real = service.select_destinations

        def spy(spec: RequestSpec, uuids: object = None, **kw: object) -> object:
            asked.append(None if spec.retry is None else (
                spec.num_instances, spec.retry.num_attempts,
                [(r.host, r.hypervisor_hostname) for r in spec.retry.hosts]))
            return real(spec, uuids, **kw)  # type: ignore[arg-type]

        service.select_destinations = spy  # type: ignore[method-assign]
        with caplog.at_level("INFO"):
            (result,) = conductor.build_instances(_spec())
        # h2 (most RAM) fails, then h1; the third attempt lands on h0.
        assert result.tried == ["h2", "h1", "h0"] and result.host == "h0"
        assert asked == [None, (1, 2, [("h2", "h2")]), (1, 3, [("h2", "h2"), ("h1", "h1")])]
        assert "asking the scheduler again (attempt 2 of 3" in caplog.text
        assert result.host_list is not None and [s.service_host for s in result.host_list] == ["h0"]
        assert _usage(st) == {"h0": 1, "h1": 0, "h2": 0}
    finally:
        st.close()


def test_with_retry_filter_more_than_max_attempts_is_max_retries_exceeded(
        template_db: Path, tmp_path: Path) -> None:
    st = _retry_stack(template_db, tmp_path, max_attempts=2)
    try:
        service = st.scheduler(seed=1)
        conductor = st.conductor(service, FakeDriver(fail_hosts={"h0", "h1", "h2"},
                                                     agents=st.agents))
        with pytest.raises(MaxRetriesExceeded, match=r"Exceeded maximum number of retries \(2\)") as caught:
            conductor.build_instances(_spec())
        assert caught.value.details["failed"] and not caught.value.details["built"]
        assert _usage(st) == {"h0": 0, "h1": 0, "h2": 0}
    finally:
        st.close()


def test_with_retry_filter_every_host_tried_is_no_valid_host_from_the_scheduler(
        template_db: Path, tmp_path: Path) -> None:
    st = _retry_stack(template_db, tmp_path, max_attempts=5)
    try:
        service = st.scheduler(seed=1)
        conductor = st.conductor(service, FakeDriver(fail_hosts={"h0", "h1", "h2"},
                                                     agents=st.agents))
        outcome = conductor.build_all(*_decided(service, 1))
        (failure,) = outcome.failed
        assert isinstance(failure.error, NoValidHost)
        assert failure.tried == ["h2", "h1", "h0"]
        assert _usage(st) == {"h0": 0, "h1": 0, "h2": 0}
    finally:
        st.close()


def test_with_retry_filter_a_single_forced_host_is_not_rescheduled(
        template_db: Path, tmp_path: Path) -> None:
    st = _retry_stack(template_db, tmp_path)
    try:
        service = st.scheduler(seed=1)
        driver = FakeDriver(fail_hosts={"h1"}, agents=st.agents)
        conductor = st.conductor(service, driver)
        with pytest.raises(MaxRetriesExceeded, match="single forced host is not rescheduled"):
            conductor.build_instances(_spec(force_hosts=["h1"]))
        assert [host for _, host in driver.attempts] == ["h1"]
    finally:
        st.close()


def test_with_retry_filter_each_instance_of_a_multi_create_retries_on_its_own(
        template_db: Path, tmp_path: Path) -> None:
    st = _retry_stack(template_db, tmp_path)
    try:
        service = st.scheduler(seed=1)
        conductor = st.conductor(service, FakeDriver(fail_hosts={"h2"}, agents=st.agents))
        results = conductor.build_instances(_spec(2))
        # Instance 1: h2 fails, then h1; instance 2 was sent to h1 and builds there.
        assert sorted((r.tried, r.host) for r in results) == [
            (["h1"], "h1"), (["h2", "h1"], "h1")]
        assert _usage(st) == {"h0": 0, "h1": 2, "h2": 0}
    finally:
        st.close()


def _decided(service: object, num: int) -> tuple[object, RequestSpec]:
    spec = _spec(num)
    return service.select_destinations(  # type: ignore[attr-defined]
        spec, service.new_instance_uuids(num)), spec  # type: ignore[attr-defined]
