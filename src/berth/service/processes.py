"""The distributed form: ``berth compute``, ``berth scheduler`` and ``berth api``.

    berth compute   (--fleet CLOUD_FILE | --host NAME) --db URL --placement-url URL...
                    [--config-file nova.conf] [--transport-url URL] [--server NAME]
                    [--threads N] [--fail-host HOST ...]
    berth scheduler --db URL [--config-file nova.conf] [--transport-url URL]
                    [--name NAME] [--seed N] [--workers N]
    berth api       --db URL [--host H] [--port N] [--cloud FILE] [--config-file nova.conf]
                    [--transport-url URL] [--threads N] [--seed N]
                    [--build-timeout S] [--reconcile-interval S]

All three meet on the message bus (``[DEFAULT] transport_url``, or ``--transport-url``;
RabbitMQ across machines) and the shared database (PostgreSQL across machines):

* ``compute`` runs the compute agents: the machine it runs on (``--host``, reported
  from the OS) or a cloud file's hosts simulated with the fake driver (``--fleet``);
  registers them with the Placement API at ``--placement-url`` (an API process's
  ``/placement``), publishes their reports over the bus and serves their builds on
  ``compute.<server>``;
* ``scheduler`` warms its host snapshot from the stored reports, then serves
  ``select_destinations`` on topic ``scheduler`` and follows the hosts' reports; run
  as many as wanted, anywhere (``--workers N``, or ``[scheduler] workers``, starts N
  worker processes here);
* ``api`` serves ``POST /boot`` / ``GET /hosts`` (as ``berth serve`` does) and the
  Placement API under ``/placement``; a boot asks a scheduler over the bus and builds
  through the hosts' agents. ``--cloud`` gives it a cloud file's flavors, images and
  server groups. Every API process runs a reconciler (build heartbeat, release of the
  claims of builds a crashed process abandoned), as ``berth serve`` does.

``berth serve`` remains the all-in-one process on the embedded defaults.

Each prints one ``ready``/``listening`` line when it serves, and stops on SIGTERM or
SIGINT. Start-up problems are one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

from berth.errors import BerthError, ConfigError, one_line
from berth.placement.db import error_line, shown_url

LOG = logging.getLogger("berth.service")


def add_commands(subparsers: Any) -> None:
    """Register ``compute``, ``scheduler`` and ``api``."""
    from berth.service.cli import (
        host_count,
        host_name,
        port_number,
        positive_int,
        positive_seconds,
        thread_count,
    )
    from berth.service.reconcile import DEFAULT_BUILD_TIMEOUT
    from berth.webauth.options import add_arguments as add_security_arguments

    def metrics_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--metrics-port", type=port_number, default=None,
                       help="serve GET /metrics (Prometheus) on this port (0: any free "
                            "one; default: none)")
        p.add_argument("--metrics-host", default="127.0.0.1",
                       help="address of --metrics-port (default 127.0.0.1)")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--db", required=True, help="SQLAlchemy URL of the shared database")
        p.add_argument("--config-file", action="append", default=[], help="nova.conf (repeatable)")
        p.add_argument("--transport-url", help="message bus URL; overrides [DEFAULT] "
                                               "transport_url (rabbit://user:pass@host:5672/)")

    c = subparsers.add_parser("compute", help="run compute agents (one machine, or a "
                                              "simulated fleet)")
    common(c)
    which = c.add_mutually_exclusive_group(required=True)
    which.add_argument("--fleet", metavar="CLOUD_FILE",
                       help="simulate every host of a cloud file (fake driver)")
    which.add_argument("--host", type=host_name, help="report this machine as compute host HOST")
    c.add_argument("--placement-url", required=True, action="append",
                   help="the Placement API (an API process's /placement); repeatable: "
                        "the calls are shared among them, and one that refuses "
                        "connections is passed over")
    c.add_argument("--server", help="this process's RPC server name (default: the host "
                                    "name, or fleet-<file name> with --fleet)")
    c.add_argument("--threads", type=thread_count, default=16,
                   help="registration threads (default 16)")
    c.add_argument("--fail-host", action="append", default=[], metavar="HOST",
                   help="the fake driver fails every build on HOST (repeatable)")
    c.add_argument("--fail-first", action="append", default=[], type=host_count,
                   metavar="HOST=N", help="the fake driver fails the first N builds on HOST")
    metrics_options(c)
    c.set_defaults(func=cmd_compute)

    s = subparsers.add_parser("scheduler", help="run a scheduler worker on the bus")
    common(s)
    s.add_argument("--name", help="this scheduler's RPC server name (default host-pid)")
    s.add_argument("--seed", type=int, default=None, help="random seed of the scheduler")
    s.add_argument("--workers", type=positive_int, default=None,
                   help="worker processes (default [scheduler] workers, else one per "
                        "CPU, as Nova's); each serves the topic with its own snapshot")
    metrics_options(s)
    s.set_defaults(func=cmd_scheduler)

    a = subparsers.add_parser("api", help="run the boot API (and Placement API) over the bus")
    common(a)
    a.add_argument("--host", default="127.0.0.1", help="address to listen on")
    a.add_argument("--port", type=port_number, default=8780, help="port (0: any free one)")
    a.add_argument("--cloud", help="cloud file whose flavors, images and server groups "
                                   "the API knows")
    a.add_argument("--threads", type=thread_count, default=16, help="server threads")
    add_security_arguments(a)
    a.add_argument("--seed", type=int, default=None,
                   help="seed of the instance uuids (default random)")
    a.add_argument("--build-timeout", type=positive_seconds, default=DEFAULT_BUILD_TIMEOUT,
                   metavar="SECONDS",
                   help="a build not updated for this long was abandoned by a crashed "
                        f"process: its claims are released (default {DEFAULT_BUILD_TIMEOUT:g})")
    a.add_argument("--reconcile-interval", type=positive_seconds, default=None,
                   metavar="SECONDS",
                   help="seconds between heartbeats and reconciliation rounds (default "
                        "the smaller of 10 and a quarter of --build-timeout)")
    a.set_defaults(func=cmd_api)


def _logging() -> None:
    from berth.service.metrics import configure_logging

    configure_logging()
    for chatty in ("alembic", "httpx", "oslo_messaging", "oslo_service", "amqp", "kombu",
                   "waitress.queue"):
        logging.getLogger(chatty).setLevel(logging.WARNING)


def _wait_for_signal() -> None:
    stop = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    while not stop.wait(1.0):
        pass


def _stop_while_starting() -> None:
    """SIGTERM or SIGINT before the process serves (a broker that does not answer keeps
    it connecting) stops it through its clean-up, the workers it started included,
    rather than killing it and leaving them running."""

    def _stop(signum: int, _frame: Any) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)


def _fail(command: str, message: str) -> int:
    print(f"berth {command}: {message}", file=sys.stderr)
    return 2


def _open(command: str, args: argparse.Namespace) -> tuple[Any, Any]:
    """(config, bus) from the arguments; BerthError with a one-line message."""
    from berth.config import SchedulerConfig, check_own_services
    from berth.service.bus import Bus

    config = (SchedulerConfig.from_files(args.config_file) if args.config_file
              else SchedulerConfig.default())
    check_own_services(config)
    return config, Bus(args.transport_url, config_files=args.config_file)


# --------------------------------------------------------------------------- compute
def cmd_compute(args: argparse.Namespace) -> int:
    """Register the hosts, report them, serve their builds until stopped."""
    import httpx

    from berth.cloudfile import load_cloud
    from berth.filters.compute import effective_service_down_time
    from berth.placement.client import PlacementAPIError, PlacementClient
    from berth.placement.db import prepare
    from berth.service.compute_rpc import COMPUTE_TOPIC, AgentDirectory, ComputeEndpoint
    from berth.service.conductor import FakeDriver
    from berth.service.fleet import Fleet, local_node
    from berth.service.group_check import GroupPolicyCheck
    from berth.service.groups import ServerGroupStore
    from berth.service.metrics import Metrics, compute_collector
    from berth.service.reports import BusRecordStore
    from berth.service.seeding import cloud_nodes, file_services, register_sharing
    from berth.webauth.client import placement_access

    _logging()
    try:
        config, bus = _open("compute", args)
    except BerthError as exc:
        return _fail("compute", str(exc))
    try:
        cloud = None
        if args.fleet:
            loaded_at = time.time()  # the file's hosts that are up reported now
            cloud = load_cloud(args.fleet, config, now=loaded_at)
            services = file_services(cloud, now=loaded_at, down_time=effective_service_down_time(
                config.service_down_time, config.report_interval))
            nodes, aggregates = cloud_nodes(cloud), list(cloud.snapshot.aggregates)
            server = args.server or "fleet-" + os.path.splitext(os.path.basename(args.fleet))[0]
            if cloud.snapshot.obj("instances") is not None and any(
                    len(i) for i in cloud.snapshot.obj("instances")):
                LOG.warning("%s: the fleet starts its hosts empty; the file's instances "
                            "and usage are not replayed", args.fleet)
        else:
            nodes, aggregates, services = [local_node(args.host)], None, None
            server = args.server or args.host or socket.gethostname()
        engine = prepare(args.db)
    except BerthError as exc:
        bus.close()
        return _fail("compute", str(exc))
    except Exception as exc:  # database unreachable, and the like: one line
        bus.close()
        return _fail("compute", f"cannot start: {exc}")
    records = BusRecordStore(engine, bus)
    try:
        access = placement_access(args.config_file)
    except BerthError as exc:
        bus.close()
        return _fail("compute", str(exc))
    try:
        client = PlacementClient(args.placement_url, **access.client_options())
    except ValueError as exc:
        bus.close()
        return _fail("compute", f"--placement-url: {exc}")
    fleet = Fleet(nodes, aggregates, client=client, records=records,
                  directory=AgentDirectory(engine), config=config, server=server,
                  services=services, cells=list(cloud.cells.values()) if cloud else None)
    for host in list(args.fail_host) + [h for h, _ in args.fail_first]:
        if host not in fleet.agents:
            return _fail("compute", f"--fail-host/--fail-first {host}: no such host here")
    driver = FakeDriver(fail_hosts=set(args.fail_host), fail_first=dict(args.fail_first),
                        agents=fleet.agents)
    groups = ServerGroupStore(engine)
    check = GroupPolicyCheck(groups.placements, groups)
    try:
        endpoint = ComputeEndpoint(fleet.agents, driver, check, config)
        if args.metrics_port is not None:  # before anything is registered: it may fail
            metrics = Metrics()
            metrics.add(compute_collector(fleet, endpoint))
            _announce_metrics(metrics, args)
        fleet.start()
        if cloud is not None:
            register_sharing(client, cloud)  # the fleet's storage beside its hosts
        seconds = fleet.register(threads=args.threads)
        bus.serve(COMPUTE_TOPIC, server, [endpoint])
        print(f"ready: {len(fleet.agents)} compute hosts registered in {seconds:.1f} s, "
              f"serving compute.{server}", flush=True)
        _wait_for_signal()
    except (BerthError, PlacementAPIError, httpx.HTTPError) as exc:
        # The bus refused us, or placement is not where --placement-url says.
        return _fail("compute", f"cannot start: {one_line(exc)}")
    finally:
        fleet.stop()
        bus.close()
        records.close()
        client.close()
        engine.dispose()
    return 0


# --------------------------------------------------------------------------- scheduler
def cmd_scheduler(args: argparse.Namespace) -> int:
    """Serve select_destinations on topic ``scheduler`` until stopped."""
    from berth.filters.compute import effective_service_down_time
    from berth.service.metrics import Metrics, claims_collector, feed_collector, hosts_collector
    from berth.service.placement import PlacementCandidates, PlacementClaimer
    from berth.service.reports import BusFeed
    from berth.service.scheduler import SchedulerService
    from berth.service.scheduler_rpc import SCHEDULER_TOPIC, SchedulerEndpoint
    from berth.service.stack import open_stack

    _logging()
    try:
        config, bus = _open("scheduler", args)
    except BerthError as exc:
        return _fail("scheduler", str(exc))
    try:
        stack = open_stack(args.db, config)
    except Exception as exc:
        bus.close()
        return _fail("scheduler", f"cannot open database {shown_url(args.db)!r}: {error_line(exc)}")
    name = args.name or f"{socket.gethostname()}-{os.getpid()}"
    # Nova's default: one worker per CPU.
    workers = args.workers or config.scheduler.workers or os.cpu_count() or 1
    _stop_while_starting()
    children = _start_workers(args, name, workers)
    try:
        feed = BusFeed(stack.records, service_down_time=effective_service_down_time(
            config.service_down_time, config.report_interval))
        service = SchedulerService(
            config, feed, PlacementCandidates(stack.candidates_client),
            PlacementClaimer(stack.claims_client or stack.client), seed=args.seed)
        endpoint = SchedulerEndpoint(service, feed)
        if args.metrics_port is not None:
            metrics = Metrics()
            service.observers.append(metrics.observe_decision)
            metrics.add(claims_collector(service.claimer.stats))
            metrics.add(hosts_collector(service))
            metrics.add(feed_collector(feed))
            _announce_metrics(metrics, args)
        # Serve first (reports queue up meanwhile), warm, then take requests.
        bus.serve(SCHEDULER_TOPIC, name, [endpoint])
        feed.warm()
        service.warm()
        endpoint.ready.set()
        print(f"ready: scheduler {name} with {len(feed.snapshot)} hosts", flush=True)
        threading.Thread(target=_log_stats, args=(name, service, feed), daemon=True).start()
        _wait_for_signal()
    except BerthError as exc:  # the bus refused us
        return _fail("scheduler", str(exc))
    finally:
        for child in children:
            child.terminate()
        for child in children:
            child.wait(timeout=30)
        bus.close()
        stack.close()
    return 0


def _announce_metrics(metrics: Any, args: argparse.Namespace) -> None:
    """Serve ``/metrics`` as ``--metrics-port`` says and say where."""
    from berth.service.metrics import serve_metrics

    try:
        port = serve_metrics(metrics, args.metrics_host, args.metrics_port)
    except OSError as exc:  # the port taken, an address not of this machine
        raise ConfigError(f"--metrics-host {args.metrics_host} --metrics-port "
                          f"{args.metrics_port}: cannot listen: {exc.strerror or exc}") from None
    print(f"metrics on http://{args.metrics_host}:{port}/metrics", flush=True)


def _start_workers(args: argparse.Namespace, name: str, workers: int) -> list[Any]:
    """Workers 2..N as child processes (``<name>-<i>``, one worker each, the seed
    offset so that each breaks ties in its own order); this process is worker 1."""
    import subprocess

    children = []
    for i in range(1, workers):
        argv = [sys.executable, "-m", "berth.cli", "scheduler", "--db", args.db,
                "--name", f"{name}-{i}", "--workers", "1"]
        for path in args.config_file:
            argv += ["--config-file", path]
        if args.transport_url:
            argv += ["--transport-url", args.transport_url]
        if args.seed is not None:
            argv += ["--seed", str(args.seed + i)]
        if args.metrics_port is not None:  # each worker its own port (0: any free one)
            argv += ["--metrics-port", str(args.metrics_port + i if args.metrics_port else 0),
                     "--metrics-host", args.metrics_host]
        children.append(subprocess.Popen(argv))
    return children


def _log_stats(name: str, service: Any, feed: Any, period: float = 30.0) -> None:
    """Log the scheduler's requests and their latency in the scheduler (its share of a
    boot's time) every ``period`` seconds while it has work."""
    seen = 0
    while True:
        time.sleep(period)
        latencies = service.stats.latencies_since(seen)
        seen = service.stats.timed
        if not latencies:
            continue
        ordered = sorted(latencies)
        LOG.info("scheduler %s: %d requests in %.0f s, in-scheduler p50 %.1f ms p99 %.1f ms; "
                 "%d host updates applied", name, len(ordered), period,
                 1000 * ordered[len(ordered) // 2], 1000 * ordered[int(0.99 * (len(ordered) - 1))],
                 feed.applied)


# --------------------------------------------------------------------------- api
def cmd_api(args: argparse.Namespace) -> int:
    """Serve the boot API and the Placement API until stopped."""
    from waitress.server import create_server

    from berth.cloudfile import load_cloud
    from berth.placement.cli import DEFAULT_CHANNEL_TIMEOUT, DEFAULT_MAX_BODY
    from berth.service.api import DEFAULT_FLAVORS, SchedulerApp
    from berth.service.builds import instance_uuid_rng
    from berth.service.compute_rpc import AgentDirectory, RemoteDriver, announce_deleted
    from berth.service.conductor import Conductor
    from berth.service.metrics import Metrics, claims_collector, instrument, queue_collector
    from berth.service.placement import PlacementClaimer
    from berth.service.policy import api_security
    from berth.service.scheduler_rpc import RemoteScheduler
    from berth.service.services_api import ServiceAdmin
    from berth.service.stack import open_stack

    _logging()
    try:
        security, placement_security = api_security(args)
        config, bus = _open("api", args)
    except BerthError as exc:
        return _fail("api", str(exc))
    apps: list[Any] = []

    def application(environ: dict[str, Any], start_response: Any) -> Any:
        return apps[0](environ, start_response)

    try:
        server: Any = create_server(application, host=args.host, port=args.port,
                                    threads=args.threads, ident="berth",
                                    clear_untrusted_proxy_headers=True,
                                    max_request_body_size=DEFAULT_MAX_BODY,
                                    channel_timeout=DEFAULT_CHANNEL_TIMEOUT)
    except (OSError, ValueError) as exc:
        bus.close()
        reason = getattr(exc, "strerror", None) or str(exc)
        return _fail("api", f"cannot listen on --host {args.host!r} --port {args.port}: {reason}")
    try:
        stack = open_stack(args.db, config, security=placement_security)
    except Exception as exc:
        server.close()
        bus.close()
        return _fail("api", f"cannot open database {shown_url(args.db)!r}: {error_line(exc)}")
    try:
        flavors: dict[str, Any] = dict(DEFAULT_FLAVORS)
        images: dict[str, Any] = {}
        if args.cloud:
            try:
                cloud = load_cloud(args.cloud, config)
            except BerthError as exc:
                return _fail("api", str(exc))
            flavors = cloud.known_flavors()
            images.update(cloud.images)
            for group in cloud.server_groups.values():
                stack.groups.put(group)
        claimer = PlacementClaimer(stack.claims_client or stack.client)
        remote = RemoteScheduler(bus, config, claimer,
                                 uuid_rng=instance_uuid_rng(args.seed, stack.builds.start))
        directory = AgentDirectory(stack.engine)
        driver = RemoteDriver(bus, directory)
        conductor = Conductor(remote, driver, claimer=claimer, config=config,
                              groups=stack.groups, builds=stack.builds,
                              instances=stack.instances, late_check_on_compute=True)
        services = ServiceAdmin(driver=driver, placement=stack.client, records=stack.records,
                                directory=directory, announce=announce_deleted(bus),
                                ask_silent_agents=False)
        reconciler = stack.reconciler(timeout=args.build_timeout,
                                      interval=args.reconcile_interval)
        reconciler.start()
        metrics = Metrics()
        metrics.add(claims_collector(claimer.stats))
        metrics.add(queue_collector(server))
        app = SchedulerApp(remote, conductor, stack.placement_app, flavors, images,
                           groups=stack.groups, hosts_view=remote.hosts, security=security,
                           services=services, moves=stack.moves(conductor))
        apps.append(instrument(security.identity.wrap(app), metrics, "scheduler"))
        LOG.info("scheduler and placement APIs: %s", security.describe())

        def _stop(signum: int, _frame: Any) -> None:
            raise KeyboardInterrupt

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        print(f"listening on http://{args.host}:{server.effective_port} (db {args.db}; "
              f"placement under /placement; bus {bus.url.split('@')[-1]})", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            server.run()
        reconciler.stop()
    finally:
        server.close()
        bus.close()
        stack.close()
    return 0
