"""The request a scheduler answers: Nova's ``RequestSpec`` and the objects it carries.

Attribute names are Nova's, so a custom filter written for Nova reads the same fields.
The pipeline works on a deep copy of the spec: its virtual changes during one request
(``instance_uuid``, ``instance_group.hosts``) never leak back to the caller.
"""

from __future__ import annotations

import random
import uuid as uuidlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from berth.model.image_props import (  # noqa: F401  (LEGACY_IMAGE_PROPERTIES: re-exported)
    FIELD_TYPES,
    LEGACY_IMAGE_PROPERTIES,
    coerce_properties,
)

#: Image property names Nova's ``ImageMetaProps`` knows. ``props.get(name)`` answers the
#: default for any other name, which is why aggregate keys such as ``os`` never make
#: AggregateImagePropertiesIsolation fail. Each field's type is in
#: :data:`berth.model.image_props.FIELD_TYPES`.
IMAGE_PROPERTY_FIELDS: frozenset[str] = frozenset(FIELD_TYPES)


class ImageMetaProps:
    """Image properties with Nova's ``ImageMetaProps`` types and access rules.

    Each known property is coerced to its field's type on construction (integers,
    booleans by Nova's FlexibleBooleanField rules, enums, version predicates, lists; see
    :mod:`berth.model.image_props`), legacy names are translated, ``trait:NAME: required``
    keys become ``traits_required`` and ``hw_numa_cpus.N`` / ``hw_numa_mem.N`` become the
    lists ``hw_numa_cpus`` / ``hw_numa_mem``. A value that does not fit raises
    :class:`~berth.model.image_props.ImagePropertyError` (an InputError naming the
    property), as Nova refuses to build the object.

    ``get(name, default)`` returns ``default`` for unset and for unknown names; attribute
    access returns None for a known but unset field. ``raw`` keeps every property as given.
    """

    __slots__ = ("_values", "raw")

    def __init__(self, properties: Mapping[str, Any] | None = None) -> None:
        raw = dict(properties or {})
        self._values = coerce_properties(raw)
        self.raw = raw

    def get(self, name: str, default: Any = None) -> Any:
        """Nova's ``ImageMetaProps.get``: the value, or ``default`` if unset or unknown."""
        return self._values.get(name, default)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in IMAGE_PROPERTY_FIELDS:
            raise AttributeError(name)
        return self._values.get(name)

    def obj_attr_is_set(self, name: str) -> bool:
        """True when the property ``name`` has a value."""
        return name in self._values

    def to_dict(self) -> dict[str, Any]:
        """The set properties, by their current names, with their typed values."""
        return dict(self._values)

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ImageMetaProps) and other._values == self._values

    def __repr__(self) -> str:
        return f"ImageMetaProps({self._values!r})"


@dataclass
class ImageMeta:
    """An image: its id (None for volume-backed), disk format and properties."""

    id: str | None = None
    name: str | None = None
    disk_format: str | None = None
    properties: ImageMetaProps = field(default_factory=ImageMetaProps)

    def __post_init__(self) -> None:
        if not isinstance(self.properties, ImageMetaProps):
            self.properties = ImageMetaProps(self.properties)


@dataclass
class Flavor:
    """A flavor (instance type). ``extra_specs`` maps str to str."""

    name: str
    vcpus: int
    memory_mb: int
    root_gb: int = 0
    ephemeral_gb: int = 0
    swap: int = 0
    id: int | str | None = None
    flavorid: str | None = None
    extra_specs: dict[str, str] = field(default_factory=dict)

    def __contains__(self, name: object) -> bool:
        # Nova filters test ``'extra_specs' in flavor`` (is the field set?).
        return isinstance(name, str) and getattr(self, name, None) is not None

    def get(self, name: str, default: Any = None) -> Any:
        """Dict-style read of a field, as Nova objects allow."""
        return getattr(self, name, default)


#: Flavors Berth knows by name in every cloud (Nova's classic defaults), after the
#: cloud's own: ``berth serve``, ``schedule``, ``capacity`` and ``simulate`` alike.
DEFAULT_FLAVORS: dict[str, Flavor] = {
    f.name: f for f in (
        Flavor(name="m1.tiny", vcpus=1, memory_mb=512, root_gb=1, id=1),
        Flavor(name="m1.small", vcpus=1, memory_mb=2048, root_gb=20, id=2),
        Flavor(name="m1.medium", vcpus=2, memory_mb=4096, root_gb=40, id=3),
        Flavor(name="m1.large", vcpus=4, memory_mb=8192, root_gb=80, id=4),
        Flavor(name="m1.xlarge", vcpus=8, memory_mb=16384, root_gb=160, id=5),
    )
}


#: Berth's defaults in a cloud with flavors of its own: the negative of their usual ids,
#: which no flavor of a cloud file can hold (its ids are 0 or more), whatever it defines.
_DEFAULTS_BESIDE_OWN: dict[str, Flavor] = {
    name: replace(f, id=-f.id) for name, f in DEFAULT_FLAVORS.items()
    if isinstance(f.id, int)}


def known_flavors(own: Mapping[str, Flavor]) -> dict[str, Flavor]:
    """Every flavor a cloud knows by name: its ``own``, then those of Berth's defaults
    it does not define. Beside flavors of its own the defaults have negative ids (m1.tiny
    -1 ... m1.xlarge -5): TypeAffinityFilter compares flavor ids, and the file's first
    flavor, id 1, would pass for m1.tiny; the ids stay the same whatever the file adds."""
    if not own:
        return dict(DEFAULT_FLAVORS)
    known = dict(own)
    for name, flavor in _DEFAULTS_BESIDE_OWN.items():
        known.setdefault(name, flavor)
    return known


def is_default_flavor(name: str, flavor: Flavor) -> bool:
    """Whether ``flavor`` is Berth's default called ``name`` (with either of its ids),
    not a flavor of the cloud's own."""
    return flavor is DEFAULT_FLAVORS.get(name) or flavor is _DEFAULTS_BESIDE_OWN.get(name)


def same_as_default(flavor: Flavor) -> bool:
    """Whether ``flavor`` is exactly Berth's default of its name, its usual id included
    (as an earlier ``berth cloud export`` wrote the defaults into a cloud file)."""
    default = DEFAULT_FLAVORS.get(flavor.name)
    return default is not None and _sizes(default) == _sizes(flavor)


def _sizes(f: Flavor) -> tuple[Any, ...]:
    return (f.id, f.vcpus, f.memory_mb, f.root_gb, f.ephemeral_gb, f.swap, f.extra_specs)


@dataclass
class InstanceGroup:
    """A server group: one policy, optional rules, its member uuids and their hosts."""

    policy: str
    uuid: str = ""
    name: str = ""
    rules: dict[str, Any] = field(default_factory=dict)
    members: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    project_id: str | None = None
    user_id: str | None = None
    #: Berth: where members are claimed now (instance uuid -> service host), read from
    #: the shared database with ``hosts``. The scheduler counts a member on its host
    #: from its claim, before the host's next report lists it (Nova's own scheduler
    #: reads a host's instances from its database until the compute has synced them).
    member_hosts: dict[str, str] = field(default_factory=dict)
    #: Berth: the flavor id of those members, so the one counted from its claim is of
    #: its own flavor (TypeAffinityFilter), as its host's report will say.
    member_flavors: dict[str, Any] = field(default_factory=dict)

    VALID_POLICIES = ("affinity", "anti-affinity", "soft-affinity", "soft-anti-affinity")

    def __post_init__(self) -> None:
        if "max_server_per_host" in self.rules:
            # The only rule Nova coerces; anything non-integer is a caller error.
            self.rules = dict(self.rules)
            self.rules["max_server_per_host"] = int(self.rules["max_server_per_host"])

    @property
    def policies(self) -> list[str]:
        """The deprecated read-only list form, ``[policy]``."""
        return [self.policy]


@dataclass(frozen=True)
class CellMapping:
    """A cell: its uuid, name and whether the scheduler may use it."""

    uuid: str
    name: str = ""
    disabled: bool = False


@dataclass
class Destination:
    """``requested_destination``: a target host/node/cell and aggregate constraints."""

    host: str | None = None
    node: str | None = None
    cell: CellMapping | None = None
    aggregates: list[str] = field(default_factory=list)
    forbidden_aggregates: set[str] = field(default_factory=set)
    allow_cross_cell_move: bool = False


@dataclass(frozen=True)
class ComputeNodeRef:
    """A (host, hypervisor_hostname) pair, as kept in ``retry.hosts``."""

    host: str
    hypervisor_hostname: str


@dataclass
class SchedulerRetries:
    """Build attempts so far and the nodes already tried (used by RetryFilter)."""

    num_attempts: int = 0
    hosts: list[ComputeNodeRef] = field(default_factory=list)


@dataclass
class NetworkMetadata:
    """Physical networks and tunnelling a request's NICs need (NUMA affinity)."""

    physnets: set[str] = field(default_factory=set)
    tunneled: bool = False


def coerce_hints(hints: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """Coerce scheduler hints as Nova does: every value a list of strings.

    A ``None`` value is dropped; a scalar becomes a one-element list.
    """
    result: dict[str, list[str]] = {}
    for key, value in (hints or {}).items():
        if value is None:
            continue
        items: Iterable[Any] = value if isinstance(value, (list, tuple)) else [value]
        result[str(key)] = [str(item) for item in items]
    return result


@dataclass
class RequestSpec:
    """Nova's ``RequestSpec``: what to build, how many, and the constraints on where.

    ``scheduler_hints`` values are lists of strings (coerced on construction);
    :meth:`get_scheduler_hint` unwraps single-element lists like Nova.
    """

    flavor: Flavor
    image: ImageMeta | None = None
    scheduler_hints: dict[str, list[str]] | None = None
    instance_group: InstanceGroup | None = None
    project_id: str | None = None
    user_id: str | None = None
    availability_zone: str | None = None
    num_instances: int = 1
    instance_uuid: str | None = None
    ignore_hosts: list[str] | None = None
    force_hosts: list[str] | None = None
    force_nodes: list[str] | None = None
    requested_destination: Destination | None = None
    retry: SchedulerRetries | None = None
    numa_topology: Any = None
    pci_requests: Any = None
    network_metadata: NetworkMetadata | None = None
    requested_resources: list[Any] = field(default_factory=list)
    request_level_params: Any = None
    is_bfv: bool = False
    requested_networks: Any = None

    def __post_init__(self) -> None:
        if self.scheduler_hints is not None:
            self.scheduler_hints = coerce_hints(self.scheduler_hints)
        if self.num_instances < 1:
            raise ValueError("num_instances must be at least 1")

    # Shortcuts Nova offers on the spec itself.
    @property
    def vcpus(self) -> int:
        """``flavor.vcpus``."""
        return self.flavor.vcpus

    @property
    def memory_mb(self) -> int:
        """``flavor.memory_mb``."""
        return self.flavor.memory_mb

    @property
    def root_gb(self) -> int:
        """``flavor.root_gb``."""
        return self.flavor.root_gb

    @property
    def ephemeral_gb(self) -> int:
        """``flavor.ephemeral_gb``."""
        return self.flavor.ephemeral_gb

    @property
    def swap(self) -> int:
        """``flavor.swap`` (MB)."""
        return self.flavor.swap

    def get_scheduler_hint(self, hint_name: str, default: Any = None) -> Any:
        """The hint's single element, the whole list if it has several, else ``default``."""
        if not self.scheduler_hints:
            return default
        values = self.scheduler_hints.get(hint_name)
        if values is None:
            return default
        if len(values) == 1:
            return values[0]
        return values

    def get_request_group_mapping(self) -> dict[str, list[str]] | None:
        """Nova's mapping of each request group's ``requester_id`` to the providers that
        serve it (``provider_uuids``, set by the scheduler from the claimed allocation
        request); None without ``requested_resources``. NUMA fitting and PCI pool
        accounting read it to follow placement's choice of provider."""
        if self.requested_resources is None:
            return None
        return {group.requester_id: list(group.provider_uuids or [])
                for group in self.requested_resources}

    def is_rebuild(self) -> bool:
        """Nova's ``request_is_rebuild``: ``_nova_check_type`` is exactly ``['rebuild']``."""
        return bool(self.scheduler_hints) and (
            (self.scheduler_hints or {}).get("_nova_check_type") == ["rebuild"]
        )

    def obj_attr_is_set(self, name: str) -> bool:
        """True when the field ``name`` holds a value."""
        return getattr(self, name, None) is not None


#: The most instances one request may ask for (``POST /boot``, ``berth boot --num``).
#: Nova bounds a multi-create only by quotas, which Berth does not have; every instance
#: costs a host list, a claim and a build, so an unbounded count could exhaust a server.
MAX_INSTANCES_PER_REQUEST = 1000


def new_instance_uuids(rng: random.Random, count: int) -> list[str]:
    """``count`` fresh instance uuids (version 4) drawn from ``rng``.

    Nova's API names every instance before it asks for hosts, and the scheduler claims
    for those names; Berth's callers in that place (``berth boot``'s API, the conductor,
    ``berth schedule``) draw them from their seeded generator, so a decision replays.
    """
    return [str(uuidlib.UUID(int=rng.getrandbits(128), version=4)) for _ in range(count)]
