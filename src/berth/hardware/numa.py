"""NUMA topologies: the host model, request parsing, fitting and consumption.

Host side (immutable values, hashable, so equal topologies share one evaluation):

* :class:`NUMAPagesTopology` — one memory page size of a cell (``size_kb``, ``total``,
  ``used``, ``reserved`` pages);
* :class:`NUMACell` — ``id``, ``cpuset`` (shared CPUs), ``pcpuset`` (dedicated CPUs),
  ``siblings`` (thread sibling sets), ``memory`` (MB), ``cpu_usage``, ``memory_usage``
  (MB), ``pinned_cpus``, ``mempages``, ``socket`` and ``network_metadata``;
* :class:`NUMATopology` — the cells of a host, with the documented dict form of
  :meth:`NUMATopology.from_dict`.

Instance side (mutable, fitting returns fresh copies): :class:`InstanceNUMACell` and
:class:`InstanceNUMATopology`.

Functions, with Nova 34's semantics (reference §3.18, §2.3):

* :func:`numa_topology_from_request` — flavor ``hw:*`` extra specs and image ``hw_*``
  properties to an InstanceNUMATopology (or None), with Nova's precedence and conflicts;
* :func:`numa_fit_instance_to_host` — place the instance cells on host cells (cell
  ordering, permutations, page sizes, CPU pinning with thread policies, oversubscription
  limits, emulator threads, PCI and network affinity);
* :func:`numa_usage_from_instance_numa` and :func:`consume` — the host topology after the
  instance is placed (pinned CPUs, memory, CPU usage, huge pages);
* :func:`prepare_request` — fill ``spec.numa_topology`` and ``spec.pci_requests``.

The core reads no globals: ``[compute] packing_host_numa_cells_allocation_strategy`` is
passed in explicitly (``pack=``), and travels to consumption inside
:class:`NUMATopologyLimits`, which the filter stores in ``host_state.limits``.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from berth.errors import ExtraSpecError, ImagePropertyError, SchedulingError

if TYPE_CHECKING:
    from berth.hardware.pci import InstancePCIRequest, PciDeviceStats

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
_PAGESIZE_WORDS = {"small": MEMPAGES_SMALL, "large": MEMPAGES_LARGE, "any": MEMPAGES_ANY}
#: Byte multipliers of oslo's IEC units (``2MB`` and ``2MiB`` are both 2 * 1024**2 bytes).
_UNIT_BYTES = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_SIZE_RE = re.compile(r"^(\d*\.?\d+)([KMGT]i?)?(b|bit|B)$")

_PINNING_POLICIES = (DEDICATED, MIXED)


class NUMAUsageError(SchedulingError):
    """Consumption would pin a CPU that is unknown or already pinned on the host cell."""

    code = "berth.scheduling.numa_usage"


# -------------------------------------------------------------------------- CPU specs
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
            target.update(range(start, end + 1))
        else:
            try:
                cpu = int(token)
            except ValueError:
                raise ValueError(f"invalid CPU number {raw.strip()!r}") from None
            if cpu < 0:
                raise ValueError(f"invalid CPU number {raw.strip()!r}")
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
        return bool(self.cells) and self.cells[0].cpu_policy in _PINNING_POLICIES

    def copy(self) -> InstanceNUMATopology:
        """A copy whose cells can be changed without touching this one."""
        return InstanceNUMATopology([c.copy() for c in self.cells], self.emulator_threads_policy)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {"cells": [c.to_dict() for c in self.cells],
                "emulator_threads_policy": self.emulator_threads_policy}


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


# -------------------------------------------------------------------------- request parsing
def _image_get(image_props: Any, name: str) -> Any:
    if image_props is None:
        return None
    getter = getattr(image_props, "get", None)
    return getter(name) if getter is not None else None


def _image_raw(image_props: Any) -> Mapping[str, Any]:
    raw = getattr(image_props, "raw", None)
    if isinstance(raw, Mapping):
        return raw
    return image_props if isinstance(image_props, Mapping) else {}


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return str(value).strip()


def _bad(key: str, value: Any, problem: str) -> ExtraSpecError | ImagePropertyError:
    """The error of the request's side that ``key`` names: a flavor extra spec
    (``hw:...``, ``resources:...``, ``trait:...``) or an image property (``hw_...``)."""
    if ":" not in key:
        return ImagePropertyError(key, value, problem)
    return ExtraSpecError(f"{key}={value!r}: {problem}", key=key, value=value)


def _choice(key: str, value: str | None, allowed: Sequence[str]) -> str | None:
    if value is None or value == "":
        return None
    if value not in allowed:
        raise _bad(key, value, f"must be one of {', '.join(allowed)}")
    return value


def _cpu_policy(specs: Mapping[str, str], image_props: Any) -> str | None:
    flavor = _choice("hw:cpu_policy", _text(specs.get("hw:cpu_policy")), CPU_POLICIES)
    image = _choice("hw_cpu_policy", _text(_image_get(image_props, "hw_cpu_policy")), CPU_POLICIES)
    if flavor == DEDICATED:
        return flavor
    if flavor == MIXED:
        if image == DEDICATED:
            raise _bad("hw_cpu_policy", image, "the image may not ask for dedicated CPUs "
                       "when the flavor's hw:cpu_policy is mixed")
        return flavor
    if flavor == SHARED:
        if image in _PINNING_POLICIES:
            raise _bad("hw_cpu_policy", image, "the image may not ask for pinned CPUs "
                       "when the flavor's hw:cpu_policy is shared")
        return flavor
    return image


def _thread_policy(specs: Mapping[str, str], image_props: Any) -> str | None:
    flavor = _choice("hw:cpu_thread_policy", _text(specs.get("hw:cpu_thread_policy")), THREAD_POLICIES)
    image = _choice("hw_cpu_thread_policy", _text(_image_get(image_props, "hw_cpu_thread_policy")),
                    THREAD_POLICIES)
    if flavor in (None, PREFER):
        return flavor or image
    if image and image != flavor:
        raise _bad("hw_cpu_thread_policy", image,
                   f"conflicts with the flavor's hw:cpu_thread_policy={flavor}")
    return flavor


def _emulator_policy(specs: Mapping[str, str]) -> str | None:
    # Nova reads the emulator threads policy from the flavor only.
    return _choice("hw:emulator_threads_policy", _text(specs.get("hw:emulator_threads_policy")),
                   EMULATOR_POLICIES)


_TRUE_WORDS = frozenset({"1", "t", "true", "on", "y", "yes"})
_RESOURCE_VCPU_RE = re.compile(r"resources([1-9][0-9]*)?:VCPU")
_RESOURCE_PCPU_RE = re.compile(r"resources([1-9][0-9]*)?:PCPU")
_HT_TRAIT_RE = re.compile(r"trait([1-9][0-9]*)?:HW_CPU_HYPERTHREADING")


def _explicit_cpu_resources(specs: Mapping[str, str]) -> tuple[int, int]:
    """``resources[N]:VCPU`` and ``resources[N]:PCPU`` totals (non-numbers are ignored
    here, as Nova leaves them to the placement request parser)."""
    vcpu = pcpu = 0
    for key, value in specs.items():
        for pattern, is_pcpu in ((_RESOURCE_VCPU_RE, False), (_RESOURCE_PCPU_RE, True)):
            if pattern.match(key):
                try:
                    amount = int(value)
                except (TypeError, ValueError):
                    continue
                if is_pcpu:
                    pcpu += amount
                else:
                    vcpu += amount
    return vcpu, pcpu


def _hyperthreading_trait(specs: Mapping[str, str], image_props: Any) -> str | None:
    for key, value in specs.items():
        if _HT_TRAIT_RE.match(key):
            return value
    required = _image_get(image_props, "traits_required") or []
    if "HW_CPU_HYPERTHREADING" in required:
        return "required"
    return None


def _realtime_cpus(specs: Mapping[str, str], image_props: Any, vcpus: int,
                   emulator_policy: str | None) -> set[int] | None:
    if str(specs.get("hw:cpu_realtime", "")).strip().lower() not in _TRUE_WORDS:
        return None
    image_mask = _text(_image_get(image_props, "hw_cpu_realtime_mask"))
    flavor_mask = _text(specs.get("hw:cpu_realtime_mask"))
    # The image's mask is more specific and wins.
    key, mask = ("hw_cpu_realtime_mask", image_mask) if image_mask else (
        "hw:cpu_realtime_mask", flavor_mask)
    everything = set(range(vcpus))
    if mask:
        try:
            rt = parse_cpu_spec(f"0-{vcpus - 1},{mask}" if mask.startswith("^") else mask)
        except ValueError as exc:
            raise _bad(key, mask, str(exc)) from None
    else:
        rt = set(everything)
    if not rt:
        raise _bad(key, mask, "the realtime mask leaves no realtime vCPU")
    if rt == everything and not emulator_policy:
        raise _bad(key, mask, "every vCPU is realtime: leave one out or set "
                   "hw:emulator_threads_policy")
    if not rt <= everything:
        raise _bad(key, mask, f"vCPUs {format_cpu_spec(rt - everything)} are outside the "
                   f"flavor's {vcpus} vCPUs")
    return rt


def _parse_pagesize(key: str, value: str) -> int:
    """Nova's page size forms: ``small``/``large``/``any``, KiB digits, or a size with an
    IEC unit as oslo parses it (``2MB``, ``1GiB``; ``b``/``bit`` count bits)."""
    if value in _PAGESIZE_WORDS:
        return _PAGESIZE_WORDS[value]
    if value.isdigit():
        size_kb = float(int(value))
    else:
        m = _SIZE_RE.match(value)
        if not m:
            raise _bad(key, value, "expected small, large, any, a size in KiB or a size "
                       "with a unit such as 2MB or 1GiB")
        size_bytes = float(m.group(1)) * _UNIT_BYTES[(m.group(2) or "")[:1]]
        if m.group(3) != "B":
            size_bytes /= 8
        size_kb = float(math.ceil(size_bytes)) / 1024
    if size_kb <= 0 or not size_kb.is_integer():
        raise _bad(key, value, "page size must be a positive whole number of KiB")
    return int(size_kb)


def _pagesize(specs: Mapping[str, str], image_props: Any) -> int | None:
    flavor = _text(specs.get("hw:mem_page_size")) or None
    image = _text(_image_get(image_props, "hw_mem_page_size")) or None
    if not flavor:
        if image:
            raise _bad("hw_mem_page_size", image,
                       "the image may set a page size only when the flavor's "
                       "hw:mem_page_size is large or any")
        return None
    size = _parse_pagesize("hw:mem_page_size", flavor)
    if image:
        if size in (MEMPAGES_ANY, MEMPAGES_LARGE):
            return _parse_pagesize("hw_mem_page_size", image)
        raise _bad("hw_mem_page_size", image,
                   f"forbidden with the flavor's hw:mem_page_size={flavor}")
    return size


def _numa_nodes(specs: Mapping[str, str], image_props: Any) -> int | None:
    flavor = _text(specs.get("hw:numa_nodes")) or None
    image_value = _image_get(image_props, "hw_numa_nodes")
    image = _text(image_value) or None
    if flavor and image:
        raise _bad("hw_numa_nodes", image, "the image may not set hw_numa_nodes when the "
                   "flavor sets hw:numa_nodes")
    key = "hw:numa_nodes" if flavor else "hw_numa_nodes"
    value = flavor or image
    if value is None:
        return None
    try:
        nodes = int(value)
    except ValueError:
        raise _bad(key, value, "must be an integer >= 1") from None
    if nodes < 1:
        raise _bad(key, value, "must be an integer >= 1")
    return nodes


def _flavor_node_list(specs: Mapping[str, str], prop: str) -> list[str] | None:
    values: list[str] = []
    while f"hw:numa_{prop}.{len(values)}" in specs:
        values.append(specs[f"hw:numa_{prop}.{len(values)}"])
    return values or None


def _image_node_list(image_props: Any, prop: str) -> list[Any] | None:
    whole = _image_get(image_props, f"hw_numa_{prop}")
    if isinstance(whole, (list, tuple)) and whole:
        return list(whole)
    raw = _image_raw(image_props)
    values: list[Any] = []
    while f"hw_numa_{prop}.{len(values)}" in raw:
        values.append(raw[f"hw_numa_{prop}.{len(values)}"])
    return values or None


def _node_cpus(specs: Mapping[str, str], image_props: Any) -> list[set[int]] | None:
    flavor = _flavor_node_list(specs, "cpus")
    image = _image_node_list(image_props, "cpus")
    if flavor is not None and image is not None:
        raise _bad("hw_numa_cpus.0", image[0], "the image may not set hw_numa_cpus.N when "
                   "the flavor sets hw:numa_cpus.N")
    values, prefix = (flavor, "hw:numa_cpus") if flavor is not None else (image, "hw_numa_cpus")
    if values is None:
        return None
    out = []
    for i, value in enumerate(values):
        if isinstance(value, (set, frozenset, list, tuple)):
            out.append({int(v) for v in value})
            continue
        try:
            out.append(parse_cpu_spec(str(value)))
        except ValueError as exc:
            raise _bad(f"{prefix}.{i}", value, str(exc)) from None
    return out


def _node_mem(specs: Mapping[str, str], image_props: Any) -> list[int] | None:
    flavor = _flavor_node_list(specs, "mem")
    image = _image_node_list(image_props, "mem")
    if flavor is not None and image is not None:
        raise _bad("hw_numa_mem.0", image[0], "the image may not set hw_numa_mem.N when the "
                   "flavor sets hw:numa_mem.N")
    values, prefix = (flavor, "hw:numa_mem") if flavor is not None else (image, "hw_numa_mem")
    if values is None:
        return None
    out = []
    for i, value in enumerate(values):
        try:
            mem = int(str(value).strip())
        except ValueError:
            raise _bad(f"{prefix}.{i}", value, "must be an integer number of MB") from None
        if mem < 0:
            raise _bad(f"{prefix}.{i}", value, "must be >= 0")
        out.append(mem)
    return out


def _dedicated_mask(specs: Mapping[str, str], vcpus: int) -> set[int] | None:
    mask = _text(specs.get("hw:cpu_dedicated_mask"))
    if not mask:
        return None
    try:
        if mask.startswith("^"):
            pcpus = parse_cpu_spec(f"0-{vcpus - 1},{mask}") if vcpus > 0 else set()
        else:
            pcpus = parse_cpu_spec(mask)
    except ValueError as exc:
        raise _bad("hw:cpu_dedicated_mask", mask, str(exc)) from None
    cpus = set(range(vcpus))
    if not pcpus <= cpus:
        raise _bad("hw:cpu_dedicated_mask", mask, f"CPUs {format_cpu_spec(pcpus - cpus)} are "
                   f"outside the flavor's {vcpus} vCPUs")
    if not pcpus or not (cpus - pcpus):
        raise _bad("hw:cpu_dedicated_mask", mask, "a mixed instance needs at least one "
                   "dedicated and one shared vCPU")
    return pcpus


def vpmem_labels(specs: Mapping[str, str]) -> list[str]:
    """The virtual persistent memory labels of ``hw:pmem`` (comma-separated; blanks
    dropped), one per namespace, in order (Nova's ``get_vpmems``)."""
    return [label.strip() for label in str(specs.get("hw:pmem") or "").split(",") if label.strip()]


@dataclass(frozen=True)
class CPUConstraints:
    """A flavor's and image's CPU constraints, each read as Nova's ``hardware`` getters
    read it: policy, thread policy (flavor and image, conflicts raise), emulator threads
    policy (flavor only), the dedicated mask (flavor only) and the realtime vCPUs (only
    with ``hw:cpu_realtime``; the image's mask wins over the flavor's). The checks
    between them are :func:`numa_topology_from_request`'s.
    """

    policy: str | None
    thread_policy: str | None
    emulator_policy: str | None
    dedicated: frozenset[int] | None
    realtime: frozenset[int] | None
    #: The ``hw:cpu_dedicated_mask`` text, for error messages.
    dedicated_mask: str | None = None

    def mixed_dedicated(self) -> set[int]:
        """The pinned vCPUs of a ``mixed`` instance: the dedicated mask or, failing that,
        the realtime vCPUs. Both, or neither, raise ExtraSpecError."""
        if self.realtime and self.dedicated:
            raise _bad("hw:cpu_dedicated_mask", self.dedicated_mask,
                       "a mixed instance takes its dedicated vCPUs from hw:cpu_dedicated_mask "
                       "or from a realtime mask, not both")
        if not (self.realtime or self.dedicated):
            raise _bad("hw:cpu_policy", MIXED, "a mixed instance needs hw:cpu_dedicated_mask "
                       "(or hw:cpu_realtime with a mask)")
        return set(self.dedicated or self.realtime or ())


def cpu_constraints(flavor: Any, image_props: Any) -> CPUConstraints:
    """The :class:`CPUConstraints` of a flavor (``vcpus``, ``extra_specs``) and image
    properties. A bad value raises :class:`~berth.errors.ExtraSpecError` naming the key."""
    specs: Mapping[str, str] = getattr(flavor, "extra_specs", None) or {}
    vcpus = int(flavor.vcpus)
    # Same order as Nova, so that of several problems the same one is reported.
    policy = _cpu_policy(specs, image_props)
    thread_policy = _thread_policy(specs, image_props)
    emulator_policy = _emulator_policy(specs)
    realtime = _realtime_cpus(specs, image_props, vcpus, emulator_policy)
    dedicated = _dedicated_mask(specs, vcpus)
    return CPUConstraints(policy, thread_policy, emulator_policy,
                          None if dedicated is None else frozenset(dedicated),
                          None if realtime is None else frozenset(realtime),
                          specs.get("hw:cpu_dedicated_mask"))


def numa_topology_from_request(flavor: Any, image_props: Any) -> InstanceNUMATopology | None:
    """The guest NUMA topology a flavor and image ask for, or None (Nova's
    ``numa_get_constraints``).

    A topology is built when ``hw:numa_nodes``, a page size, virtual persistent memory
    (``hw:pmem``) or a pinned CPU policy (dedicated/mixed) is requested. Without ``hw:numa_cpus.N``/``hw:numa_mem.N`` the vCPUs
    and memory are split evenly over the nodes; with them, every node must be given both
    and together they must cover every vCPU once and all the memory. The image may add
    what the flavor leaves open but may not contradict it. ``resources:PCPU`` /
    ``resources:VCPU`` stand for the dedicated / shared policy, the
    ``HW_CPU_HYPERTHREADING`` trait for the isolate (forbidden) / require (required)
    thread policy, and a mixed flavor may take its dedicated vCPUs from a realtime mask
    (``hw:cpu_realtime`` + ``hw:cpu_realtime_mask`` / ``hw_cpu_realtime_mask``). The
    emulator threads policy is read from the flavor only. Any bad value or conflict
    raises :class:`~berth.errors.ExtraSpecError` naming the key and the value.
    """
    specs: Mapping[str, str] = getattr(flavor, "extra_specs", None) or {}
    vcpus = int(flavor.vcpus)
    memory_mb = int(flavor.memory_mb)
    constraints = cpu_constraints(flavor, image_props)
    cpu_policy = constraints.policy
    thread_policy = constraints.thread_policy
    emulator_policy = constraints.emulator_policy
    realtime = None if constraints.realtime is None else set(constraints.realtime)
    dedicated = None if constraints.dedicated is None else set(constraints.dedicated)

    # Explicit VCPU/PCPU resources and the hyperthreading trait stand in for policies.
    requested_vcpu, requested_pcpu = _explicit_cpu_resources(specs)
    if cpu_policy and (requested_vcpu or requested_pcpu):
        raise _bad("hw:cpu_policy", cpu_policy, "cannot be combined with resources:VCPU or "
                   "resources:PCPU extra specs; use one or the other")
    if requested_vcpu and requested_pcpu:
        raise _bad("resources:PCPU", requested_pcpu, "cannot be combined with resources:VCPU")
    if requested_pcpu:
        wanted = vcpus + 1 if emulator_policy == EMULATOR_ISOLATE else vcpus
        if requested_pcpu != wanted:
            raise _bad("resources:PCPU", requested_pcpu, f"must be exactly {wanted} (the "
                       "flavor's vCPUs, plus one with isolated emulator threads)")
        cpu_policy = DEDICATED
    if requested_vcpu:
        cpu_policy = SHARED
    ht_trait = _hyperthreading_trait(specs, image_props)
    if thread_policy and ht_trait:
        raise _bad("trait:HW_CPU_HYPERTHREADING", ht_trait, "cannot be combined with a CPU "
                   "thread policy; use one or the other")
    if ht_trait == "forbidden":
        thread_policy = ISOLATE
    elif ht_trait == "required":
        thread_policy = REQUIRE

    if cpu_policy in (SHARED, None):
        if thread_policy:
            key = "hw:cpu_thread_policy" if specs.get("hw:cpu_thread_policy") else "hw_cpu_thread_policy"
            raise _bad(key, thread_policy, "a CPU thread policy needs hw:cpu_policy=dedicated "
                       "or mixed")
        if emulator_policy == EMULATOR_ISOLATE:
            raise _bad("hw:emulator_threads_policy", emulator_policy,
                       "isolated emulator threads need hw:cpu_policy=dedicated or mixed")
        if dedicated:
            raise _bad("hw:cpu_dedicated_mask", specs.get("hw:cpu_dedicated_mask"),
                       "needs hw:cpu_policy=mixed")
        if realtime:
            raise _bad("hw:cpu_realtime", specs.get("hw:cpu_realtime"),
                       "realtime vCPUs need hw:cpu_policy=dedicated or mixed")
    elif cpu_policy == DEDICATED:
        if dedicated:
            raise _bad("hw:cpu_dedicated_mask", specs.get("hw:cpu_dedicated_mask"),
                       "needs hw:cpu_policy=mixed, not dedicated")
    else:  # mixed
        dedicated = constraints.mixed_dedicated()

    nodes = _numa_nodes(specs, image_props)
    pagesize = _pagesize(specs, image_props)
    # Virtual persistent memory (hw:pmem labels) also gives the guest a NUMA topology.
    vpmems = vpmem_labels(specs)

    if not (nodes or pagesize or vpmems or cpu_policy in _PINNING_POLICIES):
        # hw:numa_cpus.N / hw:numa_mem.N alone do not ask for a topology (as in Nova).
        return None

    cpus = set(range(vcpus))
    pcpus: set[int] = set()
    if cpu_policy == DEDICATED:
        pcpus = set(cpus)
    elif cpu_policy == MIXED and dedicated:
        pcpus = dedicated
    shared = cpus - pcpus
    nodes = nodes or 1
    cpu_list = _node_cpus(specs, image_props)
    mem_list = _node_mem(specs, image_props)

    cells: list[InstanceNUMACell] = []
    if cpu_list is None and mem_list is None:
        if vcpus % nodes or memory_mb % nodes:
            raise _bad("hw:numa_nodes", nodes, f"{vcpus} vCPUs and {memory_mb} MB cannot be "
                       "split evenly over the nodes; give hw:numa_cpus.N and hw:numa_mem.N")
        per_cpu, per_mem = vcpus // nodes, memory_mb // nodes
        for node in range(nodes):
            node_cpus = set(range(node * per_cpu, (node + 1) * per_cpu))
            cells.append(InstanceNUMACell(node, node_cpus & shared, node_cpus & pcpus, per_mem))
    elif cpu_list is not None and mem_list is not None:
        if len(cpu_list) != nodes or len(mem_list) != nodes:
            raise _bad("hw:numa_nodes", nodes, f"hw:numa_cpus.N and hw:numa_mem.N must be "
                       f"given for each of the {nodes} node(s) (got {len(cpu_list)} and "
                       f"{len(mem_list)})")
        unassigned = set(cpus)
        total_mem = 0
        for node in range(nodes):
            node_cpus = cpu_list[node]
            for cpu in sorted(node_cpus):
                if cpu >= vcpus:
                    raise _bad(f"hw:numa_cpus.{node}", format_cpu_spec(node_cpus),
                               f"vCPU {cpu} is out of range 0-{vcpus - 1}")
                if cpu not in unassigned:
                    raise _bad(f"hw:numa_cpus.{node}", format_cpu_spec(node_cpus),
                               f"vCPU {cpu} is assigned to more than one node")
                unassigned.discard(cpu)
            cells.append(InstanceNUMACell(node, node_cpus & shared, node_cpus & pcpus, mem_list[node]))
            total_mem += mem_list[node]
        if unassigned:
            raise _bad("hw:numa_cpus.0", format_cpu_spec(cpu_list[0]),
                       f"vCPUs {format_cpu_spec(unassigned)} are not assigned to any node")
        if total_mem != memory_mb:
            raise _bad("hw:numa_mem.0", mem_list[0], f"the nodes' memory adds up to "
                       f"{total_mem} MB, not the flavor's {memory_mb} MB")
    else:
        missing = "hw:numa_mem.N" if mem_list is None else "hw:numa_cpus.N"
        given = "hw:numa_cpus.0" if mem_list is None else "hw:numa_mem.0"
        value: Any = format_cpu_spec(cpu_list[0]) if cpu_list else (mem_list or [0])[0]
        raise _bad(given, value, f"needs {missing} for every node as well")

    for cell in cells:
        cell.pagesize = pagesize
        cell.cpu_policy = cpu_policy
        cell.cpu_thread_policy = thread_policy
    return InstanceNUMATopology(cells, emulator_policy)


def prepare_request(spec: Any, config: Any) -> None:
    """Fill ``spec.numa_topology`` and ``spec.pci_requests`` from the flavor and image
    when they are None (what Nova's API does before a request reaches the scheduler).

    Bad extra specs raise :class:`~berth.errors.ExtraSpecError`; a bad ``[pci] alias``
    raises :class:`~berth.errors.ConfigError`.
    """
    from berth.hardware.pci import pci_requests_from_flavor

    props = spec.image.properties if spec.image is not None else None
    if spec.numa_topology is None:
        spec.numa_topology = numa_topology_from_request(spec.flavor, props)
    if spec.pci_requests is None:
        spec.pci_requests = pci_requests_from_flavor(spec.flavor, config, props)


# -------------------------------------------------------------------------- fitting
def _get_pinning(
    threads_no: int, sibling_sets: Sequence[set[int]], instance_cores: set[int]
) -> list[tuple[int, int]] | None:
    """Pin ``instance_cores`` (sorted) on the first ``threads_no`` threads of each
    sibling set in turn; None if those threads are too few."""
    if threads_no * len(sibling_sets) < len(instance_cores):
        return None
    usable = [sorted(s)[:threads_no] for s in sibling_sets]
    return list(zip(sorted(instance_cores), itertools.chain.from_iterable(usable)))


def _get_reserved(
    sibling_sets: Sequence[set[int]],
    pinning: list[tuple[int, int]] | None,
    num_reserved: int,
    isolate: bool = False,
) -> set[int] | None:
    """The pCPUs set aside for emulator threads: the first free threads left once the
    pinned ones (or, under ``isolate``, their whole cores) are taken; None if none."""
    if not pinning or not num_reserved:
        return None
    usable = [sorted(s) for s in sibling_sets]
    for _, pcpu in pinning:
        for core in usable:
            if pcpu in core:
                if isolate:
                    usable.remove(core)
                else:
                    core.remove(pcpu)
                break
    reserved = set(list(itertools.chain.from_iterable(usable))[:num_reserved])
    return reserved or None


def _pack_instance_onto_cores(
    host_cell: NUMACell, instance_cell: InstanceNUMACell, num_cpu_reserved: int = 0
) -> InstanceNUMACell | None:
    """Choose host pCPUs for the cell's dedicated vCPUs under its thread policy.

    ``require`` only uses cores with at least two free siblings; ``isolate`` takes one
    thread per fully free core (and the whole core is consumed); ``prefer`` (the default)
    tries the cores with the most free siblings first and falls back to any free threads.
    Emulator threads need ``num_cpu_reserved`` further free pCPUs. As in Nova, a cell
    with no dedicated vCPU to pin does not fit (an empty pinning counts as a failure).
    """
    threads_per_core = max((len(s) for s in host_cell.siblings), default=1) or 1
    # sibling_sets[k]: the sibling sets with at least k free threads, in host order.
    sibling_sets: dict[int, list[set[int]]] = {}
    for sib in host_cell.free_siblings:
        for k in range(1, len(sib) + 1):
            sibling_sets.setdefault(k, []).append(sib)
    wanted = instance_cell.pcpuset
    policy = instance_cell.cpu_thread_policy
    pinning: list[tuple[int, int]] | None = None
    reserved: set[int] | None = None

    if policy == ISOLATE:
        if threads_per_core not in sibling_sets:
            return None  # no fully free core to emulate a non-SMT host with
        if threads_per_core != 1 and host_cell.pcpuset != host_cell.cpuset:
            # Nova refuses isolate on an SMT host configured with cpu_dedicated_set: only
            # the legacy vcpu_pin_set layout (cpuset == pcpuset) may reserve siblings.
            return None
        pinning = _get_pinning(1, sibling_sets[threads_per_core], wanted)
        reserved = _get_reserved(sibling_sets.get(1, []), pinning, num_cpu_reserved, isolate=True)
    else:
        if policy == REQUIRE and threads_per_core <= 1:
            return None
        for threads_no in sorted(sibling_sets, reverse=True):
            if policy == REQUIRE and threads_no <= 1:
                continue
            pinning = _get_pinning(threads_no, sibling_sets[threads_no], wanted)
            reserved = _get_reserved(sibling_sets.get(1, []), pinning, num_cpu_reserved)
            if not pinning or (num_cpu_reserved and not reserved):
                continue
            break
        if policy != REQUIRE and not pinning:
            singles = [{cpu} for sib in sibling_sets.get(1, []) for cpu in sorted(sib)]
            pinning = _get_pinning(1, singles, wanted)
            reserved = _get_reserved(singles, pinning, num_cpu_reserved)
    if not pinning or (num_cpu_reserved and not reserved):
        return None
    fitted = instance_cell.copy()
    fitted.cpu_pinning = dict(pinning)
    fitted.cpuset_reserved = reserved
    fitted.id = host_cell.id
    return fitted


def _pagesize_request_fits(host_cell: NUMACell, request: int, memory_mb: int) -> int | None:
    """The page size (KiB) that serves a page size request on this cell, or None.

    ``request`` is ``small`` (the smallest size the cell lists), ``large`` (the others,
    biggest first), ``any`` (all of them, biggest first) or an explicit size in KiB. A
    size serves when the guest cell's memory fits in its free pages and is a whole number
    of them.
    """
    sizes = sorted((p.size_kb for p in host_cell.mempages), reverse=True)
    if request == MEMPAGES_SMALL:
        candidates = sizes[-1:]
    elif request == MEMPAGES_LARGE:
        candidates = sizes[:-1]
    elif request == MEMPAGES_ANY:
        candidates = sizes
    else:
        candidates = [request]
    memory_kb = memory_mb * 1024
    for size in candidates:
        if host_cell.can_fit_pagesize(size, memory_kb):
            return size
    return None


def _fit_cell(
    host_cell: NUMACell,
    instance_cell: InstanceNUMACell,
    pagesize: int | None,
    limits: NUMATopologyLimits | None,
    cpuset_reserved: int = 0,
) -> InstanceNUMACell | None:
    """Nova's ``_numa_fit_instance_cell``: the fitted copy of the cell, or None.

    ``pagesize`` is the page size (KiB) that :func:`_pagesize_request_fits` found for
    the guest cell's request on this host cell, or None when the guest asks for none
    (``instance_cell.pagesize`` is not read). With a page size, its free pages were the
    whole memory check: ``avail_memory`` is not read. Without one, the smallest pages
    must hold the memory (their free pages for pinned guests, all of them otherwise), or,
    on a cell listing no pages, the free memory (pinned) or the cell's memory (shared).
    The CPU and RAM allocation ratio limits apply to shared and mixed guests only.
    """
    pinned = instance_cell.cpu_policy in _PINNING_POLICIES
    if pagesize is None:
        if host_cell.mempages:
            # Overcommit is allowed on small pages, except for pinned guests.
            smallest = min(p.size_kb for p in host_cell.mempages)
            if not host_cell.can_fit_pagesize(smallest, instance_cell.memory * 1024, use_free=pinned):
                return None
        elif pinned:
            if host_cell.avail_memory < instance_cell.memory:
                return None
        elif host_cell.memory < instance_cell.memory:
            # A shared instance may not overcommit against itself on one cell.
            return None

    if pinned and len(instance_cell.pcpuset) + cpuset_reserved > len(host_cell.pcpuset):
        return None
    if instance_cell.cpu_policy in (SHARED, MIXED, None) and len(instance_cell.cpuset) > len(host_cell.cpuset):
        return None

    fitted: InstanceNUMACell | None = instance_cell
    if pinned:
        if len(instance_cell.pcpuset) + cpuset_reserved > host_cell.avail_pcpus:
            return None
        fitted = _pack_instance_onto_cores(host_cell, instance_cell, cpuset_reserved)
        if fitted is None:
            return None
    if instance_cell.cpu_policy in (SHARED, MIXED, None) and limits is not None:
        if limits.cpu_allocation_ratio is not None:
            cpu_limit = len(host_cell.cpuset) * limits.cpu_allocation_ratio
            if host_cell.cpu_usage + len(instance_cell.cpuset) > cpu_limit:
                return None
        if limits.ram_allocation_ratio is not None:
            ram_limit = host_cell.memory * limits.ram_allocation_ratio
            if host_cell.memory_usage + instance_cell.memory > ram_limit:
                return None
    if fitted is instance_cell:
        fitted = instance_cell.copy()
    assert fitted is not None
    fitted.id = host_cell.id
    if pagesize is not None:
        fitted.pagesize = pagesize
    return fitted


def _network_affinity_ok(
    host: NUMATopology, chosen: Sequence[NUMACell], network_metadata: Any
) -> bool:
    """A required physnet or tunnel with affinity only to cells outside ``chosen`` fails."""
    if not network_metadata:
        return True
    physnets = set(getattr(network_metadata, "physnets", None) or ())
    tunneled = bool(getattr(network_metadata, "tunneled", False))
    if physnets:
        for cell in chosen:
            if cell.network_metadata is not None:
                physnets -= cell.network_metadata.physnets
        for cell in host.cells:
            if cell.network_metadata is not None and physnets & cell.network_metadata.physnets:
                return False
    if tunneled:
        if any(c.network_metadata is not None and c.network_metadata.tunneled for c in chosen):
            return True
        if any(c.network_metadata is not None and c.network_metadata.tunneled for c in host.cells):
            return False
    return True


def pci_count_by_cell(pci_stats: PciDeviceStats) -> dict[Any, int]:
    """Free PCI devices per NUMA node id (the cell-ordering key)."""
    totals: dict[Any, int] = {}
    for pool in pci_stats.pools:
        node = pool.get("numa_node")
        totals[node] = totals.get(node, 0) + int(pool.get("count", 0))
    return totals


def order_host_cells(
    host: NUMATopology,
    instance: InstanceNUMATopology,
    pci_requests: Sequence[InstancePCIRequest] | None,
    pci_stats: PciDeviceStats | None,
    pack: bool = False,
) -> list[NUMACell]:
    """Host cells in the order permutations are tried (reference §3.18).

    Three stable sorts, so the last key (PCI devices per cell) is the primary order:
    free memory (descending unless packing); then shared CPU usage (ascending unless
    packing) or free pCPUs for pinned instances (descending unless packing); then PCI
    devices per cell when ``pci_stats`` is given (descending if PCI is requested).
    Cells keep host order when the instance uses as many cells as the host has.
    """
    cells = list(host.cells)
    if len(cells) <= len(instance.cells):
        return cells
    cells.sort(key=lambda c: c.avail_memory, reverse=not pack)
    if instance.cells[0].cpu_policy in (None, SHARED):
        cells.sort(key=lambda c: c.cpu_usage, reverse=pack)
    else:
        cells.sort(key=lambda c: len(c.free_pcpus), reverse=not pack)
    if pci_stats is not None:
        per_cell = pci_count_by_cell(pci_stats)
        cells.sort(key=lambda c: per_cell.get(c.id, 0), reverse=bool(pci_requests))
    return cells


def numa_fit_instance_to_host(
    host: NUMATopology | None,
    instance: InstanceNUMATopology | None,
    limits: NUMATopologyLimits | None = None,
    pci_requests: Sequence[InstancePCIRequest] | None = None,
    pci_stats: PciDeviceStats | None = None,
    provider_mapping: Mapping[str, Sequence[str]] | None = None,
    *,
    pack: bool | None = None,
) -> InstanceNUMATopology | None:
    """Fit the instance's cells onto host cells; the fitted topology (cell ids are host
    cell ids, with CPU pinning and chosen page sizes) or None.

    Permutations of the ordered host cells (:func:`order_host_cells`) are tried in turn;
    one is accepted when every cell fits, the PCI requests can be served from those
    cells and network NUMA affinity holds. ``pack`` defaults to ``limits.pack``.
    As in Nova, the page size picked for a guest cell that asks for ``small``, ``large``
    or ``any`` is the size asked for in every later permutation, even when the
    permutation that picked it failed (on CPUs, say). The arguments are never modified.
    """
    if not host or not instance:
        return None
    if len(host.cells) < len(instance.cells):
        return None
    if pack is None:
        pack = bool(limits.pack) if limits is not None else False
    network_metadata = limits.network_metadata if limits is not None else None
    cells = order_host_cells(host, instance, pci_requests, pci_stats, pack)
    isolate_emulator = instance.emulator_threads_isolated
    # The page size each guest cell asks for. Nova writes the size it picks for a cell
    # (for small, large or any) into the request as soon as the cell's pages fit, before
    # its CPUs are checked, and does not undo it when the permutation fails: the next
    # permutations ask for that exact size. Kept here per call, so the caller's request
    # stays untouched (Nova's filter works on a copy of the request per host).
    requested = [c.pagesize for c in instance.cells]
    for perm in itertools.permutations(cells, len(instance.cells)):
        fitted: list[InstanceNUMACell] = []
        for i, (host_cell, instance_cell) in enumerate(zip(perm, instance.cells)):
            asked, pagesize = requested[i], None
            if asked:
                pagesize = _pagesize_request_fits(host_cell, asked, instance_cell.memory)
                if pagesize is None:
                    break
                requested[i] = pagesize
            # Emulator threads get their pCPU on the host cell of guest cell 0.
            reserved = 1 if isolate_emulator and not fitted else 0
            cell = _fit_cell(host_cell, instance_cell, pagesize, limits, reserved)
            if cell is None:
                break
            fitted.append(cell)
        if len(fitted) != len(instance.cells):
            continue
        if pci_requests and pci_stats is not None and not pci_stats.support_requests(
            pci_requests, provider_mapping, fitted, host_numa=host
        ):
            continue
        if network_metadata and not _network_affinity_ok(host, perm, network_metadata):
            continue
        return InstanceNUMATopology(fitted, instance.emulator_threads_policy)
    return None


# -------------------------------------------------------------------------- consumption
def _pin(cell: NUMACell, cpus: set[int], with_siblings: bool) -> frozenset[int]:
    if with_siblings:
        whole = set(cpus)
        for sib in cell.siblings:
            if sib & cpus:
                whole |= sib
        cpus = whole
    unknown = cpus - cell.pcpuset
    if unknown:
        raise NUMAUsageError(f"cannot pin CPUs {format_cpu_spec(unknown)} on cell {cell.id}: "
                             f"not dedicated CPUs ({format_cpu_spec(cell.pcpuset) or 'none'})")
    taken = cpus & cell.pinned_cpus
    if taken:
        raise NUMAUsageError(f"cannot pin CPUs {format_cpu_spec(taken)} on cell {cell.id}: "
                             "already pinned")
    return cell.pinned_cpus | cpus


def _pages_after(cell: NUMACell, instance_cell: InstanceNUMACell) -> tuple[NUMAPagesTopology, ...]:
    """Mempages after the guest cell's memory is taken from its page size (the chosen one,
    or the smallest when none was asked for)."""
    if not cell.mempages:
        return cell.mempages
    size = instance_cell.pagesize
    if not size or size < 0:
        size = min(p.size_kb for p in cell.mempages)
    pages = []
    for p in cell.mempages:
        if p.size_kb == size:
            used = max(0, p.used + (instance_cell.memory * 1024) // p.size_kb)
            p = dataclasses.replace(p, used=used)
        pages.append(p)
    return tuple(pages)


def numa_usage_from_instance_numa(
    host: NUMATopology, instance: InstanceNUMATopology | None
) -> NUMATopology:
    """The host topology with a fitted instance added: memory and shared CPU usage grow,
    huge pages of the chosen size are used, dedicated vCPUs' pCPUs (and the emulator
    pCPU) are pinned; ``isolate`` pins whole cores.

    Raises :class:`NUMAUsageError` if a pCPU is unknown or already pinned.
    """
    if not instance:
        return host
    new_cells = []
    for cell in host.cells:
        memory_usage, cpu_usage, pinned = cell.memory_usage, cell.cpu_usage, cell.pinned_cpus
        mempages = cell.mempages
        for inst_cell in instance.cells:
            if inst_cell.id != cell.id:
                continue
            current = dataclasses.replace(cell, pinned_cpus=pinned, mempages=mempages)
            mempages = _pages_after(current, inst_cell)
            memory_usage += inst_cell.memory
            cpu_usage += len(inst_cell.cpuset)
            if inst_cell.cpu_policy in (None, SHARED):
                continue
            cpus = set(inst_cell.cpu_pinning.values()) | set(inst_cell.cpuset_reserved or ())
            pinned = _pin(current, cpus, inst_cell.cpu_thread_policy == ISOLATE)
        new_cells.append(dataclasses.replace(
            cell, memory_usage=max(0, memory_usage), cpu_usage=max(0, cpu_usage),
            pinned_cpus=pinned, mempages=mempages))
    return NUMATopology(tuple(new_cells))


def consume(
    host_numa: NUMATopology,
    instance_numa: InstanceNUMATopology,
    limits: NUMATopologyLimits | None = None,
    pci_requests: Sequence[InstancePCIRequest] | None = None,
    pci_stats: PciDeviceStats | None = None,
    provider_mapping: Mapping[str, Sequence[str]] | None = None,
) -> tuple[InstanceNUMATopology | None, NUMATopology]:
    """Virtual consumption of a NUMA request on a host (reference §2.3).

    Returns the fitted instance topology (what Nova stores back on the spec) and the
    host topology after the instance is placed. As in Nova, when the request no longer
    fits the instance topology becomes None and the host is unchanged (so later
    instances of a multi-create are no longer NUMA-constrained). ``provider_mapping`` is
    the spec's request-group mapping after the claim, so the PCI check of the fit looks
    at the pools of the providers placement allocated from.
    """
    fitted = numa_fit_instance_to_host(host_numa, instance_numa, limits, pci_requests, pci_stats,
                                       provider_mapping)
    return fitted, numa_usage_from_instance_numa(host_numa, fitted)
