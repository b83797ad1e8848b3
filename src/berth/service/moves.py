"""The conductor's move tasks: migrate, resize, evacuate, rebuild, live migrate;
confirm and revert.

Per move, as Nova's conductor runs it (``tasks/migrate.py``, ``rebuild_instance``)::

    instance ACTIVE -> MOVING (compare-and-swap: one move of an instance at a time)
      ▼
    plan (berth.moves.plan_move): the request spec, ignored/required hosts, the cell
      ▼
    migration record (pre-migrating); migrate/resize: the source allocation moves to
    the migration consumer (POST /allocations)
      ▼
    scheduler: filters and weighers; the destination claimed for the instance consumer
      │                             NoValidHost -> allocations put back, migration error
      ▼
    build on the destination through the driver, under the late group check; a failed
    build gives up its claim and the next alternate is claimed and tried (migrate,
    resize); none left -> allocations put back, migration failed
      ▼
    migrate/resize: VERIFY_RESIZE, migration finished (the source allocation stays with
    the migration consumer until confirm deletes it or revert moves it back);
    live-migrate: ACTIVE, migration completed, the source allocation deleted and the
    source lets go of the instance (a destination the conductor's checks skip gives up
    its claim and the scheduler is asked again; a failed build puts everything back);
    evacuate: ACTIVE, migration done (the instance consumer holds source and
    destination until the source's compute cleans up: :meth:`MoveService.cleanup_evacuated`
    when it is up again); rebuild: ACTIVE, new image

:class:`PlacementMoveClaims` is the placement side (Nova's report client calls for
moves: ``move_allocations`` over ``POST /allocations`` at microversion 1.28, with the
consumers' generations).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import httpx

from berth.errors import (
    AllocationMoveFailed,
    BerthError,
    InstanceNotFound,
    MaxRetriesExceeded,
    MoveRefused,
)
from berth.model.request import RequestSpec
from berth.model.selection import Selection, selection_dict
from berth.moves import (
    EVACUATE,
    LIVE_MIGRATE,
    REBUILD,
    MovePlan,
    MoveRequest,
    MovingInstance,
    SourceHost,
    destination_check,
    drop_destination,
    finish_move,
    plan_move,
    revert_move,
    schedule_live_migration,
    schedule_move,
    service_is_up,
)
from berth.pipeline import Decision
from berth.placement.client import ConflictError, ConsumerAllocations, ConsumerPost
from berth.service.conductor import BuildFailed, Conductor
from berth.service.groups import ServerGroupStore
from berth.service.instances import (
    ACTIVE,
    DELETING,
    MOVING,
    VERIFY_RESIZE,
    InstanceRecord,
    InstanceStore,
    MigrationRecord,
    spec_from_dict,
    spec_to_dict,
)
from berth.service.scheduler import SchedulerService
from berth.snapshot import HostSnapshot

LOG = logging.getLogger(__name__)

#: The microversion Nova's report client moves allocations at (consumer generations).
MOVE_MICROVERSION = "1.28"
#: Attempts of one allocation move when a consumer changes meanwhile (Nova's @retries).
MOVE_ATTEMPTS = 4


class MoveAccess(Protocol):
    """The placement calls a move makes (:class:`PlacementClient` or ``LocalPlacement``)."""

    def get_allocations(self, consumer: str) -> ConsumerAllocations:
        """GET /allocations/{consumer}."""
        ...

    def put_allocations(
        self, consumer: str, allocations: Mapping[str, Mapping[str, int]], *, project_id: str,
        user_id: str, consumer_generation: int | None, consumer_type: str = "INSTANCE",
        microversion: str | None = None,
    ) -> None:
        """PUT /allocations/{consumer}."""
        ...

    def post_allocations(self, consumers: Mapping[str, ConsumerPost], *,
                         microversion: str | None = None) -> None:
        """POST /allocations."""
        ...

    def delete_allocations(self, consumer: str) -> None:
        """DELETE /allocations/{consumer}."""
        ...

    def take_allocations(self, consumer: str) -> dict[str, dict[str, int]]:
        """DELETE /allocations/{consumer}, answering what it held."""
        ...


class MoveDriver(Protocol):
    """A compute driver that can move instances (:class:`~berth.service.conductor.FakeDriver`)."""

    def move(self, selection: Selection, instance_uuid: str, spec: RequestSpec,
             source_host: str) -> None:
        """Build the moved instance on the destination, or raise BuildFailed."""
        ...

    def confirm_move(self, instance_uuid: str, source_host: str) -> None:
        """The source lets go of the instance."""
        ...

    def revert_move(self, instance_uuid: str, dest_host: str, source_host: str) -> None:
        """The instance goes back to the source."""
        ...

    def rebuild(self, selection: Selection, instance_uuid: str, spec: RequestSpec) -> None:
        """Rebuild in place with the spec's image, or raise BuildFailed."""
        ...

    def forget_evacuated(self, instance_uuid: str, source_host: str) -> None:
        """The source of an evacuation is back and drops the instance."""
        ...


T = TypeVar("T")


def _unless_none_held(call: Callable[[], T]) -> T | None:
    """``call()``, or None when placement answers 404 (the consumer holds nothing) or
    cannot be reached."""
    try:
        return call()
    except Exception as exc:  # 404 (none held) and transport errors alike
        if getattr(exc, "status", None) != 404 and not isinstance(exc, httpx.HTTPError):
            raise
        return None


class PlacementMoveClaims:
    """:class:`~berth.moves.MoveClaims` through placement (HTTP or in process)."""

    def __init__(self, client: MoveAccess) -> None:
        self.client = client

    def allocations_of(self, consumer: str) -> dict[str, dict[str, int]]:
        """GET /allocations/{consumer}, by provider."""
        return {rp: dict(res) for rp, res in self.client.get_allocations(consumer).allocations.items()}

    def move_allocations(self, source: str, target: str, spec: RequestSpec) -> None:
        """Nova's ``move_allocations``: one ``POST /allocations`` empties ``source`` and
        gives its allocations to ``target`` (replacing the target's), each with its
        consumer generation; retried when a consumer changed meanwhile."""
        for _attempt in range(MOVE_ATTEMPTS):
            src = self.client.get_allocations(source)
            if not src.allocations:
                return
            tgt = self.client.get_allocations(target)
            project = src.project_id or spec.project_id or "unknown"
            user = src.user_id or spec.user_id or "unknown"
            body = {
                source: ConsumerPost({}, project, user, src.consumer_generation),
                target: ConsumerPost(src.allocations, project, user,
                                     tgt.consumer_generation if tgt.allocations else None),
            }
            try:
                self.client.post_allocations(body, microversion=MOVE_MICROVERSION)
                return
            except ConflictError as exc:
                if not exc.is_generation_conflict:
                    raise AllocationMoveFailed(
                        f"unable to move the allocations of {source} to {target}: {exc.detail}",
                        source=source, target=target) from None
                LOG.info("moving allocations %s -> %s: %s; retrying", source, target, exc.detail)
        raise AllocationMoveFailed(
            f"unable to move the allocations of {source} to {target}: they kept changing",
            source=source, target=target)

    def merge_allocations(self, source: str, target: str, spec: RequestSpec) -> None:
        """One ``POST /allocations``: ``target`` keeps its allocations and gains those of
        ``source``, which is left with none; retried when a consumer changed meanwhile."""
        for _attempt in range(MOVE_ATTEMPTS):
            src = self.client.get_allocations(source)
            if not src.allocations:
                return
            tgt = self.client.get_allocations(target)
            merged: dict[str, dict[str, int]] = {rp: dict(res) for rp, res in tgt.allocations.items()}
            for rp, res in src.allocations.items():
                into = merged.setdefault(rp, {})
                for rc, amount in res.items():
                    into[rc] = into.get(rc, 0) + int(amount)
            project = tgt.project_id or src.project_id or spec.project_id or "unknown"
            user = tgt.user_id or src.user_id or spec.user_id or "unknown"
            body = {
                source: ConsumerPost({}, project, user, src.consumer_generation),
                target: ConsumerPost(merged, project, user,
                                     tgt.consumer_generation if tgt.allocations else None),
            }
            try:
                self.client.post_allocations(body, microversion=MOVE_MICROVERSION)
                return
            except ConflictError as exc:
                if not exc.is_generation_conflict:
                    raise AllocationMoveFailed(
                        f"unable to give the allocations of {source} to {target}: {exc.detail}",
                        source=source, target=target) from None
        raise AllocationMoveFailed(
            f"unable to give the allocations of {source} to {target}: they kept changing",
            source=source, target=target)

    def replace_allocations(self, consumer: str, allocations: Mapping[str, Mapping[str, int]],
                            spec: RequestSpec) -> None:
        """PUT exactly ``allocations`` for the consumer, with its current generation."""
        for _attempt in range(MOVE_ATTEMPTS):
            current = self.client.get_allocations(consumer)
            try:
                self.client.put_allocations(
                    consumer, allocations,
                    project_id=current.project_id or spec.project_id or "unknown",
                    user_id=current.user_id or spec.user_id or "unknown",
                    consumer_generation=current.consumer_generation if current.allocations else None,
                    microversion=MOVE_MICROVERSION)
                return
            except ConflictError as exc:
                if not exc.is_generation_conflict:
                    raise AllocationMoveFailed(
                        f"unable to restore the allocations of {consumer}: {exc.detail}",
                        consumer=consumer) from None
        raise AllocationMoveFailed(f"unable to restore the allocations of {consumer}: they "
                                   "kept changing", consumer=consumer)

    def delete(self, consumer: str) -> bool:
        """DELETE /allocations/{consumer}; False when it had none."""
        def delete() -> bool:
            self.client.delete_allocations(consumer)
            return True

        return bool(_unless_none_held(delete))

    def take(self, consumer: str) -> dict[str, dict[str, int]] | None:
        """DELETE /allocations/{consumer}; what it held, or None when it had none (over
        HTTP a GET comes first; in process the deleted rows answer)."""
        return _unless_none_held(lambda: self.client.take_allocations(consumer))


class MovesElsewhere(BerthError):
    """A move asked of an API process without a scheduler in process."""

    code = "berth.moves.elsewhere"


class MoveService:
    """Moves of the instances ``instances`` knows, through ``conductor``'s scheduler,
    claimer and driver (which must implement :class:`MoveDriver`).

    ``traits_of(provider_uuid)`` reads a source node's provider traits (a cold migration
    stays on its host only when the node has ``COMPUTE_SAME_HOST_COLD_MIGRATE``).
    ``groups``, when given, is on ``instances``' database (a deleted instance's row and
    its memberships go in one transaction).

    Over a conductor whose scheduler is elsewhere (``berth api``: over the bus), the
    instances are listed, shown and deleted, and every move is refused
    (:class:`MovesElsewhere`): a move reads the scheduler's host snapshot in process;
    ``node_names`` then names the providers of an instance's allocations.
    """

    def __init__(
        self,
        conductor: Conductor,
        instances: InstanceStore,
        claims: PlacementMoveClaims,
        *,
        groups: ServerGroupStore | None = None,
        traits_of: Callable[[str], Sequence[str]] | None = None,
        node_names: Callable[[Iterable[str]], dict[str, str]] | None = None,
    ) -> None:
        self.conductor = conductor
        scheduler = conductor.scheduler
        # Moves read the scheduler's snapshot (the source host's state) in process.
        self.local: SchedulerService | None = (
            scheduler if isinstance(scheduler, SchedulerService) else None)
        if self.local is None and node_names is None:
            raise ValueError("instances over a remote scheduler need node_names")
        self.node_names = node_names
        self.instances = instances
        self.claims = claims
        self.groups = groups
        self.traits_of = traits_of

    # ----------------------------------------------------------------- entry points
    @property
    def scheduler(self) -> SchedulerService:
        """The scheduler service in process, which moves need; MovesElsewhere without."""
        if self.local is None:
            raise MovesElsewhere("moves are served by berth serve, whose scheduler runs in "
                                 "process; this API process schedules over the bus")
        return self.local

    @property
    def moves_here(self) -> bool:
        """Whether this service can move instances (a scheduler in process)."""
        return self.local is not None

    def move(self, instance_uuid: str, request: MoveRequest, *,
             explain: bool = False) -> dict[str, Any]:
        """Run one move; the answer says where the instance went and what the instance
        and migration consumers hold now. NoValidHost, MaxRetriesExceeded (allocations
        as before the move), MoveRefused, InputError, InstanceNotFound."""
        self.scheduler  # noqa: B018 - MovesElsewhere before anything changes
        record = self._instance(instance_uuid)
        if not self.instances.swap_status(instance_uuid, [ACTIVE], MOVING):
            raise self._busy(instance_uuid)
        try:
            return self._move(record, request, explain)
        finally:
            current = self.instances.get(instance_uuid)
            if current is not None and current.status == MOVING:
                self.instances.update(instance_uuid, status=ACTIVE)

    def confirm(self, instance_uuid: str) -> dict[str, Any]:
        """Confirm a migration or resize: the migration consumer's (source) allocations
        are deleted and the source lets go of the instance."""
        self.scheduler  # noqa: B018 - MovesElsewhere when the moves are served elsewhere
        self._instance(instance_uuid)
        migration = self._awaiting(instance_uuid)
        try:
            self.claims.delete(migration.uuid)
            self._driver().confirm_move(instance_uuid, migration.source_host)
            self.instances.set_migration(migration.uuid, status="confirmed")
        except BaseException:
            self.instances.update(instance_uuid, status=VERIFY_RESIZE)
            raise
        self.instances.update(instance_uuid, status=ACTIVE)
        return self.show(instance_uuid, migration.uuid)

    def revert(self, instance_uuid: str) -> dict[str, Any]:
        """Revert a migration or resize: the instance consumer gets the source
        allocation back from the migration consumer (its destination claim goes), and
        the instance runs on the source with its old flavor again."""
        self.scheduler  # noqa: B018 - MovesElsewhere when the moves are served elsewhere
        record = self._instance(instance_uuid)
        migration = self._awaiting(instance_uuid)
        try:
            spec = spec_from_dict(migration.old_spec)
            self.claims.move_allocations(migration.uuid, instance_uuid, spec)
            self._driver().revert_move(instance_uuid, record.host, migration.source_host)
            self.instances.set_migration(migration.uuid, status="reverted")
            self.instances.update(instance_uuid, status=ACTIVE, host=migration.source_host,
                                  nodename=migration.source_node, spec=migration.old_spec)
        except BaseException:
            self.instances.update(instance_uuid, status=VERIFY_RESIZE)
            raise
        return self.show(instance_uuid, migration.uuid)

    def delete(self, instance_uuid: str) -> dict[str, Any]:
        """Delete an instance (Nova's server delete): a resize waiting for confirmation
        gives up its source first; the instance consumer's allocations are deleted; the
        host forgets it and reports; it leaves its server groups; its record goes and its
        build record becomes ``deleted``. An instance that is moving is refused
        (MoveRefused)."""
        record = self._instance(instance_uuid)
        # Only a resized instance waiting for confirmation has a finished migration to
        # give up (Nova looks for it only then, too): an instance that was ACTIVE when
        # it became DELETING skips the query.
        if self.instances.swap_status(instance_uuid, [ACTIVE], DELETING):
            before, finished = ACTIVE, []
        elif self.instances.swap_status(instance_uuid, [VERIFY_RESIZE], DELETING):
            before = VERIFY_RESIZE
            finished = self.instances.migrations(instance_uuid, status="finished")
        else:
            raise self._busy(instance_uuid)
        freed: dict[str, Any] = {}
        try:
            for migration in finished:
                freed[migration.uuid] = self.claims.take(migration.uuid) or {}
                release = getattr(self.conductor.driver, "confirm_move", None)
                if callable(release):
                    release(instance_uuid, migration.source_host)
                self.instances.set_migration(migration.uuid, status="deleted")
            freed[instance_uuid] = self.claims.take(instance_uuid) or {}
        except BaseException:
            self.instances.update(instance_uuid, status=before)
            raise
        terminate = getattr(self.conductor.driver, "terminate", None)
        if callable(terminate):
            terminate(instance_uuid, record.host, record.nodename)
        # One transaction: the row goes with its memberships and its build's state.
        also = self.groups.leaving(instance_uuid) if self.groups is not None else []
        if self.conductor.builds is not None:
            also += self.conductor.builds.deleting(instance_uuid)
        self.instances.remove(instance_uuid, also=also)
        return {"instance_uuid": instance_uuid, "status": "DELETED", "host": record.host,
                "nodename": record.nodename, "freed": freed,
                "providers": self._provider_names(freed)}

    def evacuated_sources(self) -> set[str]:
        """The hosts with instances evacuated from them that they have not dropped yet
        (the hosts :meth:`cleanup_evacuated` has work on)."""
        return {m.source_host for m in self.instances.migrations(status="done")
                if m.migration_type == "evacuation" and m.source_host}

    def cleanup_evacuated(self, host: str) -> list[str]:
        """What Nova's compute does when it starts (``_destroy_evacuated_instances``):
        for every instance evacuated from ``host`` (migration ``done``), the instance
        consumer gives up its allocation on ``host``'s nodes, the host forgets the
        instance, and the migration becomes ``completed``. Returns the instances.

        ``berth serve`` runs it at start-up for every host that is up; call it when a
        host that was down reports again."""
        snapshot = self.scheduler.refresh()
        done = []
        for migration in self.instances.migrations(status="done"):
            if migration.migration_type != "evacuation" or migration.source_host != host:
                continue
            row = snapshot.row_of(migration.source_host, migration.source_node)
            provider = snapshot.obj("uuid")[row] if row is not None else None
            held = self.claims.allocations_of(migration.instance_uuid)
            if provider in held:
                rest = {rp: res for rp, res in held.items() if rp != provider}
                spec = spec_from_dict(migration.old_spec)
                if rest:
                    self.claims.replace_allocations(migration.instance_uuid, rest, spec)
                else:
                    self.claims.delete(migration.instance_uuid)
            self._driver().forget_evacuated(migration.instance_uuid, host)
            self.instances.set_migration(migration.uuid, status="completed")
            done.append(migration.instance_uuid)
        return done

    def show(self, instance_uuid: str, migration_uuid: str | None = None) -> dict[str, Any]:
        """The instance, its migrations, and the allocations of the instance consumer and
        of the migration consumer: ``migration_uuid``'s, or that of the move waiting to
        be confirmed or reverted (the source's allocation it holds)."""
        record = self._instance(instance_uuid)
        migrations = self.instances.migrations(instance_uuid)
        if migration_uuid is None:
            waiting = [m.uuid for m in migrations if m.status == "finished"]
            migration_uuid = waiting[-1] if waiting else None
        answer: dict[str, Any] = {
            "instance_uuid": record.uuid, "host": record.host, "nodename": record.nodename,
            "status": record.status, "flavor": record.spec["flavor"]["name"],
            "image": (record.spec.get("image") or {}).get("name"),
            "allocations": {"instance": self.claims.allocations_of(instance_uuid)},
            "migrations": [_migration_dict(m) for m in migrations],
        }
        if migration_uuid is not None:
            answer["migration_uuid"] = migration_uuid
            answer["allocations"]["migration"] = self.claims.allocations_of(migration_uuid)
        answer["providers"] = self._provider_names(answer["allocations"])
        return answer

    def _provider_names(self, allocations: Mapping[str, Any]) -> dict[str, str]:
        """``host/node`` of every provider the allocations use (for people reading). A
        row's host and node never change, so the snapshot is refreshed (which reads every
        report since the last request) only when a provider is not in it yet."""
        if self.local is None:
            assert self.node_names is not None
            return self.node_names({rp for held in allocations.values() for rp in held})
        rows = self.scheduler.feed.uuid_rows
        wanted = {rp for held in allocations.values() for rp in held}
        snapshot = (self.scheduler.feed.snapshot if all(rp in rows for rp in wanted)
                    else self.scheduler.refresh())
        names: dict[str, str] = {}
        for held in allocations.values():
            for rp in held:
                row = rows.get(rp)
                if row is not None:
                    names[rp] = f"{snapshot.obj('host')[row]}/{snapshot.obj('nodename')[row]}"
        return names

    # ----------------------------------------------------------------- the move
    def _move(self, record: InstanceRecord, request: MoveRequest,
              explain: bool) -> dict[str, Any]:
        snapshot = self.scheduler.refresh()
        plan = self._plan(record, request, snapshot)
        migration_uuid: str | None = None
        if plan.migration_type is not None:
            migration_uuid = self.scheduler.new_instance_uuids(1)[0]
            self.instances.add_migration(MigrationRecord(
                migration_uuid, record.uuid, plan.migration_type,
                "accepted" if plan.operation == LIVE_MIGRATE else "pre-migrating",
                record.host, record.nodename, None, None, record.spec))
        if not plan.schedule:
            # A rebuild with the instance's own image asks no scheduler (Nova).
            selection = self._own_selection(snapshot, record)
            self._build(plan, selection)
            self._done(record, plan, selection, migration_uuid)
            return self._answer(record, plan, [selection], [record.host], migration_uuid, None,
                                scheduled=False)

        def select(spec: RequestSpec, uuids: Sequence[str], alternates: bool,
                   explain_it: bool) -> Decision:
            return self.scheduler.select_destinations(
                spec, uuids, return_alternates=alternates, explain=explain_it,
                check_zone=False)

        skipped: list[tuple[str, str]] = []
        try:
            if plan.operation == LIVE_MIGRATE:
                assert migration_uuid is not None
                decision, before, skipped = schedule_live_migration(
                    plan, select, self.claims, migration_uuid,
                    check=destination_check(lambda: self.scheduler.feed.snapshot,
                                            record.host, plan.spec, self.scheduler.config),
                    max_retries=self.scheduler.config.migrate_max_retries, explain=explain)
            else:
                decision, before = schedule_move(plan, select, self.claims, migration_uuid,
                                                 explain=explain)
        except BaseException:
            if migration_uuid is not None:
                self.instances.set_migration(migration_uuid, status="error")
            raise
        hosts = decision.selections[0]
        tried: list[str] = []
        max_attempts = self.scheduler.config.scheduler.max_attempts
        built: Selection | None = None
        try:
            for position, selection in enumerate(hosts):
                if len(tried) >= max_attempts:
                    break
                if position > 0:
                    alloc_req = selection.allocation_request_dict
                    if alloc_req is not None and not self.conductor.claimer.claim(
                            record.uuid, alloc_req, plan.spec,
                            selection.allocation_request_version):
                        LOG.info("alternate %s refused the claim for %s; next alternate",
                                 selection.service_host, record.uuid)
                        continue
                tried.append(selection.service_host)
                try:
                    self._build(plan, selection)
                except BuildFailed as exc:
                    LOG.info("%s; rescheduling the %s", exc, plan.operation)
                    drop_destination(plan, self.claims, before)
                    continue
                built = selection
                break
        except BaseException:
            self._failed(plan, migration_uuid, before)
            raise
        if built is not None:
            # Built: the instance runs on the destination, so nothing from here on puts
            # the allocations back as before the move (an error is the caller's to see).
            self._done(record, plan, built, migration_uuid)
            if plan.drops_source:  # no confirm step: the source lets go now
                self._driver().confirm_move(record.uuid, record.host)
            finish_move(plan, self.claims, migration_uuid)
            return self._answer(record, plan, hosts, tried, migration_uuid,
                                decision.diagnosis, built_on=built, skipped=skipped)
        self._failed(plan, migration_uuid, before)
        raise MaxRetriesExceeded(
            f"Exceeded maximum number of retries. Exhausted all hosts available for retrying "
            f"the {plan.operation} of instance {record.uuid}.",
            instance_uuid=record.uuid, tried=tried)

    def _failed(self, plan: MovePlan, migration_uuid: str | None,
                before: Mapping[str, Mapping[str, int]]) -> None:
        """Every destination failed: the allocations go back as before the move."""
        revert_move(plan, self.claims, migration_uuid, before)
        if migration_uuid is not None:
            self.instances.set_migration(migration_uuid, status="failed")

    def _build(self, plan: MovePlan, selection: Selection) -> None:
        driver = self._driver()
        uuid = plan.instance_uuid
        if plan.operation == REBUILD:
            def build() -> None:
                driver.rebuild(selection, uuid, plan.spec)
        else:
            def build() -> None:
                driver.move(selection, uuid, plan.spec, plan.source_host)
        self.conductor.spawn(selection, uuid, plan.spec, build=build)

    def _done(self, record: InstanceRecord, plan: MovePlan, selection: Selection,
              migration_uuid: str | None) -> None:
        """Record where the instance runs now and in what state."""
        spec = spec_to_dict(plan.spec)
        if plan.operation in (EVACUATE, REBUILD, LIVE_MIGRATE):
            status = ACTIVE
        else:
            status = VERIFY_RESIZE
        self.instances.update(record.uuid, status=status, host=selection.service_host,
                              nodename=selection.nodename, spec=spec)
        if migration_uuid is not None:
            done = {EVACUATE: "done", LIVE_MIGRATE: "completed"}.get(plan.operation, "finished")
            self.instances.set_migration(migration_uuid, status=done,
                                         dest_host=selection.service_host,
                                         dest_node=selection.nodename)

    def _answer(self, record: InstanceRecord, plan: MovePlan, hosts: Sequence[Selection],
                tried: list[str], migration_uuid: str | None, diagnosis: Any, *,
                built_on: Selection | None = None, scheduled: bool = True,
                skipped: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
        built = built_on or hosts[0]
        answer: dict[str, Any] = {
            "instance_uuid": record.uuid, "operation": plan.operation,
            "migration_uuid": migration_uuid,
            "source": {"host": record.host, "nodename": record.nodename},
            **selection_dict(built), "tried": tried, "scheduled": scheduled,
            "alternates": [selection_dict(s) for s in hosts[1:]],
        }
        if plan.operation == LIVE_MIGRATE:
            # The hosts the scheduler chose that the conductor's checks turned down.
            answer["skipped"] = [{"host": host, "reason": why} for host, why in skipped]
        current = self.instances.get(record.uuid)
        answer["status"] = current.status if current is not None else None
        answer["allocations"] = {"instance": self.claims.allocations_of(record.uuid)}
        if migration_uuid is not None:
            answer["allocations"]["migration"] = self.claims.allocations_of(migration_uuid)
        answer["providers"] = self._provider_names(answer["allocations"])
        if diagnosis is not None:
            answer["diagnosis"] = diagnosis.to_dict()
        return answer

    # ----------------------------------------------------------------- helpers
    def _plan(self, record: InstanceRecord, request: MoveRequest,
              snapshot: HostSnapshot) -> MovePlan:
        row = snapshot.row_of(record.host, record.nodename)
        if row is None:
            raise MoveRefused(f"instance {record.uuid}: its host {record.host} "
                              f"({record.nodename}) is not a known compute node",
                              instance_uuid=record.uuid)
        group = None
        group_uuid = record.spec.get("group")
        if group_uuid and self.groups is not None:
            group = self.groups.resolve(group_uuid, field="group")
        instance = MovingInstance(record.uuid, record.host, record.nodename,
                                  spec_from_dict(record.spec, group),
                                  cell_uuid=snapshot.interned_value("cell_uuid", row))
        provider = snapshot.obj("uuid")[row]
        traits = frozenset(self.traits_of(provider)) if self.traits_of and provider else frozenset()
        held: frozenset[str] | None = None
        if request.operation == REBUILD and self.traits_of is not None:
            held = frozenset(trait for rp in self.claims.allocations_of(record.uuid)
                             for trait in self.traits_of(rp))
        source = SourceHost(traits=traits, up=service_is_up(
            snapshot, row, self.scheduler.clock(), self.scheduler.config),
            allocation_traits=held)
        hosts = snapshot.obj("host")
        nodes = snapshot.obj("nodename")

        def nodes_of(host: str) -> list[tuple[str, str | None]]:
            return [(nodes[r], snapshot.interned_value("cell_uuid", r))
                    for r in range(len(snapshot)) if hosts[r] == host]

        return plan_move(instance, request, source=source, nodes_of=nodes_of,
                         allow_resize_to_same_host=self.scheduler.config.allow_resize_to_same_host,
                         config=self.scheduler.config)

    def _own_selection(self, snapshot: HostSnapshot, record: InstanceRecord) -> Selection:
        row = snapshot.row_of(record.host, record.nodename)
        return Selection(compute_node_uuid=snapshot.obj("uuid")[row] if row is not None else None,
                         service_host=record.host, nodename=record.nodename,
                         cell_uuid=snapshot.interned_value("cell_uuid", row)
                         if row is not None else None)

    def _instance(self, uuid: str) -> InstanceRecord:
        record = self.instances.get(uuid)
        if record is None:
            raise InstanceNotFound(f"instance {uuid!r}: no such instance", field="instance")
        return record

    def _busy(self, uuid: str) -> MoveRefused:
        record = self.instances.get(uuid)
        status = record.status if record is not None else "gone"
        if status == VERIFY_RESIZE:
            return MoveRefused(f"instance {uuid} is in VERIFY_RESIZE: confirm or revert its "
                               "resize before another move", instance_uuid=uuid, status=status)
        return MoveRefused(f"instance {uuid} is {status}: another move of it is running",
                           instance_uuid=uuid, status=status)

    def _awaiting(self, uuid: str) -> MigrationRecord:
        """The finished migration of an instance in VERIFY_RESIZE (now MOVING)."""
        if not self.instances.swap_status(uuid, [VERIFY_RESIZE], MOVING):
            record = self.instances.get(uuid)
            raise MoveRefused(f"instance {uuid} is {record.status if record else 'gone'}, "
                              "not VERIFY_RESIZE: there is no resize or migration to confirm "
                              "or revert", instance_uuid=uuid)
        finished = self.instances.migrations(uuid, status="finished")
        if not finished:
            self.instances.update(uuid, status=ACTIVE)
            raise MoveRefused(f"instance {uuid}: no finished migration", instance_uuid=uuid)
        return finished[0]

    def _driver(self) -> MoveDriver:
        driver = self.conductor.driver
        for name in ("move", "confirm_move", "revert_move", "rebuild", "forget_evacuated"):
            if not callable(getattr(driver, name, None)):
                raise MoveRefused(f"the compute driver {type(driver).__name__} cannot move "
                                  f"instances (it has no {name})")
        return driver  # type: ignore[return-value]


def _migration_dict(m: MigrationRecord) -> dict[str, Any]:
    return {"uuid": m.uuid, "migration_type": m.migration_type, "status": m.status,
            "source_host": m.source_host, "source_node": m.source_node,
            "dest_host": m.dest_host, "dest_node": m.dest_node}
