"""The columnar host snapshot: every compute node's state as NumPy columns.

One row per compute node, keyed by ``(host, nodename)``. Numbers live in float64 arrays
(NaN for "not reported"); strings and dicts with few distinct values (cells, hypervisor
types, ``cpu_info``, ``stats``, ``supported_instances``, aggregate membership) are
*interned*: a code per row into a table of distinct values, so a rule over them is
evaluated once per distinct value (a "signature") instead of once per host. Objects that
are genuinely per node (the instances the node reports, NUMA topology, PCI pools, metrics)
stay in object arrays. Filters and weighers read instances per *service host*, as Nova
does, through :meth:`HostSnapshot.service_hosts`.

A snapshot is shared by every request. Requests never write to it: each request works on a
:class:`berth.host_state.WorkingSet` that copies a column only when it first changes it.
Host reports and claims update a row in place with :meth:`HostSnapshot.update_host`, which
is O(1) per changed field (no rebuild per request); a new host is appended.
"""

from __future__ import annotations

import functools
import gc
import json
import math
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Any, TypeVar

import numpy as np

from berth.instance_index import InstanceIndex
from berth.interning import DICT_ONLY, Interned, intern_batch, intern_each
from berth.model.aggregate import Aggregate
from berth.model.compute import Instance, MetricItem, ServiceRecord
from berth.service_hosts import ServiceHosts

T = TypeVar("T")

#: Integer-valued numeric fields of HostState, stored as float64 (exact below 2**53).
INT_COLUMNS: tuple[str, ...] = (
    "total_usable_ram_mb",
    "free_ram_mb",
    "total_usable_disk_gb",
    "disk_mb_used",
    "free_disk_mb",
    "vcpus_total",
    "vcpus_used",
    "num_instances",
    "num_io_ops",
    "failed_builds",
    "hypervisor_version",
)
#: Real-valued numeric fields of HostState.
FLOAT_COLUMNS: tuple[str, ...] = (
    "cpu_allocation_ratio",
    "ram_allocation_ratio",
    "disk_allocation_ratio",
    "updated",
)
#: Service columns ComputeFilter evaluates in bulk, and whether the node has a service
#: record at all (Nova's host manager skips a compute node without one, §10.2.3).
SERVICE_COLUMNS: tuple[str, ...] = ("service_disabled", "service_forced_down", "service_heartbeat",
                                    "has_service")
#: Interned (low-cardinality) fields.
INTERNED_COLUMNS: tuple[str, ...] = (
    "cell_uuid",
    "hypervisor_type",
    "cpu_info",
    "stats",
    "supported_instances",
    "aggregates",
)
#: Interned columns whose tables are compacted when they outgrow the rows (see
#: :meth:`HostSnapshot._compact`); the aggregate signatures are interned afresh whenever
#: the aggregates change instead.
_COMPACTED_COLUMNS: tuple[str, ...] = tuple(c for c in INTERNED_COLUMNS if c != "aggregates")
#: Values a table may hold beyond twice the rows before it is compacted.
_COMPACT_SLACK = 1024
#: Per-host object fields.
OBJECT_COLUMNS: tuple[str, ...] = (
    "host",
    "nodename",
    "uuid",
    "host_ip",
    "hypervisor_hostname",
    "instances",
    "metrics",
    "numa_topology",
    "pci_stats",
    "service",
)


#: Record fields the bulk build reads, and the plain numeric ones among them.
_OBJECT_FIELDS = ("host", "nodename", "cell_uuid", "uuid", "hypervisor_type",
                  "hypervisor_hostname", "host_ip", "cpu_info", "supported_instances",
                  "stats", "metrics", "numa_topology", "pci_stats", "service", "instances")
_DIRECT_NUMBERS = ("total_usable_ram_mb", "free_ram_mb", "total_usable_disk_gb",
                   "disk_mb_used", "free_disk_mb", "vcpus_total", "vcpus_used",
                   "hypervisor_version", "cpu_allocation_ratio", "ram_allocation_ratio",
                   "disk_allocation_ratio", "updated")
_COUNTERS = ("num_instances", "num_io_ops", "failed_builds")
_RECORD_FIELDS = _OBJECT_FIELDS + _DIRECT_NUMBERS + _COUNTERS
_SERVICE_FIELDS = attrgetter("disabled", "forced_down", "last_seen_up", "created_at")


@functools.lru_cache(maxsize=64)
def _fields_in_dict(kind: type) -> bool:
    """True when reading the record fields from an instance's ``__dict__`` is what
    attribute access returns: plain attribute lookup and no data descriptor (property)
    of those names on the class."""
    if kind.__getattribute__ is not object.__getattribute__:
        return False
    for name in _RECORD_FIELDS:
        for klass in kind.__mro__:
            if name in klass.__dict__:
                attr = type(klass.__dict__[name])
                if hasattr(attr, "__set__") or hasattr(attr, "__delete__"):
                    return False
                break
    return True


def _record_columns(records: Sequence[HostRecord]) -> dict[str, tuple[Any, ...]]:
    """Every field the build reads, one tuple per field, in one pass over the records.

    Reading the instances' ``__dict__`` by key is cheaper than attribute access;
    records of other shapes (slots, properties) are read by attribute.
    """
    if not records:
        return dict.fromkeys(_RECORD_FIELDS, ())
    values: list[tuple[Any, ...]] | None = None
    if all(map(_fields_in_dict, set(map(type, records)))):
        try:
            values = list(map(itemgetter(*_RECORD_FIELDS), map(vars, records)))
        except (KeyError, TypeError):  # a field not in __dict__, or no __dict__
            values = None
    if values is None:
        values = list(map(attrgetter(*_RECORD_FIELDS), records))
    return dict(zip(_RECORD_FIELDS, zip(*values)))


def _membership_masks(
    aggregates: Sequence[Aggregate], hosts: Sequence[str]
) -> tuple[list[str], list[Any], list[Any], dict[str, tuple[int, ...]]] | None:
    """Which aggregates list each host, as bit masks (one bit per aggregate index).

    Returns ``(distinct hosts, key per row, key per distinct host, outside)``: a key is
    the row's mask (an int, or a tuple of 64-bit words past 64 aggregates); ``outside``
    holds the aggregate indexes of member hosts that are not in ``hosts``. None when an
    aggregate lists a host twice (a mask cannot say so).
    """
    n = len(hosts)
    distinct = list(dict.fromkeys(hosts))
    ids = dict(zip(distinct, range(len(distinct))))
    words = max(1, (len(aggregates) + 63) // 64)
    masks = np.zeros((words, len(distinct)), dtype=np.uint64)
    outside: dict[str, list[int]] = {}
    listed = 0
    for index, agg in enumerate(aggregates):
        members = tuple(agg.hosts)
        at = np.fromiter(map(ids.get, members, repeat(-1)), dtype=np.intp, count=len(members))
        inside = at >= 0
        if not inside.all():
            for j in np.flatnonzero(~inside).tolist():
                outside.setdefault(members[j], []).append(index)
            at = at[inside]
        masks[index >> 6, at] |= np.uint64(1 << (index & 63))
        listed += len(at)
    if int(_popcount(masks).sum()) != listed:
        return None
    host_keys: list[Any] = (masks[0].tolist() if words == 1
                            else list(zip(*(word.tolist() for word in masks))))
    keys = host_keys if len(distinct) == n else list(map(
        host_keys.__getitem__, map(ids.__getitem__, hosts)))
    return distinct, keys, host_keys, {host: tuple(found) for host, found in outside.items()}


def _bits(key: int | tuple[int, ...]) -> tuple[int, ...]:
    """The aggregate indexes of a membership mask, ascending."""
    words = (key,) if isinstance(key, int) else key
    found: list[int] = []
    for w, word in enumerate(words):
        while word:
            low = word & -word
            found.append(64 * w + low.bit_length() - 1)
            word ^= low
    return tuple(found)


def _popcount(x: np.ndarray) -> np.ndarray:
    """Set bits per element of a uint64 array."""
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return (x * np.uint64(0x0101010101010101)) >> np.uint64(56)


def _or_else(values: Sequence[Any], fallback: Sequence[Any]) -> list[Any]:
    """``[v or f for v, f in zip(values, fallback)]``."""
    if all(values):
        return list(values)
    return [v or f for v, f in zip(values, fallback)]


def _or_none(values: Sequence[Any], fallback: Sequence[Any]) -> Sequence[Any]:
    """``[v if v is not None else f for v, f in zip(values, fallback)]``."""
    if None not in values:
        return values
    return [v if v is not None else f for v, f in zip(values, fallback)]


def _copies(values: Sequence[Any], kind: type) -> list[Any]:
    """``[kind(v or kind()) for v in values]``: a fresh dict or list per value."""
    if set(map(type, values)) <= {kind}:
        return list(map(kind, values))
    return [kind(v or kind()) for v in values]


@dataclass
class HostRecord:
    """One compute node's reported state: the input to a snapshot row.

    Field names are HostState's (reference §2.1). ``num_instances``, ``num_io_ops`` and
    ``failed_builds`` come from ``stats`` (``num_instances``, ``io_workload``,
    ``failed_builds``) unless given explicitly. ``service`` is the node's nova-compute
    service row; a node without one (None) is in the snapshot but never scheduled to,
    as Nova's host manager skips it (§10.2.3).
    """

    host: str
    nodename: str | None = None
    cell_uuid: str | None = None
    uuid: str | None = None
    total_usable_ram_mb: int = 0
    free_ram_mb: int = 0
    total_usable_disk_gb: int = 0
    disk_mb_used: int = 0
    free_disk_mb: int = 0
    vcpus_total: int = 0
    vcpus_used: int = 0
    num_instances: int | None = None
    num_io_ops: int | None = None
    failed_builds: int | None = None
    hypervisor_type: str | None = None
    hypervisor_version: int | None = None
    hypervisor_hostname: str | None = None
    host_ip: str | None = None
    cpu_info: str = "{}"
    supported_instances: list[list[str]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    metrics: list[MetricItem] = field(default_factory=list)
    numa_topology: Any = None
    pci_stats: Any = None
    cpu_allocation_ratio: float = 4.0
    ram_allocation_ratio: float = 1.0
    disk_allocation_ratio: float = 1.0
    service: ServiceRecord | None = None
    instances: dict[str, Instance] = field(default_factory=dict)
    updated: float | None = None

    @property
    def key(self) -> tuple[str, str]:
        """The ``(host, nodename)`` key of the row."""
        return (self.host, self.nodename or self.host)


def _stat_int(stats: Mapping[str, Any], key: str) -> int:
    return int(stats.get(key, 0) or 0)


def _stat_int_or_nan(stats: Mapping[str, Any], key: str) -> float:
    try:
        return float(_stat_int(stats, key))
    except (TypeError, ValueError):
        return math.nan


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)


class HostSnapshot:
    """Columnar state of every compute node (see the module docstring).

    Build one with :meth:`from_records`. ``aggregates`` is the list of every aggregate;
    a row's aggregates are those whose ``hosts`` contain the row's *service host* name.
    """

    def __init__(self, aggregates: Sequence[Aggregate] = (), capacity: int = 0) -> None:
        self.aggregates: list[Aggregate] = list(aggregates)
        #: Cells the scheduler must not use (disabled CellMappings).
        self.disabled_cells: frozenset[str] = frozenset()
        #: Cells whose database the last refresh could not read: their hosts are left
        #: out, as Nova's scatter-gather skips a cell that fails (§10.2).
        self.unreachable_cells: frozenset[str] = frozenset()
        self._n = 0
        self._num: dict[str, np.ndarray] = {
            name: np.full(capacity, math.nan) for name in INT_COLUMNS + FLOAT_COLUMNS
        }
        self._num["service_disabled"] = np.zeros(capacity, dtype=bool)
        self._num["service_forced_down"] = np.zeros(capacity, dtype=bool)
        self._num["service_heartbeat"] = np.full(capacity, math.nan)
        self._num["has_service"] = np.zeros(capacity, dtype=bool)
        self._interned: dict[str, Interned] = {name: Interned(capacity) for name in INTERNED_COLUMNS}
        self._obj: dict[str, np.ndarray] = {
            name: np.empty(capacity, dtype=object) for name in OBJECT_COLUMNS
        }
        self._rows: dict[tuple[str, str], int] = {}
        self._aggs_by_host: dict[str, tuple[int, ...]] = {}
        self._index_aggregates()
        self._cache: dict[Hashable, Any] = {}
        self._table_cache: dict[Hashable, Any] = {}
        #: :meth:`row_cached` columns ([values, how much of ``_rows_reported`` they
        #: have applied]) and the existing rows reported since they were built.
        self._row_cache: dict[Hashable, list[Any]] = {}
        self._rows_reported: list[int] = []
        #: Bumped on every change.
        self.generation = 0
        #: Bumped when anything but a numeric column changes (a report, a new row, the
        #: aggregates); :meth:`cached` indexes live exactly as long as it stays put.
        self.structure_generation = 0

    # ----------------------------------------------------------------- construction
    @classmethod
    def from_records(
        cls, records: Iterable[HostRecord], aggregates: Sequence[Aggregate] = ()
    ) -> HostSnapshot:
        """Build a snapshot from host records (one row per record, in order)."""
        records = list(records)
        # The build allocates a few objects per host and frees none; a cyclic-GC pass
        # over every live object each few hundred allocations would cost more than the
        # build itself at 100,000 hosts.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            snap = cls(capacity=len(records))
            snap.aggregates = list(aggregates)
            snap._write_many(records, index_aggregates=True)
        finally:
            if gc_was_enabled:
                gc.enable()
        return snap

    def _index_membership(self, hosts: Sequence[str]) -> np.ndarray:
        """Index the aggregates' hosts and intern the membership of rows whose service
        hosts are ``hosts``; returns their codes (what :meth:`_index_aggregates` and
        interning row by row give).

        One bit per (host, aggregate) set with NumPy, so the per-host work is C-level
        dict lookups; tuples of aggregate indexes are built once per distinct membership.
        """
        n = len(hosts)
        col = self._interned["aggregates"]
        membership = _membership_masks(self.aggregates, hosts)
        if membership is None:  # a host listed twice in an aggregate: keep its repeats
            self._index_aggregates()
            by_host = self._aggs_by_host
            return intern_batch(col, [by_host.get(host, ()) for host in hosts])
        distinct, keys, host_keys, outside = membership
        members = {key: _bits(key) for key in dict.fromkeys(keys)}
        by_host = dict(zip(distinct, map(members.__getitem__, host_keys)))
        by_host.update(outside)
        self._aggs_by_host = by_host
        intern = col.intern
        lookup = {key: intern(members[key]) for key in dict.fromkeys(keys)}
        return np.fromiter(map(lookup.__getitem__, keys), dtype=np.int32, count=n)

    def _index_aggregates(self) -> None:
        by_host: dict[str, list[int]] = {}
        for index, agg in enumerate(self.aggregates):
            for host in agg.hosts:
                by_host.setdefault(host, []).append(index)
        self._aggs_by_host = {host: tuple(ids) for host, ids in by_host.items()}

    def _grow(self, needed: int) -> None:
        capacity = len(self._obj["host"])
        if needed <= capacity:
            return
        new_capacity = max(needed, capacity * 2, 16)
        for name, arr in self._num.items():
            fill: Any = False if arr.dtype == bool else math.nan
            grown = np.full(new_capacity, fill, dtype=arr.dtype)
            grown[: self._n] = arr[: self._n]
            self._num[name] = grown
        for col in self._interned.values():
            grown_codes = np.zeros(new_capacity, dtype=np.int32)
            grown_codes[: self._n] = col.codes[: self._n]
            col.codes = grown_codes
        for name, arr in self._obj.items():
            grown_obj = np.empty(new_capacity, dtype=object)
            grown_obj[: self._n] = arr[: self._n]
            self._obj[name] = grown_obj

    def _append(self, record: HostRecord) -> int:
        key = record.key
        if key in self._rows:
            raise ValueError(f"duplicate compute node {key[0]}/{key[1]}")
        self._grow(self._n + 1)
        row = self._n
        self._n += 1
        self._rows[key] = row
        self._write(row, record)
        return row

    def _write_many(self, records: list[HostRecord], index_aggregates: bool = False) -> None:
        """Append ``records`` column by column; the same rows as :meth:`_append` each.

        Building 100,000 rows one ``_write`` at a time costs seconds of NumPy scalar
        stores; here each column is one array built from a list, and per-row Python work
        is left to C-level passes (``map``, ``zip``, dict builds) wherever the values
        allow it. ``index_aggregates`` (a fresh snapshot) indexes the aggregates' hosts
        together with the rows' membership.
        """
        start = self._n
        n = len(records)
        rows = self._rows
        f = _record_columns(records)
        hosts = list(f["host"])
        nodenames = _or_else(f["nodename"], hosts)
        new_rows = dict(zip(zip(hosts, nodenames), range(start, start + n)))
        if len(new_rows) != n or (rows and not rows.keys().isdisjoint(new_rows)):
            seen: set[tuple[str, str]] = set(rows)
            for key in zip(hosts, nodenames):
                if key in seen:
                    raise ValueError(f"duplicate compute node {key[0]}/{key[1]}")
                seen.add(key)
        rows.update(new_rows)
        self._grow(start + n)
        self._n = start + n
        end = start + n
        num = self._num
        for name in _DIRECT_NUMBERS:
            # One pass per field (np.array would scan the values twice); None -> NaN.
            num[name][start:end] = np.fromiter(f[name], dtype=float, count=n)

        # Stats: only the distinct dicts are copied (the rows hold codes, never the
        # caller's dicts). Counters are evaluated once per distinct stats dict, then
        # explicit record values win where given.
        raw_stats = f["stats"]
        stats_list: Sequence[Any] = (
            raw_stats if set(map(type, raw_stats)) <= DICT_ONLY
            else [dict(stats or {}) for stats in raw_stats])
        stats_col = self._interned["stats"]
        # One Python pass with frozenset keys (their hash is cached) beats C-level passes
        # over tuple keys here.
        stats_codes = intern_each(stats_col, stats_list, copy=dict)
        stats_col.codes[start:end] = stats_codes
        for name, stat in (("num_instances", "num_instances"), ("num_io_ops", "io_workload"),
                           ("failed_builds", "failed_builds")):
            given = f[name]
            column = np.empty(0)
            if n:
                per_code = np.array([_stat_int_or_nan(v, stat) for v in stats_col.values],
                                    dtype=float)
                column = per_code[stats_codes]
            if given.count(None) != n:
                for i, value in enumerate(given):
                    if value is not None:
                        column[i] = value
            for i in np.flatnonzero(np.isnan(column)).tolist():
                if given[i] is None:
                    column[i] = _stat_int(stats_list[i], stat)  # raises as _write does
            num[name][start:end] = column

        # A node without a service record keeps None (the pipeline leaves it out); its
        # service columns read as a default record's (enabled, never seen up).
        services = list(f["service"])
        present = [service is not None for service in services]
        num["has_service"][start:end] = np.fromiter(present, dtype=bool, count=n)
        if n:
            defaulted = (services if all(present)
                         else [service or ServiceRecord(host=host)
                               for service, host in zip(services, hosts)])
            disabled, forced_down, seen_up, created = zip(*map(_SERVICE_FIELDS, defaulted))
            num["service_disabled"][start:end] = np.fromiter(map(bool, disabled), dtype=bool,
                                                            count=n)
            num["service_forced_down"][start:end] = np.fromiter(map(bool, forced_down),
                                                               dtype=bool, count=n)
            num["service_heartbeat"][start:end] = np.fromiter(_or_none(seen_up, created),
                                                              dtype=float, count=n)

        interned = self._interned
        cpu_info = f["cpu_info"]
        for name, values in (
            ("cell_uuid", f["cell_uuid"]),
            ("hypervisor_type", f["hypervisor_type"]),
            ("cpu_info", cpu_info if None not in cpu_info
             else [c if c is not None else "{}" for c in cpu_info]),
        ):
            col = interned[name]
            col.codes[start:end] = intern_batch(col, values)
        interned["aggregates"].codes[start:end] = (
            self._index_membership(hosts) if index_aggregates
            else intern_batch(interned["aggregates"],
                               [self._aggs_by_host.get(host, ()) for host in hosts]))
        col = interned["supported_instances"]
        col.codes[start:end] = intern_each(
            col, [si or [] for si in f["supported_instances"]],
            copy=lambda triples: [list(t) for t in triples])

        obj = self._obj
        object_columns: tuple[tuple[str, Sequence[Any]], ...] = (
            ("host", hosts),
            ("nodename", nodenames),
            ("uuid", f["uuid"]),
            ("host_ip", f["host_ip"]),
            ("hypervisor_hostname", _or_else(f["hypervisor_hostname"], nodenames)),
            # Copies: a caller changing its record afterwards must not change the row.
            ("instances", _copies(f["instances"], dict)),
            ("metrics", _copies(f["metrics"], list)),
            ("numa_topology", f["numa_topology"]),
            ("pci_stats", f["pci_stats"]),
            ("service", services),
        )
        for name, objects in object_columns:
            obj[name][start:end] = np.fromiter(objects, dtype=object, count=n)

    def _write(self, row: int, record: HostRecord) -> None:
        stats = dict(record.stats or {})
        num = self._num
        num["total_usable_ram_mb"][row] = record.total_usable_ram_mb
        num["free_ram_mb"][row] = record.free_ram_mb
        num["total_usable_disk_gb"][row] = record.total_usable_disk_gb
        num["disk_mb_used"][row] = record.disk_mb_used
        num["free_disk_mb"][row] = record.free_disk_mb
        num["vcpus_total"][row] = record.vcpus_total
        num["vcpus_used"][row] = record.vcpus_used
        num["num_instances"][row] = (
            record.num_instances
            if record.num_instances is not None
            else _stat_int(stats, "num_instances")
        )
        num["num_io_ops"][row] = (
            record.num_io_ops if record.num_io_ops is not None else _stat_int(stats, "io_workload")
        )
        num["failed_builds"][row] = (
            record.failed_builds
            if record.failed_builds is not None
            else _stat_int(stats, "failed_builds")
        )
        num["hypervisor_version"][row] = _num(record.hypervisor_version)
        num["cpu_allocation_ratio"][row] = _num(record.cpu_allocation_ratio)
        num["ram_allocation_ratio"][row] = _num(record.ram_allocation_ratio)
        num["disk_allocation_ratio"][row] = _num(record.disk_allocation_ratio)
        num["updated"][row] = _num(record.updated)
        num["has_service"][row] = record.service is not None
        service = record.service or ServiceRecord(host=record.host)
        num["service_disabled"][row] = bool(service.disabled)
        num["service_forced_down"][row] = bool(service.forced_down)
        heartbeat = service.last_seen_up if service.last_seen_up is not None else service.created_at
        num["service_heartbeat"][row] = _num(heartbeat)

        interned = self._interned
        for name, value in (
            ("cell_uuid", record.cell_uuid),
            ("hypervisor_type", record.hypervisor_type),
            ("cpu_info", record.cpu_info if record.cpu_info is not None else "{}"),
            ("stats", stats),
            ("supported_instances", [list(s) for s in record.supported_instances or []]),
            ("aggregates", self._aggs_by_host.get(record.host, ())),
        ):
            col = interned[name]
            col.codes[row] = col.intern(value)

        obj = self._obj
        obj["host"][row] = record.host
        obj["nodename"][row] = record.nodename or record.host
        obj["uuid"][row] = record.uuid
        obj["host_ip"][row] = record.host_ip
        obj["hypervisor_hostname"][row] = record.hypervisor_hostname or record.nodename or record.host
        obj["instances"][row] = dict(record.instances or {})
        obj["metrics"][row] = list(record.metrics or [])
        obj["numa_topology"][row] = record.numa_topology
        obj["pci_stats"][row] = record.pci_stats
        obj["service"][row] = record.service

    # ----------------------------------------------------------------- updates
    def _changed(self, structure: bool = True, row: int | None = None) -> None:
        """Count a change: a numeric one (``structure`` false), the report of the
        existing ``row``, or any other (rows added or gone, the aggregates)."""
        self.generation += 1
        if structure:
            self.structure_generation += 1
            self._cache.clear()
            if row is None or len(self._rows_reported) > self._n + 1024:
                self._row_cache.clear()
                self._rows_reported.clear()
            elif self._row_cache:
                self._rows_reported.append(row)

    def upsert(self, record: HostRecord) -> int:
        """Replace a node's row with a fresh report (or append a new node); O(1) amortized."""
        row = self._rows.get(record.key)
        appended = row is None
        if row is None:
            row = self._append(record)
        else:
            self._write(row, record)
        for name in _COMPACTED_COLUMNS:
            if len(self._interned[name].values) > 2 * self._n + _COMPACT_SLACK:
                self._compact(name)
        self._changed(row=None if appended else row)
        return row

    def remove(self, keys: Iterable[tuple[str, str]]) -> bool:
        """Drop the rows of the nodes ``keys`` ((host, nodename) pairs; unknown ones are
        skipped): a compute service deleted. The rows after them move up, so every
        derived index goes, as for a new row. Columns are replaced, not compacted in
        place, so a reader holding the old ones keeps a consistent view. Whether a row
        went."""
        gone = sorted({row for key in keys if (row := self._rows.get(key)) is not None})
        if not gone:
            return False
        n = self._n
        keep = np.ones(n, dtype=bool)
        keep[gone] = False
        capacity = len(self._obj["host"])
        left = n - len(gone)
        for name, arr in self._num.items():
            fill: Any = False if arr.dtype == bool else math.nan
            kept = np.full(capacity, fill, dtype=arr.dtype)
            kept[:left] = arr[:n][keep]
            self._num[name] = kept
        for col in self._interned.values():
            codes = np.zeros(capacity, dtype=np.int32)
            codes[:left] = col.codes[:n][keep]
            col.codes = codes
        for name, arr in self._obj.items():
            objs = np.empty(capacity, dtype=object)
            objs[:left] = arr[:n][keep]
            self._obj[name] = objs
        self._n = left
        hosts, nodes = self._obj["host"][:left].tolist(), self._obj["nodename"][:left].tolist()
        self._rows = {(host, node or host): row for row, (host, node) in enumerate(zip(hosts, nodes))}
        self._changed()
        return True

    def _compact(self, name: str) -> None:
        """Drop the values of an interned column that no row holds any more.

        Reports only ever add values (a host's ``stats`` change with every instance it
        gains or loses), so a long-running scheduler's table would grow with every
        change it ever saw. When a table holds more than twice as many values as there
        are rows (plus some slack), the values still in use are interned into a new
        column, in their old order, and every row gets its new code: O(rows) once per
        O(rows) reports. The column is replaced as a whole (a reader that holds the old
        one still sees its codes and values agree), and the caches derived from tables
        are dropped, as when the aggregates change."""
        old = self._interned[name]
        used, inverse = np.unique(old.codes[: self._n], return_inverse=True)
        fresh = Interned(len(old.codes))
        mapping = np.array([fresh.intern(old.values[code]) for code in used.tolist()],
                           dtype=np.int32)
        fresh.codes[: self._n] = mapping[inverse.reshape(-1)]
        self._interned[name] = fresh
        self._table_cache.clear()

    def update_host(self, row: int, **fields: Any) -> None:
        """Set numeric fields of one row in place (a claim or a partial host report).

        Only numbers change, so the :meth:`cached` indexes stay.
        """
        for name, value in fields.items():
            if name not in self._num:
                raise KeyError(f"{name} is not a numeric host column")
            self._num[name][row] = value
        self._changed(structure=False)

    def set_aggregates(self, aggregates: Sequence[Aggregate]) -> None:
        """Replace the aggregate list and recompute every row's membership.

        The membership signatures are interned afresh: they hold indexes into the
        aggregate list, so those of the old list must not outlive it (an aggregate
        deleted would leave a signature pointing past the end, which every
        per-signature evaluation visits)."""
        self.aggregates = list(aggregates)
        self._interned["aggregates"] = Interned(len(self._interned["aggregates"].codes))
        col = self._interned["aggregates"]
        col.codes[: self._n] = self._index_membership(self._obj["host"][: self._n].tolist())
        self._table_cache.clear()
        self._changed()

    # ----------------------------------------------------------------- reads
    def __len__(self) -> int:
        return self._n

    def row_of(self, host: str, nodename: str | None = None) -> int | None:
        """The row of a node, or None."""
        return self._rows.get((host, nodename or host))

    def num(self, name: str) -> np.ndarray:
        """A numeric column (a view of the live rows; never write to it)."""
        return self._num[name][: self._n]

    def codes(self, name: str) -> np.ndarray:
        """The codes of an interned column."""
        return self._interned[name].codes[: self._n]

    def table(self, name: str) -> list[Any]:
        """The distinct values of an interned column (indexed by code)."""
        return self._interned[name].values

    def interned_value(self, name: str, row: int) -> Any:
        """The value of an interned column at ``row``."""
        return self._interned[name].value(row)

    def obj(self, name: str) -> np.ndarray:
        """An object column."""
        return self._obj[name][: self._n]

    def aggregates_of_signature(self, code: int) -> list[Aggregate]:
        """The aggregates of an aggregate-membership signature code."""
        return [self.aggregates[i] for i in self._interned["aggregates"].values[code]]

    def table_cached(self, key: Hashable, build: Callable[[], T]) -> T:
        """A value derived only from the value tables of interned columns (by code) and
        the aggregates, built once until the aggregates change.

        Unlike :meth:`cached`, a host's report leaves it: a report only appends to a
        table (codes already given keep their values), so a key that names the
        lengths of the tables it read stays true (a multiplier per aggregate
        signature, a verdict per distinct ``supported_instances``). Every length
        keeps its own entry, so this is only for tables that rarely grow (aggregate
        signatures, ``supported_instances``, ``cpu_info``); not for ``stats``, which
        nearly every report extends."""
        try:
            return self._table_cache[key]  # type: ignore[no-any-return]
        except KeyError:
            value = self._table_cache[key] = build()
            return value

    def row_cached(self, key: Hashable, build: Callable[[], np.ndarray],
                   compute_row: Callable[[int], float]) -> np.ndarray:
        """A per-row column derived from the object columns of each row alone: built
        once, then, after a report of an existing host, recomputed for that row only
        (``compute_row(row)``) where :meth:`cached` would build it all again (at 10,000
        hosts, a PCI weigher's column cost the request after every report 1.4 ms).
        New or removed rows and the aggregates build it again. Never write to it."""
        entry = self._row_cache.get(key)
        if entry is None:
            values = build()
            self._row_cache[key] = [values, len(self._rows_reported)]
            return values
        values, seen = entry
        reported = self._rows_reported
        if seen < len(reported):
            values = values.copy()  # a reader holding the old one keeps it as it was
            for row in set(reported[seen:]):
                values[row] = compute_row(row)
            entry[0], entry[1] = values, len(reported)
        return values  # type: ignore[no-any-return]

    def cached(self, key: Hashable, build: Callable[[], T]) -> T:
        """A derived index, built once per :attr:`structure_generation`.

        Only for indexes derived from the object and interned columns and the
        aggregates: numeric columns change in place (claims) without dropping them.
        """
        try:
            return self._cache[key]  # type: ignore[no-any-return]
        except KeyError:
            value = self._cache[key] = build()
            return value

    def instance_rows(self) -> InstanceIndex:
        """Map of every known instance uuid to the row of the node that reports it (its
        service host is that row's; :meth:`service_hosts` maps rows to hosts). Kept like
        a :meth:`row_cached` column: after a report of an existing host only that row's
        instances change in it (see :mod:`berth.instance_index`)."""
        instances = self.obj("instances")
        entry = self._row_cache.get("instance_rows")
        reported = self._rows_reported
        if entry is None:
            index = InstanceIndex.build(instances)
        elif entry[1] < len(reported):
            index = entry[0].updated(instances, reported[entry[1]:])
        else:
            return entry[0]  # type: ignore[no-any-return]
        self._row_cache["instance_rows"] = [index, len(reported)]
        return index

    def service_hosts(self) -> ServiceHosts:
        """Rows grouped by service host, with each row's service-host instances (Nova
        shares a host's instances among all its nodes; see :mod:`berth.service_hosts`)."""
        return self.cached("service_hosts", lambda: ServiceHosts(
            self.obj("host").tolist(), self.obj("instances")))

    def host_names_lower(self) -> np.ndarray:
        """Lower-cased service host names (force/ignore hosts are case-insensitive)."""
        return self.cached(
            "host_lower", lambda: np.array([h.lower() for h in self.obj("host")], dtype=object)
        )

    def cpu_info_decoded(self, code: int) -> Any:
        """The JSON-decoded ``cpu_info`` of a signature code, or None if it is not JSON."""

        def build() -> list[Any]:
            decoded: list[Any] = []
            for text in self.table("cpu_info"):
                try:
                    decoded.append(json.loads(text) if isinstance(text, str) else text)
                except ValueError:
                    decoded.append(None)
            return decoded

        return self.table_cached(("cpu_info_decoded", len(self.table("cpu_info"))), build)[code]

    def nbytes(self) -> int:
        """Approximate memory held by the columns (arrays only, not per-host objects)."""
        total = sum(a.nbytes for a in self._num.values())
        total += sum(c.codes.nbytes for c in self._interned.values())
        total += sum(a.nbytes for a in self._obj.values())
        return total
