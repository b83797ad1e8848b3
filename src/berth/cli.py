"""``berth``: the command line. Every error maps to an exit code in one place
(:func:`berth.errors.exit_code_for`) and prints one clear line, never a traceback.

    berth schedule CLOUD --flavor NAME [--image NAME] [--hint k=v ...] [--num N]
                   [--config-file nova.conf ...] [--seed S] [--explain] [--json]
    berth schedule CLOUD (--migrate UUID [--host H] | --resize UUID --flavor NEW |
                          --evacuate UUID [--host H] | --rebuild UUID --image NAME |
                          --live-migrate UUID [--host H] |
                          --drain HOST [--drain-by migrate])
                   [--allow-cross-cell] [--explain] [--json]
    berth cloud check CLOUD
    berth cloud import [--os-cloud NAME] [-o FILE] | berth cloud export --url URL [-o FILE]
    berth config check FILE [FILE ...]
    berth filters list | berth weighers list
    berth flavor check (CLOUD --flavor NAME | --extra-spec k=v ...)
    berth placement serve ...
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from berth import __version__
from berth.errors import (
    BerthError,
    CloudFileError,
    ConfigError,
    ExtraSpecError,
    InputError,
    NoValidHost,
    error_dict,
    exit_code_for,
)
from berth.explain import diagnosis_lines, node_label


def _hints(pairs: Sequence[str]) -> dict[str, list[str]]:
    hints: dict[str, list[str]] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InputError(f"--hint {pair!r}: expected key=value")
        hints.setdefault(key, []).append(value)
    return hints


def _load_config(paths: Sequence[str] | None) -> Any:
    from berth.config import SchedulerConfig

    return SchedulerConfig.from_files(paths) if paths else SchedulerConfig.default()


# ----------------------------------------------------------------------------- schedule
def cmd_schedule(args: argparse.Namespace) -> int:
    """Schedule a request against a cloud file and print the selections.

    The cloud file's hosts are registered into a scratch store exactly as ``berth
    serve --cloud`` registers them, and the request goes through the same scheduler
    service (:mod:`berth.service.offline`): request filters, the placement query and
    the allocation-candidate engine, the core, the claims."""
    from berth.model import RequestSpec
    from berth.schedule_moves import cmd_schedule_drain, cmd_schedule_move, move_of
    from berth.service.offline import offline_cloud

    if args.drain:
        return cmd_schedule_drain(args)
    if args.drain_by:
        raise InputError("--drain-by: only with --drain HOST", field="--drain-by")
    move = move_of(args)
    if move is not None:
        return cmd_schedule_move(args, *move)
    if getattr(args, "host", None) or getattr(args, "allow_cross_cell", False):
        raise InputError("--host and --allow-cross-cell: only with a move (--migrate, --resize, "
                         "--evacuate, --rebuild, --live-migrate)")
    if not args.flavor:
        raise InputError("--flavor: required (except for --migrate, --evacuate, --rebuild and "
                         "--live-migrate)",
                         field="--flavor")
    config = _load_config(args.config_file)
    now = time.time() if args.now is None else args.now
    with offline_cloud(args.cloud, config, now=now) as offline:
        cloud, stack = offline.cloud, offline.stack
        flavor = cloud.flavor(args.flavor)
        warnings = _checked_extra_specs(args.flavor, flavor.extra_specs)
        spec = RequestSpec(
            flavor=flavor,
            image=cloud.image(args.image) if args.image else None,
            scheduler_hints=_hints(args.hint) or None,
            instance_group=stack.groups.resolve(args.group, field="--group") if args.group else None,
            project_id=args.project,
            user_id=args.user,
            availability_zone=args.availability_zone,
            num_instances=args.num,
            force_hosts=args.force_host or None,
            ignore_hosts=args.ignore_host or None,
        )
        prepare_request(spec, config)
        service = stack.scheduler(seed=args.seed)
        try:
            decision = service.select_destinations(
                spec, return_alternates=not args.no_alternates, explain=args.explain)
        except NoValidHost as exc:
            if args.json:
                # As POST /boot answers a refusal: the diagnosis only when there is one.
                print(json.dumps({"error": error_dict(exc),
                                  **({"diagnosis": exc.diagnosis.to_dict()}
                                     if exc.diagnosis else {}),
                                  **({"warnings": warnings} if args.explain else {})}, indent=2))
            else:
                print(f"error: {exc.message}", file=sys.stderr)
                if exc.fit_note():
                    print(f"  {exc.fit_note()}", file=sys.stderr)
                if exc.diagnosis is not None:
                    _print_warnings(warnings)
                    _print_diagnosis(exc.diagnosis, verbose=args.verbose)
            return exit_code_for(exc)
    if args.json:
        answer = decision.to_dict()
        if args.explain:
            answer["warnings"] = warnings
        print(json.dumps(answer, indent=2, default=str))
        return 0
    _print_decision(decision, {c.uuid: c.name for c in cloud.cells.values()})
    if decision.diagnosis is not None:
        print()
        _print_warnings(warnings)
        _print_diagnosis(decision.diagnosis, verbose=args.verbose)
    return 0


def _checked_extra_specs(flavor: str, extra_specs: Any) -> list[str]:
    """Enforce the registered extra-spec validators (built-ins and plugins') on a flavor,
    as Nova's API does before a flavor is used: ExtraSpecError naming the flavor and every
    problem. Returns the warnings (valid values that are probably mistyped)."""
    from berth.extra_specs.validators import check_flavor, flavor_warnings

    problems = check_flavor(extra_specs)
    if problems:
        raise ExtraSpecError(f"flavor {flavor!r}: " + "; ".join(problems), flavor=flavor,
                             problems=problems)
    return flavor_warnings(extra_specs)


def _print_warnings(warnings: Sequence[str]) -> None:
    for warning in warnings:
        print(f"warning: extra spec {warning}")


def prepare_request(spec: Any, config: Any) -> None:
    """Derive the request's NUMA topology and PCI requests from its flavor and image."""
    from berth.hardware.numa import prepare_request as prepare

    prepare(spec, config)


def _print_decision(decision: Any, cell_names: dict[str, str] | None = None) -> None:
    """The table of a decision; cells by their names (``cell_names``: uuid -> name),
    else by their uuids' first 8 characters."""
    rows = [("#", "instance", "host", "node", "cell", "az", "alternates")]
    names = cell_names or {}
    for i, (uuid, sels) in enumerate(zip(decision.instance_uuids, decision.selections), start=1):
        first = sels[0]
        cell = names.get(first.cell_uuid or "") or (first.cell_uuid or "-")[:8]
        rows.append((str(i), uuid[:8], first.service_host, first.nodename,
                     cell, first.availability_zone or "-",
                     ", ".join(node_label(s.service_host, s.nodename) for s in sels[1:])
                     or "-"))
    _table(rows)


def _print_diagnosis(diagnosis: Any, verbose: bool = False) -> None:
    print("\n".join(diagnosis_lines(diagnosis, verbose=verbose)))


def _table(rows: Sequence[Sequence[str]], indent: str = "") -> None:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(indent + "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip())


# ----------------------------------------------------------------------------- checks
def cmd_cloud_check(args: argparse.Namespace) -> int:
    """Validate a cloud file (every flavor's extra specs against the registered
    validators too) and summarize it."""
    from berth.cloudfile import load_cloud
    from berth.extra_specs.validators import check_flavor, flavor_warnings

    cloud = load_cloud(args.cloud, _load_config(args.config_file), now=time.time())
    # The registered validators (built-ins and installed plugins'), on every flavor.
    problems = [f"flavor {name!r}: {problem}" for name, flavor in cloud.flavors.items()
                for problem in check_flavor(flavor.extra_specs)]
    warnings = [f"flavor {name!r}: extra spec {warning}" for name, flavor in cloud.flavors.items()
                for warning in flavor_warnings(flavor.extra_specs)]
    # Entries that only fail the requests using them are still errors of the file.
    problems += [f"image {name!r}: {bad.problem} (requests with this image fail)"
                 for name, bad in cloud.broken_images.items()]
    snap = cloud.snapshot
    counts = {"compute_nodes": len(snap), "cells": len(cloud.cells),
              "aggregates": len(snap.aggregates), "flavors": len(cloud.flavors),
              "images": len(cloud.images) + len(cloud.broken_images),
              "server_groups": len(cloud.server_groups),
              "sharing_providers": len(cloud.sharing)}
    code = exit_code_for(ExtraSpecError("")) if problems else 0
    if args.json:
        print(json.dumps({"file": args.cloud, "ok": not problems, **counts, "errors": problems,
                          "warnings": warnings}, indent=2))
        return code
    for warning in warnings:
        print(f"warning: {warning}")
    for problem in problems:
        print(f"error: {problem}")
    if problems:
        return code
    print(f"{args.cloud}: ok: {counts['compute_nodes']} compute nodes, {counts['cells']} cells, "
          f"{counts['aggregates']} aggregates, {counts['flavors']} flavors, "
          f"{counts['images']} images, {counts['server_groups']} server groups"
          + (f", {counts['sharing_providers']} sharing providers"
             if counts["sharing_providers"] else ""))
    return 0


def cmd_config_check(args: argparse.Namespace) -> int:
    """Validate nova.conf files: values, plugin names, unknown options."""
    from berth import plugins
    from berth.config import SchedulerConfig
    from berth.config_check import check_files, nova_release

    config = SchedulerConfig.from_files(args.files, warn_unknown=False)
    filters = plugins.load_filters(config)
    weighers = plugins.load_weighers(config)
    report = check_files(args.files)
    problems = list(report.problems)
    if config.filter_scheduler.pci_in_placement:
        problems.append("[filter_scheduler] pci_in_placement = True: berth nova-scheduler "
                        "takes it (Nova's conductor makes the PCI request groups); berth serve, "
                        "its processes and the offline commands refuse it")
    if args.json:
        print(json.dumps({"files": list(args.files), "ok": True,
                          "enabled_filters": [type(f).__name__ for f in filters],
                          "weighers": [type(w).__name__ for w in weighers],
                          "weighing_strategy": config.filter_scheduler.weighing_strategy,
                          "warnings": problems, "not_used_by_berth": report.not_used},
                         indent=2))
        return 0
    for problem in problems:
        print(f"warning: {problem}")
    if report.not_used:
        shown = ", ".join(report.not_used[:8]) + (", ..." if len(report.not_used) > 8 else "")
        print(f"{len(report.not_used)} option(s) of Nova {nova_release()} not used by Berth: "
              f"{shown}")
    print("enabled filters: " + ", ".join(type(f).__name__ for f in filters))
    print("weighers: " + ", ".join(type(w).__name__ for w in weighers))
    print(f"weighing strategy: {config.filter_scheduler.weighing_strategy}")
    print("ok" if not problems else f"ok with {len(problems)} warning(s)")
    return 0


def _first_line(obj: Any) -> str:
    doc = (obj.__doc__ or "").strip().splitlines()
    return doc[0] if doc else ""


def cmd_filters_list(args: argparse.Namespace) -> int:
    """Print every built-in filter with its one-line rule."""
    from berth.filters.registry import BUILTIN_FILTERS, DEFAULT_ENABLED_FILTERS, load_builtin

    if args.json:
        print(json.dumps([{"name": name, "default": name in DEFAULT_ENABLED_FILTERS,
                           "rule": _first_line(load_builtin(name))}
                          for name in BUILTIN_FILTERS], indent=2))
        return 0
    rows = [("filter", "default", "rule")]
    for name in BUILTIN_FILTERS:
        cls = load_builtin(name)
        rows.append((name, "yes" if name in DEFAULT_ENABLED_FILTERS else "", _first_line(cls)))
    _table(rows)
    return 0


def cmd_weighers_list(args: argparse.Namespace) -> int:
    """Print every built-in weigher with its one-line rule."""
    from berth.weighers.registry import BUILTIN_WEIGHERS, load_builtin

    if args.json:
        print(json.dumps([{"name": name, "rule": _first_line(load_builtin(name))}
                          for name in BUILTIN_WEIGHERS], indent=2))
        return 0
    rows = [("weigher", "rule")]
    for name in BUILTIN_WEIGHERS:
        rows.append((name, _first_line(load_builtin(name))))
    _table(rows)
    return 0


def cmd_flavor_check(args: argparse.Namespace) -> int:
    """Validate a flavor's extra specs against the registered validators; warn about
    values that look like an operator the grammar does not see (``>=24``)."""
    from berth.extra_specs.validators import check_flavor, flavor_warnings

    if args.cloud:
        if not args.flavor:
            raise InputError("flavor check: with a cloud file, --flavor NAME is required")
        from berth.cloudfile import load_cloud

        specs = dict(load_cloud(args.cloud, now=time.time()).flavor(args.flavor).extra_specs)
    else:
        specs = {}
        for pair in args.extra_spec or []:
            key, sep, value = pair.partition("=")
            if not sep or not key:
                raise InputError(f"--extra-spec {pair!r}: expected key=value")
            specs[key] = value
    problems = check_flavor(specs)
    warnings = flavor_warnings(specs)
    if args.json:
        print(json.dumps({"ok": not problems, "extra_specs": len(specs), "errors": problems,
                          "warnings": warnings}, indent=2))
        return exit_code_for(InputError("")) if problems else 0
    for warning in warnings:
        print(f"warning: {warning}")
    for problem in problems:
        print(f"error: {problem}")
    if problems:
        return exit_code_for(InputError(""))
    print(f"ok: {len(specs)} extra spec(s) valid"
          + (f", {len(warnings)} warning(s)" if warnings else ""))
    return 0


def cmd_placement(argv: Sequence[str]) -> int:
    """Hand ``berth placement ...`` to the resource store's own command line."""
    from berth.placement.cli import main as placement_main

    return int(placement_main(list(argv)) or 0)


# ----------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    """The ``berth`` argument parser."""
    from berth.service.cli import host_name, instant, positive_int

    parser = argparse.ArgumentParser(prog="berth", description="Berth: an explainable VM scheduler "
                                     "with Nova's filter-scheduler semantics.")
    parser.add_argument("--debug", action="store_true", help="log debug output")
    parser.add_argument("--version", action="version", version=f"berth {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("schedule", help="schedule a request against a cloud file (offline)")
    p.add_argument("cloud", help="cloud description (YAML or JSON)")
    p.add_argument("--flavor", help="flavor name from the cloud file (required but for a "
                                    "move; with --resize the new flavor)")
    p.add_argument("--image", help="image name (or id) from the cloud file")
    p.add_argument("--hint", action="append", default=[], metavar="KEY=VALUE",
                   help="scheduler hint; repeat a key for a list")
    p.add_argument("--num", type=positive_int, default=1,
                   help="number of instances (default 1)")
    p.add_argument("--group", help="server group name from the cloud file")
    p.add_argument("--availability-zone", "--az", dest="availability_zone")
    p.add_argument("--project", default="demo", help="project id (default demo)")
    p.add_argument("--user", default="demo", help="user id (default demo)")
    p.add_argument("--force-host", action="append", default=[])
    p.add_argument("--ignore-host", action="append", default=[])
    p.add_argument("--config-file", action="append", help="nova.conf (repeatable)")
    p.add_argument("--seed", type=int, default=None, help="random seed (same seed, same decision)")
    p.add_argument("--now", type=instant, default=None, help="scheduling instant, epoch seconds")
    p.add_argument("--no-alternates", action="store_true", help="do not compute alternates")
    p.add_argument("--explain", action="store_true", help="explain the decision")
    p.add_argument("--verbose", "-v", action="store_true", help="every rejected host and term")
    p.add_argument("--json", action="store_true", help="print JSON")
    moves = p.add_mutually_exclusive_group()
    moves.add_argument("--migrate", metavar="INSTANCE_UUID",
                       help="cold-migrate an instance the cloud file lists (its host ignored)")
    moves.add_argument("--resize", metavar="INSTANCE_UUID",
                       help="resize an instance to --flavor (its host ignored unless "
                            "allow_resize_to_same_host)")
    moves.add_argument("--evacuate", metavar="INSTANCE_UUID",
                       help="evacuate an instance from its host, which must be down")
    moves.add_argument("--rebuild", metavar="INSTANCE_UUID",
                       help="rebuild an instance on its host with --image (rebuild filters only)")
    moves.add_argument("--live-migrate", metavar="INSTANCE_UUID",
                       help="live-migrate an instance within its cell (its host ignored; the "
                            "destination's hypervisor checked against its source's)")
    moves.add_argument("--drain", metavar="HOST", type=host_name,
                       help="move every instance the cloud file lists on HOST off it, one "
                            "after another (each sees where the ones before went)")
    p.add_argument("--drain-by", choices=("live-migrate", "migrate"), default=None,
                   help="with --drain: live-migrate (default) or cold-migrate each instance")
    p.add_argument("--host", help="with --migrate, --evacuate or --live-migrate: the requested "
                                  "destination host")
    p.add_argument("--allow-cross-cell", action="store_true",
                   help="with --migrate or --resize: the instance may leave its cell")
    p.set_defaults(func=cmd_schedule)

    cloud = sub.add_parser("cloud", help="cloud file tools").add_subparsers(dest="action", required=True)
    c = cloud.add_parser("check", help="validate a cloud file")
    c.add_argument("cloud")
    c.add_argument("--config-file", action="append")
    c.add_argument("--json", action="store_true", help="print JSON")
    c.set_defaults(func=cmd_cloud_check)
    from berth.cloudio.cli import add_commands as add_cloud_io

    add_cloud_io(cloud)

    conf = sub.add_parser("config", help="configuration tools").add_subparsers(dest="action", required=True)
    c = conf.add_parser("check", help="validate nova.conf files")
    c.add_argument("files", nargs="+")
    c.add_argument("--json", action="store_true", help="print JSON")
    c.set_defaults(func=cmd_config_check)

    flt = sub.add_parser("filters", help="filter tools").add_subparsers(dest="action", required=True)
    c = flt.add_parser("list", help="list the built-in filters")
    c.add_argument("--json", action="store_true", help="print JSON")
    c.set_defaults(func=cmd_filters_list)
    wgt = sub.add_parser("weighers", help="weigher tools").add_subparsers(dest="action", required=True)
    c = wgt.add_parser("list", help="list the built-in weighers")
    c.add_argument("--json", action="store_true", help="print JSON")
    c.set_defaults(func=cmd_weighers_list)

    flv = sub.add_parser("flavor", help="flavor tools").add_subparsers(dest="action", required=True)
    c = flv.add_parser("check", help="validate a flavor's extra specs")
    c.add_argument("cloud", nargs="?", help="cloud file holding the flavor")
    c.add_argument("--flavor", help="flavor name in the cloud file")
    c.add_argument("--extra-spec", action="append", metavar="KEY=VALUE")
    c.add_argument("--json", action="store_true", help="print JSON")
    c.set_defaults(func=cmd_flavor_check)

    from berth.service.capacity import add_command as add_capacity
    from berth.service.cli import add_commands
    from berth.service.processes import add_commands as add_process_commands

    add_capacity(sub)
    from berth.simulate.cli import add_commands as add_simulate

    add_simulate(sub)
    from berth.nova.command import add_command as add_nova_scheduler

    add_nova_scheduler(sub)

    add_commands(sub)
    add_process_commands(sub)
    sub.add_parser("placement", help="the Placement-compatible resource store (serve, ...)",
                   add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``berth`` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "placement":
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        try:
            return cmd_placement(argv[1:])
        except BerthError as exc:
            print(f"error: {exc.message}", file=sys.stderr)
            return exit_code_for(exc)
    parser = build_parser()
    if not argv:
        # A bare `berth` is a request for help, not a usage error.
        parser.print_help()
        return 0
    args, extra = parser.parse_known_args(argv)
    if extra:
        if (args.command == "simulate" and getattr(args, "url", None) and len(extra) == 1
                and not extra[0].startswith("-")):
            # `simulate CLOUD --url U TRACE`: argparse took CLOUD for the trace.
            parser.error(f"simulate: --url replays against the running Berth's own cloud: "
                         f"give the trace alone, without the cloud file {args.trace!r}")
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(levelname)s: %(message)s")
    try:
        return int(args.func(args))
    except (ConfigError, CloudFileError, InputError, BerthError) as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return exit_code_for(exc)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Output piped into `head` and the like: stop quietly, as Unix tools do.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the interpreter's flush
        return 0


if __name__ == "__main__":
    sys.exit(main())
