"""Per-request host state: a copy-on-write working set over a snapshot, and row views.

Nova rebuilds every HostState for each ``select_destinations`` call and mutates them while
the request runs (virtual consumption, ``limits``, ``allocation_candidates``, server-group
stubs). Berth keeps the shared :class:`~berth.snapshot.HostSnapshot` untouched and gives
each request a :class:`WorkingSet`: a column is copied the first time the request changes
it, and per-host objects are overridden sparsely. :class:`HostState` is a view of one row
of a working set with Nova's attribute names, which is what custom filters and the
per-host (explanation) path see. :class:`Hosts` is the bulk view built-in filters and
weighers evaluate at once.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Hashable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from berth.model.aggregate import Aggregate
from berth.model.compute import Instance
from berth.model.hvspec import host_triple
from berth.snapshot import FLOAT_COLUMNS, INT_COLUMNS, HostSnapshot

if TYPE_CHECKING:
    from berth.model.request import RequestSpec

LOG = logging.getLogger(__name__)

#: Columns a request may change (virtual consumption).
CONSUMED_COLUMNS = ("free_ram_mb", "free_disk_mb", "vcpus_used", "num_instances", "num_io_ops")


class CandidateOverlay(dict):  # type: ignore[type-arg]
    """The request's allocation candidates by row: writes stay in the request, reads fall
    back to the adapter's mapping (so a request does not copy 100,000 entries up front).

    Behaves as a dict for ``get``, ``[]``, ``in``, assignment, ``len`` and iteration;
    deleting a row the request did not write hides the base entry.
    """

    __slots__ = ("_base", "_hidden")

    def __init__(self, base: dict[int, list[dict[str, Any]]]) -> None:
        super().__init__()
        self._base = base
        self._hidden: set[int] = set()

    def __missing__(self, row: int) -> list[dict[str, Any]]:
        if row in self._hidden:
            raise KeyError(row)
        return self._base[row]

    def get(self, row: int, default: Any = None) -> Any:  # type: ignore[override]
        """The row's candidates, or ``default``."""
        if dict.__contains__(self, row):
            return dict.__getitem__(self, row)
        if row in self._hidden:
            return default
        return self._base.get(row, default)

    def __contains__(self, row: object) -> bool:
        return dict.__contains__(self, row) or (row in self._base and row not in self._hidden)

    def __setitem__(self, row: int, value: list[dict[str, Any]]) -> None:
        self._hidden.discard(row)
        dict.__setitem__(self, row, value)

    def __delitem__(self, row: int) -> None:
        if row not in self:
            raise KeyError(row)
        if dict.__contains__(self, row):
            dict.__delitem__(self, row)
        if row in self._base:
            self._hidden.add(row)

    def _merged(self) -> dict[int, list[dict[str, Any]]]:
        merged = {r: v for r, v in self._base.items() if r not in self._hidden}
        merged.update(dict.items(self))
        return merged

    def __iter__(self) -> Iterator[int]:
        return iter(self._merged())

    def __len__(self) -> int:
        return len(self._merged())

    def keys(self) -> Any:
        """Rows with candidates."""
        return self._merged().keys()

    def values(self) -> Any:
        """Candidate lists."""
        return self._merged().values()

    def items(self) -> Any:
        """``(row, candidates)`` pairs."""
        return self._merged().items()

    def copy(self) -> dict[int, list[dict[str, Any]]]:
        """A plain dict of the merged view."""
        return self._merged()

    def __eq__(self, other: object) -> bool:
        return self._merged() == (other._merged() if isinstance(other, CandidateOverlay) else other)

    def __repr__(self) -> str:
        return f"CandidateOverlay({self._merged()!r})"


class WorkingSet:
    """One request's mutable layer over a snapshot (copy-on-write per column).

    ``now`` is the scheduling instant (seconds since the epoch) the adapter passes in; the
    core never reads a clock. ``candidates`` maps a row to its placement allocation
    requests, or is None when placement candidates are not in use (rebuilds, the legacy
    path).
    """

    def __init__(
        self,
        snapshot: HostSnapshot,
        now: float,
        candidates: dict[int, list[dict[str, Any]]] | None = None,
        *,
        share_stubs: bool = True,
        builds_in_flight: bool = True,
        pack_numa_cells: bool = False,
    ) -> None:
        self.snapshot = snapshot
        #: ``[compute] packing_host_numa_cells_allocation_strategy``, which Nova reads at
        #: every NUMA fit, the consumption's too (whether or not a filter ran).
        self.pack_numa_cells = pack_numa_cells
        self.now = now
        self.candidates = candidates
        #: Whether an instance this request placed counts as a build in progress (Nova:
        #: ``num_io_ops`` grows by one), or as built and running (what-if of a steady
        #: state: capacity, where builds of the past do not hold I/O slots).
        self.builds_in_flight = builds_in_flight
        #: Whether the nodes of a service host see each other's server-group stubs. Nova
        #: gives them one shared instance dict when it tracks instance changes (``[filter_
        #: scheduler] track_instance_changes``, the default, once the computes have
        #: synced); without tracking, each node gets its own copy of the host's instances
        #: from the database, so a stub stays on the node it was placed on.
        self.share_stubs = share_stubs
        #: Every row this request changed, in order (set_num, set_obj, add_instance,
        #: set_updated, attrs): lets request-scoped caches refresh only those rows.
        self.touched: list[int] = []
        #: The field each ``touched`` entry changed: a numeric column or object name,
        #: ``instances``, ``updated``, or ``*attrs`` (a plugin's own attribute).
        self.touched_fields: list[str] = []
        #: Request-scoped caches of the core (e.g. raw weights between instances).
        self.memo: dict[Hashable, Any] = {}
        self._cols: dict[str, np.ndarray] = {}
        self._limits: dict[int, dict[str, Any]] = {}
        self._limit_cols: dict[str, np.ndarray] = {}
        #: Server-group stubs this request placed, by service-host code (by row when
        #: stubs are not shared).
        self._stubs: dict[int, dict[str, Instance]] = {}
        self._objects: dict[str, dict[int, Any]] = {}
        self._attrs: dict[int, dict[str, Any]] = {}
        self._updated: dict[int, float | None] = {}

    # ----------------------------------------------------------------- columns
    def col(self, name: str) -> np.ndarray:
        """A numeric column as this request sees it."""
        col = self._cols.get(name)
        return col if col is not None else self.snapshot.num(name)

    def set_num(self, name: str, row: int, value: float) -> None:
        """Change one numeric value for this request only."""
        col = self._cols.get(name)
        if col is None:
            col = self._cols[name] = self.snapshot.num(name).copy()
        col[row] = value
        self.touched.append(row)
        self.touched_fields.append(name)

    def obj(self, name: str, row: int) -> Any:
        """A per-host object as this request sees it."""
        overrides = self._objects.get(name)
        if overrides is not None and row in overrides:
            return overrides[row]
        return self.snapshot.obj(name)[row]

    def set_obj(self, name: str, row: int, value: Any) -> None:
        """Override a per-host object for this request only."""
        self._objects.setdefault(name, {})[row] = value
        self.touched.append(row)
        self.touched_fields.append(name)

    def overridden(self, name: str) -> dict[int, Any]:
        """Rows whose per-host object ``name`` this request replaced, with the new values
        (bulk filters patch their per-snapshot caches with these; do not modify)."""
        return self._objects.get(name, {})

    # ----------------------------------------------------------------- limits
    def limits(self, row: int) -> dict[str, Any]:
        """The mutable ``limits`` dict of a row (what the Selection hands to the compute)."""
        limits = self._limits.get(row)
        if limits is None:
            limits = self._limits[row] = {}
            for name, col in self._limit_cols.items():
                value = col[row]
                if col.dtype == object:
                    if value is not None:
                        limits[name] = value
                elif not math.isnan(value):
                    limits[name] = float(value)
        return limits

    def set_limits(self, name: str, rows: np.ndarray, values: np.ndarray) -> None:
        """Set ``limits[name]`` for many rows at once (vectorized filters).

        Numbers are kept in a float column (NaN: unset); an object array of values (such
        as NUMA limits) in an object column (None: unset).
        """
        col = self._limit_cols.get(name)
        if col is None:
            if np.asarray(values).dtype == object:
                col = self._limit_cols[name] = np.full(len(self.snapshot), None, dtype=object)
            else:
                col = self._limit_cols[name] = np.full(len(self.snapshot), math.nan)
        col[rows] = values
        if self._limits:
            # Only rows whose limits dict already exists need the value copied in.
            rows = np.asarray(rows)
            known = np.fromiter(self._limits, dtype=np.int64, count=len(self._limits))
            hit = np.isin(rows, known)
            if hit.any():
                for row, value in zip(rows[hit].tolist(), np.asarray(values)[hit].tolist()):
                    self._limits[row][name] = value

    # ----------------------------------------------------------------- instances
    def instances(self, row: int) -> dict[str, Instance]:
        """Instances on the row's *service host* (every node of it reports into one set,
        as Nova's host manager keys them by ``compute.host``), including the stubs this
        request placed on any node of that host (on this node only, without
        ``share_stubs``)."""
        hosts = self.snapshot.service_hosts()
        base = hosts.instances(row)
        if not self._stubs:
            return base
        extra = self._stubs.get(hosts.code_of(row) if self.share_stubs else row)
        if not extra:
            return base
        merged = dict(base)
        merged.update(extra)
        return merged

    def add_instance(self, row: int, instance: Instance) -> None:
        """Record a stub instance on a row (server-group bookkeeping of a multi-create):
        every node of its service host sees it, as in Nova, where all of them share the
        host's instance dict (only this node, without ``share_stubs``)."""
        hosts = self.snapshot.service_hosts()
        key = hosts.code_of(row) if self.share_stubs else row
        self._stubs.setdefault(key, {})[instance.uuid] = instance
        for seen_by in hosts.rows_of(key) if self.share_stubs else (row,):
            self.touched.append(seen_by)
            self.touched_fields.append("instances")

    def extra_instances(self) -> dict[int, dict[str, Instance]]:
        """Stubs added by this request, by row: every row that sees a stub, with the
        stubs it sees (with ``share_stubs``, every node of a service host that got one)."""
        if not self._stubs or not self.share_stubs:
            return self._stubs
        hosts = self.snapshot.service_hosts()
        return {row: stubs for code, stubs in self._stubs.items()
                for row in hosts.rows_of(code)}

    # ----------------------------------------------------------------- attributes
    def attrs(self, row: int) -> dict[str, Any]:
        """Arbitrary attributes a plugin set on a HostState."""
        self.touched.append(row)
        self.touched_fields.append("*attrs")
        return self._attrs.setdefault(row, {})

    def updated(self, row: int) -> float | None:
        """The row's ``updated`` timestamp as this request sees it."""
        if row in self._updated:
            return self._updated[row]
        value = self.snapshot.num("updated")[row]
        return None if math.isnan(value) else float(value)

    def set_updated(self, row: int, value: float | None) -> None:
        """Set ``updated`` for a row (consumption sets it; a rollback clears it)."""
        self._updated[row] = value
        self.touched.append(row)
        self.touched_fields.append("updated")

    # ----------------------------------------------------------------- views
    def host_state(self, row: int) -> HostState:
        """The HostState view of a row."""
        return HostState(self, row)

    def hosts(self, rows: np.ndarray | None = None) -> Hosts:
        """The bulk view of ``rows`` (all rows by default)."""
        if rows is None:
            rows = np.arange(len(self.snapshot), dtype=np.int64)
        return Hosts(self, rows)

    # ----------------------------------------------------------------- consumption
    def consume(self, row: int, spec: RequestSpec) -> None:
        """Virtually consume a flavor on a row (reference §2.3).

        Swap is not subtracted from disk; ``num_instances`` grows by one, and
        ``num_io_ops`` too unless the working set counts placed instances as built. NUMA and PCI usage are applied when both sides have them. Any error is
        logged and swallowed, as Nova does, and then ``updated`` is left unchanged.
        """
        flavor = spec.flavor
        try:
            self.set_num("free_ram_mb", row, self.col("free_ram_mb")[row] - flavor.memory_mb)
            disk_mb = (flavor.root_gb + flavor.ephemeral_gb) * 1024
            self.set_num("free_disk_mb", row, self.col("free_disk_mb")[row] - disk_mb)
            self.set_num("vcpus_used", row, self.col("vcpus_used")[row] + flavor.vcpus)
            self.set_num("num_instances", row, self.col("num_instances")[row] + 1)
            host_numa = self.obj("numa_topology", row)
            pci_stats = self.obj("pci_stats", row)
            pci_requests = getattr(spec.pci_requests, "requests", None) or []
            # Which provider serves each request group, as claimed: PCI devices are
            # taken from the pool of the provider placement allocated from.
            mapping = spec.get_request_group_mapping()
            if host_numa is not None and spec.numa_topology is not None:
                from berth.hardware import numa

                # In Nova's order: the fit is stored on the request before its usage
                # is applied, which may still fail (and the instance count is kept).
                spec.numa_topology = numa.numa_fit_instance_to_host(
                    host_numa,
                    spec.numa_topology,
                    limits=self.limits(row).get("numa_topology"),
                    pci_requests=pci_requests or None,
                    pci_stats=pci_stats,
                    provider_mapping=mapping,
                    pack=self.pack_numa_cells,
                )
                self.set_obj("numa_topology", row, numa.numa_usage_from_instance_numa(
                    host_numa, spec.numa_topology))
            if pci_requests:
                from berth.hardware.pci import PciDeviceStats, PciRequestFailed

                # Nova's host state always has device stats: without pools, the
                # request cannot be applied and the consumption fails here.
                stats = pci_stats if pci_stats is not None else PciDeviceStats.from_pools([])
                cells = getattr(spec.numa_topology, "cells", None)
                try:
                    self.set_obj("pci_stats", row, stats.apply_requests(pci_requests, cells,
                                                                        mapping))
                except PciRequestFailed as failed:
                    # What the requests before the failed one took stays taken, as in
                    # Nova (it applies them to the host's pools in place).
                    if failed.partial is not None and pci_stats is not None:
                        self.set_obj("pci_stats", row, failed.partial)
                    raise
            # Last, as in Nova: a consumption that failed above counts no io operation.
            if self.builds_in_flight:
                self.set_num("num_io_ops", row, self.col("num_io_ops")[row] + 1)
        except Exception as exc:  # Nova swallows consumption errors; so do we, loudly.
            LOG.warning("failed to consume resources on %s: %s", self.obj("host", row), exc)
            return
        self.set_updated(row, self.now)


def _num_property(name: str, as_int: bool) -> property:
    def getter(self: HostState) -> Any:
        value = self._ws.col(name)[self._row]
        if math.isnan(value):
            return None
        return int(value) if as_int else float(value)

    def setter(self: HostState, value: Any) -> None:
        self._ws.set_num(name, self._row, math.nan if value is None else float(value))

    return property(getter, setter, doc=f"HostState.{name}")


def _obj_property(name: str) -> property:
    def getter(self: HostState) -> Any:
        return self._ws.obj(name, self._row)

    def setter(self: HostState, value: Any) -> None:
        self._ws.set_obj(name, self._row, value)

    return property(getter, setter, doc=f"HostState.{name}")


def _interned_property(name: str) -> property:
    def getter(self: HostState) -> Any:
        return self._ws.snapshot.interned_value(name, self._row)

    return property(getter, doc=f"HostState.{name}")


class HostState:
    """One compute node as Nova's ``HostState`` shows it: a view of a working-set row.

    Every field of reference §2.1 is an attribute. Numeric fields and per-host objects may
    be assigned (the change stays in the request's working set); a plugin may also set
    attributes of its own. ``now`` (Berth's addition) is the scheduling instant.
    """

    __slots__ = ("_ws", "_row")

    if TYPE_CHECKING:
        total_usable_ram_mb: int
        free_ram_mb: int
        total_usable_disk_gb: int
        disk_mb_used: int
        free_disk_mb: int
        vcpus_total: int
        vcpus_used: int
        num_instances: int
        num_io_ops: int
        failed_builds: int
        hypervisor_version: int | None
        cpu_allocation_ratio: float
        ram_allocation_ratio: float
        disk_allocation_ratio: float
        host: str
        nodename: str
        uuid: str | None
        host_ip: str | None
        hypervisor_hostname: str | None
        metrics: list[Any]
        numa_topology: Any
        pci_stats: Any
        cell_uuid: str | None
        hypervisor_type: str | None
        cpu_info: str
        stats: dict[str, Any]

    def __init__(self, ws: WorkingSet, row: int) -> None:
        object.__setattr__(self, "_ws", ws)
        object.__setattr__(self, "_row", row)

    @property
    def row(self) -> int:
        """The snapshot row this view shows."""
        return self._row

    @property
    def working_set(self) -> WorkingSet:
        """The request's working set."""
        return self._ws

    @property
    def now(self) -> float:
        """The scheduling instant (seconds since the epoch)."""
        return self._ws.now

    @property
    def supported_instances(self) -> list[list[str]]:
        """``[arch, hv_type, vm_mode]`` triples as Nova's host state holds them
        (canonicalized: ``QEMU`` is ``qemu``, see :func:`berth.model.hvspec.host_triple`);
        ``[]`` if none."""
        return [list(host_triple(t))
                for t in self._ws.snapshot.interned_value("supported_instances", self._row)]

    @property
    def aggregates(self) -> list[Aggregate]:
        """Aggregates whose hosts contain this node's service host."""
        code = int(self._ws.snapshot.codes("aggregates")[self._row])
        return self._ws.snapshot.aggregates_of_signature(code)

    @property
    def instances(self) -> dict[str, Instance]:
        """Instance uuid to Instance on this node's service host (all its nodes share
        them, as in Nova), including this request's stubs."""
        return self._ws.instances(self._row)

    @property
    def service(self) -> dict[str, Any]:
        """The service record as a dict (``disabled``, ``forced_down``, ``last_seen_up``...)."""
        record = self._ws.obj("service", self._row)
        return record.as_dict() if record is not None else {}

    @property
    def limits(self) -> dict[str, Any]:
        """Limits handed to the compute through the Selection (filters may set them)."""
        return self._ws.limits(self._row)

    @property
    def allocation_candidates(self) -> list[dict[str, Any]]:
        """Placement allocation requests for this node (``[]`` when none)."""
        if self._ws.candidates is None:
            return []
        return self._ws.candidates.get(self._row, [])

    @allocation_candidates.setter
    def allocation_candidates(self, value: list[dict[str, Any]]) -> None:
        if self._ws.candidates is None:
            self._ws.candidates = {}
        self._ws.candidates[self._row] = list(value)

    @property
    def updated(self) -> float | None:
        """When this node was last updated or consumed from."""
        return self._ws.updated(self._row)

    @updated.setter
    def updated(self, value: float | None) -> None:
        self._ws.set_updated(self._row, value)

    def consume_from_request(self, spec_obj: RequestSpec) -> None:
        """Virtually consume the request's flavor on this node (reference §2.3)."""
        self._ws.consume(self._row, spec_obj)

    def __getattr__(self, name: str) -> Any:
        attrs = self._ws._attrs.get(self._row)
        if attrs is not None and name in attrs:
            return attrs[name]
        raise AttributeError(f"HostState has no attribute {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        descriptor = getattr(type(self), name, None)
        if isinstance(descriptor, property):
            if descriptor.fset is None:
                raise AttributeError(f"HostState.{name} is read-only")
            descriptor.fset(self, value)
        else:
            self._ws.attrs(self._row)[name] = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HostState) and other._ws is self._ws and other._row == self._row

    def __hash__(self) -> int:
        return hash((id(self._ws), self._row))

    def __repr__(self) -> str:
        return (
            f"({self.host}, {self.nodename}) ram: {self.free_ram_mb}MB "
            f"disk: {self.free_disk_mb}MB io_ops: {self.num_io_ops} "
            f"instances: {self.num_instances}"
        )


for _name in INT_COLUMNS:
    setattr(HostState, _name, _num_property(_name, as_int=True))
for _name in FLOAT_COLUMNS:
    if _name != "updated":
        setattr(HostState, _name, _num_property(_name, as_int=False))
for _name in ("host", "nodename", "uuid", "host_ip", "hypervisor_hostname", "metrics",
              "numa_topology", "pci_stats"):
    setattr(HostState, _name, _obj_property(_name))
for _name in ("cell_uuid", "hypervisor_type", "cpu_info", "stats"):
    setattr(HostState, _name, _interned_property(_name))


def unique_codes(codes: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(codes, return_inverse=True)`` for codes in ``[0, size)``, in O(n):
    a presence table instead of a sort (the same arrays, dtypes included)."""
    present = np.zeros(size, dtype=bool)
    present[codes] = True
    unique = np.flatnonzero(present)
    position = np.zeros(size, dtype=np.intp)
    position[unique] = np.arange(len(unique), dtype=np.intp)
    return unique.astype(codes.dtype), position[codes]


class Hosts:
    """The hosts in play for one filter or weigher call: a working set and its rows.

    Built-in filters evaluate ``Hosts`` at once: numeric columns through :meth:`col`,
    interned columns once per distinct value through :meth:`signatures`.
    """

    __slots__ = ("ws", "rows", "_codes", "_signatures")

    def __init__(self, ws: WorkingSet, rows: np.ndarray) -> None:
        self.ws = ws
        self.rows = rows
        # Interned codes never change during a request; weighers ask for the same ones
        # many times (every aggregate-overridable multiplier reads "aggregates").
        self._codes: dict[str, np.ndarray] = {}
        self._signatures: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def snapshot(self) -> HostSnapshot:
        """The underlying snapshot."""
        return self.ws.snapshot

    def col(self, name: str) -> np.ndarray:
        """A numeric column restricted to these rows."""
        return self.ws.col(name)[self.rows]

    def codes(self, name: str) -> np.ndarray:
        """An interned column's codes restricted to these rows (do not write to it)."""
        codes = self._codes.get(name)
        if codes is None:
            codes = self._codes[name] = self.ws.snapshot.codes(name)[self.rows]
            codes.flags.writeable = False  # shared by every caller: fail loudly on writes
        return codes

    def signatures(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Distinct codes of an interned column among these rows, and each row's position
        in that list (``unique, inverse``): evaluate once per unique code, then
        ``result[inverse]`` spreads it back to the rows."""
        cached = self._signatures.get(name)
        if cached is None:
            cached = self._signatures[name] = unique_codes(
                self.codes(name), len(self.ws.snapshot.table(name)))
            for array in cached:
                array.flags.writeable = False
        return cached

    def objects(self, name: str) -> list[Any]:
        """A per-host object column for these rows (request overrides applied)."""
        return [self.ws.obj(name, int(row)) for row in self.rows]

    def states(self) -> Iterator[HostState]:
        """HostState views of these rows, in order."""
        ws = self.ws
        for row in self.rows.tolist():
            yield HostState(ws, row)

    def subset(self, mask: np.ndarray) -> Hosts:
        """The hosts where ``mask`` is True, order kept."""
        return Hosts(self.ws, self.rows[mask])
