"""The host state of a Nova deployment, read from Nova's databases (reference
``nova-scheduler-rpc.md`` §2.1), as Berth's snapshot.

Nova's tables are read with plain SQL; Berth issues the statements itself and imports
no Nova code:

* the API database (``[api_database] connection``): ``cell_mappings`` (cell0 is skipped,
  a disabled cell is not scheduled to), and ``aggregates`` with ``aggregate_hosts`` and
  ``aggregate_metadata``;
* each cell's database (``cell_mappings.database_connection``, whose ``{username}``,
  ``{password}``, ``{hostname}``, ``{port}``, ``{path}``, ``{scheme}`` and ``{query}``
  templates are filled from ``[database] connection``, as Nova fills them): the compute
  nodes that are not deleted, their ``nova-compute`` service rows (disabled, forced
  down, and the heartbeat that ComputeFilter judges), and the instances on each host.

:class:`NovaFeed` keeps a :class:`~berth.snapshot.HostSnapshot` current the way the
scheduler service expects its feed to (``refresh``, ``snapshot``, ``uuid_rows``). The first
refresh reads everything. Each later refresh reads only the rows updated since the
previous one, with a two-second overlap for the databases' whole-second timestamps. It
does so at most every ``min_interval`` seconds: compute nodes, services and instances by
``updated_at``, ``deleted_at`` and ``created_at``.

The scheduler casts make a refresh read its rows at once: a changed aggregate (fanout
``update_aggregates`` / ``delete_aggregate``), and instance info.

The instances a host state holds are Nova's host manager's, not the database's
(:class:`TrackedInstances`): once a compute has sent ``update_instance_info`` (or a
``delete_instance_info``, or a ``sync_instance_info`` that matched), its instances are
the ones those casts gave, until a sync finds them out of step; before that, and after,
the database's. Nova's view lags on purpose: a resized instance stays on its source
until the resize is confirmed (it may come back on a revert), and a live-migrated one
until the source's next sync. Nova's column values
that are object primitives are converted: ``numa_topology`` (NUMATopology) and
``pci_stats`` (PciDevicePoolList).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from berth.errors import ConfigError
from berth.model.aggregate import Aggregate
from berth.model.compute import Instance, MetricItem, ServiceRecord
from berth.nova import primitives as prim
from berth.service.records import RowIndex
from berth.snapshot import HostRecord, HostSnapshot

LOG = logging.getLogger(__name__)

CELL0_UUID = "00000000-0000-0000-0000-000000000000"
#: How far before the newest stamp read an incremental read starts (seconds): stamps
#: have whole seconds, come from each Nova service's own clock, and a transaction may
#: commit after a newer-stamped one.
OVERLAP = 10.0
#: A full read of every cell this often (seconds), whatever the incremental reads saw.
RESYNC_INTERVAL = 600.0


# ----------------------------------------------------------------------------- values
def _epoch(value: Any) -> float | None:
    """A naive-UTC DATETIME (Nova's columns) as epoch seconds."""
    if value is None:
        return None
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return float(value.timestamp())


def _stamp(epoch: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).replace(tzinfo=None)


#: Metrics Nova stores as fractions of 1 and reads back as percents.
_PERCENT_METRICS = frozenset(["cpu.user.percent", "cpu.kernel.percent", "cpu.idle.percent",
                              "cpu.iowait.percent", "cpu.percent"])


def _metric(m: dict[str, Any]) -> MetricItem:
    """A compute node's stored metric as Nova's host state holds it
    (``MonitorMetricList.from_json``): the CPU percents multiplied by 100, and every
    value an integer (``MonitorMetric.value`` is an IntegerField: truncated)."""
    value = m.get("value")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if m.get("name") in _PERCENT_METRICS:
            value = value * 100
        if math.isfinite(value):
            value = int(value)
    return MetricItem(name=m.get("name"), value=value,  # type: ignore[arg-type]
                      timestamp=m.get("timestamp"), source=m.get("source"))


def _json(value: Any, default: Any) -> Any:
    if value is None or value == "":
        return default
    if isinstance(value, (dict, list)):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return default


def numa_dict(value: Any) -> dict[str, Any] | None:
    """A host's NUMATopology primitive (the ``compute_nodes.numa_topology`` column) in
    the dict form of :meth:`berth.hardware.numa.NUMATopology.from_dict`."""
    data = _json(value, None)
    if data is None:
        return None
    top = prim.data_of(data, "NUMATopology", "numa_topology")
    cells = []
    for i, c in enumerate(prim.objects_of(top.get("cells"), "NUMACellList", "NUMACell",
                                          "numa_topology.cells")):
        pages = [{"size_kb": p.get("size_kb"), "total": p.get("total", 0),
                  "used": p.get("used", 0), "reserved": p.get("reserved", 0)}
                 for p in prim.objects_of(c.get("mempages"), "NUMAPagesTopologyList",
                                          "NUMAPagesTopology", f"numa_topology.cells[{i}].mempages")]
        net = c.get("network_metadata")
        cell: dict[str, Any] = {
            "id": c.get("id", i), "cpuset": sorted(c.get("cpuset") or []),
            "pcpuset": sorted(c.get("pcpuset") or []),
            "siblings": [sorted(s) for s in c.get("siblings") or []],
            "memory": c.get("memory", 0), "cpu_usage": c.get("cpu_usage", 0),
            "memory_usage": c.get("memory_usage", 0),
            "pinned_cpus": sorted(c.get("pinned_cpus") or []), "mempages": pages}
        if c.get("socket") is not None:
            cell["socket"] = c["socket"]
        if net is not None:
            meta = prim.data_of(net, "NetworkMetadata", f"numa_topology.cells[{i}].network_metadata")
            cell["network_metadata"] = {"physnets": sorted(meta.get("physnets") or []),
                                        "tunneled": bool(meta.get("tunneled", False))}
        cells.append(cell)
    return {"cells": cells}


def pci_pools(value: Any) -> list[dict[str, Any]] | None:
    """A PciDevicePoolList primitive (``compute_nodes.pci_stats``) as pool dicts."""
    data = _json(value, None)
    if data is None:
        return None
    pools = []
    for p in prim.objects_of(data, "PciDevicePoolList", "PciDevicePool", "pci_stats"):
        pool = {str(k): v for k, v in (p.get("tags") or {}).items()}
        pool.update(vendor_id=p.get("vendor_id"), product_id=p.get("product_id"),
                    numa_node=p.get("numa_node"), count=int(p.get("count") or 0))
        pools.append(pool)
    return pools


def fallback_ratios(config: Any = None) -> dict[str, float]:
    """The allocation ratio of each kind a compute node whose own is NULL or 0.0 gets,
    as Nova's ComputeNode loads it: ``[DEFAULT] x_allocation_ratio``, else
    ``initial_x_allocation_ratio`` (of ``config``; the defaults without one)."""
    from berth.config import SchedulerConfig
    from berth.service.compute import resolved_ratio

    config = config if config is not None else SchedulerConfig.default()
    return {kind: resolved_ratio(None, kind, config) for kind in ("cpu", "ram", "disk")}


def record_of(node: Mapping[str, Any], service: Mapping[str, Any] | None, cell_uuid: str,
              instances: Mapping[str, Instance],
              ratios: Mapping[str, float] | None = None) -> HostRecord:
    """One ``compute_nodes`` row (with its service row) as a host record, the way
    Nova's HostState reads a ComputeNode. A ratio that is NULL or 0.0 (a row no resource
    tracker has updated since) is ``ratios``' of its kind, as Nova's ComputeNode loads
    it: ``[DEFAULT] x_allocation_ratio``, else ``initial_x_allocation_ratio``."""
    from berth.hardware.numa import NUMATopology
    from berth.hardware.pci import PciDeviceStats

    ratios = ratios if ratios is not None else fallback_ratios()

    # As Nova's HostState: the smaller of free_disk_gb and disk_available_least.
    free_disk_gb = node.get("free_disk_gb") or 0
    least = node.get("disk_available_least")
    if least is not None:
        free_disk_gb = min(least, free_disk_gb)
    numa = numa_dict(node.get("numa_topology"))
    topology = NUMATopology.from_dict(numa) if numa is not None else None
    pools = pci_pools(node.get("pci_stats"))
    record = HostRecord(
        host=str(node["host"]), nodename=node.get("hypervisor_hostname") or node["host"],
        cell_uuid=cell_uuid, uuid=node.get("uuid"),
        total_usable_ram_mb=int(node.get("memory_mb") or 0),
        free_ram_mb=int(node.get("free_ram_mb") or 0),
        total_usable_disk_gb=int(node.get("local_gb") or 0),
        disk_mb_used=int(node.get("local_gb_used") or 0) * 1024,
        free_disk_mb=int(free_disk_gb) * 1024,
        vcpus_total=int(node.get("vcpus") or 0), vcpus_used=int(node.get("vcpus_used") or 0),
        hypervisor_type=node.get("hypervisor_type"),
        hypervisor_version=node.get("hypervisor_version"),
        hypervisor_hostname=node.get("hypervisor_hostname"), host_ip=node.get("host_ip"),
        cpu_info=node.get("cpu_info") or "{}",
        supported_instances=_json(node.get("supported_instances"), []),
        stats=_json(node.get("stats"), {}),
        metrics=[_metric(m) for m in _json(node.get("metrics"), [])],
        numa_topology=topology,
        pci_stats=PciDeviceStats.from_pools(pools, topology) if pools is not None else None,
        cpu_allocation_ratio=float(node.get("cpu_allocation_ratio") or ratios["cpu"]),
        ram_allocation_ratio=float(node.get("ram_allocation_ratio") or ratios["ram"]),
        disk_allocation_ratio=float(node.get("disk_allocation_ratio") or ratios["disk"]),
        instances=dict(instances), updated=_epoch(node.get("updated_at")))
    if service is not None and not service.get("deleted"):
        record.service = ServiceRecord(
            host=str(service["host"]), disabled=bool(service.get("disabled")),
            disabled_reason=service.get("disabled_reason"),
            forced_down=bool(service.get("forced_down")),
            # Nova's database servicegroup driver: last_seen_up, else created_at.
            last_seen_up=_epoch(service.get("last_seen_up")) or _epoch(service.get("created_at")),
            created_at=_epoch(service.get("created_at")),
            updated_at=_epoch(service.get("updated_at")))
    return record


# ----------------------------------------------------------------------------- databases
def cell_url(template: str, main: str | None) -> str:
    """A cell's ``database_connection``, its templates filled from ``[database]
    connection`` as Nova's ``format_db_url`` fills them (user name and password as they
    are written there, percent-encoding kept)."""
    if "{" not in template:
        return template
    if not main:
        raise ConfigError(f"cell_mappings.database_connection {template!r} is a template and "
                          "[database] connection is not set", field="[database] connection")
    from urllib.parse import urlsplit

    url = urlsplit(main)
    return template.format(scheme=url.scheme, username=url.username or "",
                           password=url.password or "", hostname=url.hostname or "",
                           port=url.port or "", path=url.path.removeprefix("/"), query=url.query,
                           fragment=url.fragment)


@dataclass
class Cell:
    """A cell mapping and the engine of its database."""

    uuid: str
    name: str
    disabled: bool
    engine: Any
    #: Its database's URL (the mapping's, templated with ``[database] connection``).
    url: str = ""
    #: When a cell whose read failed is tried again (the scheduler's clock).
    retry_at: float = 0.0
    #: Per table, the newest stamp read so far (epoch seconds). The stamps are written
    #: by Nova's services with their own clocks, so every incremental read goes back
    #: ``overlap`` seconds before it, and a full read every ``resync_interval`` heals
    #: whatever a clock further off still hid.
    marks: dict[str, float] = field(default_factory=dict)
    #: When the last full read was (the scheduler's clock).
    full_at: float = 0.0
    #: Rows by id, and the ids of each host's rows.
    nodes: dict[int, dict[str, Any]] = field(default_factory=dict)
    services: dict[int, dict[str, Any]] = field(default_factory=dict)
    node_hosts: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    service_hosts: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    #: The instances on each host, and the host of each instance.
    instances: dict[str, dict[str, Instance]] = field(default_factory=lambda: defaultdict(dict))
    where: dict[str, str] = field(default_factory=dict)
    #: Hosts to write again at the next refresh (a cast changed them).
    pending: set[str] = field(default_factory=set)


#: The columns Berth reads of Nova's tables (a subset of each; Nova's schema has more).
NOVA_TABLES = sa.MetaData()
cell_mappings = sa.Table(
    "cell_mappings", NOVA_TABLES, sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("uuid", sa.String(36)), sa.Column("name", sa.String(255)),
    sa.Column("database_connection", sa.Text), sa.Column("disabled", sa.Boolean))
host_mappings = sa.Table(
    "host_mappings", NOVA_TABLES, sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("cell_id", sa.Integer), sa.Column("host", sa.String(255), unique=True),
    sa.Column("created_at", sa.DateTime), sa.Column("updated_at", sa.DateTime))
aggregates = sa.Table(
    "aggregates", NOVA_TABLES, sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("uuid", sa.String(36)), sa.Column("name", sa.String(255)))
aggregate_hosts = sa.Table(
    "aggregate_hosts", NOVA_TABLES, sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("host", sa.String(255)), sa.Column("aggregate_id", sa.Integer))
aggregate_metadata = sa.Table(
    "aggregate_metadata", NOVA_TABLES, sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("aggregate_id", sa.Integer), sa.Column("key", sa.String(255)),
    sa.Column("value", sa.String(255)))


def _stamps() -> tuple[sa.Column[Any], ...]:
    """Nova's soft-delete columns (new Column objects for each table)."""
    return (sa.Column("created_at", sa.DateTime), sa.Column("updated_at", sa.DateTime),
            sa.Column("deleted_at", sa.DateTime), sa.Column("deleted", sa.Integer))


compute_nodes = sa.Table(
    "compute_nodes", NOVA_TABLES, sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("uuid", sa.String(36)), sa.Column("service_id", sa.Integer),
    sa.Column("host", sa.String(255)), sa.Column("hypervisor_hostname", sa.String(255)),
    *(sa.Column(c, sa.Integer) for c in (
        "vcpus", "vcpus_used", "memory_mb", "memory_mb_used", "free_ram_mb", "local_gb",
        "local_gb_used", "free_disk_gb", "disk_available_least", "hypervisor_version")),
    sa.Column("hypervisor_type", sa.Text), sa.Column("host_ip", sa.String(39)),
    *(sa.Column(c, sa.Text) for c in ("cpu_info", "supported_instances", "stats", "metrics",
                                       "numa_topology", "pci_stats")),
    *(sa.Column(c, sa.Float) for c in ("cpu_allocation_ratio", "ram_allocation_ratio",
                                        "disk_allocation_ratio")),
    sa.Column("mapped", sa.Integer), *_stamps())
services = sa.Table(
    "services", NOVA_TABLES, sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("host", sa.String(255)), sa.Column("binary", sa.String(255)),
    sa.Column("disabled", sa.Boolean), sa.Column("disabled_reason", sa.String(255)),
    sa.Column("forced_down", sa.Boolean), sa.Column("last_seen_up", sa.DateTime),
    *_stamps())
instances = sa.Table(
    "instances", NOVA_TABLES, sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("uuid", sa.String(36)), sa.Column("host", sa.String(255)),
    sa.Column("instance_type_id", sa.Integer), sa.Column("project_id", sa.String(255)),
    *_stamps())


def _newest(rows: Sequence[Mapping[str, Any]]) -> float | None:
    """The newest created/updated/deleted stamp of ``rows``."""
    stamps = [_epoch(r.get(k)) for r in rows for k in ("created_at", "updated_at", "deleted_at")]
    known = [s for s in stamps if s is not None]
    return max(known) if known else None


def _take(rows: Sequence[Mapping[str, Any]], by_id: dict[int, dict[str, Any]],
          by_host: dict[str, set[int]], touched: set[str]) -> None:
    """Keep the rows that differ from what was read before, indexed by host; the hosts
    they leave and join are ``touched``."""
    for r in rows:
        row_id, row = int(r["id"]), dict(r)
        old = by_id.get(row_id)
        if old == row:
            continue
        if old is not None:
            by_host[str(old["host"])].discard(row_id)
            touched.add(str(old["host"]))
        by_id[row_id] = row
        by_host[str(row["host"])].add(row_id)
        touched.add(str(row["host"]))


def _changed(table: sa.Table, mark: float | None, overlap: float = OVERLAP) -> Any:
    """Rows changed since ``overlap`` seconds before ``mark`` (created, updated or
    deleted), or every row."""
    if mark is None:
        return sa.true()
    since = _stamp(mark - overlap)
    return sa.or_(table.c.updated_at >= since, table.c.created_at >= since,
                  table.c.deleted_at >= since)


#: Seconds a cell database may take to connect, and to answer a read: a host that drops
#: packets holds no request longer than Nova's CELL_TIMEOUT (60 s) would.
CONNECT_TIMEOUT = 10
READ_TIMEOUT = 50
#: Seconds a cell that failed is left out before it is tried again (each try costs a
#: request up to CONNECT_TIMEOUT).
CELL_RETRY = 30.0


def cell_engine(url: str) -> Any:
    """An engine for one of Nova's databases, with bounded connects and reads."""
    parsed = sa.engine.make_url(url)
    backend = parsed.get_backend_name()
    args: dict[str, Any] = {}
    if backend in ("mysql", "mariadb"):
        args = {"connect_timeout": CONNECT_TIMEOUT, "read_timeout": READ_TIMEOUT,
                "write_timeout": READ_TIMEOUT}
    elif backend == "postgresql":
        # A peer that stops answering mid-read: unacknowledged data times the socket
        # out (tcp_user_timeout), an idle one is probed (keepalives).
        args = {"connect_timeout": CONNECT_TIMEOUT, "keepalives": 1, "keepalives_idle": 10,
                "keepalives_interval": 5, "keepalives_count": 3,
                "tcp_user_timeout": READ_TIMEOUT * 1000}
    return sa.create_engine(url, pool_pre_ping=True, connect_args=args)


@dataclass
class TrackedInstances:
    """One host's entry in Nova's ``HostManager._instance_info``: the instances the
    compute's casts left there, and whether they stand for the host (``updated``; when
    not, the database's instances do)."""

    instances: dict[str, Instance]
    updated: bool = False


class NovaFeed:
    """The scheduler's feed over Nova's databases (see the module's docstring)."""

    def __init__(self, api_url: str, main_url: str | None = None, *,
                 min_interval: float = 1.0, clock: Callable[[], float] = time.time,
                 engine_factory: Callable[[str], Any] | None = None,
                 overlap: float = OVERLAP, resync_interval: float = RESYNC_INTERVAL,
                 ratios: Mapping[str, float] | None = None) -> None:
        self.api_url = api_url
        self.ratios = dict(ratios) if ratios is not None else fallback_ratios()
        self.main_url = main_url
        self.min_interval = min_interval
        self.overlap = overlap
        self.resync_interval = resync_interval
        self.clock = clock
        self._engine = engine_factory or cell_engine
        self.api = self._engine(api_url)
        self.cells: dict[str, Cell] = {}
        self.snapshot = HostSnapshot()
        self.uuid_rows = RowIndex()
        self._lock = threading.Lock()
        self._last = -1e18
        self._aggregates_stale = True
        self._dirty = True
        self._reset = False
        #: Nova's ``_instance_info``, by host (see :class:`TrackedInstances`); filled
        #: from the database at the first refresh, as Nova's ``_init_instance_info``.
        self.tracked: dict[str, TrackedInstances] = {}
        self._tracking_started = False

    # ---------------------------------------------------------------- cells
    def discover_hosts(self) -> list[str]:
        """What ``[scheduler] discover_hosts_in_cells_interval`` makes nova-scheduler do
        (and ``nova-manage cell_v2 discover_hosts``): every compute node a cell holds that
        is not mapped yet gets a host mapping to its cell in the API database, and is
        marked mapped. Several schedulers may run it at once: a host mapped meanwhile by
        another is left as it is (the mapping's host is unique). Returns the hosts mapped."""
        with self._lock:  # the cells the last refresh read (never the snapshot here)
            cells = list(self.cells.values())
        with self.api.connect() as conn:
            ids = {str(r.uuid): int(r.id) for r in conn.execute(
                sa.select(cell_mappings.c.id, cell_mappings.c.uuid))}
        mapped: list[str] = []
        for cell in cells:
            cell_id = ids.get(cell.uuid)
            if cell_id is None:
                continue
            with cell.engine.connect() as conn:
                fresh = conn.execute(sa.select(compute_nodes.c.id, compute_nodes.c.host).where(
                    sa.func.coalesce(compute_nodes.c.mapped, 0) < 1,
                    compute_nodes.c.deleted == 0)).all()
            for node_id, host in fresh:
                now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
                try:
                    with self.api.begin() as conn:
                        if conn.execute(sa.select(host_mappings.c.id).where(
                                host_mappings.c.host == host)).first() is None:
                            conn.execute(sa.insert(host_mappings).values(
                                cell_id=cell_id, host=host, created_at=now))
                            mapped.append(str(host))
                except sa.exc.IntegrityError:  # another scheduler mapped it just now
                    pass
                with cell.engine.begin() as conn:
                    conn.execute(sa.update(compute_nodes).where(compute_nodes.c.id == node_id)
                                 .values(mapped=1))
        if mapped:
            LOG.info("discovered and mapped compute hosts: %s", ", ".join(mapped))
        return mapped

    def load_cells(self) -> None:
        """(Re)read ``cell_mappings``: the cells to read hosts from. A cell no longer
        mapped takes its hosts out of scheduling (they stay in the snapshot without a
        service). Called under the feed's lock, from :meth:`refresh`."""
        with self.api.connect() as conn:
            rows = conn.execute(sa.select(cell_mappings)).mappings().all()
        seen = set()
        for row in rows:
            uuid = str(row["uuid"])
            if uuid == CELL0_UUID:
                continue
            seen.add(uuid)
            cell = self.cells.get(uuid)
            url = cell_url(str(row["database_connection"]), self.main_url)
            if cell is not None and cell.url != url:
                # Its database moved (nova-manage cell_v2 update_cell): read it anew there.
                cell.engine.dispose()
                self.cells.pop(uuid)
                for node in cell.nodes.values():
                    self._write(record_of(node, None, cell.uuid, {}, self.ratios))
                cell = None
            if cell is None:
                self.cells[uuid] = Cell(uuid, str(row["name"] or ""), bool(row["disabled"]),
                                        self._engine(url), url=url)
            else:
                cell.disabled = bool(row["disabled"])
                cell.name = str(row["name"] or "")
        for gone in set(self.cells) - seen:
            cell = self.cells.pop(gone)
            for node in cell.nodes.values():
                self._write(record_of(node, None, cell.uuid, {}, self.ratios))
            cell.engine.dispose()
        self.snapshot.disabled_cells = frozenset(u for u, c in self.cells.items() if c.disabled)

    def reset(self) -> None:
        """What SIGHUP does to a nova-scheduler: the cells again, then everything, at the
        next request (under the scheduler's lock, never beside a decision)."""
        self._reset = True
        self._dirty = True

    # ---------------------------------------------------------------- casts
    def aggregates_changed(self, aggregates: Sequence[Aggregate]) -> None:
        """``update_aggregates``: re-read them at the next request."""
        self._aggregates_stale = True
        self._dirty = True

    def aggregate_deleted(self, aggregate: Aggregate) -> None:
        """``delete_aggregate``."""
        self._aggregates_stale = True
        self._dirty = True

    def instances_changed(self, host: str, instances: Sequence[Instance]) -> None:
        """``update_instance_info`` (Nova's ``HostManager.update_instance_info``): the
        instances join the host's tracked ones, which then stand for the host; a host
        without an entry takes a list of several as its whole list, and is read from the
        database for one. The snapshot changes at the next refresh."""
        with self._lock:
            entry = self.tracked.get(host)
            if entry is not None:
                for instance in instances:
                    entry.instances[instance.uuid] = self._complete(instance)
                entry.updated = True
            elif len(instances) > 1:
                self.tracked[host] = TrackedInstances(
                    {i.uuid: self._complete(i) for i in instances}, updated=True)
            else:
                self._recreate(host)
            self._touch(host)
        self._dirty = True

    def instance_deleted(self, host: str, instance_uuid: str) -> None:
        """``delete_instance_info``: the instance leaves its host's tracked ones (and
        the database's view, where it is gone too) at the next request (the snapshot
        changes only inside :meth:`refresh`, under the scheduler's lock)."""
        with self._lock:
            for cell in self.cells.values():
                if cell.where.get(instance_uuid) == host:
                    cell.instances[host].pop(instance_uuid, None)
                    del cell.where[instance_uuid]
            entry = self.tracked.get(host)
            if entry is not None:
                entry.instances.pop(instance_uuid, None)
                entry.updated = True
            else:
                self._recreate(host)
            self._touch(host)
        self._dirty = True

    def instances_synced(self, host: str, instance_uuids: list[str]) -> None:
        """``sync_instance_info``: tracked instances that match the compute's list
        stand for the host; a mismatch has them read from the database again."""
        with self._lock:
            entry = self.tracked.get(host)
            if entry is not None and set(entry.instances) == set(instance_uuids):
                entry.updated = True
            else:
                self._recreate(host)
            self._touch(host)
        self._dirty = True

    def _db_instances(self, host: str) -> dict[str, Instance]:
        """The host's instances as the database has them (as last read)."""
        out: dict[str, Instance] = {}
        for cell in self.cells.values():
            out.update(cell.instances.get(host, {}))
        return out

    def _recreate(self, host: str) -> None:
        """Nova's ``_recreate_instance_info``: the database's instances, not updated."""
        self.tracked[host] = TrackedInstances(dict(self._db_instances(host)), updated=False)

    def _complete(self, instance: Instance) -> Instance:
        """A cast's instance, with the flavor and project the database knows when the
        cast's object left them out."""
        if instance.instance_type_id is not None and instance.project_id is not None:
            return instance
        for cell in self.cells.values():
            host = cell.where.get(instance.uuid)
            if host is not None:
                known = cell.instances[host][instance.uuid]
                return Instance(uuid=instance.uuid,
                                instance_type_id=instance.instance_type_id
                                if instance.instance_type_id is not None
                                else known.instance_type_id,
                                project_id=instance.project_id or known.project_id)
        return instance

    def _touch(self, host: str) -> None:
        """Have the next refresh write ``host`` again."""
        for cell in self.cells.values():
            if host in cell.node_hosts:
                cell.pending.add(host)

    def host_instances(self, cell: Cell, host: str) -> dict[str, Instance]:
        """What Nova's ``_get_instance_info`` gives the host state: the tracked
        instances when they stand for the host, else the database's."""
        entry = self.tracked.get(host)
        if entry is not None and entry.updated:
            return entry.instances
        return cell.instances.get(host, {})

    # ---------------------------------------------------------------- refresh
    def refresh(self) -> HostSnapshot:
        """Bring the snapshot up to date (see the module's docstring)."""
        with self._lock:
            now = self.clock()
            if not self._dirty and now - self._last < self.min_interval:
                return self.snapshot
            if self._reset or not self.cells:
                self.load_cells()
                for cell in self.cells.values():
                    cell.marks.clear()
                    cell.retry_at = 0.0  # an operator's SIGHUP: every cell tried now
                self._aggregates_stale = True
                self._reset = False
            if self._aggregates_stale:
                self.snapshot.set_aggregates(self.read_aggregates())
                self._aggregates_stale = False
            unreachable = set()
            for cell in self.cells.values():
                if now < cell.retry_at:
                    unreachable.add(cell.uuid)  # failed lately: not tried on every request
                    continue
                full = not cell.marks or now - cell.full_at >= self.resync_interval
                try:
                    self._read_cell(cell, full)
                except sa_exc.SQLAlchemyError as exc:
                    # Nova's scatter-gather logs a cell that fails and schedules in the
                    # others; its hosts come back with its database (read from the marks
                    # the last good read left).
                    unreachable.add(cell.uuid)
                    cell.retry_at = now + CELL_RETRY
                    if cell.uuid not in self.snapshot.unreachable_cells:
                        LOG.warning("cell %s (%s): its database cannot be read, its hosts "
                                    "are left out until it can: %s", cell.name, cell.uuid,
                                    str(exc).splitlines()[0])
                    continue
                if cell.uuid in self.snapshot.unreachable_cells:
                    LOG.info("cell %s (%s): its database answers again", cell.name, cell.uuid)
                if full:
                    cell.full_at = now
            self.snapshot.unreachable_cells = frozenset(unreachable)
            if not self._tracking_started:
                # Nova's _init_instance_info: every host with instances, not updated.
                self._tracking_started = True
                for cell in self.cells.values():
                    for host, found in cell.instances.items():
                        if found and host not in self.tracked:
                            self.tracked[host] = TrackedInstances(dict(found))
            self._last = now
            self._dirty = False
        return self.snapshot

    def read_aggregates(self) -> list[Aggregate]:
        """Every aggregate with its hosts and metadata."""
        with self.api.connect() as conn:
            aggs = conn.execute(sa.select(aggregates)).mappings().all()
            hosts = conn.execute(sa.select(aggregate_hosts.c.aggregate_id,
                                           aggregate_hosts.c.host)).all()
            meta = conn.execute(sa.select(aggregate_metadata.c.aggregate_id,
                                          aggregate_metadata.c.key,
                                          aggregate_metadata.c.value)).all()
        by_hosts: dict[int, list[str]] = defaultdict(list)
        for agg_id, host in hosts:
            by_hosts[agg_id].append(str(host))
        by_meta: dict[int, dict[str, str]] = defaultdict(dict)
        for agg_id, key, value in meta:
            by_meta[agg_id][str(key)] = str(value)
        return [Aggregate(id=int(a["id"]), name=str(a["name"] or ""), uuid=str(a["uuid"] or ""),
                          hosts=tuple(sorted(by_hosts[a["id"]])), metadata=by_meta[a["id"]])
                for a in aggs]

    def _read_cell(self, cell: Cell, full: bool) -> None:
        """Read the cell's changed rows (every live row when ``full``) and write the
        hosts whose rows differ from what was read before."""
        def query(table: sa.Table, mark: str, *extra: Any) -> Any:
            where = [*extra]
            if full:
                where.append(table.c.deleted == 0)
            else:
                where.append(_changed(table, cell.marks.get(mark), self.overlap))
            return sa.select(table).where(*where)

        with cell.engine.connect() as conn:
            nodes = conn.execute(query(compute_nodes, "nodes")).mappings().all()
            svcs = conn.execute(query(services, "services",
                                      services.c.binary == "nova-compute")).mappings().all()
            insts = conn.execute(query(instances, "instances", *(
                [instances.c.host.is_not(None)] if full else []))).mappings().all()
        touched = set(cell.pending)
        cell.pending.clear()
        if full:  # what a full read did not return is gone (deleted, or archived)
            alive = {int(n["id"]) for n in nodes}
            for node_id in [i for i in cell.nodes if i not in alive]:
                dropped = cell.nodes.pop(node_id)
                self._write(record_of(dropped, None, cell.uuid, {}, self.ratios))
                cell.node_hosts[str(dropped["host"])].discard(node_id)
            alive = {int(s["id"]) for s in svcs}
            for sid in [i for i in cell.services if i not in alive]:
                host = str(cell.services.pop(sid)["host"])
                cell.service_hosts[host].discard(sid)
                touched.add(host)
            alive_uuids = {str(i["uuid"]) for i in insts}
            for uuid in [u for u in cell.where if u not in alive_uuids]:
                host = cell.where.pop(uuid)
                cell.instances[host].pop(uuid, None)
                touched.add(host)
        _take(svcs, cell.services, cell.service_hosts, touched)
        _take(nodes, cell.nodes, cell.node_hosts, touched)
        for i in insts:
            uuid, host = str(i["uuid"]), i["host"]
            gone = bool(i["deleted"]) or host is None  # deleted, shelved off, rescheduled
            before = cell.where.get(uuid)
            if before is not None and (gone or before != host):
                cell.instances[before].pop(uuid, None)
                del cell.where[uuid]
                touched.add(before)
            if gone:
                continue
            instance = Instance(uuid=uuid, instance_type_id=i["instance_type_id"],
                                project_id=i["project_id"])
            if cell.instances[str(host)].get(uuid) != instance:
                cell.instances[str(host)][uuid] = instance
                cell.where[uuid] = str(host)
                touched.add(str(host))
        for host in touched:
            self._upsert_host(cell, host)
        for key, rows in (("nodes", nodes), ("services", svcs), ("instances", insts)):
            newest = _newest(rows)
            if newest is not None:
                cell.marks[key] = max(newest, cell.marks.get(key, newest))

    def _upsert_host(self, cell: Cell, host: str) -> None:
        """Write every compute node of ``host`` in ``cell`` into the snapshot; a deleted
        node or one without a live service stays, never to be scheduled to."""
        mine = {sid: cell.services[sid] for sid in cell.service_hosts.get(host, ())}
        by_host = next((s for s in mine.values() if not s.get("deleted")), None)
        for node_id in cell.node_hosts.get(host, ()):
            node = cell.nodes[node_id]
            service = mine.get(int(node.get("service_id") or -1)) or by_host
            if node.get("deleted") or node.get("free_disk_gb") is None:
                # Deleted, or created and not updated yet: Nova's host state ignores such
                # a node's usage and has no uuid a candidate could name (a deviation:
                # docs/architecture.md).
                service = None
            self._write(record_of(node, service, cell.uuid, self.host_instances(cell, host),
                                    self.ratios))

    def _write(self, record: HostRecord) -> None:
        row = self.snapshot.upsert(record)
        if record.uuid:
            self.uuid_rows[record.uuid] = row

    def close(self) -> None:
        """Dispose of every engine."""
        for cell in self.cells.values():
            cell.engine.dispose()
        self.api.dispose()
