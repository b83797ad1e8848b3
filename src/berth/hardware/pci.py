"""PCI device pools, PCI requests and aliases (reference §3.19, §2.3).

* :class:`PciDeviceStats` — a host's free PCI devices grouped in pools (dicts with
  ``vendor_id``, ``product_id``, ``numa_node``, ``dev_type``, ``count``, optional
  ``rp_uuid`` and free-form tags such as ``physical_network``). Immutable in use:
  :meth:`~PciDeviceStats.support_requests` works on a copy and
  :meth:`~PciDeviceStats.apply_requests` returns a new object.
* :class:`InstancePCIRequest` / :class:`InstancePCIRequests` — what a request needs.
* :func:`parse_aliases` reads ``[pci] alias`` (JSON objects) and
  :func:`pci_requests_from_flavor` turns the flavor's ``pci_passthrough:alias`` =
  ``"name:count[,name:count]"`` into requests.

Pool selection for one request, in order (Nova 34's ``_filter_pools``):

1. spec match: a pool matches if, for any spec dict of the request, every key equals the
   pool's value (strings case-insensitively; a list value needs all its items in the
   pool's list); ``resource_class``, ``traits`` and ``rp_uuids`` are not matched here,
   and ``live_migratable`` is matched as true or false (a pool without it matches no
   spec naming it);
2. NUMA affinity when instance cells are given, by policy ``required`` (only pools on
   the cells), ``legacy`` (the default: also pools with no NUMA node), ``preferred``
   (any pool, the cells' pools first) or ``socket`` (pools on cells of the same socket);
   a stricter set is used whenever it holds enough devices;
3. PF pools are dropped unless ``dev_type=type-PF`` is asked, ``vdpa`` pools unless
   asked, ``remote_managed=true`` pools unless asked;
4. when placement mapped the request to resource providers, only pools on them that
   still hold what placement allocated from them remain (and consumption then takes
   exactly that from each);
5. ``live_migratable`` true (or false) in every spec of the request keeps only pools
   tagged the same (a pool without the tag is neither);
6. the request fails when the surviving pools hold fewer than ``count`` devices.
"""

from __future__ import annotations

import copy
import functools
import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from berth.errors import ConfigError, ExtraSpecError, SchedulingError
from berth.interning import freeze

if TYPE_CHECKING:
    from berth.hardware.numa import NUMATopology

TYPE_PCI, TYPE_PF, TYPE_VF, TYPE_VDPA = "type-PCI", "type-PF", "type-VF", "vdpa"
DEVICE_TYPES = (TYPE_PCI, TYPE_PF, TYPE_VF, TYPE_VDPA)
REQUIRED, LEGACY, PREFERRED, SOCKET = "required", "legacy", "preferred", "socket"
NUMA_POLICIES = (REQUIRED, LEGACY, PREFERRED, SOCKET)
REMOTE_MANAGED_TAG = "remote_managed"
LIVE_MIGRATABLE_TAG = "live_migratable"

#: Spec keys that do not describe the device itself (placement or migration hints).
_UNMATCHED_SPEC_KEYS = frozenset({"resource_class", "traits", "rp_uuids"})
_TRUE_STRINGS = frozenset({"1", "t", "true", "on", "y", "yes"})
_FALSE_STRINGS = frozenset({"0", "f", "false", "off", "n", "no"})
_ALIAS_KEYS = frozenset({"name", "capability_type", "product_id", "vendor_id", "device_type",
                         "numa_policy", "resource_class", "traits", LIVE_MIGRATABLE_TAG})


class PciRequestFailed(SchedulingError):
    """PCI requests were applied to a host whose pools cannot serve them. ``partial``:
    the pools with the requests before the failed one taken, as Nova leaves a host's
    pools (its ``apply_requests`` works on them in place)."""

    code = "berth.scheduling.pci_request_failed"

    def __init__(self, message: str, *, partial: PciDeviceStats | None = None) -> None:
        super().__init__(message)
        self.partial = partial


def _as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in _TRUE_STRINGS if value is not None else False


# -------------------------------------------------------------------------- requests
@dataclass
class InstancePCIRequest:
    """``count`` devices matching any dict of ``spec``, under ``numa_policy``.

    ``request_id`` ties the request to placement request groups named
    ``{request_id}`` or ``{request_id}-{n}`` in an allocation candidate's mappings.
    :attr:`source` says where the request came from, derived as Nova derives it.
    """

    #: Sources of a PCI request (Nova's ``InstancePCIRequest`` constants).
    FLAVOR_ALIAS: ClassVar[int] = 0
    NEUTRON_PORT: ClassVar[int] = 1

    count: int
    spec: list[dict[str, Any]]
    alias_name: str | None = None
    numa_policy: str | None = None
    request_id: str | None = None

    @property
    def source(self) -> int:
        """:attr:`FLAVOR_ALIAS` or :attr:`NEUTRON_PORT`: a port's request has no alias."""
        return self.NEUTRON_PORT if self.alias_name is None else self.FLAVOR_ALIAS

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {"count": self.count, "spec": self.spec, "alias_name": self.alias_name,
                "numa_policy": self.numa_policy, "request_id": self.request_id}


@dataclass
class InstancePCIRequests:
    """The PCI requests of an instance (``spec.pci_requests``)."""

    requests: list[InstancePCIRequest] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.requests)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {"requests": [r.to_dict() for r in self.requests]}


def is_live_migratable(request: InstancePCIRequest) -> bool:
    """Whether every spec of ``request`` asks for live-migratable devices in so many
    words (Nova's ``InstancePCIRequest.is_live_migratable``: the tag is ``"true"``)."""
    return all(s.get(LIVE_MIGRATABLE_TAG) == "true" for s in request.spec)


def requests_of(value: Any) -> list[InstancePCIRequest]:
    """The request list of ``spec.pci_requests`` (an InstancePCIRequests, a list, or None)."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return list(getattr(value, "requests", None) or [])


# -------------------------------------------------------------------------- aliases
@functools.lru_cache(maxsize=64)
def _parse_aliases_cached(aliases: tuple[str, ...]) -> dict[str, tuple[str, tuple[dict[str, Any], ...]]]:
    result: dict[str, tuple[str, tuple[dict[str, Any], ...]]] = {}
    for index, text in enumerate(aliases):
        where = f"[pci] alias #{index + 1}"
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{where}: not valid JSON ({exc}): {text!r}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a JSON object, got {text!r}")
        unknown = set(data) - _ALIAS_KEYS
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}; allowed: "
                              f"{', '.join(sorted(_ALIAS_KEYS))}")
        for key, value in data.items():
            if not isinstance(value, str):
                raise ConfigError(f"{where}: {key} must be a string, got {value!r}")
        name = data.pop("name", "").strip()
        if not name:
            raise ConfigError(f"{where}: name is required")
        for key in ("vendor_id", "product_id"):
            value = data.get(key)
            if value is not None and not (len(value) == 4 and all(c in "0123456789abcdefABCDEF" for c in value)):
                raise ConfigError(f"{where}: {key} must be 4 hex digits, got {value!r}")
        if data.get("capability_type", "pci") != "pci":
            raise ConfigError(f"{where}: capability_type must be 'pci', got {data['capability_type']!r}")
        policy = data.pop("numa_policy", None) or LEGACY
        if policy not in NUMA_POLICIES:
            raise ConfigError(f"{where}: numa_policy must be one of {', '.join(NUMA_POLICIES)}, "
                              f"got {policy!r}")
        dev_type = data.pop("device_type", None)
        if dev_type is not None:
            if dev_type not in DEVICE_TYPES:
                raise ConfigError(f"{where}: device_type must be one of {', '.join(DEVICE_TYPES)}, "
                                  f"got {dev_type!r}")
            data["dev_type"] = dev_type
        live = data.get(LIVE_MIGRATABLE_TAG)
        if live is not None:
            if live.strip().lower() not in _TRUE_STRINGS | _FALSE_STRINGS:
                raise ConfigError(f"{where}: live_migratable must be true or false, got "
                                  f"{live!r}")
            # Spelt "true" or "false" from here on, as Nova rewrites it when it reads
            # the alias (a live migration then asks for exactly "true").
            data[LIVE_MIGRATABLE_TAG] = "true" if _as_bool(live) else "false"
        if name in result:
            known_policy, specs = result[name]
            if known_policy != policy:
                raise ConfigError(f"{where}: alias {name!r} is defined again with numa_policy "
                                  f"{policy!r} (was {known_policy!r})")
            if specs[0].get("dev_type") != data.get("dev_type"):
                raise ConfigError(f"{where}: alias {name!r} is defined again with device_type "
                                  f"{data.get('dev_type')!r} (was {specs[0].get('dev_type')!r})")
            result[name] = (policy, specs + (data,))
        else:
            result[name] = (policy, (data,))
    return result


def parse_aliases(aliases: Iterable[str]) -> dict[str, tuple[str, list[dict[str, Any]]]]:
    """``[pci] alias`` JSON strings -> name -> (numa_policy, [spec, ...]).

    Several definitions with one name add specs (any of them may match); they must agree
    on ``numa_policy`` and ``device_type``. Bad JSON, unknown keys or values raise
    :class:`~berth.errors.ConfigError`.
    """
    parsed = _parse_aliases_cached(tuple(aliases))
    return {name: (policy, [dict(s) for s in specs]) for name, (policy, specs) in parsed.items()}


def _pci_numa_policy(flavor: Any, image_props: Any) -> str | None:
    specs = getattr(flavor, "extra_specs", None) or {}
    flavor_policy = specs.get("hw:pci_numa_affinity_policy") or None
    image_policy = None
    if image_props is not None and hasattr(image_props, "get"):
        image_policy = image_props.get("hw_pci_numa_affinity_policy") or None
    for key, value in (("hw:pci_numa_affinity_policy", flavor_policy),
                       ("hw_pci_numa_affinity_policy", image_policy)):
        if value is not None and value not in NUMA_POLICIES:
            raise ExtraSpecError(f"{key}={value!r}: must be one of {', '.join(NUMA_POLICIES)}",
                                 key=key, value=value)
    if flavor_policy and image_policy and flavor_policy != image_policy:
        raise ExtraSpecError(
            f"hw_pci_numa_affinity_policy={image_policy!r}: conflicts with the flavor's "
            f"hw:pci_numa_affinity_policy={flavor_policy}",
            key="hw_pci_numa_affinity_policy", value=image_policy)
    return flavor_policy or image_policy


def pci_requests_from_flavor(
    flavor: Any, config: Any, image_props: Any = None
) -> InstancePCIRequests:
    """The PCI requests of a flavor's ``pci_passthrough:alias`` (empty without one).

    Each ``name:count`` becomes one request for ``count`` devices matching the alias's
    specs, with the flavor/image ``pci_numa_affinity_policy`` overriding the alias's
    ``numa_policy``. An unknown alias or a malformed value raises
    :class:`~berth.errors.ExtraSpecError`; a bad ``[pci] alias`` raises ConfigError.
    """
    specs = getattr(flavor, "extra_specs", None) or {}
    value = specs.get("pci_passthrough:alias")
    # Checked with or without an alias: Nova's API refuses a bad or conflicting policy
    # for every boot (hardware.get_pci_numa_policy_constraint).
    policy = _pci_numa_policy(flavor, image_props)
    if value is None:
        return InstancePCIRequests([])
    key = "pci_passthrough:alias"
    aliases = parse_aliases(_config_aliases(config))
    requests: list[InstancePCIRequest] = []
    for index, part in enumerate(str(value).split(",")):
        name, sep, count_text = part.partition(":")
        name = name.strip()
        if not sep or not name or ":" in count_text:
            raise ExtraSpecError(f"{key}={value!r}: expected name:count[,name:count], "
                                 f"got {part.strip()!r}", key=key, value=value)
        try:
            count = int(count_text.strip())
        except ValueError:
            raise ExtraSpecError(f"{key}={value!r}: count of {name!r} must be an integer, "
                                 f"got {count_text.strip()!r}", key=key, value=value) from None
        if count < 1:
            raise ExtraSpecError(f"{key}={value!r}: count of {name!r} must be >= 1",
                                 key=key, value=value)
        if name not in aliases:
            known = ", ".join(sorted(aliases)) or "none configured"
            raise ExtraSpecError(f"{key}={value!r}: PCI alias {name!r} is not defined in "
                                 f"[pci] alias (known: {known})", key=key, value=value)
        alias_policy, alias_specs = aliases[name]
        requests.append(InstancePCIRequest(
            count=count, spec=alias_specs, alias_name=name,
            numa_policy=policy or alias_policy,
            request_id=f"pci-{getattr(flavor, 'name', 'flavor')}-{index}-{name}",
        ))
    return InstancePCIRequests(requests)


def _config_aliases(config: Any) -> tuple[str, ...]:
    if config is None:
        return ()
    group = getattr(config, "pci", None)
    aliases = getattr(group, "alias", None) if group is not None else None
    return tuple(aliases or ())


# -------------------------------------------------------------------------- pools
_POOL_INT_KEYS = ("count",)


def _validate_pool(pool: Any, index: int) -> dict[str, Any]:
    where = f"[{index}]"
    if not isinstance(pool, Mapping):
        raise TypeError(f"{where}: expected a mapping, got {pool!r}")
    out = dict(pool)
    count = out.get("count")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"{where}.count: expected an integer >= 0, got {count!r}")
    node = out.get("numa_node")
    if node is not None and (isinstance(node, bool) or not isinstance(node, int)):
        raise TypeError(f"{where}.numa_node: expected an integer or null, got {node!r}")
    out.setdefault("numa_node", None)
    out.setdefault("dev_type", TYPE_PCI)
    for key in ("vendor_id", "product_id", "dev_type", "rp_uuid"):
        if key in out and out[key] is not None and not isinstance(out[key], str):
            raise TypeError(f"{where}.{key}: expected a string, got {out[key]!r}")
    return out


class PciDeviceStats:
    """A host's free PCI devices by pool (Nova's ``PciDeviceStats``).

    ``pools`` must not be changed in place once the object is built: equal pool lists
    share a signature, which the bulk filters evaluate once. ``numa_topology`` (the
    host's) is only needed by the ``socket`` NUMA policy.
    """

    __slots__ = ("pools", "numa_topology", "_key", "_hash")

    def __init__(self, pools: Iterable[Mapping[str, Any]] = (), numa_topology: NUMATopology | None = None) -> None:
        # Nova's PciDeviceStats sorts its pools by how many keys each has (a stable
        # sort): pools with more tags (rp_uuid, physical_network, ...) come last, and
        # a request takes its devices from the pools in that order.
        self.pools: list[dict[str, Any]] = sorted((dict(p) for p in pools), key=len)
        self.numa_topology = numa_topology
        self._key: Any = None
        self._hash: int | None = None

    @classmethod
    def from_pools(
        cls, pools: Sequence[Mapping[str, Any]], numa_topology: NUMATopology | None = None
    ) -> PciDeviceStats:
        """Build from pool dicts (the cloud file's ``pci_pools``), validating them.

        Each pool needs ``count`` (an integer >= 0); ``numa_node`` is an integer or null;
        ``dev_type`` defaults to ``type-PCI``. Other keys are tags matched by requests.
        Malformed pools raise ValueError/TypeError naming ``[index].field``.
        """
        if not isinstance(pools, (list, tuple)):
            raise TypeError(f"expected a list of pools, got {type(pools).__name__}")
        return cls([_validate_pool(p, i) for i, p in enumerate(pools)], numa_topology)

    # ---------------------------------------------------------------- identity
    def signature(self) -> Any:
        """A hashable key equal for equal pool lists (cached)."""
        if self._key is None:
            self._key = (freeze(self.pools), self.numa_topology)
        return self._key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PciDeviceStats) and other.signature() == self.signature()

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(self.signature())
        return self._hash

    def __repr__(self) -> str:
        return f"PciDeviceStats({self.pools!r})"

    def __iter__(self) -> Any:
        return iter(self.pools)

    def free_count(self) -> int:
        """Free devices over every pool."""
        return sum(int(p.get("count", 0)) for p in self.pools)

    def to_dict(self) -> list[dict[str, Any]]:
        """The pool dicts (JSON-ready)."""
        return [dict(p) for p in self.pools]

    # ---------------------------------------------------------------- requests
    def support_requests(
        self,
        requests: Any,
        provider_mapping: Mapping[str, Sequence[str]] | None = None,
        numa_cells: Sequence[Any] | None = None,
        *,
        host_numa: NUMATopology | None = None,
    ) -> bool:
        """True if every request, in order, can be served (on a copy of the pools).

        ``numa_cells`` are fitted instance cells (their ids are host cell ids);
        ``provider_mapping`` is an allocation candidate's ``mappings``.
        """
        pools = copy.deepcopy(self.pools)
        host = host_numa if host_numa is not None else self.numa_topology
        return all(
            _apply_request(pools, r, provider_mapping, numa_cells, host) for r in requests_of(requests)
        )

    def apply_requests(
        self,
        requests: Any,
        numa_cells: Sequence[Any] | None = None,
        provider_mapping: Mapping[str, Sequence[str]] | None = None,
        *,
        host_numa: NUMATopology | None = None,
    ) -> PciDeviceStats:
        """A new PciDeviceStats with the requested devices taken (emptied pools drop out).

        Raises :class:`PciRequestFailed` if a request cannot be served, with the
        requests before it taken (``partial``: Nova applies them one by one to the
        host's own pools and does not put back what the earlier ones took).
        """
        pools = copy.deepcopy(self.pools)
        host = host_numa if host_numa is not None else self.numa_topology
        for request in requests_of(requests):
            if not _apply_request(pools, request, provider_mapping, numa_cells, host):
                raise PciRequestFailed(
                    f"PCI request for {request.count} device(s)"
                    f"{' of alias ' + repr(request.alias_name) if request.alias_name else ''} "
                    "cannot be served by this host's pools",
                    partial=PciDeviceStats(pools, self.numa_topology))
        return PciDeviceStats(pools, self.numa_topology)


# -------------------------------------------------------------------------- pool filtering
def _value_matches(wanted: Any, have: Any) -> bool:
    if isinstance(wanted, list) and isinstance(have, list):
        return all(item in have for item in wanted)
    if isinstance(wanted, str):
        wanted = wanted.lower()
    if isinstance(have, str):
        have = have.lower()
    return bool(have == wanted)


def _key_matches(key: str, wanted: Any, have: Any) -> bool:
    if key == LIVE_MIGRATABLE_TAG:  # "true"/"false" either way; a pool without it: no
        return have is not None and _as_bool(wanted) == _as_bool(have)
    return _value_matches(wanted, have)


def spec_matches(pool: Mapping[str, Any], specs: Sequence[Mapping[str, Any]]) -> bool:
    """True if, for any spec dict, every (device) key equals the pool's value (as Nova,
    ``live_migratable`` too: a pool without the tag matches no spec that names it)."""
    return any(
        all(_key_matches(k, v, pool.get(k)) for k, v in spec.items()
            if k not in _UNMATCHED_SPEC_KEYS)
        for spec in specs
    )


def _total(pools: Sequence[Mapping[str, Any]]) -> int:
    return sum(int(p.get("count", 0)) for p in pools)


def _on_nodes(pools: Sequence[dict[str, Any]], nodes: Iterable[Any]) -> list[dict[str, Any]]:
    wanted = list(nodes)
    return [p for p in pools if p.get("numa_node") in wanted]


def _filter_numa(
    pools: list[dict[str, Any]],
    request: InstancePCIRequest,
    numa_cells: Sequence[Any] | None,
    host: NUMATopology | None,
) -> list[dict[str, Any]]:
    if not numa_cells:
        return pools
    policy = request.numa_policy or LEGACY
    cell_ids: list[Any] = [c.id for c in numa_cells]
    strict = _on_nodes(pools, cell_ids)
    # A stricter choice is always taken when it holds enough devices.
    if policy == REQUIRED or _total(strict) >= request.count:
        return strict
    if policy == SOCKET:
        if host is None or any(c.socket is None for c in host.cells):
            return []  # no socket information: the socket policy cannot be honoured
        sockets = {hc.socket for hc in host.cells if hc.id in cell_ids}
        return _on_nodes(pools, [hc.id for hc in host.cells if hc.socket in sockets])
    cell_ids.append(None)  # legacy: devices with no NUMA affinity are acceptable too
    relaxed = _on_nodes(pools, cell_ids)
    if policy == LEGACY or _total(relaxed) >= request.count:
        return relaxed
    # preferred: anything, the best-placed pools first.
    return sorted(pools, key=lambda p: p.get("numa_node") not in cell_ids)


def _rp_uuids(request: InstancePCIRequest, provider_mapping: Mapping[str, Sequence[str]] | None) -> list[str]:
    """The providers placement took the request's devices from, once per device.

    Without a mapping, the spec's comma-joined ``rp_uuids`` (if any) stand in. A mapping
    names PCI request groups ``{request_id}`` or ``{request_id}-{n}``, each served by
    one provider.
    """
    if not provider_mapping:
        rp_text = request.spec[0].get("rp_uuids") if request.spec else None
        return str(rp_text).split(",") if rp_text else []
    rid = request.request_id
    if not rid:
        return []
    return [
        uuids[0]
        for group, uuids in provider_mapping.items()
        if uuids and (group == rid or group.startswith(rid + "-"))
    ]


def filter_pools(
    pools: list[dict[str, Any]],
    request: InstancePCIRequest,
    numa_cells: Sequence[Any] | None = None,
    provider_mapping: Mapping[str, Sequence[str]] | None = None,
    host: NUMATopology | None = None,
) -> list[dict[str, Any]] | None:
    """The pools that may serve ``request``, in the order they are drawn from, or None
    when they hold fewer than ``request.count`` devices (rules 1-6 of the module doc)."""
    specs = request.spec or [{}]
    chosen = [p for p in pools if spec_matches(p, specs)]
    if _total(chosen) < request.count:
        return None
    chosen = _filter_numa(chosen, request, numa_cells, host)
    if _total(chosen) < request.count:
        return None
    if all(s.get("dev_type") != TYPE_PF for s in specs):
        chosen = [p for p in chosen if p.get("dev_type") != TYPE_PF]
    if all(s.get("dev_type") != TYPE_VDPA for s in specs):
        chosen = [p for p in chosen if p.get("dev_type") != TYPE_VDPA]
    if all(not _as_bool(s.get(REMOTE_MANAGED_TAG)) for s in specs):
        chosen = [p for p in chosen if not _as_bool(p.get(REMOTE_MANAGED_TAG))]
    rp_uuids = _rp_uuids(request, provider_mapping)
    if rp_uuids:
        # Only pools placement allocated from, and able to give what it allocated.
        per_rp = Counter(rp_uuids)
        chosen = [p for p in chosen
                  if p.get("rp_uuid") is not None and p["rp_uuid"] in per_rp
                  and p["count"] >= per_rp[p["rp_uuid"]]]
    # Every spec asking for live-migratable devices (or every one refusing them) keeps
    # only the pools tagged alike, as Nova's _filter_pools_for_live_migratable_devices.
    lives = [s.get(LIVE_MIGRATABLE_TAG) for s in specs]
    if lives and all(v is not None for v in lives) and len({_as_bool(v) for v in lives}) == 1:
        wanted = _as_bool(lives[0])
        chosen = [p for p in chosen if p.get(LIVE_MIGRATABLE_TAG) is not None
                  and _as_bool(p.get(LIVE_MIGRATABLE_TAG)) == wanted]
    if _total(chosen) < request.count:
        return None
    return chosen


def _apply_request(
    pools: list[dict[str, Any]],
    request: InstancePCIRequest,
    provider_mapping: Mapping[str, Sequence[str]] | None,
    numa_cells: Sequence[Any] | None,
    host: NUMATopology | None,
) -> bool:
    chosen = filter_pools(pools, request, numa_cells, provider_mapping, host)
    if not chosen:
        return False
    rp_uuids = _rp_uuids(request, provider_mapping)
    if rp_uuids:
        # Follow placement's allocation: each pool gives what was allocated from its RP.
        per_rp = Counter(rp_uuids)
        for pool in chosen:
            pool["count"] -= per_rp[pool["rp_uuid"]]
            if pool["count"] == 0:
                _remove(pools, pool)
        return True
    needed = request.count
    for pool in chosen:
        if pool["count"] > needed:
            pool["count"] -= needed
            needed = 0
        else:
            needed -= pool["count"]
            _remove(pools, pool)
        if not needed:
            break
    return True


def _remove(pools: list[dict[str, Any]], pool: dict[str, Any]) -> None:
    # Identity, not equality: two pools may hold equal values.
    for i, candidate in enumerate(pools):
        if candidate is pool:
            del pools[i]
            return


def mapping_keyer(requests: Sequence[InstancePCIRequest]) -> Callable[[Any], Any]:
    """A function giving the part of an allocation candidate's ``mappings`` that PCI pool
    selection reads for ``requests``.

    Two candidates with equal keys get the same :meth:`PciDeviceStats.support_requests`
    answer, so filters evaluate once per key. An empty mapping differs from a mapping
    without PCI groups (the former falls back to the spec's ``rp_uuids``).
    """
    ids = frozenset(r.request_id for r in requests if r.request_id)
    prefixes = tuple(rid + "-" for rid in ids)

    def key(mapping: Any) -> Any:
        if not mapping:
            return None
        relevant = [(group, uuids[0]) for group, uuids in mapping.items()
                    if uuids and (group in ids or (prefixes and group.startswith(prefixes)))]
        if len(relevant) > 1:
            relevant.sort()
        return tuple(relevant)

    return key
