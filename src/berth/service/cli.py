"""``berth serve`` and ``berth boot``: the resource store and scheduler as a service.

    berth serve [--db URL] [--host H] [--port N] [--cloud FILE] [--config-file nova.conf]
                [--threads N] [--seed N] [--no-resume]
                [--fail-host HOST ...] [--fail-first HOST=N ...] [--build-delay S]
                [--build-timeout S] [--reconcile-interval S]
    berth audit [--db URL] [--fix] [--json] [--build-timeout S]
    berth boot --flavor F [--num N] [--hint k=v ...] [--group G] [--image NAME] [--url URL]
               [--explain] [--json]
    berth migrate UUID [--host H] [--allow-cross-cell]   berth resize UUID --flavor F
    berth evacuate UUID [--host H]   berth rebuild UUID --image NAME
    berth confirm-resize UUID   berth revert-resize UUID   berth server UUID

``serve`` opens (and migrates) the database — the embedded SQLite file
``./berth.sqlite`` by default, or any SQLAlchemy URL such as
``postgresql+psycopg://postgres@127.0.0.1:5432/test`` — and serves the scheduler API
(:mod:`berth.service.api`) with the Placement API under ``/placement``. With ``--cloud``
every host of the cloud file is registered through the compute-agent path (provider,
inventories, traits, aggregates, record) with its stats, ``io_workload`` and
``failed_builds``, its instances get their allocations, and the file's server groups
are stored; the agents then report every ``[DEFAULT] report_interval`` seconds.

A restart keeps what ran: an agent takes over the instances and usage of its host's
stored record, and the hosts an earlier run stored that the cloud file does not name
(all of them without ``--cloud``) get their agents back from their records, so they
keep reporting instead of going down after ``service_down_time``. ``--no-resume`` skips
the latter for a database whose hosts report from elsewhere. A cloud file that would
take a resource class away from a host whose allocations use it is refused before
anything is written.

``--fail-host`` and ``--fail-first`` tell the fake compute driver to fail builds, so the
conductor's rescheduling onto alternates can be watched; a host that is down (silent in
the file, or forced down) fails every build anyway. ``--build-delay`` makes every build
take that long (builds in flight, for crash tests).

Every ``serve`` runs a reconciler (:mod:`berth.service.reconcile`): its build heartbeat,
and the release of claims and group memberships of builds that a crashed process
abandoned ``--build-timeout`` seconds ago. ``audit`` (:mod:`berth.service.audit`) lists
and fixes what no build stands behind.

``migrate``, ``resize``, ``evacuate``, ``rebuild``, ``confirm-resize`` and
``revert-resize`` post a move of an instance to ``/servers/{uuid}/...`` and print where
it went and what the instance and migration consumers hold; ``server`` shows one.

``boot`` posts to ``/boot`` and prints where each instance went (and, on a partial
failure, which instances were not built; exit status 6). ``--flavor`` is a flavor name
the server knows (the cloud file's, or m1.tiny ... m1.xlarge) or ``VCPUS,RAM_MB,DISK_GB``;
``--group`` names a server group (uuid or name), the same as ``--hint group=G``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from berth.cloudfile import load_cloud, stable_uuid
from berth.errors import CloudFileError, InputError
from berth.filters.compute import effective_service_down_time
from berth.model.request import MAX_INSTANCES_PER_REQUEST, Flavor
from berth.placement.client import NotFoundError, PlacementAPIError
from berth.service.reconcile import DEFAULT_BUILD_TIMEOUT

if TYPE_CHECKING:
    from berth.explain import Diagnosis

DEFAULT_DB = "sqlite:///berth.sqlite"
DEFAULT_PORT = 8780
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"

LOG = logging.getLogger("berth.service")


def add_commands(subparsers: Any) -> None:
    """Register ``serve`` and ``boot`` on the ``berth`` command's subparsers."""
    p = subparsers.add_parser("serve", help="run the resource store and the scheduler API")
    p.add_argument("--db", default=DEFAULT_DB,
                   help=f"SQLAlchemy URL or SQLite path (default {DEFAULT_DB})")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=port_number, default=DEFAULT_PORT,
                   help=f"port, 0-65535, 0 for any free one (default {DEFAULT_PORT})")
    p.add_argument("--cloud", help="cloud file whose hosts are registered at start-up")
    p.add_argument("--config-file", action="append", help="nova.conf (repeatable)")
    p.add_argument("--threads", type=positive_int, default=8, help="server threads (default 8)")
    p.add_argument("--seed", type=int, default=None, help="random seed of the scheduler")
    p.add_argument("--no-resume", action="store_true",
                   help="do not re-create agents for the hosts stored by an earlier run (for "
                        "a database whose hosts report from elsewhere); they go down after "
                        "service_down_time unless something reports for them")
    p.add_argument("--fail-host", action="append", default=[], metavar="HOST",
                   help="the fake driver fails every build on HOST (repeatable): the "
                        "conductor reschedules onto the alternates")
    p.add_argument("--fail-first", action="append", default=[], type=host_count,
                   metavar="HOST=N", help="the fake driver fails the first N builds on HOST "
                                          "(repeatable)")
    p.add_argument("--build-delay", type=seconds, default=0.0, metavar="SECONDS",
                   help="the fake driver takes this long per build (builds in flight, for "
                        "crash tests and demos)")
    p.add_argument("--build-timeout", type=positive_seconds, default=DEFAULT_BUILD_TIMEOUT,
                   metavar="SECONDS",
                   help="a build not updated for this long was abandoned by a crashed "
                        "process: its claims and group membership are released "
                        f"(default {DEFAULT_BUILD_TIMEOUT:g})")
    p.add_argument("--reconcile-interval", type=positive_seconds, default=None,
                   metavar="SECONDS",
                   help="seconds between heartbeats and reconciliation rounds (default "
                        "the smaller of 10 and a quarter of --build-timeout)")
    p.set_defaults(func=cmd_serve)

    from berth.service.audit import add_command as add_audit

    add_audit(subparsers, DEFAULT_DB, positive_seconds)

    b = subparsers.add_parser("boot", help="ask a running 'berth serve' to place instances")
    b.add_argument("--flavor", required=True, help="flavor name, or VCPUS,RAM_MB,DISK_GB")
    b.add_argument("--num", type=instance_count, default=1,
                   help="number of instances (default 1, at most "
                        f"{MAX_INSTANCES_PER_REQUEST})")
    b.add_argument("--hint", action="append", default=[], metavar="KEY=VALUE",
                   help="scheduler hint; repeat a key for a list")
    b.add_argument("--group", help="server group (name or uuid) the instances join; the "
                                   "same as --hint group=GROUP")
    b.add_argument("--image", help="image name known to the server")
    b.add_argument("--availability-zone", "--az", dest="availability_zone")
    b.add_argument("--project", default="demo")
    b.add_argument("--user", default="demo")
    b.add_argument("--url", default=DEFAULT_URL, help=f"server URL (default {DEFAULT_URL})")
    b.add_argument("--explain", action="store_true",
                   help="ask for the diagnosis (filters, rejections, weights) and print it "
                        "as 'berth schedule --explain' does, also when no host is valid")
    b.add_argument("--verbose", "-v", action="store_true",
                   help="with --explain: every rejected host and every weigher's term")
    b.add_argument("--json", action="store_true",
                   help="print the JSON answer as the server sent it (errors too)")
    b.set_defaults(func=cmd_boot)

    # Moves of an instance the server knows (booted through it, or from its cloud file).
    actions = (
        ("migrate", "cold-migrate an instance (its host ignored) through a running 'berth serve'"),
        ("resize", "resize an instance to another flavor"),
        ("evacuate", "rebuild an instance of a host that is down on another host"),
        ("rebuild", "rebuild an instance on its own host with another image"),
        ("confirm-resize", "confirm a migration or resize: the source allocation goes"),
        ("revert-resize", "revert a migration or resize: back to the source and old flavor"),
        ("server", "show an instance: host, status, migrations, allocations"),
    )
    for name, text in actions:
        m = subparsers.add_parser(name, help=text)
        m.add_argument("instance", metavar="INSTANCE_UUID")
        if name in ("migrate", "evacuate"):
            m.add_argument("--host", help="the requested destination host")
        if name in ("migrate", "resize"):
            m.add_argument("--allow-cross-cell", action="store_true",
                           help="the instance may leave its cell (Nova's policy rule "
                                "compute:servers:resize:cross_cell)")
        if name == "resize":
            m.add_argument("--flavor", required=True,
                           help="flavor name, or VCPUS,RAM_MB,DISK_GB")
        if name == "rebuild":
            m.add_argument("--image", required=True, help="image name known to the server")
        if name in ("migrate", "resize", "evacuate", "rebuild"):
            m.add_argument("--explain", action="store_true",
                           help="print the diagnosis, as 'berth boot --explain' does")
            m.add_argument("--verbose", "-v", action="store_true",
                           help="with --explain: every rejected host and every weigher's term")
        m.add_argument("--url", default=DEFAULT_URL, help=f"server URL (default {DEFAULT_URL})")
        m.add_argument("--json", action="store_true", help="print the JSON answer as sent")
        m.set_defaults(func=cmd_server_action, action=name)


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def seconds(text: str) -> float:
    """An argparse type: a number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


def positive_seconds(text: str) -> float:
    """An argparse type: a number of seconds > 0."""
    value = seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def instance_count(text: str) -> int:
    """An argparse type: a number of instances, 1 to the request bound."""
    value = positive_int(text)
    if value > MAX_INSTANCES_PER_REQUEST:
        raise argparse.ArgumentTypeError(
            f"at most {MAX_INSTANCES_PER_REQUEST} instances per request, got {value}")
    return value


def port_number(text: str) -> int:
    """An argparse type: a TCP port, 0-65535 (0: any free port)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535, got {value}")
    return value


def host_count(text: str) -> tuple[str, int]:
    """An argparse type: ``HOST=N`` with N >= 1."""
    host, sep, count = text.partition("=")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f"expected HOST=N, got {text!r}")
    try:
        return host, positive_int(count)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected HOST=N with N a positive integer, got {text!r}") from None


# ----------------------------------------------------------------------------- boot
def flavor_argument(text: str) -> Any:
    """``--flavor``: a name, or ``VCPUS,RAM_MB,DISK_GB`` as an inline flavor."""
    parts = text.split(",")
    if len(parts) == 1:
        return text
    if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
        raise InputError(f"--flavor {text!r}: expected a name or VCPUS,RAM_MB,DISK_GB")
    vcpus, ram, disk = (int(p) for p in parts)
    return {"name": text, "vcpus": vcpus, "memory_mb": ram, "root_gb": disk}


def _hints(pairs: list[str]) -> dict[str, list[str]]:
    hints: dict[str, list[str]] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InputError(f"--hint {pair!r}: expected key=value")
        hints.setdefault(key, []).append(value)
    return hints


def cmd_boot(args: argparse.Namespace) -> int:
    """POST /boot and print the placements."""
    import httpx

    hints = _hints(args.hint)
    if args.group:
        if hints.get("group", [args.group]) != [args.group]:
            raise InputError(f"--group {args.group!r} and --hint group={hints['group'][0]!r} "
                             "disagree; give one")
        hints["group"] = [args.group]
    body: dict[str, Any] = {"flavor": flavor_argument(args.flavor), "num": args.num,
                            "hints": hints, "project_id": args.project, "user_id": args.user}
    if args.image:
        body["image"] = args.image
    if args.availability_zone:
        body["availability_zone"] = args.availability_zone
    if args.explain:
        body["explain"] = True
    try:
        resp = httpx.post(args.url.rstrip("/") + "/boot", json=body, timeout=60)
    except httpx.HTTPError as exc:
        print(f"error: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 7
    try:
        data = resp.json()
    except ValueError:
        print(f"error: {resp.status_code} from {args.url}: {resp.text[:200]}", file=sys.stderr)
        return 1
    if args.json:
        # The server's answer untouched, errors and their diagnosis included.
        print(json.dumps(data, indent=2))
        return 0 if resp.status_code == 200 else _exit_code(resp.status_code, data)
    verbose = bool(getattr(args, "verbose", False))
    if not isinstance(data, dict):
        print(f"error: {resp.status_code} from {args.url}: {resp.text[:200]}", file=sys.stderr)
        return 1
    if data.get("instances"):
        # Also in a 409 that built some of the instances: those exist.
        _print_instances(data["instances"])
    for failed in data.get("failed") or []:
        err = failed.get("error", {})
        print(f"instance {failed.get('instance_uuid')} not built (tried "
              f"{','.join(failed.get('tried') or []) or 'no host'}): {err.get('message')}",
              file=sys.stderr)
    if resp.status_code != 200:
        err = data.get("error", {})
        print(f"error: {err.get('message', resp.text)} ({err.get('code', resp.status_code)})",
              file=sys.stderr)
        if data.get("diagnosis"):
            _print_diagnosis(data["diagnosis"], verbose)
        return _exit_code(resp.status_code, data)
    if data.get("diagnosis"):
        print()
        _print_diagnosis(data["diagnosis"], verbose)
    return 0


def cmd_server_action(args: argparse.Namespace) -> int:
    """POST a move (or confirm/revert) to ``/servers/{uuid}/{action}``, or GET the
    instance, and print where it is and what its consumers hold."""
    import httpx

    url = f"{args.url.rstrip('/')}/servers/{args.instance}"
    body: dict[str, Any] = {}
    if getattr(args, "host", None):
        body["host"] = args.host
    if getattr(args, "allow_cross_cell", False):
        body["allow_cross_cell"] = True
    if getattr(args, "flavor", None):
        body["flavor"] = flavor_argument(args.flavor)
    if getattr(args, "image", None):
        body["image"] = args.image
    if getattr(args, "explain", False):
        body["explain"] = True
    try:
        if args.action == "server":
            resp = httpx.get(url, timeout=60)
        else:
            resp = httpx.post(f"{url}/{args.action}", json=body, timeout=60)
    except httpx.HTTPError as exc:
        print(f"error: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 7
    try:
        data = resp.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        print(f"error: {resp.status_code} from {args.url}: {resp.text[:200]}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(data, indent=2))
        return 0 if resp.status_code == 200 else _exit_code(resp.status_code, data)
    verbose = bool(getattr(args, "verbose", False))
    if resp.status_code != 200:
        err = data.get("error", {})
        print(f"error: {err.get('message', resp.text)} ({err.get('code', resp.status_code)})",
              file=sys.stderr)
        if data.get("diagnosis"):
            _print_diagnosis(data["diagnosis"], verbose)
        return _exit_code(resp.status_code, data)
    _print_server(args.action, data)
    if data.get("diagnosis"):
        print()
        _print_diagnosis(data["diagnosis"], verbose)
    return 0


def _print_server(action: str, data: dict[str, Any]) -> None:
    """Where the instance is (and came from), its status, and each consumer's
    allocations by provider."""
    source = data.get("source")
    if source and action != "server":
        tried = ",".join(data.get("tried") or []) or "-"
        alternates = ",".join(a["host"] for a in data.get("alternates") or []) or "-"
        print(f"{action}: {data['instance_uuid']} {source['host']} -> {data['host']} "
              f"({data['nodename']}); status {data.get('status')}; tried {tried}; "
              f"alternates {alternates}")
    else:
        print(f"{data['instance_uuid']}: on {data['host']} ({data['nodename']}); status "
              f"{data.get('status')}" + (f"; flavor {data['flavor']}" if data.get("flavor") else ""))
    allocations = data.get("allocations") or {}
    for consumer, label in (("instance", data["instance_uuid"]),
                            ("migration", data.get("migration_uuid"))):
        if consumer not in allocations:
            continue
        held = allocations[consumer]
        names = data.get("providers") or {}
        text = "; ".join(f"{names.get(rp, rp)} " + ", ".join(
            f"{rc}={n}" for rc, n in sorted(res.items()))
            for rp, res in sorted(held.items())) or "nothing"
        print(f"  {consumer} consumer {label}: {text}")


def _print_instances(instances: list[dict[str, Any]]) -> None:
    """One row per built instance: where it went, the hosts tried, its alternates."""
    rows = [("#", "instance", "host", "node", "tried", "alternates")]
    for i, inst in enumerate(instances, start=1):
        rows.append((str(i), inst["instance_uuid"], inst["host"], inst["nodename"],
                     ",".join(inst["tried"]),
                     ",".join(a["host"] for a in inst["alternates"]) or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


def _exit_code(status: int, data: Any) -> int:
    """The exit status ``berth schedule`` gives the same error (by its code), else 3 for a
    bad request and 4 for another refusal."""
    from berth.errors import EXIT_CODES

    code = data.get("error", {}).get("code") if isinstance(data, dict) else None
    for cls, exit_status in EXIT_CODES.items():
        if cls.code == code:
            return exit_status
    return 3 if status == 400 else 4


def diagnosis_from_dict(data: Any) -> Diagnosis:
    """The :class:`~berth.explain.Diagnosis` of an API answer's ``"diagnosis"`` (the
    inverse of ``Diagnosis.to_dict``), so it prints as ``berth schedule --explain``."""
    from berth.explain import (
        Diagnosis,
        FilterStep,
        HostRejection,
        HostWeighing,
        InstanceDiagnosis,
        WeigherTerm,
    )
    from berth.filters.base import Reject

    if not isinstance(data, dict) or not isinstance(data.get("instances"), list):
        raise InputError("diagnosis: expected an object with a list of instances")
    instances: list[InstanceDiagnosis] = []
    for item in data["instances"]:
        chosen = item.get("chosen")
        steps = [
            FilterStep(
                name=s["name"], hosts_in=int(s["hosts_in"]), hosts_out=int(s["hosts_out"]),
                skipped=s.get("skipped"),
                rejections=[HostRejection(r["host"], r["nodename"], s["name"],
                                          Reject(r["reason"], dict(r.get("numbers") or {})))
                            for r in s.get("rejections") or []],
            )
            for s in item.get("steps") or []
        ]
        weighing = [
            HostWeighing(w["host"], w["nodename"], float(w["weight"]), [
                WeigherTerm(t["weigher"], float(t["raw"]), float(t["normalized"]),
                            float(t["multiplier"]))
                for t in w.get("terms") or []])
            for w in item.get("weighing") or []
        ]
        instances.append(InstanceDiagnosis(
            index=int(item.get("index", len(instances))), instance_uuid=item.get("instance_uuid"),
            hosts_considered=int(item.get("hosts_considered", 0)), steps=steps,
            weighing=weighing, chosen=(chosen[0], chosen[1]) if chosen else None,
            claim_failures=[(c[0], c[1]) for c in item.get("claim_failures") or []],
            ranked_by="cost" if item.get("ranked_by") == "cost" else "weight",
        ))
    return Diagnosis(instances)


def _print_diagnosis(data: Any, verbose: bool) -> None:
    """Print an API diagnosis the way ``berth schedule --explain`` prints its own."""
    from berth.explain import diagnosis_lines

    try:
        diagnosis = diagnosis_from_dict(data)
    except (InputError, KeyError, TypeError, ValueError, IndexError):
        # A server of another version: show what it sent rather than nothing.
        print(json.dumps(data, indent=2))
        return
    print("\n".join(diagnosis_lines(diagnosis, verbose=verbose)))


# ----------------------------------------------------------------------------- serve
def cloud_nodes(cloud: Any) -> list[Any]:
    """The compute nodes of a loaded cloud file, as agents register them: size,
    capabilities, ratios, the host's own stats and its numeric ``io_workload``."""
    from berth.service.compute import ComputeNodeSpec

    snap = cloud.snapshot
    nodes = []
    for row in range(len(snap)):
        num = {name: snap.num(name)[row] for name in (
            "vcpus_total", "total_usable_ram_mb", "total_usable_disk_gb", "hypervisor_version",
            "cpu_allocation_ratio", "ram_allocation_ratio", "disk_allocation_ratio")}
        # The host's own stats go with it; the agent counts num_instances and
        # failed_builds itself and reports a numeric io_workload from the node's.
        stats = {str(k): str(v) for k, v in (snap.interned_value("stats", row) or {}).items()}
        io_workload = stats.get("io_workload", "0")
        if io_workload.isdigit():
            stats.pop("io_workload", None)
        for own in ("num_instances", "failed_builds"):
            stats.pop(own, None)
        nodes.append(ComputeNodeSpec(
            host=snap.obj("host")[row], nodename=snap.obj("nodename")[row],
            uuid=snap.obj("uuid")[row], cell_uuid=snap.interned_value("cell_uuid", row),
            vcpus=int(num["vcpus_total"]), memory_mb=int(num["total_usable_ram_mb"]),
            local_gb=int(num["total_usable_disk_gb"]),
            hypervisor_type=snap.interned_value("hypervisor_type", row) or "QEMU",
            hypervisor_version=(int(num["hypervisor_version"])
                                if num["hypervisor_version"] == num["hypervisor_version"] else 0),
            cpu_info=snap.interned_value("cpu_info", row) or "{}",
            supported_instances=snap.interned_value("supported_instances", row),
            host_ip=snap.obj("host_ip")[row], numa_topology=snap.obj("numa_topology")[row],
            pci_stats=snap.obj("pci_stats")[row], metrics=list(snap.obj("metrics")[row]),
            cpu_allocation_ratio=float(num["cpu_allocation_ratio"]),
            ram_allocation_ratio=float(num["ram_allocation_ratio"]),
            disk_allocation_ratio=float(num["disk_allocation_ratio"]),
            stats=stats, io_workload=int(io_workload) if io_workload.isdigit() else 0))
    return nodes


def seed_from_cloud(stack: Any, path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Register a cloud file's hosts through their agents; returns (flavors, images)."""
    import time

    from berth.moves import instance_from_cloud

    cloud = load_cloud(path, stack.config, now=time.time())
    snap = cloud.snapshot
    nodes = cloud_nodes(cloud)
    check_against_allocations(stack, nodes, path)
    agents = stack.register_hosts(nodes, snap.aggregates)
    for group in cloud.server_groups.values():
        stack.groups.put(group)
    flavors_by_id = {f.id: f for f in cloud.flavors.values()}
    config = stack.config
    down_time = effective_service_down_time(config.service_down_time, config.report_interval)
    # The file's instances (and the usage holders beyond them) exist without a build by
    # Berth: recorded as active builds, so the audit does not take them for orphans.
    existing: dict[str, str | None] = {}
    for row, agent in enumerate(agents):
        service = snap.obj("service")[row]
        if service is not None and service.disabled:
            agent.set_disabled(True, service.disabled_reason)
        failed = snap.num("failed_builds")[row]
        if "failed_builds" in (snap.interned_value("stats", row) or {}) and not math.isnan(failed):
            agent.failed_builds = int(failed)
        placed: list[Flavor] = []
        for uuid, inst in snap.obj("instances")[row].items():
            flavor = flavors_by_id.get(inst.instance_type_id)
            if flavor is None:
                continue
            placed.append(flavor)
            known = stack.instances.get(uuid)
            if known is not None and known.host != agent.node.host:
                # Moved by an earlier run: it runs (and is allocated) where it went; the
                # file's usage of this host no longer includes it.
                continue
            existing[uuid] = agent.node.host
            _allocate(stack, uuid, agent.uuid, flavor, inst.project_id or "seed")
            agent.spawn(uuid, flavor, inst.project_id, publish=False,
                        image_properties=inst.image_properties)
            if known is None:
                # Known with its spec from now on, so it can be moved like a booted one.
                stack.instances.record(uuid, agent.node.host,
                                       agent.node.nodename or agent.node.host,
                                       instance_from_cloud(cloud, uuid).spec)
        # Usage the file states beyond its instances (and the reserved amounts) is held
        # by one consumer per host, so placement and the reports agree.
        extra = Flavor(
            name="preexisting",
            vcpus=max(0, int(snap.num("vcpus_used")[row]) - config.reserved_host_cpus
                      - sum(f.vcpus for f in placed)),
            memory_mb=max(0, int(snap.num("total_usable_ram_mb")[row] - snap.num("free_ram_mb")[row])
                          - config.reserved_host_memory_mb - sum(f.memory_mb for f in placed)),
            root_gb=max(0, int(snap.num("disk_mb_used")[row]) // 1024
                        - math.ceil(config.reserved_host_disk_mb / 1024)
                        - sum(f.root_gb + f.ephemeral_gb for f in placed)))
        if extra.vcpus or extra.memory_mb or extra.root_gb:
            # One consumer may not exceed max_unit (the node's total) per class.
            node = agent.node
            parts = max(math.ceil(extra.vcpus / max(node.vcpus, 1)),
                        math.ceil(extra.memory_mb / max(node.memory_mb, 1)),
                        math.ceil(extra.root_gb / max(node.local_gb, 1)), 1)
            for i in range(parts):
                share = Flavor(name="preexisting", vcpus=_share(extra.vcpus, parts, i),
                               memory_mb=_share(extra.memory_mb, parts, i),
                               root_gb=_share(extra.root_gb, parts, i))
                holder = stable_uuid("preexisting", agent.uuid, str(i))
                existing[holder] = agent.node.host
                _allocate(stack, holder, agent.uuid, share, "seed")
            agent.baseline = extra
        # Instances the file counts (stats num_instances) but does not list.
        agent.baseline_instances = max(
            0, int(snap.num("num_instances")[row]) - len(snap.obj("instances")[row]))
        down_since = None
        if service is not None:
            agent.forced_down = service.forced_down
            seen = service.last_seen_up
            if seen is not None and time.time() - seen > down_time:
                # A host the file says is down keeps its old heartbeat and stays silent.
                agent.silent, down_since = True, seen
        agent.report(now=down_since)
    stack.builds.adopt(existing, request_id=f"cloud-file:{path}"[:64])
    return dict(cloud.flavors), dict(cloud.images)


#: The cloud-file field behind each resource class a node reports.
_CLASS_FIELDS = {"VCPU": "vcpus", "PCPU": "pcpus", "MEMORY_MB": "memory_mb",
                 "DISK_GB": "local_gb"}


def check_against_allocations(stack: Any, nodes: Sequence[Any], path: str) -> None:
    """Refuse, before anything is written, a cloud file that would take a resource class
    away from a host whose stored allocations use it (placement refuses such an
    inventory, and the store would be left half re-seeded); warn where a host shrinks
    below what its allocations use (placement allows that: the host is overcommitted
    and takes no more of that class until they shrink)."""
    from berth.service.compute import inventories_for

    for node in nodes:
        try:
            usages = stack.client.provider_usages(node.uuid)
        except NotFoundError:
            continue  # a new host
        inventory = inventories_for(node, stack.config)
        for rc, used in sorted(usages.items()):
            if not used:
                continue
            name = _CLASS_FIELDS.get(rc, rc)
            inv = inventory.get(rc)
            if inv is None:
                raise CloudFileError(
                    f"{path}: host {node.host}: {name} would leave it no {rc} inventory, but "
                    f"its allocations in the database use {used} {rc}; keep {name} at least "
                    f"{used} or delete those allocations first (nothing was changed)",
                    host=node.host, field=name)
            capacity = int((inv["total"] - inv["reserved"]) * inv["allocation_ratio"])
            if capacity < used:
                LOG.warning("%s: host %s: %s gives %d %s, below the %d its allocations use; "
                            "it takes no more %s until they shrink", path, node.host, name,
                            capacity, rc, used, rc)


def _share(total: int, parts: int, index: int) -> int:
    """The ``index``-th of ``parts`` near-equal integer shares of ``total``."""
    return total // parts + (1 if index < total % parts else 0)


def _allocate(stack: Any, consumer: str, rp_uuid: str, flavor: Flavor, project: str) -> None:
    """Give an existing workload its allocation, unless it has one already."""
    if stack.client.get_allocations(consumer).allocations:
        return
    resources = {"VCPU": flavor.vcpus, "MEMORY_MB": flavor.memory_mb,
                 "DISK_GB": flavor.root_gb + flavor.ephemeral_gb}
    try:
        stack.client.put_allocations(consumer, {rp_uuid: {k: v for k, v in resources.items() if v}},
                                     project_id=project, user_id="seed", consumer_generation=None)
    except PlacementAPIError as exc:
        LOG.warning("could not seed the allocation of %s: %s", consumer, exc.detail)


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the store and the scheduler API until SIGTERM/SIGINT.

    Start-up order: configuration, the listening socket (a port in use or a bad address
    fails before the database is touched), the database, the cloud file's hosts, then
    agents for the hosts an earlier run stored (unless ``--no-resume``). Every start-up
    problem is one line on stderr and exit status 2 (3 for a bad cloud file).
    """
    from waitress.server import create_server

    from berth.config import SchedulerConfig
    from berth.service.api import DEFAULT_FLAVORS, SchedulerApp
    from berth.service.conductor import FakeDriver
    from berth.service.stack import open_stack

    # ``berth`` configured logging at WARNING already; serve logs at INFO.
    logging.basicConfig(level=logging.INFO, force=True,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    for chatty in ("alembic", "httpx"):  # migrations, and every in-process placement call
        logging.getLogger(chatty).setLevel(logging.WARNING)
    config = SchedulerConfig.from_files(args.config_file) if args.config_file else SchedulerConfig.default()
    apps: list[Any] = []

    def application(environ: dict[str, Any], start_response: Any) -> Any:
        return apps[0](environ, start_response)

    try:
        server: Any = create_server(application, host=args.host, port=args.port,
                                    threads=args.threads, ident="berth",
                                    clear_untrusted_proxy_headers=True)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        print(f"berth serve: cannot listen on --host {args.host!r} --port {args.port}: {reason}",
              file=sys.stderr)
        return 2
    try:
        try:
            stack = open_stack(args.db, config)
        except Exception as exc:  # start-up problems are reported, not traced
            print(f"berth serve: cannot open database {args.db!r}: {exc}", file=sys.stderr)
            return 2
        try:
            return _serve(args, server, apps, stack, DEFAULT_FLAVORS, SchedulerApp, FakeDriver)
        finally:
            stack.close()
    finally:
        server.close()


def _serve(args: argparse.Namespace, server: Any, apps: list[Any], stack: Any,
           default_flavors: dict[str, Any], app_class: Any, driver_class: Any) -> int:
    """Register the hosts, wire the app behind ``server`` and run it."""
    from berth.service.compute import agent_key

    flavors: dict[str, Any] = dict(default_flavors)
    images: dict[str, Any] = {}
    if args.cloud:
        cloud_flavors, images = seed_from_cloud(stack, args.cloud)
        flavors.update(cloud_flavors)
        LOG.info("registered %d compute nodes from %s", len(stack.agents), args.cloud)
    if not args.no_resume:
        resumed = stack.resume_agents()
        if resumed:
            names = [a.node.host for a in resumed]
            LOG.info("resumed %d compute nodes stored by an earlier run: %s%s", len(names),
                     ", ".join(names[:10]), ", ..." if len(names) > 10 else "")
    else:
        stored = {agent_key(r["host"], r.get("nodename"))
                  for r in stack.records.reports()} - set(stack.agents)
        if stored:
            LOG.warning("%d stored hosts have no agent here (--no-resume): they go down "
                        "after service_down_time unless they report from elsewhere",
                        len(stored))
    if not stack.agents:
        LOG.warning("no compute hosts: every boot fails with NoValidHost until hosts "
                    "register (start with --cloud FILE)")
    fail_first = dict(args.fail_first)
    known = {agent.node.host for agent in stack.agents.values()}
    for option, host in [("--fail-host", h) for h in args.fail_host] + [
            ("--fail-first", h) for h in fail_first]:
        if host not in known:
            print(f"berth serve: {option} {host}: no compute host {host!r} (known: "
                  f"{', '.join(sorted(known)) or 'none'})", file=sys.stderr)
            return 2
    driver = driver_class(fail_hosts=set(args.fail_host), fail_first=fail_first,
                          agents=stack.agents, delay=args.build_delay)
    for agent in stack.agents.values():
        agent.start()
    service = stack.scheduler(seed=args.seed)
    conductor = stack.conductor(service, driver)
    moves = stack.moves(conductor)
    for host, agent in stack.agents.items():
        # A compute that starts drops the instances evacuated from it (Nova's init_host).
        if not agent.down:
            cleaned = moves.cleanup_evacuated(host)
            if cleaned:
                LOG.info("compute %s is up: released %d instances evacuated from it",
                         host, len(cleaned))
    apps.append(app_class(service, conductor, stack.placement_app, flavors, images,
                          groups=stack.groups, moves=moves))
    reconciler = stack.reconciler(timeout=args.build_timeout, interval=args.reconcile_interval)
    reconciler.start()

    def _stop(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(f"listening on http://{args.host}:{server.effective_port} (db {args.db}; "
          f"placement under /placement)", flush=True)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            server.run()
    finally:
        reconciler.stop()
    return 0
