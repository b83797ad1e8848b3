"""``berth audit``: the claims no build stands behind, listed and (with ``--fix``) released.

    berth audit [--db URL] [--fix] [--json] [--build-timeout SECONDS] [--purge DAYS]

Reads the shared database (:func:`berth.service.reconcile.scan`) and prints:

* orphaned allocations: consumers holding resources with no build record (no Berth boot
  wrote them);
* leaked allocations: those of failed builds, or of builds abandoned by a crashed process
  (``building`` with no update for ``--build-timeout`` seconds);
* never-built group members: failed or abandoned builds still in a server group;
* active builds without allocations (reported, never changed).

``--fix`` releases all of it, orphans included (the reconciler of a running server
releases everything but orphans by itself). ``--purge DAYS`` deletes the build records
of deleted and failed instances settled more than DAYS days ago, which nothing reads any
more (:meth:`berth.service.builds.BuildRecords.purge`); a running server keeps them. Exit status 0 when the database is clean
(after fixing, with ``--fix``), 8 when something was found and left as it is. Nova's
counterpart is ``nova-manage placement audit [--delete]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

from berth.placement.db import error_line, shown_url

#: Exit status when findings remain.
FINDINGS_EXIT = 8


def add_command(subparsers: Any, default_db: str, seconds_type: Any) -> None:
    """Register ``audit`` on the ``berth`` command's subparsers."""
    from berth.service.reconcile import DEFAULT_BUILD_TIMEOUT

    a = subparsers.add_parser("audit", help="list (and fix) allocations no build stands behind")
    a.add_argument("--db", default=default_db,
                   help=f"SQLAlchemy URL or SQLite path (default {default_db})")
    a.add_argument("--fix", action="store_true",
                   help="delete orphaned and leaked allocations, fail abandoned builds and "
                        "take never-built instances out of their groups")
    a.add_argument("--json", action="store_true", help="print the findings as JSON")
    a.add_argument("--build-timeout", type=seconds_type, default=DEFAULT_BUILD_TIMEOUT,
                   metavar="SECONDS",
                   help="a build not updated for this long counts as abandoned "
                        f"(default {DEFAULT_BUILD_TIMEOUT:g})")
    a.add_argument("--purge", type=_days, default=None, metavar="DAYS",
                   help="delete the build records of deleted and failed instances settled "
                        "more than DAYS days ago, at least 1 (kept while they hold "
                        "allocations or a group place)")
    a.set_defaults(func=cmd_audit)


def _days(text: str) -> float:
    """``--purge``'s value: a number of days, 1 or more.

    Not less: a build whose owner stalled past the build timeout is failed by a
    reconciler and may still claim; purged by then, its claim would be an orphan."""
    try:
        days = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of days") from None
    if not 1 <= days <= 100_000:  # also refuses nan and inf
        raise argparse.ArgumentTypeError(f"{text!r}: the days must be 1 to 100000")
    return days


def cmd_audit(args: argparse.Namespace) -> int:
    """Scan, print, and fix when asked."""
    from pathlib import Path

    import sqlalchemy as sa
    from sqlalchemy.engine import make_url

    from berth.errors import ServiceUnavailable
    from berth.placement.db import create_db_engine, current_revision
    from berth.placement.local import LocalPlacement
    from berth.placement.store import PlacementStore
    from berth.service.builds import BuildRecords
    from berth.service.groups import ServerGroupStore
    from berth.service.instances import InstanceStore
    from berth.service.reconcile import repair, scan

    url = args.db if "://" in args.db else f"sqlite:///{args.db}"
    try:
        parsed = make_url(url)
    except Exception as exc:  # noqa: BLE001 - a malformed URL is one line
        print(f"berth audit: --db {args.db!r}: {exc}", file=sys.stderr)
        return 2
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").is_file():
        print(f"berth audit: --db {args.db!r}: no such database file", file=sys.stderr)
        return 2
    try:
        engine = create_db_engine(url)
        revision = current_revision(engine)
    except Exception as exc:  # any connection problem is one line, not a trace
        print(f"berth audit: cannot open database {shown_url(args.db)!r}: {error_line(exc)}", file=sys.stderr)
        return 2
    if revision is None:
        print(f"berth audit: {args.db!r} holds no Berth database (never served)",
              file=sys.stderr)
        engine.dispose()
        return 2
    store = PlacementStore(engine)
    try:
        builds = BuildRecords(engine, register=args.fix)  # a listing writes nothing
        groups = ServerGroupStore(engine)
        findings = scan(builds, groups, timeout=args.build_timeout)
        repairs = None
        if args.fix and not findings.clean:
            repairs = repair(findings, builds, groups, LocalPlacement(store), orphans=True,
                             timeout=args.build_timeout, instances=InstanceStore(engine))
        purged = None
        if args.purge is not None:
            before = time.time() - args.purge * 86400
            purged = {"before": _iso(before), "build_records": builds.purge(before)}
        if args.json:
            out: dict[str, Any] = {"findings": findings.as_dict()}
            if repairs is not None:
                out["fixed"] = repairs.as_dict()
            if purged is not None:
                out["purged"] = purged
            print(json.dumps(out, indent=2))
        else:
            _print(findings, repairs)
            if purged is not None:
                print(f"purged: {purged['build_records']} build records of deleted and failed "
                      f"instances settled before {purged['before']}")
        if findings.clean or (repairs is not None and not findings.missing):
            return 0
        return FINDINGS_EXIT
    except (sa.exc.SQLAlchemyError, ServiceUnavailable) as exc:
        # What was fixed or purged before stays done; each step is its own transaction.
        print(f"berth audit: {shown_url(args.db)!r}: {error_line(exc)}", file=sys.stderr)
        return 1
    finally:
        store.close()
        engine.dispose()


def _iso(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).isoformat(timespec="seconds")


def _print(findings: Any, repairs: Any) -> None:
    """The findings as text, one line each."""
    if findings.clean:
        print("clean: every allocation belongs to a build, no build was abandoned")
        return
    for title, holdings in (("orphaned allocations (no build record)", findings.orphaned),
                            ("leaked allocations (failed or abandoned builds, deleted instances)",
                             findings.leaked)):
        print(f"{title}: {len(holdings)}")
        for h in holdings:
            where = "; ".join(f"{host} " + ",".join(f"{rc}={n}" for rc, n in sorted(res.items()))
                              for host, res in sorted(h.resources.items()))
            why = f" ({h.reason})" if h.reason else ""
            print(f"  {h.consumer}  {where}{why}")
    print(f"abandoned builds: {len(findings.abandoned)}")
    for b in findings.abandoned:
        print(f"  {b.instance_uuid}  owner {b.owner}  request {b.request_id}")
    stale = sum(len(m) for m in findings.stale_members.values())
    print(f"never-built group members: {stale}")
    for group, members in sorted(findings.stale_members.items()):
        print(f"  group {group}: {', '.join(members)}")
    print(f"active builds without allocations: {len(findings.missing)}")
    for uuid in findings.missing:
        print(f"  {uuid}")
    if repairs is not None:
        members = sum(len(m) for m in repairs.members_removed.values())
        print(f"fixed: {len(repairs.allocations_deleted)} consumers' allocations deleted, "
              f"{len(repairs.builds_failed)} abandoned builds failed, {members} members "
              f"removed from their groups")
