"""Build records, the reconciler and ``berth audit``: claims no build stands behind are
found and released; uuids are never issued twice.

The crash of a process is played here by a second :class:`BuildRecords` (another
owner) whose builds stop being updated; tests/service/test_shared_state_postgres.py
kills real ``berth serve`` processes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from berth.cli import main
from berth.errors import InstanceExists, ServiceUnavailable
from berth.model.request import Flavor, InstanceGroup, RequestSpec
from berth.service.builds import ACTIVE, BUILDING, DELETED, FAILED, BuildRecords
from berth.service.reconcile import Lease, repair, scan
from berth.service.stack import Stack

from .builders import node, reopen

GROUP = "aaaaaaaa-0000-4000-8000-0000000000b1"
U1, U2, U3, ORPHAN = (f"00000000-0000-4000-8000-00000000010{i}" for i in range(4))
TINY = Flavor(name="tiny", vcpus=1, memory_mb=512, root_gb=1, id=1)


class Clock:
    """A clock the test moves."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _claim(stack: Stack, consumer: str, host: int = 0) -> None:
    rp = list(stack.agents.values())[host].uuid
    stack.client.put_allocations(consumer, {rp: {"VCPU": 1, "MEMORY_MB": 512}}, project_id="p",
                                 user_id="u", consumer_generation=None)


def _held(stack: Stack, consumer: str) -> dict[str, dict[str, int]]:
    return stack.client.get_allocations(consumer).allocations


# ----------------------------------------------------------------- build records
def test_a_uuid_issued_once_is_refused_the_second_time(stack: Stack) -> None:
    stack.builds.begin([U1, U2], "req-1")
    other = BuildRecords(stack.engine)
    with pytest.raises(InstanceExists, match=U2):
        other.begin([U3, U2], "req-2")
    assert other.existing([U1, U2, U3]) == {U1, U2}  # nothing of the refused boot written


def test_a_build_settles_once_and_only_by_its_owner(stack: Stack) -> None:
    stack.builds.begin([U1], "req-1")
    assert not BuildRecords(stack.engine).settle(U1, ACTIVE, host="h0")
    assert stack.builds.settle(U1, ACTIVE, host="h0")
    assert not stack.builds.settle(U1, FAILED, reason="late")
    record = stack.builds.get(U1)
    assert record is not None and (record.state, record.host) == (ACTIVE, "h0")


def test_an_instance_row_written_with_its_settle_lands_only_if_the_build_settles(
        stack: Stack) -> None:
    stack.builds.begin([U1], "req-1")
    row = stack.instances.upserts([(U1, "h0", "h0", {"flavor": "tiny"})])
    assert not BuildRecords(stack.engine).settle(U1, ACTIVE, host="h0", also=row)
    assert stack.instances.get(U1) is None and stack.builds.get(U1).state == BUILDING
    assert stack.builds.settle(U1, ACTIVE, host="h0", also=row)
    instance = stack.instances.get(U1)
    assert instance is not None and instance.host == "h0"


def test_the_heartbeat_keeps_builds_in_flight_from_looking_abandoned(stack: Stack) -> None:
    clock = Clock()
    live, dead = BuildRecords(stack.engine, clock=clock), BuildRecords(stack.engine, clock=clock)
    live.begin([U1], "req-live")
    dead.begin([U2], "req-dead")
    clock.now += 100
    live.heartbeat()
    assert [b.instance_uuid for b in live.abandoned(60, clock.now)] == [U2]


def test_seeded_schedulers_never_draw_the_same_uuids_across_restarts_or_services(
        first: Stack) -> None:
    drawn = [first.scheduler(seed=7).new_instance_uuids(3),
             first.scheduler(seed=7).new_instance_uuids(3)]
    second = reopen(first)
    try:
        drawn.append(second.scheduler(seed=7).new_instance_uuids(3))
        assert second.builds.start == first.builds.start + 1
    finally:
        second.close()
    assert len({u for batch in drawn for u in batch}) == 9


# ----------------------------------------------------------------- the lease
def test_one_holder_at_a_time_until_the_lease_expires(stack: Stack) -> None:
    a, b = (Lease(stack.engine, "job", holder, ttl=10) for holder in ("a", "b"))
    assert a.acquire(100) and not b.acquire(105)
    assert a.acquire(108)  # renewed until 118
    assert not b.acquire(117) and b.acquire(119)
    b.release()
    assert a.acquire(120)


# ----------------------------------------------------------------- scan and repair
def _crashed_boot(stack: Stack, clock: Clock) -> BuildRecords:
    """U1 (claimed on h0) and U2 (not yet claimed) of a process that then died, both in
    GROUP; U3 a failed build whose claim was left behind; ORPHAN claimed with no
    record."""
    stack.register_hosts([node("h0"), node("h1")])
    stack.groups.put(InstanceGroup(policy="anti-affinity", uuid=GROUP, name="g"))
    dead = BuildRecords(stack.engine, clock=clock)
    dead.begin([U1, U2], "req-dead", GROUP)
    stack.groups.add_members(GROUP, [U1, U2])
    _claim(stack, U1)
    dead.begin([U3], "req-failed")
    _claim(stack, U3, host=1)
    dead.settle(U3, FAILED, reason="driver error")
    _claim(stack, ORPHAN, host=1)
    return dead


def test_a_pass_after_a_crash_of_many_builds_finds_them_all(stack: Stack) -> None:
    """40,000 builds left in flight by a dead process (more values than SQLite binds in
    one statement unless built otherwise): one pass finds every one abandoned, and the
    one with a claim leaked."""
    clock = Clock()
    stack.register_hosts([node("h0")])
    dead = BuildRecords(stack.engine, clock=clock)
    many = [f"00000000-0000-4000-8000-{i:012d}" for i in range(1000, 41000)]
    for start in range(0, len(many), 5000):
        dead.begin(many[start:start + 5000], f"req-{start}")
    _claim(stack, many[-1])
    findings = scan(stack.builds, stack.groups, timeout=60, now=clock.now + 61)
    assert len(findings.abandoned) == len(many)
    assert [h.consumer for h in findings.leaked] == [many[-1]]
    assert findings.leaked[0].reason == "build abandoned"


def test_abandoned_builds_and_failed_claims_are_released_and_orphans_only_listed(
        stack: Stack) -> None:
    clock = Clock()
    _crashed_boot(stack, clock)
    early = scan(stack.builds, stack.groups, timeout=60, now=clock.now + 30)
    assert not early.abandoned and [h.consumer for h in early.leaked] == [U3]

    later = clock.now + 61
    findings = scan(stack.builds, stack.groups, timeout=60, now=later)
    assert sorted(b.instance_uuid for b in findings.abandoned) == [U1, U2]
    assert sorted(h.consumer for h in findings.leaked) == [U1, U3]
    assert [h.consumer for h in findings.orphaned] == [ORPHAN]
    assert findings.stale_members == {GROUP: [U1, U2]}
    (u3,) = [h for h in findings.leaked if h.consumer == U3]
    assert u3.resources == {"h1": {"VCPU": 1, "MEMORY_MB": 512}} and u3.reason == "driver error"

    done = repair(findings, stack.builds, stack.groups, stack.client, timeout=60)
    assert sorted(done.builds_failed) == [U1, U2]
    assert sorted(done.allocations_deleted) == [U1, U3]
    assert _held(stack, U1) == {} and _held(stack, U3) == {} and _held(stack, ORPHAN)
    group = stack.groups.get(GROUP)
    assert group is not None and group.members == []
    record = stack.builds.get(U1)
    assert record is not None and record.state == FAILED and "abandoned" in (record.reason or "")
    after = scan(stack.builds, stack.groups, timeout=60, now=later)
    assert not (after.abandoned or after.leaked or after.stale_members)
    assert [h.consumer for h in after.orphaned] == [ORPHAN]


def test_a_build_whose_owner_came_back_is_left_alone(stack: Stack) -> None:
    clock = Clock()
    dead = _crashed_boot(stack, clock)
    findings = scan(stack.builds, stack.groups, timeout=60, now=clock.now + 61)
    clock.now += 62
    dead.heartbeat()  # the owner was only slow: its builds in flight move on
    done = repair(findings, stack.builds, stack.groups, stack.client, timeout=60)
    assert done.builds_failed == [] and done.allocations_deleted == [U3]
    assert _held(stack, U1)
    record = stack.builds.get(U1)
    assert record is not None and record.state == BUILDING


def test_the_reconciler_repairs_under_its_lease_and_skips_while_another_holds_it(
        stack: Stack) -> None:
    clock = Clock()
    _crashed_boot(stack, clock)
    clock.now += 61
    rec = stack.reconciler(timeout=60)
    rec.clock = clock
    other = Lease(stack.engine, rec.LEASE, "someone-else", ttl=30)
    assert other.acquire(clock.now)
    assert rec.run_once() is None and _held(stack, U1)
    clock.now += 31
    done = rec.run_once()
    assert done is not None and sorted(done.allocations_deleted) == [U1, U3]


def test_a_boot_records_its_builds_and_settles_them(stack: Stack) -> None:
    stack.register_hosts([node("h0")])
    conductor = stack.conductor(stack.scheduler(seed=1))
    (built,) = conductor.build_instances(RequestSpec(flavor=TINY, project_id="p", user_id="u"))
    record = stack.builds.get(built.instance_uuid)
    assert record is not None and (record.state, record.host) == (ACTIVE, "h0")
    instance = stack.instances.get(built.instance_uuid)
    assert instance is not None and (instance.host, instance.status) == ("h0", "ACTIVE")
    huge = Flavor(name="huge", vcpus=512, memory_mb=512, root_gb=1, id=2)
    uuids = conductor.scheduler.new_instance_uuids(1)
    with pytest.raises(Exception, match="No valid host"):
        conductor.build_instances(RequestSpec(flavor=huge, project_id="p", user_id="u"), uuids)
    failed = stack.builds.get(uuids[0])
    assert failed is not None and failed.state == FAILED and "No valid host" in (failed.reason or "")


def _settles_down(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """A database that cannot take a build's settle (``ServiceUnavailable``) while the
    flag this returns holds True."""
    real = stack.builds.settle
    down = [True]

    def settle(*args: Any, **kwargs: Any) -> bool:
        if down[0] and kwargs.get("host") is not None:
            raise ServiceUnavailable("the database connection was lost; try again shortly")
        return real(*args, **kwargs)

    monkeypatch.setattr(stack.builds, "settle", settle)
    return down


def test_a_build_the_database_cannot_record_is_still_built_and_recorded_when_it_is_back(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """The database goes while a boot settles its builds: the instance runs and holds
    its claim, so the boot answers it as built (an error would be retried by a client,
    and build it twice); the record waits, keeps its heartbeat (the reconciler must not
    take it for abandoned) and is written on the next heartbeat round."""
    stack.register_hosts([node("h0")])
    conductor = stack.conductor(stack.scheduler(seed=1))
    down = _settles_down(stack, monkeypatch)
    (built,) = conductor.build_instances(RequestSpec(flavor=TINY, project_id="p", user_id="u"))
    uuid = built.instance_uuid
    assert _held(stack, uuid) and stack.builds.deferred == [uuid]
    record = stack.builds.get(uuid)
    assert record is not None and record.state == BUILDING and stack.instances.get(uuid) is None
    assert stack.builds.settle_deferred() == []  # still down: it waits
    down[0] = False
    assert stack.builds.settle_deferred() == [uuid] and stack.builds.deferred == []
    record = stack.builds.get(uuid)
    assert record is not None and (record.state, record.host) == (ACTIVE, "h0")
    instance = stack.instances.get(uuid)
    assert instance is not None and instance.host == "h0" and _held(stack, uuid)
    assert scan(stack.builds, stack.groups, timeout=60).clean


def test_a_deferred_build_a_reconciler_failed_meanwhile_is_dropped_by_its_host(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """The database stayed away past the build timeout: another process's reconciler
    failed the build (it had not found it running) and released its claim before its
    owner could record it. The owner has the host drop the instance."""
    (agent,) = stack.register_hosts([node("h0")])
    conductor = stack.conductor(stack.scheduler(seed=1))
    down = _settles_down(stack, monkeypatch)
    (built,) = conductor.build_instances(RequestSpec(flavor=TINY, project_id="p", user_id="u"))
    uuid = built.instance_uuid
    assert uuid in agent.host_record(0.0).instances
    with stack.engine.begin() as conn:  # the other process's reconciler
        conn.execute(sa.text("UPDATE berth_builds SET state = 'failed' "
                             "WHERE instance_uuid = :u"), {"u": uuid})
    stack.client.delete_allocations(uuid)
    down[0] = False
    assert stack.builds.settle_deferred() == [uuid]
    assert uuid not in agent.host_record(0.0).instances
    assert stack.instances.get(uuid) is None


def test_a_build_whose_record_cannot_be_read_after_a_refused_settle_waits(
        stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    """The settle was refused (the record changed) and the record cannot be read to see
    how: nothing is released or dropped on a guess; the build waits for the next round."""
    (agent,) = stack.register_hosts([node("h0")])
    conductor = stack.conductor(stack.scheduler(seed=1))
    real_settle, real_get = stack.builds.settle, stack.builds.get
    down = [True]

    def settle(uuid: str, state: str, **kwargs: Any) -> bool:
        if down[0] and kwargs.get("host") is not None:
            return False
        return real_settle(uuid, state, **kwargs)

    def get(uuid: str) -> Any:
        if down[0]:
            raise ServiceUnavailable("the database connection was lost; try again shortly")
        return real_get(uuid)

    monkeypatch.setattr(stack.builds, "settle", settle)
    monkeypatch.setattr(stack.builds, "get", get)
    (built,) = conductor.build_instances(RequestSpec(flavor=TINY, project_id="p", user_id="u"))
    uuid = built.instance_uuid
    assert _held(stack, uuid) and uuid in agent.host_record(0.0).instances
    assert stack.builds.deferred == [uuid]
    down[0] = False
    assert stack.builds.settle_deferred() == [uuid]
    record = real_get(uuid)
    assert record is not None and record.state == ACTIVE and stack.instances.get(uuid)


@pytest.mark.parametrize("reconciler_found", ["running", "nothing"])
def test_a_build_a_reconciler_settled_first_is_kept_if_it_found_it_running(
        stack: Stack, monkeypatch: pytest.MonkeyPatch, reconciler_found: str) -> None:
    """The owner settles after another process's reconciler took its build over (it was
    cut off past the build timeout). Found running there, the build was recorded active
    with its claim: it stays built. Else it was failed and its claim released: the build
    does not count, and its host drops the instance."""
    from berth.errors import BerthError

    (agent,) = stack.register_hosts([node("h0")])
    conductor = stack.conductor(stack.scheduler(seed=1))
    real = stack.builds.settle

    def settle(uuid: str, state: str, **kwargs: Any) -> bool:
        if kwargs.get("host") is not None:  # the reconciler got there first
            with stack.engine.begin() as conn:
                conn.execute(sa.text("UPDATE berth_builds SET state = :s, host = :h "
                                     "WHERE instance_uuid = :u"),
                             {"s": ACTIVE if reconciler_found == "running" else FAILED,
                              "h": kwargs["host"], "u": uuid})
            return False
        return real(uuid, state, **kwargs)

    monkeypatch.setattr(stack.builds, "settle", settle)
    (uuid,) = conductor.scheduler.new_instance_uuids(1)
    if reconciler_found == "running":
        (built,) = conductor.build_instances(RequestSpec(flavor=TINY, project_id="p",
                                                         user_id="u"), [uuid])
        assert built.instance_uuid == uuid and _held(stack, uuid)
        assert uuid in agent.host_record(0.0).instances
    else:
        with pytest.raises(BerthError, match="abandoned"):
            conductor.build_instances(RequestSpec(flavor=TINY, project_id="p", user_id="u"),
                                      [uuid])
        assert not _held(stack, uuid)
        assert uuid not in agent.host_record(0.0).instances


def test_a_deleted_instance_is_recorded_deleted_and_its_uuid_stays_taken(
        stack: Stack) -> None:
    """The audit compares active builds with claims: a deleted instance's record must
    say it is gone, or every delete would be listed as an active build without
    allocations for good. Its uuid is never issued again, and should its consumer get
    allocations again (not through Berth), they are leaked and released."""
    stack.register_hosts([node("h0")])
    moves = stack.moves(stack.conductor(stack.scheduler(seed=1)))
    (built,) = moves.conductor.build_instances(
        RequestSpec(flavor=TINY, project_id="p", user_id="u"))
    uuid = built.instance_uuid
    moves.delete(uuid)
    record = stack.builds.get(uuid)
    assert record is not None and record.state == DELETED
    assert scan(stack.builds, stack.groups, timeout=60).clean
    with pytest.raises(InstanceExists, match=uuid):
        stack.builds.begin([uuid], "req-again")
    _claim(stack, uuid)
    findings = scan(stack.builds, stack.groups, timeout=60)
    assert [(h.consumer, h.reason) for h in findings.leaked] == [(uuid, "instance deleted")]
    repair(findings, stack.builds, stack.groups, stack.client)
    assert _held(stack, uuid) == {}
    assert scan(stack.builds, stack.groups, timeout=60).clean


# ----------------------------------------------------------------- berth audit
def test_audit_lists_then_fixes_planted_orphans_and_leaks(
        first: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    clock = Clock(1.0)  # long ago: every building record is abandoned by now
    _crashed_boot(first, clock)
    db = str(first.engine.url)

    def owners() -> int:
        with first.engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT count(*) FROM berth_owners")).scalar_one())

    registered = owners()
    assert main(["audit", "--db", db, "--json"]) == 8
    assert owners() == registered  # a listing writes nothing (it took a read-only db)
    found = json.loads(capsys.readouterr().out)["findings"]
    assert [h["consumer"] for h in found["orphaned"]] == [ORPHAN]
    assert sorted(h["consumer"] for h in found["leaked"]) == [U1, U3]
    assert found["stale_members"] == {GROUP: [U1, U2]}
    assert main(["audit", "--db", db, "--fix"]) == 0
    out = capsys.readouterr().out
    assert "fixed: 3 consumers' allocations deleted, 2 abandoned builds failed, 2 members" in out
    assert main(["audit", "--db", db]) == 0
    assert capsys.readouterr().out.startswith("clean:")
    for consumer in (U1, U3, ORPHAN):
        assert _held(first, consumer) == {}


def test_audit_purges_old_records_of_deleted_and_failed_instances_that_hold_nothing(
        stack: Stack, capsys: pytest.CaptureFixture[str]) -> None:
    """Build records are kept so that uuids are never issued twice; those of instances
    long deleted or failed are purged on request, unless their instance still holds a
    claim or a group place (the reconciler releases those through the record)."""
    stack.register_hosts([node("h0")])
    stack.groups.put(InstanceGroup(policy="anti-affinity", uuid=GROUP, name="g"))
    old, day = Clock(1_000_000.0), 86400.0
    uuids = [f"00000000-0000-4000-8000-0000000002{i:02d}" for i in range(7)]
    failed, deleted, claimed, member, active, recent, building = uuids
    then = BuildRecords(stack.engine, clock=old)
    then.begin(uuids, "req-old", None)
    for u in (failed, claimed, member, recent):
        then.settle(u, FAILED, reason="driver error")
    for u in (deleted, active):
        then.settle(u, ACTIVE, host="h0")
    _claim(stack, claimed)
    _claim(stack, active)
    stack.groups.add_members(GROUP, [member])
    with stack.engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE berth_builds SET state = '{DELETED}' "
                             "WHERE instance_uuid = :u"), {"u": deleted})
        conn.execute(sa.text("UPDATE berth_builds SET updated_at = :t WHERE instance_uuid = :u"),
                     {"t": time.time() - 0.5 * day, "u": recent})
    db = str(stack.engine.url)
    for bad, why in (("x", "'x' is not a number of days"),
                     ("nan", "'nan': the days must be 1 to 100000"),
                     ("0.5", "'0.5': the days must be 1 to 100000")):
        with pytest.raises(SystemExit) as exit_:
            main(["audit", "--db", db, "--purge", bad])
        assert exit_.value.code == 2
        assert capsys.readouterr().err.strip().endswith(f"argument --purge: {why}")
    # Settled before day 5: the failed and the deleted instance's records only.
    purged = then.purge(old.now + 5 * day)
    assert purged == 2
    assert stack.builds.existing(uuids) == {claimed, member, active, recent, building}
    # The command: records settled more than a day ago that hold nothing (none left).
    rc = main(["audit", "--db", db, "--json", "--purge", "1"])
    out = json.loads(capsys.readouterr().out)
    assert out["purged"]["build_records"] == 0 and rc == 8  # the leak of `claimed` stays
    assert stack.builds.existing(uuids) == {claimed, member, active, recent, building}
    # --fix first releases the claim and the group place; the abandoned build it fails
    # now is settled today, so it stays (its late claim would not become an orphan).
    assert main(["audit", "--db", db, "--fix", "--purge", "1"]) == 0
    text = capsys.readouterr().out
    assert "purged: 2 build records of deleted and failed instances settled before" in text
    assert stack.builds.existing(uuids) == {active, recent, building}


def test_a_database_error_during_an_audit_is_one_line(
        stack: Stack, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(*_args: Any) -> int:
        raise sa.exc.OperationalError("DELETE FROM berth_builds", {},
                                      Exception("database is locked\nmore"))

    monkeypatch.setattr(BuildRecords, "purge", fails)
    assert main(["audit", "--db", str(stack.engine.url), "--purge", "30"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.endswith(": database is locked") and "\n" not in err


def test_audit_of_a_missing_database_is_one_line(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--db", str(tmp_path / "none.sqlite")]) == 2
    assert capsys.readouterr().err.strip() == (
        f"berth audit: --db '{tmp_path / 'none.sqlite'}': no such database file")
    assert not (tmp_path / "none.sqlite").exists()


def test_an_abandoned_build_whose_instance_runs_on_its_claimed_host_is_completed(
        tmp_path: Path) -> None:
    """An API process killed while the agent built: the instance runs and holds its
    claim; the reconciler records the build as active instead of releasing the claim,
    with the instance's row from the spec its build record kept, so it can be listed,
    moved and deleted as any other."""
    from berth.service.compute import ComputeNodeSpec
    from berth.service.instances import spec_to_dict
    from berth.service.stack import open_stack

    stack = open_stack(f"sqlite:///{tmp_path}/c.sqlite")
    try:
        agent = stack.agent(ComputeNodeSpec(host="h1", vcpus=8, memory_mb=8192, local_gb=100))
        agent.register([])
        crashed = BuildRecords(stack.engine, clock=lambda: 100.0)
        uuid = "00000000-0000-4000-8000-00000000c0de"
        flavor = Flavor("t", 1, 512, 1, extra_specs={"trait:CUSTOM_X": "required"})
        spec = RequestSpec(flavor=flavor, project_id="p", user_id="u")
        crashed.begin([uuid], "req-1", spec=json.dumps(spec_to_dict(spec)))
        stack.client.put_allocations(uuid, {agent.uuid: {"VCPU": 1, "MEMORY_MB": 512,
                                                         "DISK_GB": 1}},
                                     project_id="p", user_id="u", consumer_generation=None)
        agent.spawn(uuid, flavor, "p")
        findings = scan(stack.builds, stack.groups, timeout=10, now=1000.0)
        assert [(b.instance_uuid, h) for b, h in findings.completed] == [(uuid, "h1")]
        assert findings.abandoned == [] and findings.leaked == []
        repair(findings, stack.builds, stack.groups, stack.client, timeout=10,
               instances=stack.instances)
        record = stack.builds.get(uuid)
        assert record is not None and (record.state, record.host) == (ACTIVE, "h1")
        assert record.spec is None  # kept only while the build is under way
        assert stack.client.get_allocations(uuid).allocations
        instance = stack.instances.get(uuid)
        assert instance is not None and (instance.host, instance.nodename) == ("h1", "h1")
        assert instance.spec["flavor"]["extra_specs"] == {"trait:CUSTOM_X": "required"}
        moves = stack.moves(stack.conductor(stack.scheduler(seed=1)))
        moves.delete(uuid)
        assert not stack.client.get_allocations(uuid).allocations
        assert scan(stack.builds, stack.groups, timeout=10, now=2000.0).clean
    finally:
        stack.close()


def test_a_build_records_table_of_an_earlier_berth_gets_its_spec_column(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A database an earlier Berth wrote has no ``spec`` column: a listing reads it as
    it is (and writes nothing), a server adds the column."""
    from berth.service.stack import open_stack

    db = f"sqlite:///{tmp_path}/old.sqlite"
    stack = open_stack(db)
    stack.builds.begin([U1], "req-1")
    stack.close()
    engine = sa.create_engine(db)
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE berth_builds DROP COLUMN spec"))
    assert main(["audit", "--db", db]) == 0
    capsys.readouterr()
    columns = {c["name"] for c in sa.inspect(engine).get_columns("berth_builds")}
    assert "spec" not in columns
    reader = BuildRecords(engine, register=False)
    record = reader.get(U1)
    assert record is not None and record.state == BUILDING and record.spec is None
    BuildRecords(engine)
    assert "spec" in {c["name"] for c in sa.inspect(engine).get_columns("berth_builds")}
    engine.dispose()
