"""``berth schedule CLOUD --migrate|--resize|--evacuate|--rebuild|--live-migrate
INSTANCE_UUID``: a move of an instance the cloud file lists, scheduled offline.

The request is the one ``berth serve`` sends for the same move (:func:`berth.moves.plan_move`)
and the claims move the same way (:func:`berth.moves.schedule_move`), through the same
scheduler service and placement store, with the cloud file registered into a scratch
store as ``berth serve --cloud`` registers it (:mod:`berth.service.offline`): the
instance's allocation is the one registration gave it; migrate and resize hand it to the
migration consumer before the destination is claimed for the instance; a live migration
checks the destination as Nova's conductor does, asks again past a host the checks skip
(:func:`berth.moves.schedule_live_migration`) and deletes the migration consumer's
allocation at the end. The answer prints where the instance would go and what the
instance and migration consumers would hold (before a confirm).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from berth.errors import InputError, NoValidHost, SchedulingError, exit_code_for
from berth.moves import (
    LIVE_MIGRATE,
    OPERATIONS,
    TARGETED,
    MoveRequest,
    SourceHost,
    destination_check,
    finish_move,
    plan_move,
    schedule_live_migration,
    schedule_move,
    service_is_up,
)


def move_of(args: argparse.Namespace) -> tuple[str, str] | None:
    """``(operation, instance uuid)`` when the command line asks for a move."""
    for op in OPERATIONS:
        uuid = getattr(args, op.replace("-", "_"), None)
        if uuid:
            return op, uuid
    return None


def _refuse_boot_options(args: argparse.Namespace, op: str) -> None:
    """Options of a boot that a move does not take: one line naming the first."""
    boot_only: Sequence[tuple[str, Any]] = (
        ("--num", args.num != 1), ("--group", args.group), ("--hint", args.hint),
        ("--availability-zone", args.availability_zone), ("--force-host", args.force_host),
        ("--ignore-host", args.ignore_host))
    for name, given in boot_only:
        if given:
            raise InputError(f"{name}: not used with --{op} (the instance's own request is "
                             "moved)", field=name)
    if args.flavor and op != "resize":
        raise InputError(f"--flavor: only --resize takes a flavor, not --{op}", field="--flavor")
    if args.image and op != "rebuild":
        raise InputError(f"--image: only --rebuild takes an image, not --{op}", field="--image")
    if args.host and op not in TARGETED:
        raise InputError(f"--host: only --migrate, --evacuate and --live-migrate take a "
                         f"destination, not --{op}", field="--host")


def cmd_schedule_move(args: argparse.Namespace, op: str, uuid: str) -> int:
    """Plan and schedule the move, then print it (or its NoValidHost)."""
    from berth.cli import _load_config
    from berth.moves import instance_from_cloud
    from berth.service.moves import PlacementMoveClaims
    from berth.service.offline import offline_cloud

    _refuse_boot_options(args, op)
    config = _load_config(args.config_file)
    now = time.time() if args.now is None else args.now
    with offline_cloud(args.cloud, config, now=now) as offline:
        cloud, stack = offline.cloud, offline.stack
        instance = instance_from_cloud(cloud, uuid)
        request = MoveRequest(
            op, host=args.host, allow_cross_cell=args.allow_cross_cell,
            flavor=cloud.flavor(args.flavor) if op == "resize" and args.flavor else None,
            image=cloud.image(args.image) if op == "rebuild" and args.image else None)
        service = stack.scheduler(seed=args.seed)
        snapshot = service.refresh()
        row = snapshot.row_of(instance.host, instance.nodename)
        assert row is not None
        hosts, nodes = snapshot.obj("host"), snapshot.obj("nodename")

        def nodes_of(host: str) -> list[tuple[str, str | None]]:
            return [(nodes[r], snapshot.interned_value("cell_uuid", r))
                    for r in range(len(snapshot)) if hosts[r] == host]

        provider = snapshot.obj("uuid")[row]
        traits = stack.client.get_provider_traits(provider)[1] if provider else []
        held: frozenset[str] | None = None
        if op == "rebuild":  # the traits of the providers holding the instance's allocations
            held = frozenset(trait for rp in stack.client.get_allocations(uuid).allocations
                             for trait in stack.client.get_provider_traits(rp)[1])
        try:
            plan = plan_move(instance, request,
                             source=SourceHost(traits=frozenset(traits),
                                               up=service_is_up(snapshot, row, now, config),
                                               allocation_traits=held),
                             nodes_of=nodes_of,
                             allow_resize_to_same_host=config.allow_resize_to_same_host,
                             config=config)
        except NoValidHost as exc:  # a rebuild's image traits, refused before scheduling
            return _print_refusal(args, exc)
        source = {"host": instance.host, "nodename": instance.nodename}
        if not plan.schedule:
            answer = {"operation": op, "instance_uuid": uuid, "scheduled": False,
                      "source": source, "message": "the instance's own image: rebuilt in "
                      "place, the scheduler is not asked"}
            print(json.dumps(answer, indent=2) if args.json else answer["message"])
            return 0
        # The instance's allocation is the one seeding gave it (as berth serve --cloud).
        claims = PlacementMoveClaims(stack.claims_client or stack.client)
        migration_uuid = service.new_instance_uuids(1)[0] if plan.migration_type else None

        def select(spec: Any, uuids: Sequence[str], alternates: bool, explain: bool) -> Any:
            return service.select_destinations(
                spec, uuids, return_alternates=alternates and not args.no_alternates,
                explain=explain, check_zone=False)

        skipped: list[tuple[str, str]] = []
        try:
            if op == LIVE_MIGRATE:
                assert migration_uuid is not None
                decision, _, skipped = schedule_live_migration(
                    plan, select, claims, migration_uuid,
                    check=destination_check(lambda: service.feed.snapshot, instance.host,
                                            plan.spec, config),
                    max_retries=config.migrate_max_retries, explain=args.explain)
            else:
                decision, _ = schedule_move(plan, select, claims, migration_uuid,
                                            explain=args.explain)
            # As once the instance is built on its destination.
            finish_move(plan, claims, migration_uuid)
        except SchedulingError as exc:
            return _print_refusal(args, exc)
        rows = service.feed.uuid_rows

        def by_host(consumer: str) -> dict[str, dict[str, int]]:
            """The consumer's allocations by ``host/node`` (a sharing provider by name)."""
            out = {}
            for rp, res in claims.allocations_of(consumer).items():
                r = rows.get(rp)
                out[f"{hosts[r]}/{nodes[r]}" if r is not None else rp] = res
            return out

        allocations = {"instance": by_host(uuid)}
        if migration_uuid is not None:
            allocations["migration"] = by_host(migration_uuid)
    return _print_move(args, op, uuid, instance, source, decision, migration_uuid, allocations,
                       {c.uuid: c.name for c in cloud.cells.values()}, skipped)


def cmd_schedule_drain(args: argparse.Namespace) -> int:
    """``--drain HOST``: every instance of HOST moved off it on the cloud file's scratch
    store, as ``berth drain`` moves them on a running server (the same
    :func:`~berth.service.drain.drain_host`, conductor and fake driver). Exit 0 when
    the host is left empty, 4 when some instances stay."""
    from berth.cli import _load_config
    from berth.service.drain import drain_host, drain_lines
    from berth.service.offline import offline_cloud

    _refuse_boot_options(args, "drain")
    for name, given in (("--explain", args.explain),
                        ("--allow-cross-cell", args.allow_cross_cell)):
        if given:
            raise InputError(f"{name}: not used with --drain", field=name)
    config = _load_config(args.config_file)
    now = time.time() if args.now is None else args.now
    with offline_cloud(args.cloud, config, now=now) as offline:
        stack = offline.stack
        service = stack.scheduler(seed=args.seed)
        moves = stack.moves(stack.conductor(service))
        answer = drain_host(moves, args.drain, args.drain_by or LIVE_MIGRATE)
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        print("\n".join(drain_lines(answer)))
    return 4 if "error" in answer else 0


def _print_refusal(args: argparse.Namespace, exc: SchedulingError) -> int:
    from berth.cli import _print_diagnosis

    diagnosis = getattr(exc, "diagnosis", None)
    if args.json:
        print(json.dumps({"error": {"code": exc.code, "message": exc.message},
                          **({"diagnosis": diagnosis.to_dict()} if diagnosis else {})},
                         indent=2))
    else:
        print(f"error: {exc.message}", file=sys.stderr)
        if diagnosis is not None:
            _print_diagnosis(diagnosis, verbose=args.verbose)
    return exit_code_for(exc)


def _print_move(args: argparse.Namespace, op: str, uuid: str, instance: Any,
                source: dict[str, Any], decision: Any, migration_uuid: str | None,
                allocations: dict[str, Any], cell_names: dict[str, str],
                skipped: Sequence[tuple[str, str]]) -> int:
    from berth.cli import _print_decision, _print_diagnosis

    if args.json:
        extra = ({"skipped": [{"host": h, "reason": why} for h, why in skipped]}
                 if op == LIVE_MIGRATE else {})
        print(json.dumps({"operation": op, "instance_uuid": uuid, "migration_uuid": migration_uuid,
                          "source": source, "decision": decision.to_dict(),
                          "allocations": allocations, **extra}, indent=2, default=str))
        return 0
    print(f"{op} of {uuid} from {instance.host} ({instance.nodename})")
    for host, why in skipped:
        print(f"skipped {host}: {why}")
    _print_decision(decision, cell_names)
    print()
    print(f"allocations: instance {uuid[:8]}: {_describe(allocations['instance'])}")
    if migration_uuid is not None and op == LIVE_MIGRATE:
        print(f"             migration {migration_uuid[:8]}: deleted once the instance runs "
              "on its destination (no confirm step)")
    elif migration_uuid is not None:
        print(f"             migration {migration_uuid[:8]}: "
              f"{_describe(allocations['migration'])} (deleted on confirm, back to the "
              "instance on revert)")
    if decision.diagnosis is not None:
        print()
        _print_diagnosis(decision.diagnosis, verbose=args.verbose)
    return 0


def _describe(allocations: dict[str, dict[str, int]]) -> str:
    if not allocations:
        return "nothing"
    return "; ".join(f"{where} " + ", ".join(f"{rc}={n}" for rc, n in sorted(res.items()))
                     for where, res in sorted(allocations.items()))

