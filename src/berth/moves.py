"""Move operations as Nova 34 asks its scheduler for them: cold migrate, resize,
evacuate, rebuild and live migrate.

A move schedules one existing instance again. What differs from a boot is the request
spec the conductor sends and what happens to the instance's allocations:

=========  ===========================================  ==================================
operation  the request (reference §1.3, §10.4, §7.2)     allocations (Nova's conductor)
=========  ===========================================  ==================================
migrate    the source host in ``ignore_hosts`` unless   before scheduling, the source
           its provider has ``COMPUTE_SAME_HOST_COLD_   allocation moves to the migration
           MIGRATE``; a named host's first node is the  consumer (``POST /allocations``);
           ``requested_destination`` (not the source;   the scheduler claims the
           in the instance's cell unless crossing is    destination for the instance
           allowed); the cell is the instance's,        consumer; confirm deletes the
           crossed only when allowed, and none when a   migration's, revert moves it back
           host is named and crossing is allowed
resize     as migrate, with the new flavor; the source   as migrate
           is ignored unless ``allow_resize_to_same_
           host``; the flavor must change
evacuate   the source (which must be down) ignored; a   the instance consumer ends with
           named host's first node (in the instance's   the source allocation and the
           cell) is the requested destination; the      destination's, until the source's
           instance's cell only; no alternates          compute cleans up (see below)
rebuild    ``_nova_check_type=rebuild``; the instance's  nothing is claimed; placement is
           own host and node forced, so only the         not asked (§8.1.4); the same
           ``RUN_ON_REBUILD`` filters run on it; with    image is not scheduled at all
           the new image
live-      the source in ``ignore_hosts``, always; the  as migrate; once the instance runs
migrate    instance's cell, always; a named host's      on the destination the migration
           first node is the requested destination (a   consumer's (source) allocation is
           hint: the filters still run); no alternates  deleted: there is no confirm step
=========  ===========================================  ==================================

A live migration's destination must then pass the conductor's checks
(:func:`live_migration_problem`, Nova's ``LiveMigrationTask``): the same hypervisor type
as the source, a version no older (unless ``[workarounds]
skip_hypervisor_version_check_on_lm``), and PCI devices from flavor aliases asked for as
live-migratable. A destination that fails them gives up its claim and joins the ignored
hosts, and the scheduler is asked again (``[DEFAULT] migrate_max_retries`` times, -1:
until no host is left): :func:`schedule_live_migration`.

Nova's scheduler claims an evacuation's destination by merging it into the instance
consumer's existing allocations. Berth's claims never merge into an existing consumer
(a merge would let a re-issued uuid take over another instance's allocations), so an
evacuation hands the source allocation to its migration consumer while the destination
is claimed, then gives it back to the instance consumer in the same ``POST
/allocations`` that empties the migration consumer (:func:`finish_move`): the end state
is Nova's.

Forced hosts of the original boot never carry over (Nova's
``reset_forced_destinations``), nor do the boot's ignored hosts, retries or destination.

:func:`plan_move` is pure: it takes what is known of the instance and its source host
and returns a :class:`MovePlan`. :func:`schedule_move`, :func:`revert_move` and
:func:`confirm_move` move the claims through a :class:`MoveClaims` (placement over HTTP
or in process for ``berth serve``, the in-memory placement for ``berth schedule``), so
offline and online moves take one path.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from berth.errors import InputError, MaxRetriesExceeded, MoveRefused, NoValidHost
from berth.model.request import CellMapping, Destination, Flavor, ImageMeta, RequestSpec
from berth.pipeline import Decision

MIGRATE = "migrate"
RESIZE = "resize"
EVACUATE = "evacuate"
REBUILD = "rebuild"
LIVE_MIGRATE = "live-migrate"
#: Every move operation, in the order the CLI and docs list them.
OPERATIONS = (MIGRATE, RESIZE, EVACUATE, REBUILD, LIVE_MIGRATE)
#: The operations that take a destination host.
TARGETED = (MIGRATE, EVACUATE, LIVE_MIGRATE)

#: The provider trait that lets a cold migration stay on its host (Nova's
#: ``_allow_resize_to_same_host`` for a migration; only some drivers report it).
SAME_HOST_COLD_MIGRATE_TRAIT = "COMPUTE_SAME_HOST_COLD_MIGRATE"

#: Nova's ``Migration.migration_type`` per operation (rebuild records none).
MIGRATION_TYPES = {MIGRATE: "migration", RESIZE: "resize", EVACUATE: "evacuation",
                   LIVE_MIGRATE: "live-migration"}


@dataclass
class MovingInstance:
    """What a move needs of an instance: where it runs and the request spec it was
    booted with (flavor, image, hints, server group, zone, project and user)."""

    uuid: str
    host: str
    nodename: str
    spec: RequestSpec
    cell_uuid: str | None = None


@dataclass
class MoveRequest:
    """One move as asked: the operation and its arguments.

    ``host``: the requested destination (migrate, evacuate, live-migrate: there a hint
    the filters still judge, as Nova's API makes it without ``force``). ``flavor``: the new flavor
    (resize). ``image``: the new image (rebuild). ``allow_cross_cell``: the caller may
    move the instance to another cell (migrate, resize), which Nova grants by the policy
    rule ``compute:servers:resize:cross_cell``.
    """

    operation: str
    host: str | None = None
    flavor: Flavor | None = None
    image: ImageMeta | None = None
    allow_cross_cell: bool = False


@dataclass
class SourceHost:
    """The instance's host as the move sees it: its nodes' provider traits and whether
    its compute service is up (ComputeFilter's rule)."""

    traits: frozenset[str] = frozenset()
    up: bool = True
    #: The traits of the providers holding the instance's allocations (a rebuild with
    #: another image checks the image's required traits against them, as Nova's
    #: conductor does); None: the node's ``traits``.
    allocation_traits: frozenset[str] | None = None


@dataclass(frozen=True)
class Hypervisor:
    """A host's hypervisor as a live migration compares them: its first node's
    ``hypervisor_type`` and ``hypervisor_version`` (Nova's
    ``get_first_node_by_host_for_old_compat``)."""

    type: str | None
    version: int | None


@dataclass
class MovePlan:
    """The request to schedule and how the move treats claims.

    ``migration_allocation``: the source allocation moves to the migration consumer
    first (migrate, resize, evacuate, live-migrate). ``keeps_source``: it comes back to
    the instance consumer beside the destination's once the move is built (evacuate).
    ``drops_source``: it is deleted once the move is built, with no confirm step
    (live-migrate). ``claims``: the scheduler claims the destination (everything but
    rebuild). ``schedule``: ask the scheduler at all (a rebuild with the instance's own
    image does not). ``return_alternates``: a failed build may go on to an alternate
    (migrate, resize).
    """

    operation: str
    instance_uuid: str
    spec: RequestSpec
    source_host: str
    source_node: str
    migration_allocation: bool
    claims: bool
    schedule: bool
    return_alternates: bool
    keeps_source: bool = False
    drops_source: bool = False

    @property
    def migration_type(self) -> str | None:
        """Nova's migration type of the operation (None for a rebuild)."""
        return MIGRATION_TYPES.get(self.operation)


def plan_move(
    instance: MovingInstance,
    request: MoveRequest,
    *,
    source: SourceHost,
    nodes_of: Callable[[str], Sequence[tuple[str, str | None]]],
    allow_resize_to_same_host: bool = False,
    config: Any = None,
) -> MovePlan:
    """The request spec Nova's API and conductor build for ``request`` on ``instance``.

    ``nodes_of(host)`` lists a host's nodes in the order Nova's database gives them (the
    order they were registered in), each as (nodename, cell uuid); none: no such host.
    ``config`` derives
    the new NUMA and PCI requests from the flavor and image (as a boot does). Raises
    :class:`~berth.errors.InputError` for a request Nova's API refuses with 400 and
    :class:`~berth.errors.MoveRefused` for one it refuses with 409 (evacuating from a
    host whose service is up).
    """
    op = request.operation
    if op not in OPERATIONS:
        raise InputError(f"operation: expected one of {', '.join(OPERATIONS)}, got {op!r}",
                         field="operation")
    if request.allow_cross_cell and op not in (MIGRATE, RESIZE):
        raise InputError(f"allow_cross_cell: only migrate and resize may cross cells, not {op}",
                         field="allow_cross_cell")
    if request.host is not None and op not in TARGETED:
        raise InputError(f"host: {op} takes no destination host", field="host")
    if request.flavor is not None and op != RESIZE:
        raise InputError(f"flavor: only resize takes a flavor, not {op}", field="flavor")
    if request.image is not None and op != REBUILD:
        raise InputError(f"image: only rebuild takes an image, not {op}", field="image")

    spec = copy.deepcopy(instance.spec)
    spec.instance_uuid = instance.uuid
    spec.num_instances = 1
    # Nova's reset_forced_destinations; nothing of the boot's routing carries over.
    spec.force_hosts = spec.force_nodes = None
    spec.ignore_hosts = None
    spec.requested_destination = None
    spec.retry = None
    hints = dict(spec.scheduler_hints or {})
    hints.pop("_nova_check_type", None)
    if op == REBUILD:  # Nova 34 sets the hint for a rebuild only (compute API's rebuild)
        hints["_nova_check_type"] = ["rebuild"]
    spec.scheduler_hints = hints

    schedule = True
    if op == RESIZE:
        if request.flavor is None:
            raise InputError("flavor: resize needs the new flavor", field="flavor")
        # Nova's API: accelerators first (a 403 there), then a zero disk, then the
        # same flavor.
        if request.flavor.extra_specs.get("accel:device_profile"):
            raise InputError("flavor: a resize to a flavor with accelerators "
                             "(accel:device_profile) is not supported", field="flavor")
        if (request.flavor.root_gb == 0 and instance.spec.flavor.root_gb != 0
                and not instance.spec.is_bfv):
            raise InputError("flavor: the server disk cannot be resized: a resize to a zero "
                             "disk flavor is allowed for a volume-backed server only",
                             field="flavor")
        if _same_flavor(request.flavor, instance.spec.flavor):
            raise InputError(f"flavor: the instance already has flavor {request.flavor.name!r}; "
                             "a resize must change the flavor", field="flavor")
        spec.flavor = request.flavor
    if op == REBUILD:
        if request.image is None:
            raise InputError("image: rebuild needs an image", field="image")
        schedule = not _same_image(request.image, instance.spec.image)
        spec.image = request.image
        if schedule:
            _check_rebuild_traits(request.image, instance.spec.flavor, source)
            if instance.cell_uuid:  # Nova's _restrict_request_spec_to_cell
                spec.requested_destination = Destination(
                    cell=CellMapping(uuid=instance.cell_uuid))
        # The instance's own node, forced: with the rebuild hint the filters still run,
        # and only those marked RUN_ON_REBUILD judge the new image (§1.1, §10.4).
        spec.force_hosts = [instance.host]
        spec.force_nodes = [instance.nodename]
    if op == EVACUATE and source.up:
        raise MoveRefused(f"Compute service of {instance.host} is still in use: an instance "
                          "is evacuated only from a host whose service is down",
                          instance_uuid=instance.uuid, host=instance.host)
    if op == LIVE_MIGRATE:
        _check_live_migratable(instance, source)
        dest = Destination()
        if request.host is not None:
            # Nova's API names the host's first node and leaves the rest to the scheduler
            # (its own host too: ignored, so NoValidHost, not a refusal of the API).
            nodes = [(node, cell) for node, cell in nodes_of(request.host)
                     if not instance.cell_uuid or cell == instance.cell_uuid]
            if not nodes:
                raise InputError(f"host: compute host {request.host!r} could not be found",
                                 field="host")
            dest.host, dest.node = request.host, nodes[0][0]
        if instance.cell_uuid:  # Nova live-migrates within the instance's cell only
            dest.cell = CellMapping(uuid=instance.cell_uuid)
        if dest.host or dest.cell:
            spec.requested_destination = dest
        spec.ignore_hosts = [instance.host]

    if op in (MIGRATE, RESIZE, EVACUATE):
        dest = Destination()
        if request.host is not None:
            if request.host == instance.host:
                raise InputError(f"host: the target host can't be the same one as the "
                                 f"instance's ({instance.host})", field="host")
            nodes = list(nodes_of(request.host))
            if instance.cell_uuid and not request.allow_cross_cell:
                # Nova's API looks the host up in the instance's cell only (its context
                # is targeted there): a host of another cell is not found (a 400 for a
                # migrate, a 500 for an evacuate, where Berth says the same 400).
                nodes = [(node, cell) for node, cell in nodes if cell == instance.cell_uuid]
            if not nodes:
                raise InputError(f"host: compute host {request.host!r} could not be found",
                                 field="host")
            dest.host = request.host
            # Nova names the host's first node, however many it has (migrate:
            # get_first_node_by_host_for_old_compat; evacuate: nodes[0]).
            dest.node = nodes[0][0]
        if instance.cell_uuid:
            # A targeted move that may cross cells is not kept to (nor does it prefer) the
            # instance's cell: the host says where it goes (Nova's migrate task).
            if not (dest.host and request.allow_cross_cell):
                dest.cell = CellMapping(uuid=instance.cell_uuid)
            dest.allow_cross_cell_move = request.allow_cross_cell
        if dest.host or dest.cell:
            spec.requested_destination = dest
        if op == EVACUATE:
            same_host = False
        elif op == MIGRATE:
            same_host = SAME_HOST_COLD_MIGRATE_TRAIT in source.traits
        else:
            same_host = allow_resize_to_same_host
        if not same_host:
            spec.ignore_hosts = [instance.host]

    if config is not None:
        from berth.hardware.numa import prepare_request

        spec.numa_topology = None
        spec.pci_requests = None
        prepare_request(spec, config)
    return MovePlan(
        operation=op, instance_uuid=instance.uuid, spec=spec, source_host=instance.host,
        source_node=instance.nodename,
        migration_allocation=op in (MIGRATE, RESIZE, EVACUATE, LIVE_MIGRATE),
        claims=op != REBUILD, schedule=schedule, return_alternates=op in (MIGRATE, RESIZE),
        keeps_source=op == EVACUATE, drops_source=op == LIVE_MIGRATE)


def _check_live_migratable(instance: MovingInstance, source: SourceHost) -> None:
    """What Nova's API and conductor refuse before a live migration is scheduled: an
    instance with accelerators, with a vTPM whose secret the host does not hold, or with
    encrypted memory (NotSupported: a 400); a source whose compute service is down
    (ComputeServiceUnavailable)."""
    from berth.resource_request import mem_encryption_requested, vtpm_version

    flavor = instance.spec.flavor
    if flavor.extra_specs.get("accel:device_profile"):
        raise InputError("instance: a live migration of an instance with accelerators "
                         "(accel:device_profile) is not supported", field="instance")
    if vtpm_version(instance.spec) is not None:
        security = flavor.extra_specs.get("hw:tpm_secret_security") or "user"
        if security != "host":
            raise InputError(f"instance: a live migration of a vTPM-enabled instance is "
                             f"supported with hw:tpm_secret_security 'host' only, not "
                             f"{security!r}", field="instance")
    if mem_encryption_requested(instance.spec):
        raise InputError("instance: a live migration of an instance with encrypted memory "
                         "(hw:mem_encryption) is not supported", field="instance")
    if not source.up:
        raise MoveRefused(f"Compute service of {instance.host} is unavailable at this time: "
                          "a live migration needs its source up", instance_uuid=instance.uuid,
                          host=instance.host)


def live_migration_problem(source: Hypervisor, dest: Hypervisor, spec: RequestSpec, *,
                           skip_version_check: bool = False) -> str | None:
    """Why the conductor skips ``dest`` as the destination of a live migration from
    ``source`` (Nova's ``_check_compatible_with_source_hypervisor`` then
    ``_check_can_migrate_pci``), or None when it passes."""
    from berth.hardware.pci import is_live_migratable, requests_of

    if source.type != dest.type:
        return (f"hypervisor type {dest.type!r} is not the source's {source.type!r} "
                "(InvalidHypervisorType)")
    if not skip_version_check and (source.version or 0) > (dest.version or 0):
        return (f"hypervisor version {dest.version} is older than the source's "
                f"{source.version} (DestinationHypervisorTooOld)")
    for request in requests_of(spec.pci_requests):
        if request.source == request.FLAVOR_ALIAS and not is_live_migratable(request):
            return (f"PCI alias {request.alias_name!r} does not explicitly request "
                    "live-migratable devices (MigrationPreCheckError)")
    return None


def _check_rebuild_traits(image: ImageMeta, flavor: Flavor, source: SourceHost) -> None:
    """Nova's conductor before it schedules a rebuild with another image
    (``_validate_image_traits_for_rebuild``): the image's required traits must be none
    the flavor forbids, and all on the providers holding the instance's allocations;
    NoValidHost otherwise, with Nova's reasons."""
    required = set(image.properties.get("traits_required") or [])
    if not required:
        return
    forbidden = {key.split(":", 1)[1] for key, value in flavor.extra_specs.items()
                 if key.startswith("trait") and ":" in key and value == "forbidden"}
    if required & forbidden:
        raise NoValidHost(
            "Image traits are part of forbidden traits in flavor associated with the "
            "server. Either specify a different image during rebuild or create a new "
            "server with the specified image and a compatible flavor.", cause="hosts")
    held = source.allocation_traits if source.allocation_traits is not None else source.traits
    if required - held:
        raise NoValidHost(
            "Image traits cannot be satisfied by the current resource providers. Either "
            "specify a different image during rebuild or create a new server with the "
            "specified image.", cause="hosts")


def _same_flavor(a: Flavor, b: Flavor) -> bool:
    """Nova compares flavor ids; Berth's flavors are named, and an inline one has no id."""
    return a.name == b.name and a.id == b.id and (a.vcpus, a.memory_mb, a.root_gb,
                                                  a.ephemeral_gb, a.swap, a.extra_specs) == (
        b.vcpus, b.memory_mb, b.root_gb, b.ephemeral_gb, b.swap, b.extra_specs)


def _same_image(a: ImageMeta, b: ImageMeta | None) -> bool:
    """Nova compares image refs; an inline image without an id compares by content."""
    if b is None:
        return False
    if a.id is not None or b.id is not None:
        return a.id == b.id
    return (a.name, a.disk_format, a.properties.raw) == (b.name, b.disk_format, b.properties.raw)


# --------------------------------------------------------------------------- claims
Allocations = dict[str, dict[str, int]]


class MoveClaims(Protocol):
    """Placement as a move uses it (Nova's report client: ``get_allocs_for_consumer``,
    ``move_allocations``, ``put_allocations``, ``delete_allocation_for_instance``)."""

    def allocations_of(self, consumer: str) -> Allocations:
        """The consumer's allocations by provider (empty when it has none)."""
        ...

    def move_allocations(self, source: str, target: str, spec: RequestSpec) -> None:
        """Give ``target`` every allocation of ``source`` (replacing its own) and leave
        ``source`` with none, in one write; :class:`~berth.errors.AllocationMoveFailed`
        when that cannot be done."""
        ...

    def replace_allocations(self, consumer: str, allocations: Mapping[str, Mapping[str, int]],
                            spec: RequestSpec) -> None:
        """Set the consumer's allocations to exactly ``allocations``."""
        ...

    def merge_allocations(self, source: str, target: str, spec: RequestSpec) -> None:
        """Add every allocation of ``source`` to those of ``target`` and leave ``source``
        with none, in one write."""
        ...

    def delete(self, consumer: str) -> bool:
        """Delete the consumer's allocations; False if it had none."""
        ...


#: ``select(spec, instance_uuids, return_alternates, explain) -> Decision``: the
#: scheduler as the move calls it (the service's, or the core with in-memory candidates).
Select = Callable[[RequestSpec, Sequence[str], bool, bool], Decision]


def schedule_move(
    plan: MovePlan, select: Select, claims: MoveClaims, migration_uuid: str | None, *,
    explain: bool = False,
) -> tuple[Decision, Allocations]:
    """Ask for destinations with Nova's claims around the question.

    Migrate, resize and evacuate first move the source allocation to the migration
    consumer (``migration_uuid``), so the scheduler's claim for the instance consumer
    holds the destination alone. A rebuild claims nothing. When scheduling
    raises, every allocation is put back as it was before. Returns the decision and the
    instance's allocations before the move.
    """
    before = claims.allocations_of(plan.instance_uuid) if plan.claims else {}
    if plan.migration_allocation:
        if migration_uuid is None:
            raise ValueError("a migration consumer is needed to migrate or resize")
        claims.move_allocations(plan.instance_uuid, migration_uuid, plan.spec)
    try:
        decision = select(plan.spec, [plan.instance_uuid], plan.return_alternates, explain)
    except BaseException:
        revert_move(plan, claims, migration_uuid, before)
        raise
    return decision, before


#: ``check(selection) -> problem or None``: the conductor's checks of a live
#: migration's destination (:func:`live_migration_problem` on the hosts' hypervisors).
DestinationCheck = Callable[[Any], "str | None"]


def schedule_live_migration(
    plan: MovePlan, select: Select, claims: MoveClaims, migration_uuid: str, *,
    check: DestinationCheck, max_retries: int = -1, explain: bool = False,
) -> tuple[Decision, Allocations, list[tuple[str, str]]]:
    """Nova's ``LiveMigrationTask._find_destination`` around :func:`schedule_move`: the
    source allocation goes to the migration consumer, then the scheduler is asked (no
    alternates) and its choice checked; a host that fails ``check`` gives up its claim
    and joins ``ignore_hosts``, and the scheduler is asked again. ``max_retries`` bounds
    the asks after the first (Nova's ``migrate_max_retries``; -1: none, so it ends when
    no host is left: NoValidHost, naming the hosts skipped and why). Any failure puts
    the allocations back. Returns the decision, the instance's allocations before the
    move and the hosts skipped with their reasons."""
    attempted = list(plan.spec.ignore_hosts or [plan.source_host])
    skipped: list[tuple[str, str]] = []
    plan.spec.ignore_hosts = list(attempted)
    decision, before = schedule_move(plan, select, claims, migration_uuid, explain=explain)
    try:
        while True:
            chosen = decision.selections[0][0]
            problem = check(chosen)
            if problem is None:
                return decision, before, skipped
            skipped.append((chosen.service_host, problem))
            attempted.append(chosen.service_host)
            # The claim on the skipped host goes, as a failed build's does.
            drop_destination(plan, claims, before)
            if max_retries != -1 and len(attempted) - 1 > max_retries:
                raise MaxRetriesExceeded(
                    f"Exceeded maximum number of retries. Exceeded max scheduling retries "
                    f"{len(attempted) - 1} for instance {plan.instance_uuid} during live "
                    f"migration ({_skips(skipped)})",
                    instance_uuid=plan.instance_uuid, skipped=skipped)
            plan.spec.ignore_hosts = list(attempted)
            try:
                decision = select(plan.spec, [plan.instance_uuid], False, explain)
            except NoValidHost as exc:
                raise NoValidHost(f"The live-migration checks skipped {_skips(skipped)}.",
                                  diagnosis=exc.diagnosis, cause=exc.cause,
                                  rejections=exc.rejections) from None
    except BaseException:
        # Whatever failed (the checks, a claim given up, the scheduler), the
        # allocations go back as they were before the move.
        revert_move(plan, claims, migration_uuid, before)
        raise


def hypervisor_of(snapshot: Any, host: str) -> Hypervisor | None:
    """``host``'s hypervisor from its first node in ``snapshot`` (None: no such host)."""
    import math

    import numpy as np

    rows = np.flatnonzero(snapshot.obj("host") == host)
    if not len(rows):
        return None
    row = int(rows[0])
    version = snapshot.num("hypervisor_version")[row]
    return Hypervisor(snapshot.interned_value("hypervisor_type", row),
                      None if math.isnan(version) else int(version))


def destination_check(current: Callable[[], Any], source_host: str, spec: RequestSpec,
                      config: Any) -> DestinationCheck:
    """The conductor's checks of a live migration's destination, on the hosts as
    ``current()`` (the snapshot the scheduler just decided on) has them, and
    ``config``'s ``[workarounds] skip_hypervisor_version_check_on_lm``."""
    skip = bool(config.workarounds.skip_hypervisor_version_check_on_lm)

    def check(selection: Any) -> str | None:
        snapshot = current()
        source = hypervisor_of(snapshot, source_host) or Hypervisor(None, None)
        dest = hypervisor_of(snapshot, selection.service_host) or Hypervisor(None, None)
        return live_migration_problem(source, dest, spec, skip_version_check=skip)

    return check


def _skips(skipped: Sequence[tuple[str, str]]) -> str:
    return "; ".join(f"{host}: {why}" for host, why in skipped)


def finish_move(plan: MovePlan, claims: MoveClaims, migration_uuid: str | None) -> None:
    """The move is built: an evacuated instance's consumer takes its source allocation
    back beside the destination's (Nova's end state; the source's compute releases it
    when it is up again); a live-migrated instance's source allocation is deleted (Nova's
    post-live-migration). Migrate and resize leave it with the migration consumer until
    confirm or revert."""
    if plan.keeps_source and migration_uuid is not None:
        claims.merge_allocations(migration_uuid, plan.instance_uuid, plan.spec)
    if plan.drops_source and migration_uuid is not None:
        claims.delete(migration_uuid)


def revert_move(plan: MovePlan, claims: MoveClaims, migration_uuid: str | None,
                before: Mapping[str, Mapping[str, int]]) -> None:
    """Put the instance's allocations back as they were before the move: the migration
    consumer's go back to the instance consumer (Nova's
    ``revert_allocation_for_migration``), or, for an evacuation, the destination's claim
    is dropped from the instance consumer."""
    if not plan.claims:
        return
    if (plan.migration_allocation and migration_uuid is not None
            and claims.allocations_of(migration_uuid)):
        claims.move_allocations(migration_uuid, plan.instance_uuid, plan.spec)
        return
    if before:
        claims.replace_allocations(plan.instance_uuid, before, plan.spec)
    else:
        claims.delete(plan.instance_uuid)


def drop_destination(plan: MovePlan, claims: MoveClaims,
                     before: Mapping[str, Mapping[str, int]]) -> None:
    """A build on the destination failed: the instance consumer gives up the
    destination's claim before an alternate is claimed (it held only that one: the
    source allocation is with the migration consumer)."""
    if not plan.claims:
        return
    if plan.migration_allocation or not before:
        claims.delete(plan.instance_uuid)
    else:
        claims.replace_allocations(plan.instance_uuid, before, plan.spec)


def confirm_move(claims: MoveClaims, migration_uuid: str) -> bool:
    """Confirming a resize or migration deletes the migration consumer's (source)
    allocations; False when it held none."""
    return claims.delete(migration_uuid)



def service_is_up(snapshot: Any, row: int, now: float, config: Any) -> bool:
    """Nova's ``servicegroup_api.service_is_up`` for one node: not forced down and a
    heartbeat within the effective ``service_down_time``. Unlike ComputeFilter, a
    disabled service that still reports is up (an evacuation needs it down)."""
    import numpy as np

    from berth.filters.compute import effective_service_down_time, services_up

    down_time = effective_service_down_time(config.service_down_time, config.report_interval)
    up = services_up(np.zeros(1, dtype=bool), snapshot.num("service_forced_down")[row:row + 1],
                     snapshot.num("service_heartbeat")[row:row + 1], now, down_time)
    return bool(up[0])


# --------------------------------------------------------------------------- cloud files
def instance_from_cloud(cloud: Any, uuid: str) -> MovingInstance:
    """An instance a cloud file lists on a host, as a move sees it: its host and node,
    its cell, and the spec it would have been booted with (its flavor, its image — the
    file's image with those properties — its project, its server group).

    :class:`~berth.errors.InstanceNotFound` when no host lists it, and an InputError
    when it names no flavor (a move needs the flavor's resources).
    """
    from berth.errors import InstanceNotFound

    snapshot = cloud.snapshot
    row = snapshot.instance_rows().get(uuid)
    if row is None:
        raise InstanceNotFound(f"instance {uuid!r}: no host of the cloud file lists it",
                               field="instance")
    inst = snapshot.obj("instances")[row][uuid]
    flavor = next((f for f in cloud.known_flavors().values()
                   if inst.instance_type_id is not None and f.id == inst.instance_type_id), None)
    if flavor is None:
        raise InputError(f"instance {uuid!r}: it names no flavor in the cloud file, so its "
                         "resources are unknown; give it 'flavor' to move it", field="instance")
    image = None
    if inst.image_properties:
        image = next((i for name, i in sorted(cloud.images.items())
                      if dict(i.properties.raw) == dict(inst.image_properties)), None)
    group = next((g for g in cloud.server_groups.values() if uuid in g.members), None)
    spec = RequestSpec(flavor=flavor, image=image, instance_group=copy.deepcopy(group),
                       project_id=inst.project_id or "demo", user_id="demo")
    return MovingInstance(uuid, snapshot.obj("host")[row], snapshot.obj("nodename")[row], spec,
                          cell_uuid=snapshot.interned_value("cell_uuid", row))
