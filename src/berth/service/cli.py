"""``berth serve`` and ``berth boot``: the resource store and scheduler as a service.

    berth serve [--db URL] [--host H] [--port N] [--cloud FILE] [--config-file nova.conf]
    berth boot --flavor F [--num N] [--hint k=v ...] [--image NAME] [--url URL] [--explain]
               [--json]

``serve`` opens (and migrates) the database — the embedded SQLite file
``./berth.sqlite`` by default, or any SQLAlchemy URL such as
``postgresql+psycopg://postgres@127.0.0.1:5432/test`` — and serves the scheduler API
(:mod:`berth.service.api`) with the Placement API under ``/placement``. With ``--cloud``
every host of the cloud file is registered through the compute-agent path (provider,
inventories, traits, aggregates, record) and its instances get their allocations; the
agents then report every ``[DEFAULT] report_interval`` seconds. ``boot`` posts to
``/boot`` and prints where each instance went. ``--flavor`` is a flavor name the server
knows (the cloud file's, or m1.tiny ... m1.xlarge) or ``VCPUS,RAM_MB,DISK_GB``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import sys
from typing import TYPE_CHECKING, Any

from berth.cloudfile import load_cloud, stable_uuid
from berth.errors import InputError
from berth.model.request import Flavor
from berth.placement.client import PlacementAPIError

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
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--cloud", help="cloud file whose hosts are registered at start-up")
    p.add_argument("--config-file", action="append", help="nova.conf (repeatable)")
    p.add_argument("--threads", type=int, default=8, help="server threads (default 8)")
    p.add_argument("--seed", type=int, default=None, help="random seed of the scheduler")
    p.set_defaults(func=cmd_serve)

    b = subparsers.add_parser("boot", help="ask a running 'berth serve' to place instances")
    b.add_argument("--flavor", required=True, help="flavor name, or VCPUS,RAM_MB,DISK_GB")
    b.add_argument("--num", type=int, default=1, help="number of instances (default 1)")
    b.add_argument("--hint", action="append", default=[], metavar="KEY=VALUE",
                   help="scheduler hint; repeat a key for a list")
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

    body: dict[str, Any] = {"flavor": flavor_argument(args.flavor), "num": args.num,
                            "hints": _hints(args.hint), "project_id": args.project,
                            "user_id": args.user}
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
    if resp.status_code != 200:
        err = data.get("error", {}) if isinstance(data, dict) else {}
        print(f"error: {err.get('message', resp.text)} ({err.get('code', resp.status_code)})",
              file=sys.stderr)
        if isinstance(data, dict) and data.get("diagnosis"):
            _print_diagnosis(data["diagnosis"], verbose)
        return _exit_code(resp.status_code, data)
    rows = [("#", "instance", "host", "node", "tried", "alternates")]
    for i, inst in enumerate(data["instances"], start=1):
        rows.append((str(i), inst["instance_uuid"], inst["host"], inst["nodename"],
                     ",".join(inst["tried"]),
                     ",".join(a["host"] for a in inst["alternates"]) or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    if data.get("diagnosis"):
        print()
        _print_diagnosis(data["diagnosis"], verbose)
    return 0


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
def seed_from_cloud(stack: Any, path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Register a cloud file's hosts through their agents; returns (flavors, images)."""
    import time

    from berth.service.compute import ComputeNodeSpec

    cloud = load_cloud(path, stack.config, now=time.time())
    snap = cloud.snapshot
    nodes = []
    for row in range(len(snap)):
        num = {name: snap.num(name)[row] for name in (
            "vcpus_total", "total_usable_ram_mb", "total_usable_disk_gb", "hypervisor_version",
            "cpu_allocation_ratio", "ram_allocation_ratio", "disk_allocation_ratio")}
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
            disk_allocation_ratio=float(num["disk_allocation_ratio"])))
    agents = stack.register_hosts(nodes, snap.aggregates)
    flavors_by_id = {f.id: f for f in cloud.flavors.values()}
    config = stack.config
    for row, agent in enumerate(agents):
        service = snap.obj("service")[row]
        if service is not None and service.disabled:
            agent.set_disabled(True, service.disabled_reason)
        placed: list[Flavor] = []
        for uuid, inst in snap.obj("instances")[row].items():
            flavor = flavors_by_id.get(inst.instance_type_id)
            if flavor is None:
                continue
            _allocate(stack, uuid, agent.uuid, flavor, inst.project_id or "seed")
            agent.spawn(uuid, flavor, inst.project_id, publish=False)
            placed.append(flavor)
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
                _allocate(stack, stable_uuid("preexisting", agent.uuid, str(i)), agent.uuid,
                          share, "seed")
            agent.baseline = extra
        down_since = None
        if service is not None:
            agent.forced_down = service.forced_down
            seen = service.last_seen_up
            if seen is not None and time.time() - seen > config.service_down_time:
                # A host the file says is down keeps its old heartbeat and stays silent.
                agent.silent, down_since = True, seen
        agent.report(now=down_since)
    return dict(cloud.flavors), dict(cloud.images)


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
    """Run the store and the scheduler API until SIGTERM/SIGINT."""
    from waitress.server import create_server

    from berth.config import SchedulerConfig
    from berth.service.api import DEFAULT_FLAVORS, SchedulerApp
    from berth.service.stack import open_stack

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)
    config = SchedulerConfig.from_files(args.config_file) if args.config_file else SchedulerConfig.default()
    try:
        stack = open_stack(args.db, config)
    except Exception as exc:  # start-up problems are reported, not traced
        print(f"berth serve: cannot open database {args.db!r}: {exc}", file=sys.stderr)
        return 2
    flavors: dict[str, Any] = dict(DEFAULT_FLAVORS)
    images: dict[str, Any] = {}
    if args.cloud:
        cloud_flavors, images = seed_from_cloud(stack, args.cloud)
        flavors.update(cloud_flavors)
        LOG.info("registered %d compute nodes from %s", len(stack.agents), args.cloud)
    for agent in stack.agents.values():
        agent.start()
    service = stack.scheduler(seed=args.seed)
    app = SchedulerApp(service, stack.conductor(service), stack.placement_app, flavors, images)
    server: Any = create_server(app, host=args.host, port=args.port, threads=args.threads,
                                ident="berth", clear_untrusted_proxy_headers=True)

    def _stop(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(f"listening on http://{args.host}:{server.effective_port} (db {args.db}; "
          f"placement under /placement)", flush=True)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        stack.close()
    return 0
