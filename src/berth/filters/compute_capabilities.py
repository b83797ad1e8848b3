"""ComputeCapabilitiesFilter: the flavor's ``capabilities:`` (and legacy unscoped) extra
specs must match what the host reports.

A key ``capabilities:a:b:c`` is a path into the host (split on every colon): a HostState
attribute or, failing that, a ``stats`` key, then into JSON-decoded strings (how
``cpu_info`` is entered) and dicts; ``str()`` of what it reaches is matched with the
operator grammar of :mod:`berth.extra_specs.ops` (so a JSON list is its Python repr). An
unscoped key counts only if it names a HostState attribute or a stats key; other scopes
(``hw:``, ``aggregate_instance_extra_specs:``...) are ignored. ``hw:maxphysaddr_bits=B``
is checked as ``capabilities:cpu_info:maxphysaddr:bits='>= B'``. Options: none. Lever:
the flavor's extra specs (reference §5).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from berth.extra_specs.ops import Requirement, compile_requirement, validate_requirement
from berth.filters.base import BaseHostFilter, Reject
from berth.filters.utils import nova_updated
from berth.snapshot import FLOAT_COLUMNS, INT_COLUMNS

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec

SCOPE = "capabilities"
MAXPHYSADDR_KEY = "hw:maxphysaddr_bits"
MAXPHYSADDR_PATH = "capabilities:cpu_info:maxphysaddr:bits"

#: Nova's HostState attributes (reference §2.1): the names an unscoped key or the first
#: element of a path may read. Berth's own additions (``now``, ``row``) are not among them.
HOST_STATE_FIELDS: frozenset[str] = frozenset([
    "host", "nodename", "cell_uuid", "uuid", "total_usable_ram_mb", "free_ram_mb",
    "total_usable_disk_gb", "disk_mb_used", "free_disk_mb", "vcpus_total", "vcpus_used",
    "numa_topology", "pci_stats", "stats", "num_instances", "num_io_ops", "failed_builds",
    "host_ip", "hypervisor_type", "hypervisor_version", "hypervisor_hostname", "cpu_info",
    "supported_instances", "metrics", "cpu_allocation_ratio", "ram_allocation_ratio",
    "disk_allocation_ratio", "aggregates", "instances", "service", "limits", "updated",
    "allocation_candidates",
])  # fmt: skip
#: Fields held as numeric columns (evaluated per distinct value, or vectorized).
_NUMERIC_FIELDS = frozenset(INT_COLUMNS + FLOAT_COLUMNS) - {"updated"}
#: Fields held as interned columns (evaluated once per distinct value).
_INTERNED_FIELDS = frozenset(
    ["cell_uuid", "hypervisor_type", "cpu_info", "stats", "supported_instances", "aggregates"]
)

_MISSING = "(missing)"


@dataclass(frozen=True)
class CapabilitySpec:
    """One extra spec this filter may evaluate: its flavor key, its path and requirement.

    ``unscoped`` specs are evaluated only on hosts where the key is a HostState field or
    a stats key (``always`` says it is a field, so every host evaluates it).
    """

    key: str
    path: tuple[str, ...]
    requirement: Requirement
    unscoped: bool

    @property
    def always(self) -> bool:
        """True when every host evaluates the spec (scoped, or an unscoped field name)."""
        return not self.unscoped or self.path[0] in HOST_STATE_FIELDS


def capability_specs(extra_specs: Mapping[str, str]) -> list[CapabilitySpec]:
    """The specs of a flavor this filter looks at, with ``hw:maxphysaddr_bits`` rewritten.

    Cached per distinct extra-spec items, so the per-host path parses a flavor once.
    """
    items = tuple(extra_specs.items())
    try:
        return list(_capability_specs(items))
    except TypeError:  # an unhashable value: parse without the cache
        return list(_capability_specs.__wrapped__(items))


@functools.lru_cache(maxsize=256)
def _capability_specs(items: tuple[tuple[str, str], ...]) -> tuple[CapabilitySpec, ...]:
    extra_specs = dict(items)
    specs: list[CapabilitySpec] = []
    rewritten: dict[str, tuple[str, str]] = {k: (k, v) for k, v in extra_specs.items()}
    if MAXPHYSADDR_KEY in rewritten:
        bits = rewritten.pop(MAXPHYSADDR_KEY)[1]
        rewritten[MAXPHYSADDR_PATH] = (MAXPHYSADDR_KEY, ">= " + bits)
    for path_key, (key, req) in rewritten.items():
        scope = path_key.split(":")
        if len(scope) == 1:
            specs.append(CapabilitySpec(key, (path_key,), compile_requirement(req), True))
        elif scope[0] == SCOPE:
            specs.append(CapabilitySpec(key, tuple(scope[1:]), compile_requirement(req), False))
    return tuple(specs)


def _first(host_state: HostState, name: str) -> Any:
    """The first path element: a HostState field, else the stats key of that name."""
    value = getattr(host_state, name, None) if name in HOST_STATE_FIELDS else None
    if value is None:
        value = host_state.stats.get(name)
    elif name == "updated":
        value = nova_updated(value)  # a datetime in Nova, shown as one
    return value


_NOT_JSON = object()


@functools.lru_cache(maxsize=1024)
def _decode(text: str) -> Any:
    """JSON-decode a capability string (cached: cpu_info strings repeat across hosts).

    Callers only read the decoded value, so sharing it is safe.
    """
    try:
        return json.loads(text)
    except ValueError:
        return _NOT_JSON


def resolve(host_state: HostState, path: tuple[str, ...]) -> Any:
    """Walk ``path`` into the host (reference §5 step 4); None when it leads nowhere."""
    cap = _first(host_state, path[0])
    rest = path[1:]
    if path[0] == "service" and rest:
        # Nova's host state keeps its service as a ReadOnlyDict, a UserDict and not a
        # dict: the filter looks its keys up as attributes (none), then in its `stats`
        # (an AttributeError), and fails. Only `data` (the UserDict's own dict) resolves.
        if rest[0] != "data":
            return None
        rest = rest[1:]
    for name in rest:
        if cap is None:
            return None
        if isinstance(cap, str):
            cap = _decode(cap)
            if cap is _NOT_JSON:
                return None
        if isinstance(cap, dict):
            cap = cap.get(name)
            continue
        value = getattr(cap, name, None)
        if value is None:
            stats = getattr(cap, "stats", None)
            # Nova's `cap.stats.get(...)` raises AttributeError for anything but a
            # HostState-like object, and that ends resolution.
            if stats is None or not hasattr(stats, "get"):
                return None
            value = stats.get(name)
        cap = value
    return cap


def check_spec(host_state: HostState, spec: CapabilitySpec) -> Reject | None:
    """One spec on one host: None if it is ignored or satisfied, else the mismatch."""
    if not spec.always and spec.path[0] not in host_state.stats:
        return None
    cap = resolve(host_state, spec.path)
    if cap is None:
        return Reject.of("capability mismatch", key=spec.key, requested=spec.requirement.req,
                         host_value=_MISSING)
    value = str(cap)
    if spec.requirement.match(value, key=spec.key, host=host_state.host):
        return None
    return Reject.of("capability mismatch", key=spec.key, requested=spec.requirement.req,
                     host_value=value)


class ComputeCapabilitiesFilter(BaseHostFilter):
    """Flavor capabilities:* (and legacy unscoped) extra specs must match the host's values.

    Values are host attributes, stats and the JSON cpu_info (reference §5).
    """

    run_filter_once_per_request: ClassVar[bool] = True

    def validate_request(self, spec_obj: RequestSpec) -> None:
        """Reject malformed requirements of specs every host would evaluate."""
        flavor = spec_obj.flavor
        if "extra_specs" not in flavor:
            return
        for spec in capability_specs(flavor.extra_specs):
            if spec.always:
                validate_requirement(spec.key, spec.requirement.req)

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """``capability mismatch`` naming the key, the requirement and the host value."""
        flavor = spec_obj.flavor
        if "extra_specs" not in flavor:
            return None
        for spec in capability_specs(flavor.extra_specs):
            reject = check_spec(host_state, spec)
            if reject is not None:
                return reject
        return None

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """Spec by spec over the hosts still passing, each once per distinct input.

        A spec's outcome depends only on the value its path starts from: a stats
        signature, an interned column's code (plus stats when that value is missing), a
        numeric column's value (vectorized for numeric operators), or, for genuinely
        per-host objects (``host``, ``instances``...), the host itself. One representative
        host per distinct input is evaluated with the per-host code and the verdict is
        spread to its group, so both paths agree by construction.
        """
        passing = np.ones(len(hosts), dtype=bool)
        flavor = spec_obj.flavor
        if "extra_specs" not in flavor or len(hosts) == 0:
            return passing
        for spec in capability_specs(flavor.extra_specs):
            idx = np.flatnonzero(passing)
            if len(idx) == 0:
                break
            passing[idx] = _spec_mask(hosts, hosts.rows[idx], spec)
        return passing


def _stats_value_codes(snapshot: Any, name: str) -> np.ndarray:
    """Per stats-table code, a code of ``stats.get(name)``: 0 when the key is absent,
    else one code per distinct value (cached per snapshot; the table only grows, so its
    length keys the cache).

    Stats usually differ per host (instance counters), but a capability read from stats
    depends only on that one value, so grouping by it keeps the evaluation per value.
    """
    table = snapshot.table("stats")

    def build() -> np.ndarray:
        index: dict[Any, int] = {}
        codes = np.zeros(len(table), dtype=np.int64)
        for i, stats in enumerate(table):
            if name in stats:
                # repr, not equality: 1, 1.0 and True are equal but str() differently.
                codes[i] = index.setdefault(repr(stats[name]), len(index) + 1)
        return codes

    codes: np.ndarray = snapshot.cached(("capability_stats_values", name, len(table)), build)
    return codes


def _spec_mask(hosts: Hosts, rows: np.ndarray, spec: CapabilitySpec) -> np.ndarray:
    """One spec's verdict for ``rows`` (see :meth:`ComputeCapabilitiesFilter.filter_all_hosts`).

    Group keys: ``>= 0`` for the field's own value (a numeric value's rank, an interned
    code, or the row for per-host objects); ``< 0`` for rows that fall back to stats,
    keyed by the stats value (``-1 - code``).
    """
    ws = hosts.ws
    snapshot = ws.snapshot
    name = spec.path[0]
    stats_values = _stats_value_codes(snapshot, name)[snapshot.codes("stats")[rows]]
    result = np.ones(len(rows), dtype=bool)
    # An unscoped key that is not a HostState field is evaluated only where stats carry it.
    todo = np.ones(len(rows), dtype=bool) if spec.always else stats_values != 0
    if not todo.any():
        return result
    sub = rows[todo]
    fallback = -1 - stats_values[todo]
    if spec.always and name in _NUMERIC_FIELDS:
        values = ws.col(name)[sub]
        if name in INT_COLUMNS:
            values = np.trunc(values)  # HostState shows int columns as int()
        missing = np.isnan(values)
        if len(spec.path) == 1 and spec.requirement.is_numeric and spec.requirement.error is None:
            verdict = np.zeros(len(sub), dtype=bool)
            verdict[~missing] = spec.requirement.match_numbers(values[~missing])
            if missing.any():
                verdict[missing] = _by_group(ws, sub[missing], fallback[missing], spec)
            result[todo] = verdict
            return result
        _, value_codes = np.unique(np.where(missing, 0.0, values), return_inverse=True)
        keys = np.where(missing, fallback, value_codes.reshape(-1))
    elif spec.always and name in _INTERNED_FIELDS:
        codes = snapshot.codes(name)[sub].astype(np.int64)
        absent = np.array([v is None for v in snapshot.table(name)], dtype=bool)[codes]
        keys = np.where(absent, fallback, codes)
    elif spec.always and name in HOST_STATE_FIELDS:
        keys = np.arange(len(sub), dtype=np.int64)  # per-host objects
    else:
        keys = fallback  # not a field: the stats value alone decides
    result[todo] = _by_group(ws, sub, keys, spec)
    return result


def _by_group(ws: Any, rows: np.ndarray, keys: np.ndarray, spec: CapabilitySpec) -> np.ndarray:
    """Evaluate ``spec`` on the first row of each key group and spread the verdicts."""
    unique, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    verdicts = np.array(
        [check_spec(ws.host_state(int(rows[i])), spec) is None for i in first.tolist()],
        dtype=bool,
    )
    return verdicts[inverse.reshape(-1)] if len(unique) else np.zeros(0, dtype=bool)
