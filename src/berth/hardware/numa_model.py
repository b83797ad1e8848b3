"""NUMA topologies: constants, CPU specs, and the host and instance models (see
:mod:`berth.hardware.numa`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from berth.errors import SchedulingError

if TYPE_CHECKING:
    pass

# -------------------------------------------------------------------------- constants
SHARED, DEDICATED, MIXED = "shared", "dedicated", "mixed"
CPU_POLICIES = (SHARED, DEDICATED, MIXED)
PREFER, ISOLATE, REQUIRE = "prefer", "isolate", "require"
THREAD_POLICIES = (PREFER, ISOLATE, REQUIRE)
EMULATOR_SHARE, EMULATOR_ISOLATE = "share", "isolate"
EMULATOR_POLICIES = (EMULATOR_SHARE, EMULATOR_ISOLATE)

#: Page size requests that are not an explicit size (Nova's constants).
MEMPAGES_SMALL = -1
MEMPAGES_LARGE = -2
MEMPAGES_ANY = -3

#: CPU policies that pin instance CPUs to host CPUs.
PINNING_POLICIES = (DEDICATED, MIXED)


class NUMAUsageError(SchedulingError):
    """Consumption would pin a CPU that is unknown or already pinned on the host cell."""

    code = "berth.scheduling.numa_usage"


# -------------------------------------------------------------------------- CPU specs
#: One past the highest CPU number a host can have (Linux's NR_CPUS is at most 8,192;
#: the bound keeps a typo such as "0-99999999" from building a set of 100 million).
MAX_CPUS = 65536


def parse_cpu_spec(spec: str) -> set[int]:
    """``"0-3,^2,8"`` -> ``{0, 1, 3, 8}``: ranges and single CPUs, ``^N`` excludes.

    Raises ValueError naming the bad token.
    """
    included: set[int] = set()
    excluded: set[int] = set()
    for raw in str(spec).split(","):
        token = raw.strip()
        if not token:
            continue
        target = included
        if token.startswith("^"):
            target, token = excluded, token[1:].strip()
        if "-" in token:
            start_text, _, end_text = token.partition("-")
            try:
                start, end = int(start_text), int(end_text)
            except ValueError:
                raise ValueError(f"invalid CPU range {raw.strip()!r}") from None
            if start < 0 or end < start:
                raise ValueError(f"invalid CPU range {raw.strip()!r}")
            if end >= MAX_CPUS:
                raise ValueError(f"CPU range {raw.strip()!r} goes past CPU {MAX_CPUS - 1}")
            target.update(range(start, end + 1))
        else:
            try:
                cpu = int(token)
            except ValueError:
                raise ValueError(f"invalid CPU number {raw.strip()!r}") from None
            if cpu < 0:
                raise ValueError(f"invalid CPU number {raw.strip()!r}")
            if cpu >= MAX_CPUS:
                raise ValueError(f"CPU number {raw.strip()!r} is past CPU {MAX_CPUS - 1}")
            target.add(cpu)
    return included - excluded


def format_cpu_spec(cpus: Iterable[int]) -> str:
    """``{0, 1, 2, 5}`` -> ``"0-2,5"`` (the inverse of :func:`parse_cpu_spec`)."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


# -------------------------------------------------------------------------- host model
@dataclass(frozen=True)
class NUMAPagesTopology:
    """One page size of a host cell: ``total``, ``used`` and ``reserved`` pages of
    ``size_kb`` KiB each."""

    size_kb: int
    total: int
    used: int = 0
    reserved: int = 0

    @property
    def free(self) -> int:
        """Pages neither used nor reserved."""
        return self.total - self.used - self.reserved

    @property
    def free_kb(self) -> int:
        """Free memory in KiB."""
        return self.free * self.size_kb

    @property
    def total_kb(self) -> int:
        """All memory of this page size in KiB (overcommit checks use it)."""
        return self.total * self.size_kb


@dataclass(frozen=True)
class CellNetworkMetadata:
    """Networks a host cell has NUMA affinity to: physnet names and tunnelled networks."""

    physnets: frozenset[str] = frozenset()
    tunneled: bool = False


@dataclass(frozen=True)
class NUMACell:
    """One host NUMA cell (Nova's ``NUMACell``); ``memory`` and ``memory_usage`` in MB.

    ``cpuset`` holds the CPUs for shared (floating) instances, ``pcpuset`` those for
    pinned ones; ``siblings`` are the thread sibling sets (empty means no SMT: every CPU
    is its own core).
    """

    id: int
    cpuset: frozenset[int] = frozenset()
    pcpuset: frozenset[int] = frozenset()
    siblings: tuple[frozenset[int], ...] = ()
    memory: int = 0
    cpu_usage: int = 0
    memory_usage: int = 0
    pinned_cpus: frozenset[int] = frozenset()
    mempages: tuple[NUMAPagesTopology, ...] = ()
    socket: int | None = None
    network_metadata: CellNetworkMetadata | None = None

    @property
    def free_pcpus(self) -> frozenset[int]:
        """Dedicated CPUs not pinned yet."""
        return self.pcpuset - self.pinned_cpus

    @property
    def avail_pcpus(self) -> int:
        """How many dedicated CPUs are free."""
        return len(self.free_pcpus)

    @property
    def avail_cpus(self) -> int:
        """Shared CPUs minus their usage."""
        return len(self.cpuset) - self.cpu_usage

    @property
    def avail_memory(self) -> int:
        """Memory (MB) not used by instances."""
        return self.memory - self.memory_usage

    @property
    def has_threads(self) -> bool:
        """True when a sibling set has more than one thread (SMT)."""
        return any(len(s) > 1 for s in self.siblings)

    @property
    def free_siblings(self) -> list[set[int]]:
        """Each sibling set restricted to the free dedicated CPUs (singletons without SMT)."""
        free = self.free_pcpus
        if not self.siblings:
            return [{cpu} for cpu in sorted(free)]
        return [set(s & free) for s in self.siblings]

    def can_fit_pagesize(self, pagesize: int, memory_kb: int, use_free: bool = True) -> bool | None:
        """Whether ``memory_kb`` fits in pages of ``pagesize`` KiB (None: no such size)."""
        for pages in self.mempages:
            if pages.size_kb == pagesize:
                avail = pages.free_kb if use_free else pages.total_kb
                return memory_kb <= avail and memory_kb % pages.size_kb == 0
        return None


@dataclass(frozen=True)
class NUMATopology:
    """A host's NUMA cells (Nova's ``NUMATopology``); falsy when it has no cell.

    Dict form (:meth:`from_dict` / :meth:`to_dict`, used by the offline cloud file)::

        {"cells": [
          {"id": 0,
           "cpuset": "0-3",             # shared CPUs: a CPU spec string or a list of ints
           "pcpuset": [4, 5, 6, 7],     # dedicated CPUs (same forms); default: none
           "siblings": [[4, 6], [5, 7]],# thread siblings; default: none (no SMT)
           "memory": 65536,             # MB
           "cpu_usage": 0,              # shared CPUs in use (default 0)
           "memory_usage": 0,           # MB in use (default 0)
           "pinned_cpus": [],           # dedicated CPUs already pinned (default none)
           "socket": 0,                 # physical socket (the PCI socket policy needs it)
           "mempages": [{"size_kb": 4, "total": 16777216, "used": 0, "reserved": 0},
                        {"size_kb": 2048, "total": 1024}],
           "network_metadata": {"physnets": ["physnet0"], "tunneled": false}}]}

    Only ``id`` and ``memory`` are required per cell. Malformed values raise ValueError
    (or TypeError) whose message names the field, e.g. ``cells[1].memory: ...``.
    """

    cells: tuple[NUMACell, ...] = ()

    def __len__(self) -> int:
        return len(self.cells)

    def __hash__(self) -> int:
        return self._hash

    @cached_property
    def _hash(self) -> int:
        return hash(self.cells)

    @property
    def has_threads(self) -> bool:
        """True when some cell has a sibling set larger than one thread."""
        return any(cell.has_threads for cell in self.cells)

    def cell(self, cell_id: int) -> NUMACell | None:
        """The cell with ``id`` == ``cell_id``, or None."""
        for c in self.cells:
            if c.id == cell_id:
                return c
        return None

    # ---------------------------------------------------------------- dict form
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NUMATopology:
        """Build from the dict form described in the class docstring."""
        if not isinstance(data, Mapping):
            raise TypeError(f"expected a mapping with 'cells', got {type(data).__name__}")
        unknown = set(data) - {"cells"}
        if unknown:
            raise ValueError(f"unknown key(s) {', '.join(sorted(map(str, unknown)))}; expected 'cells'")
        cells_data = data.get("cells")
        if not isinstance(cells_data, list):
            raise TypeError("cells: expected a list of cells")
        cells = tuple(_cell_from_dict(c, f"cells[{i}]") for i, c in enumerate(cells_data))
        ids = [c.id for c in cells]
        if len(set(ids)) != len(ids):
            raise ValueError(f"cells: duplicate cell ids {ids}")
        return cls(cells)

    def to_dict(self) -> dict[str, Any]:
        """The dict form (CPU sets as sorted lists)."""
        return {"cells": [_cell_to_dict(c) for c in self.cells]}


_CELL_KEYS = {"id", "cpuset", "pcpuset", "siblings", "memory", "cpu_usage", "memory_usage",
              "pinned_cpus", "socket", "mempages", "network_metadata"}


def _int_field(data: Mapping[str, Any], key: str, where: str, default: int | None = None) -> int:
    if key not in data or data[key] is None:
        if default is None:
            raise ValueError(f"{where}.{key}: required")
        return default
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{where}.{key}: expected an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{where}.{key}: must be >= 0, got {value}")
    return value


def _cpus_field(data: Mapping[str, Any], key: str, where: str) -> frozenset[int]:
    value = data.get(key)
    if value is None:
        return frozenset()
    if isinstance(value, str):
        try:
            return frozenset(parse_cpu_spec(value))
        except ValueError as exc:
            raise ValueError(f"{where}.{key}: {exc}") from None
    if isinstance(value, (list, tuple, set, frozenset)):
        cpus: set[int] = set()
        for cpu in value:
            if isinstance(cpu, bool) or not isinstance(cpu, int) or cpu < 0:
                raise TypeError(f"{where}.{key}: expected CPU numbers, got {cpu!r}")
            cpus.add(cpu)
        return frozenset(cpus)
    raise TypeError(f"{where}.{key}: expected a CPU list or a spec like '0-3,8', got {value!r}")


def _cell_from_dict(data: Any, where: str) -> NUMACell:
    if not isinstance(data, Mapping):
        raise TypeError(f"{where}: expected a mapping, got {data!r}")
    unknown = set(data) - _CELL_KEYS
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))}")
    cpuset = _cpus_field(data, "cpuset", where)
    pcpuset = _cpus_field(data, "pcpuset", where)
    siblings_data = data.get("siblings") or []
    if not isinstance(siblings_data, list):
        raise TypeError(f"{where}.siblings: expected a list of CPU lists")
    siblings = tuple(
        _cpus_field({"s": s}, "s", f"{where}.siblings[{i}]") for i, s in enumerate(siblings_data)
    )
    pinned = _cpus_field(data, "pinned_cpus", where)
    if not pinned <= pcpuset:
        raise ValueError(f"{where}.pinned_cpus: {sorted(pinned - pcpuset)} not in pcpuset")
    pages_data = data.get("mempages") or []
    if not isinstance(pages_data, list):
        raise TypeError(f"{where}.mempages: expected a list")
    pages = []
    for i, p in enumerate(pages_data):
        pw = f"{where}.mempages[{i}]"
        if not isinstance(p, Mapping):
            raise TypeError(f"{pw}: expected a mapping, got {p!r}")
        extra = set(p) - {"size_kb", "total", "used", "reserved"}
        if extra:
            raise ValueError(f"{pw}: unknown key(s) {', '.join(sorted(map(str, extra)))}")
        size = _int_field(p, "size_kb", pw)
        if size == 0:
            raise ValueError(f"{pw}.size_kb: must be > 0")
        pages.append(NUMAPagesTopology(size, _int_field(p, "total", pw),
                                       _int_field(p, "used", pw, 0), _int_field(p, "reserved", pw, 0)))
    net = None
    net_data = data.get("network_metadata")
    if net_data is not None:
        nw = f"{where}.network_metadata"
        if not isinstance(net_data, Mapping):
            raise TypeError(f"{nw}: expected a mapping")
        physnets = net_data.get("physnets") or []
        if not isinstance(physnets, list) or not all(isinstance(p, str) for p in physnets):
            raise TypeError(f"{nw}.physnets: expected a list of names")
        tunneled = net_data.get("tunneled", False)
        if not isinstance(tunneled, bool):
            raise TypeError(f"{nw}.tunneled: expected true or false, got {tunneled!r}")
        net = CellNetworkMetadata(frozenset(physnets), tunneled)
    socket = data.get("socket")
    if socket is not None and (isinstance(socket, bool) or not isinstance(socket, int)):
        raise TypeError(f"{where}.socket: expected an integer, got {socket!r}")
    return NUMACell(
        id=_int_field(data, "id", where),
        cpuset=cpuset,
        pcpuset=pcpuset,
        siblings=siblings,
        memory=_int_field(data, "memory", where),
        cpu_usage=_int_field(data, "cpu_usage", where, 0),
        memory_usage=_int_field(data, "memory_usage", where, 0),
        pinned_cpus=pinned,
        mempages=tuple(pages),
        socket=socket,
        network_metadata=net,
    )


def _cell_to_dict(cell: NUMACell) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": cell.id,
        "cpuset": sorted(cell.cpuset),
        "pcpuset": sorted(cell.pcpuset),
        "siblings": [sorted(s) for s in cell.siblings],
        "memory": cell.memory,
        "cpu_usage": cell.cpu_usage,
        "memory_usage": cell.memory_usage,
        "pinned_cpus": sorted(cell.pinned_cpus),
        "mempages": [dataclasses.asdict(p) for p in cell.mempages],
    }
    if cell.socket is not None:
        out["socket"] = cell.socket
    if cell.network_metadata is not None:
        out["network_metadata"] = {"physnets": sorted(cell.network_metadata.physnets),
                                   "tunneled": cell.network_metadata.tunneled}
    return out


# -------------------------------------------------------------------------- instance model
@dataclass
class InstanceNUMACell:
    """One guest NUMA cell: shared ``cpuset``, dedicated ``pcpuset``, ``memory`` (MB).

    After fitting, ``id`` is the host cell's id, ``cpu_pinning`` maps guest vCPU to host
    pCPU, ``cpuset_reserved`` holds the pCPU set aside for emulator threads, and
    ``pagesize`` is the page size (KiB) chosen when one was requested.
    """

    id: int
    cpuset: set[int] = field(default_factory=set)
    pcpuset: set[int] = field(default_factory=set)
    memory: int = 0
    pagesize: int | None = None
    cpu_policy: str | None = None
    cpu_thread_policy: str | None = None
    cpu_pinning: dict[int, int] = field(default_factory=dict)
    cpuset_reserved: set[int] | None = None

    def __len__(self) -> int:
        return len(self.cpuset) + len(self.pcpuset)

    def copy(self) -> InstanceNUMACell:
        """A deep enough copy (sets and dicts are new)."""
        return dataclasses.replace(
            self, cpuset=set(self.cpuset), pcpuset=set(self.pcpuset),
            cpu_pinning=dict(self.cpu_pinning),
            cpuset_reserved=None if self.cpuset_reserved is None else set(self.cpuset_reserved),
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {
            "id": self.id, "cpuset": sorted(self.cpuset), "pcpuset": sorted(self.pcpuset),
            "memory": self.memory, "pagesize": self.pagesize, "cpu_policy": self.cpu_policy,
            "cpu_thread_policy": self.cpu_thread_policy,
            "cpu_pinning": {str(k): v for k, v in sorted(self.cpu_pinning.items())},
            "cpuset_reserved": None if self.cpuset_reserved is None else sorted(self.cpuset_reserved),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InstanceNUMACell:
        """The inverse of :meth:`to_dict`."""
        reserved = data.get("cpuset_reserved")
        return cls(id=int(data["id"]), cpuset=set(data.get("cpuset") or ()),
                   pcpuset=set(data.get("pcpuset") or ()), memory=int(data.get("memory") or 0),
                   pagesize=data.get("pagesize"), cpu_policy=data.get("cpu_policy"),
                   cpu_thread_policy=data.get("cpu_thread_policy"),
                   cpu_pinning={int(k): int(v) for k, v in (data.get("cpu_pinning") or {}).items()},
                   cpuset_reserved=None if reserved is None else set(reserved))


@dataclass
class InstanceNUMATopology:
    """A guest's NUMA cells and its emulator threads policy; falsy without cells."""

    cells: list[InstanceNUMACell] = field(default_factory=list)
    emulator_threads_policy: str | None = None

    def __len__(self) -> int:
        return len(self.cells)

    @property
    def emulator_threads_isolated(self) -> bool:
        """True when emulator threads need their own pCPU."""
        return self.emulator_threads_policy == EMULATOR_ISOLATE

    @property
    def cpu_pinning_requested(self) -> bool:
        """True for dedicated or mixed instances."""
        return bool(self.cells) and self.cells[0].cpu_policy in PINNING_POLICIES

    def copy(self) -> InstanceNUMATopology:
        """A copy whose cells can be changed without touching this one."""
        return InstanceNUMATopology([c.copy() for c in self.cells], self.emulator_threads_policy)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {"cells": [c.to_dict() for c in self.cells],
                "emulator_threads_policy": self.emulator_threads_policy}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InstanceNUMATopology:
        """The inverse of :meth:`to_dict`."""
        return cls([InstanceNUMACell.from_dict(c) for c in data.get("cells") or ()],
                   data.get("emulator_threads_policy"))


@dataclass(frozen=True)
class NUMATopologyLimits:
    """Oversubscription limits for shared instances (Nova's ``NUMATopologyLimits``).

    ``network_metadata`` (a request's physnets/tunnelling) rides along as in Nova.
    ``pack`` is Berth's: the ``packing_host_numa_cells_allocation_strategy`` value the
    filter used, so that consumption orders cells the same way without a global.
    """

    cpu_allocation_ratio: float | None
    ram_allocation_ratio: float | None
    network_metadata: Any = None
    pack: bool = False

    def to_dict(self) -> dict[str, Any]:
        """What the Selection hands to the compute (as Nova's object fields)."""
        out: dict[str, Any] = {"cpu_allocation_ratio": self.cpu_allocation_ratio,
                               "ram_allocation_ratio": self.ram_allocation_ratio}
        net = self.network_metadata
        if net is not None:
            out["network_metadata"] = {"physnets": sorted(getattr(net, "physnets", ()) or ()),
                                       "tunneled": bool(getattr(net, "tunneled", False))}
        return out


