"""``berth nova-scheduler --config-file nova.conf``: Berth in the place of nova-scheduler.

It reads the nova.conf a nova-scheduler reads:

* ``[DEFAULT] transport_url`` (and ``control_exchange``, ``nova`` by default), ``host``
  (the server name; the machine's name by default), ``rpc_response_timeout``;
* ``[api_database] connection`` (cells, aggregates) and ``[database] connection``
  (which fills the cells' templated connections);
* ``[placement]``: keystoneauth credentials (``auth_type``, ``auth_url``, ...), where
  Placement is (``endpoint_override``, else the catalog's ``placement`` endpoint of
  ``valid_interfaces`` in ``region_name``) and the session options every Placement call
  uses (``cafile``, ``insecure``, ``certfile``, ``keyfile``, ``timeout``);
* ``[filter_scheduler]``, ``[scheduler]``, ``[compute]``, ``[workarounds]``, ``[pci]``:
  the scheduler's own options, as every Berth command reads them.

It serves :mod:`berth.nova.rpc` on topic ``scheduler`` with the host state of
:mod:`berth.nova.hoststate`. Claims are made in Placement as Nova's scheduler makes
them: candidates at microversion 1.36 with ``limit = [scheduler]
max_placement_results``, and ``PUT /allocations`` with the consumer generation, retried
on a generation conflict and removed again on failure. Any number of these processes
may run side by side, as nova-schedulers do.

SIGHUP reads the cells again and then every host, as nova-scheduler's reset does. With
``[scheduler] discover_hosts_in_cells_interval`` > 0, new compute hosts are mapped to
their cells at start and then that often, by the scheduler elected as Nova elects it
(the first by host name of the ``nova-scheduler`` services rows that are up). Like
nova-scheduler, it keeps its own row in the services table of ``[database] connection``
(:mod:`berth.nova.service_row`: heartbeat every ``[DEFAULT] report_interval``), so
``openstack compute service list`` shows it up. ``[scheduler] workers`` processes serve
the topic (unset: one), each with ``[DEFAULT] executor_thread_pool_size`` RPC threads;
``--config-dir`` reads a ``nova.conf.d``.
SIGTERM and SIGINT stop it. ``--explain`` logs every decision's explanation at INFO,
keyed by instance uuid.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import exc as sa_exc

from berth.errors import BerthError, ConfigError

if TYPE_CHECKING:
    from berth.nova.service_row import ServiceRow
    from berth.webauth.client import PlacementAccess

LOG = logging.getLogger("berth.nova")


def add_command(sub: Any) -> None:
    """Register ``nova-scheduler``."""
    p = sub.add_parser("nova-scheduler", help="serve Nova's scheduler RPC interface in place "
                       "of nova-scheduler (reads nova.conf)")
    p.add_argument("--config-file", action="append", default=[],
                   help="nova.conf (repeatable, later files win)")
    p.add_argument("--config-dir", action="append", default=[],
                   help="a directory whose *.conf files are read after the --config-file "
                        "ones, in name order (nova.conf.d; repeatable)")
    p.add_argument("--host", help="this server's name (default [DEFAULT] host, else the "
                                  "machine's name)")
    from berth.service.cli import positive_int

    p.add_argument("--workers", type=positive_int, default=None,
                   help="RPC worker threads of each process (default [DEFAULT] "
                        "executor_thread_pool_size, 64)")
    p.add_argument("--processes", type=positive_int, default=None,
                   help="scheduler processes serving the topic together (default "
                        "[scheduler] workers, else 1)")
    p.add_argument("--worker-index", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=None, help="random seed of the decisions")
    p.add_argument("--explain", action="store_true",
                   help="log every decision's explanation at INFO, keyed by instance uuid")
    p.set_defaults(func=cmd_nova_scheduler)


class NovaOptions:
    """The options of nova.conf that are not the scheduler's own."""

    def __init__(self, files: Sequence[str]) -> None:
        from oslo_config import cfg

        conf = cfg.ConfigOpts()
        conf.register_opts([cfg.StrOpt("host"), cfg.StrOpt("transport_url", secret=True),
                            cfg.IntOpt("executor_thread_pool_size", default=64, min=1)])
        conf.register_opts([cfg.StrOpt("connection", secret=True)], group="api_database")
        conf.register_opts([cfg.StrOpt("connection", secret=True)], group="database")
        try:
            conf([], project="nova", default_config_files=list(files), use_env=False)
        except cfg.Error as exc:
            raise ConfigError(f"nova.conf: {str(exc).splitlines()[0]}") from None
        if not conf.api_database.connection:
            raise ConfigError("[api_database] connection: not set (nova-scheduler reads cells "
                              "and aggregates there)", field="[api_database] connection")
        self.api_url: str = conf.api_database.connection
        self.main_url: str | None = conf.database.connection
        self.host: str = conf.host or socket.gethostname()
        #: The RPC server's threads (oslo.messaging's option).
        self.rpc_threads: int = conf.executor_thread_pool_size


def placement_endpoint(files: Sequence[str]) -> tuple[str, PlacementAccess]:
    """Where Placement is and how to reach it, as Nova's report client finds them:
    ``[placement] endpoint_override``, else the Keystone catalog; the credentials, and
    the session's TLS options and timeout (``cafile``, ``insecure``, ``certfile``,
    ``keyfile``, ``timeout``), which Nova's client uses for Placement's calls too."""
    from keystoneauth1 import exceptions as ks_exc
    from keystoneauth1 import loading
    from oslo_config import cfg

    from berth.webauth.client import KeystoneAuth, PlacementAccess, session_tls

    conf = cfg.ConfigOpts()
    loading.register_auth_conf_options(conf, "placement")
    loading.register_session_conf_options(conf, "placement")
    loading.register_adapter_conf_options(conf, "placement", include_deprecated=False)
    conf.set_default("service_type", "placement", group="placement")
    conf.set_default("valid_interfaces", ["internal", "public"], group="placement")
    try:
        conf([], project="nova", default_config_files=list(files), use_env=False)
        tls, timeout = session_tls(conf, "placement")
        override = conf.placement.endpoint_override
        if not conf.placement.auth_type:
            if not override:
                raise ConfigError("[placement]: neither auth_type nor endpoint_override is set",
                                  field="[placement]")
            return str(override), PlacementAccess(None, tls, timeout)
        plugin = loading.load_auth_from_conf_options(conf, "placement")
        session = loading.load_session_from_conf_options(conf, "placement", auth=plugin)
        if override:
            return str(override), PlacementAccess(KeystoneAuth(plugin, session), tls, timeout)
        adapter = loading.load_adapter_from_conf_options(conf, "placement", session=session,
                                                         auth=plugin)
        url = adapter.get_endpoint()
    except ConfigError:
        raise
    except ks_exc.ClientException as exc:
        raise ConfigError(f"[placement]: cannot find Placement: {exc}") from None
    except Exception as exc:  # option errors, unknown plugins
        raise ConfigError(f"[placement]: {str(exc).splitlines()[0]}") from None
    if not url:
        raise ConfigError("[placement]: the catalog has no placement endpoint of "
                          f"{', '.join(conf.placement.valid_interfaces)}", field="[placement]")
    return str(url), PlacementAccess(KeystoneAuth(plugin, session), tls, timeout)


def build(files: Sequence[str], *, seed: int | None = None, explain: bool = False) -> dict[str, Any]:
    """Everything the command runs, not started: config, feed, service, endpoint, bus."""
    from berth.config import SchedulerConfig
    from berth.nova.hoststate import NovaFeed, fallback_ratios
    from berth.nova.rpc import EXCHANGE, NovaSchedulerEndpoint
    from berth.placement.client import PlacementClient
    from berth.service.bus import Bus
    from berth.service.placement import (
        CANDIDATES_MICROVERSION,
        PlacementCandidates,
        PlacementClaimer,
    )
    from berth.service.scheduler import SchedulerService

    config = SchedulerConfig.from_files(list(files))
    options = NovaOptions(files)
    url, access = placement_endpoint(files)
    opened: list[Any] = []
    try:
        try:
            client = PlacementClient(url, **access.client_options())
        except ValueError as exc:
            raise ConfigError(f"[placement] endpoint: {exc}",
                              field="[placement] endpoint_override") from None
        opened.append(client)
        candidates = PlacementClient(url, microversion=CANDIDATES_MICROVERSION,
                                     **access.client_options())
        opened.append(candidates)
        try:
            feed = NovaFeed(options.api_url, options.main_url, ratios=fallback_ratios(config))
        except (sa_exc.ArgumentError, sa_exc.NoSuchModuleError, ImportError) as exc:
            raise ConfigError(f"[api_database] connection: {str(exc).splitlines()[0]}",
                              field="[api_database] connection") from None
        opened.append(feed)
        # Nova's conductor asks for an evacuated instance's new host with the instance
        # as the consumer, which holds the source's allocations: Nova's merged claim.
        service = SchedulerService(config, feed, PlacementCandidates(candidates),  # type: ignore[arg-type]
                                   PlacementClaimer(client, merge_existing=True), seed=seed,
                                   check_zone=False)  # Nova's API checked it already
        endpoint = NovaSchedulerEndpoint(service, feed, explain=explain)
        bus = Bus(config_files=list(files), exchange=EXCHANGE)
        if bus.embedded:
            bus.close()
            raise ConfigError(f"[DEFAULT] transport_url: {bus.url} is Berth's in-process bus; "
                              "a Nova deployment's scheduler needs Nova's message bus",
                              field="[DEFAULT] transport_url")
    except BaseException:
        for thing in opened:
            thing.close()
        raise
    return {"config": config, "options": options, "feed": feed, "service": service,
            "endpoint": endpoint, "bus": bus, "clients": [client, candidates]}


def _discover(feed: Any, interval: float, stop: threading.Event, row: ServiceRow | None = None,
              service_down_time: float = 60.0) -> None:
    """Map new compute hosts to their cells at once and then every ``interval`` seconds
    (``[scheduler] discover_hosts_in_cells_interval``), as Nova's periodic task: only
    the elected scheduler (the first by host name of those up, from the services rows)
    when this one has a row, else this one."""
    while True:
        try:
            leader = row.leader(service_down_time) if row is not None else None
            if row is None or leader is None or leader == row.host:
                feed.discover_hosts()
            else:
                LOG.debug("current leader is %s, skipping discover hosts on %s", leader,
                          row.host)
        except Exception:  # the databases may be away for a while: try again next time
            LOG.exception("discovering hosts failed")
        if stop.wait(interval):
            return


def _service_row(main_url: str | None, host: str) -> ServiceRow | None:
    """This scheduler's row in Nova's services table (:mod:`berth.nova.service_row`),
    registered; None without ``[database] connection`` or when it cannot be written
    (scheduling needs no row: a warning, and the scheduler runs on)."""
    from berth.nova.hoststate import cell_engine
    from berth.nova.service_row import ServiceRow

    if not main_url:
        LOG.warning("[database] connection is not set: no nova-scheduler service row")
        return None
    row = ServiceRow(cell_engine(main_url), host)
    try:
        row.register()
    except Exception as exc:  # a schema or database problem: one line
        LOG.warning("cannot write this scheduler's services row: %s", str(exc).splitlines()[0])
        row.engine.dispose()
        return None
    return row


def _heartbeat(row: ServiceRow, interval: float, stop: threading.Event) -> None:
    """``[DEFAULT] report_interval``: the row's heartbeat, as nova-scheduler's."""
    while not stop.wait(interval):
        try:
            if not row.beat():
                return
        except Exception as exc:  # the database away for a while: the next beat
            LOG.warning("services row heartbeat failed: %s", str(exc).splitlines()[0])


def config_files(files: Sequence[str], dirs: Sequence[str]) -> list[str]:
    """The files ``--config-file`` and ``--config-dir`` name, in the order oslo.config
    reads them: the files, then each directory's ``*.conf`` in name order."""
    out = list(files)
    for directory in dirs:
        if not os.path.isdir(directory):
            raise ConfigError(f"--config-dir {directory}: not a directory", field="--config-dir")
        out += sorted(os.path.join(directory, name) for name in os.listdir(directory)
                      if name.endswith(".conf"))
    if not out:
        raise ConfigError("--config-file: nova.conf is needed (--config-file or --config-dir)",
                          field="--config-file")
    return out


def cmd_nova_scheduler(args: argparse.Namespace) -> int:
    """Serve until SIGTERM; SIGHUP resets."""
    from berth.nova.rpc import serve
    from berth.service.processes import _logging

    _logging()
    try:
        args.config_file = config_files(args.config_file, args.config_dir)
        parts = build(args.config_file, seed=args.seed, explain=args.explain)
    except BerthError as exc:
        print(f"berth nova-scheduler: {exc.message}", file=sys.stderr)
        return 2
    feed, bus = parts["feed"], parts["bus"]
    host = args.host or parts["options"].host
    children: list[Any] = []
    row: ServiceRow | None = None
    try:
        try:
            snapshot = feed.refresh()
        except Exception as exc:  # the databases: one line, not a trace
            print(f"berth nova-scheduler: cannot read Nova's databases: "
                  f"{str(exc).splitlines()[0]}", file=sys.stderr)
            return 2
        try:
            serve(bus, parts["endpoint"], host,
                  workers=args.workers or parts["options"].rpc_threads)
        except BerthError as exc:  # the broker refused us (credentials, vhost)
            print(f"berth nova-scheduler: {exc}", file=sys.stderr)
            return 2
        print(f"ready: nova-scheduler {host} with {len(snapshot)} compute nodes in "
              f"{len(feed.cells)} cells", flush=True)
        if args.worker_index == 0:
            # Unset: one process, where nova-scheduler forks one per CPU (a deliberate
            # deviation, docs/architecture.md: each process reads Nova's databases).
            processes = args.processes or parts["config"].scheduler.workers or 1
            children = _start_processes(args, host, processes)
        stop = threading.Event()

        def _stop(signum: int, _frame: Any) -> None:
            stop.set()

        def _reset(signum: int, _frame: Any) -> None:
            LOG.info("SIGHUP: reading the cells and every host again")
            threading.Thread(target=feed.reset, name="berth-nova-reset", daemon=True).start()
            for child in children:  # each process reads the cells itself
                if child.poll() is None:
                    child.send_signal(signal.SIGHUP)

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        signal.signal(signal.SIGHUP, _reset)
        config = parts["config"]
        if args.worker_index == 0:  # one process of each scheduler: its row, discovery
            row = _service_row(parts["options"].main_url, host)
            if row is not None:
                threading.Thread(target=_heartbeat, args=(row, config.report_interval, stop),
                                 name="berth-service-row", daemon=True).start()
            interval = config.scheduler.discover_hosts_in_cells_interval
            if interval > 0:
                threading.Thread(target=_discover,
                                 args=(feed, interval, stop, row, config.service_down_time),
                                 name="berth-discover-hosts", daemon=True).start()
        parent = os.getppid()
        while not stop.wait(1.0):
            if args.worker_index and os.getppid() != parent:
                LOG.warning("the first process of this scheduler is gone: stopping")
                break  # a worker does not outlive the process that started it
            for index, child in enumerate(children):
                if child.poll() is None or time.monotonic() < getattr(child, "retry_at", 0.0):
                    continue
                # As Nova's launcher does: a worker that dies is started again (not
                # more often than every RESTART_PAUSE seconds).
                LOG.error("scheduler process %d exited with %s; starting another", child.pid,
                          child.returncode)
                again = _worker(args, host, index + 1)
                again.retry_at = time.monotonic() + RESTART_PAUSE
                children[index] = again
    finally:
        for child in children:
            child.terminate()
        for child in children:
            try:
                child.wait(timeout=30)
            except Exception:  # a child that will not stop: it goes with its group
                child.kill()
        bus.close()
        feed.close()
        for client in parts["clients"]:
            client.close()
        if row is not None:
            row.engine.dispose()
    return 0


#: Seconds between two starts of one worker process (one that dies at once is not
#: started in a loop).
RESTART_PAUSE = 5.0


def _start_processes(args: argparse.Namespace, host: str, processes: int) -> list[Any]:
    """Processes 2..N of this scheduler (``[scheduler] workers``, as nova-scheduler forks
    its workers): each reads Nova's databases and serves the topic with the others; the
    seed offset so that each breaks ties in its own order."""
    children: list[Any] = []
    try:
        _spawn(args, host, processes, children)
    except OSError:
        for child in children:
            child.terminate()
        raise
    return children


def _spawn(args: argparse.Namespace, host: str, processes: int, children: list[Any]) -> None:
    for i in range(1, processes):
        children.append(_worker(args, host, i))


def _worker(args: argparse.Namespace, host: str, index: int) -> Any:
    """Start worker process ``index`` (its seed offset by it)."""
    import subprocess

    argv = [sys.executable, "-m", "berth.cli", "nova-scheduler", "--host", host,
            "--worker-index", str(index)]
    if args.workers is not None:
        argv += ["--workers", str(args.workers)]
    for path in args.config_file:
        argv += ["--config-file", path]
    if args.seed is not None:
        argv += ["--seed", str(args.seed + index)]
    if args.explain:
        argv.append("--explain")
    return subprocess.Popen(argv)
