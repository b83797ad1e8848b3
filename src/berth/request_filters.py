"""Pre-placement request filters (reference §9): they shape the placement query.

:func:`process_reqspec` runs every filter of :data:`ALL_REQUEST_FILTERS` in order on a
spec that is not a rebuild. Each filter reads the spec, the configuration and the list
of host aggregates (no globals), may add ``member_of`` groups
(``requested_destination.aggregates`` / ``forbidden_aggregates``) or required/forbidden
root traits (``spec.request_level_params``), and answers whether it changed anything.
A :class:`RequestFilterFailed` means no host can satisfy the request; the scheduler
service turns it into a NoValidHost carrying its message (Nova's "Scheduling failed:
<reason>").

Data from outside the scheduler is injected through :class:`FilterContext`: a
:class:`NetworkLookup` (ports, routed-network segment aggregates) and the minimum
nova-compute service version (``owner_nova_filter``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from berth.config import SchedulerConfig
from berth.errors import ImagePropertyError, SchedulingError
from berth.hardware.pci import InstancePCIRequest, requests_of
from berth.model.aggregate import Aggregate
from berth.model.request import Destination, RequestSpec
from berth.resource_request import (
    allowed_value,
    from_request_spec,
    request_level_params,
    trait_exists,
    unique_flavor_image_value,
)

LOG = logging.getLogger(__name__)

#: The minimum nova-compute service version from which OWNER_NOVA is required.
OWNER_NOVA_MIN_SERVICE_VERSION = 73

_TRUE = {"1", "t", "true", "on", "y", "yes"}


class RequestFilterFailed(SchedulingError):
    """A request filter found that no host can satisfy the request.

    The message is Nova's "Scheduling failed: <reason>", which the NoValidHost raised
    for it keeps; ``reason`` is the bare reason.
    """

    code = "berth.scheduling.request_filter_failed"

    def __init__(self, reason: str, **details: Any) -> None:
        super().__init__(f"Scheduling failed: {reason}", **details)
        self.reason = reason


class NetworkLookup(Protocol):
    """Network data the routed-networks and remote-managed-ports filters need."""

    def port(self, port_id: str) -> Mapping[str, Any]:
        """The port: ``network_id``, ``fixed_ips`` ([{subnet_id, ...}]), ``binding:vnic_type``."""
        ...

    def network_aggregates(self, network_id: str) -> list[str]:
        """Aggregate uuids of the network's segments ([] for a non-routed network)."""
        ...

    def subnet_aggregates(self, subnet_id: str) -> list[str]:
        """Aggregate uuids of the subnet's segment ([] when the subnet has no segment);
        LookupError when the segment has no aggregate."""
        ...


@dataclass
class StaticNetworkLookup:
    """A :class:`NetworkLookup` over in-memory tables (tests, simulations, ``berth serve``)."""

    ports: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Network id -> its segments' aggregates (absent or [] when not routed).
    networks: dict[str, list[str]] = field(default_factory=dict)
    #: Subnet id -> its segment's aggregates (absent: no segment; []: a segment that
    #: has no aggregate, a routed-network configuration error).
    subnets: dict[str, list[str]] = field(default_factory=dict)

    def port(self, port_id: str) -> Mapping[str, Any]:
        """The port, or KeyError naming it."""
        if port_id not in self.ports:
            raise KeyError(f"port {port_id} not found")
        return self.ports[port_id]

    def network_aggregates(self, network_id: str) -> list[str]:
        """Segment aggregates of a network ([] when not routed)."""
        return list(self.networks.get(network_id, []))

    def subnet_aggregates(self, subnet_id: str) -> list[str]:
        """The segment aggregates of a subnet ([] without a segment), or LookupError
        when its segment has none."""
        if subnet_id not in self.subnets:
            return []
        if not self.subnets[subnet_id]:
            raise LookupError(f"the segment of subnet {subnet_id} has no aggregate")
        return list(self.subnets[subnet_id])


@dataclass(frozen=True)
class FilterContext:
    """What the request filters may consult besides the spec and the config."""

    network_lookup: NetworkLookup | None = None
    min_compute_version: int | None = None


RequestFilter = Callable[[RequestSpec, SchedulerConfig, Sequence[Aggregate], FilterContext], bool]


# --------------------------------------------------------------------------- helpers
def _destination(spec: RequestSpec) -> Destination:
    if spec.requested_destination is None:
        spec.requested_destination = Destination()
    return spec.requested_destination


def require_aggregates(spec: RequestSpec, uuids: Iterable[str]) -> None:
    """Add one OR group of aggregates (``member_of=in:a,b``) to the destination."""
    _destination(spec).aggregates.append(",".join(sorted(set(uuids))))


def _truthy(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    return value is not None and str(value).strip().lower() in _TRUE


def _flavor_or_image(spec: RequestSpec, flavor_key: str, image_key: str) -> Any:
    value = spec.flavor.extra_specs.get(flavor_key)
    if value is None and spec.image is not None:
        value = spec.image.properties.get(image_key)
    return value


def _root_required(spec: RequestSpec, trait: str) -> None:
    request_level_params(spec).root_required.add(trait)


def _field(item: Any, name: str) -> Any:
    if isinstance(item, Mapping):
        return item.get(name)
    return getattr(item, name, None)


# --------------------------------------------------------------------------- filters
def require_tenant_aggregate(spec: RequestSpec, config: SchedulerConfig,
                             aggregates: Sequence[Aggregate], ctx: FilterContext) -> bool:
    """Tenant isolation in placement: aggregates whose ``filter_tenant_id*`` metadata
    equals the project id (exactly) become one required OR group."""
    if not config.scheduler.limit_tenants_to_placement_aggregate:
        return False
    found = [a.uuid for a in aggregates
             if any(k.startswith("filter_tenant_id") and v == spec.project_id
                    for k, v in a.metadata.items())]
    if found:
        require_aggregates(spec, found)
        return True
    if config.scheduler.placement_aggregate_required_for_tenants:
        raise RequestFilterFailed("No hosts available for tenant")
    return False


def map_az_to_placement_aggregate(spec: RequestSpec, config: SchedulerConfig,
                                  aggregates: Sequence[Aggregate], ctx: FilterContext) -> bool:
    """The requested availability zone's aggregates become one required OR group."""
    zone = spec.availability_zone
    if not zone:
        return False
    found = [a.uuid for a in aggregates if a.metadata.get("availability_zone") == zone]
    if not found:
        return False
    require_aggregates(spec, found)
    return True


def require_image_type_support(spec: RequestSpec, config: SchedulerConfig,
                               aggregates: Sequence[Aggregate], ctx: FilterContext) -> bool:
    """The image's disk format as a required root trait ``COMPUTE_IMAGE_TYPE_<FORMAT>``."""
    if not config.scheduler.query_placement_for_image_type_support or spec.is_bfv:
        return False
    disk_format = spec.image.disk_format if spec.image is not None else None
    if not disk_format:
        return False
    trait = f"COMPUTE_IMAGE_TYPE_{disk_format.upper()}"
    if not trait_exists(trait):
        LOG.error("image disk format %r has no trait %s; not filtering on it", disk_format, trait)
        return False
    _root_required(spec, trait)
    return True


def compute_status_filter(spec: RequestSpec, config: SchedulerConfig,
                          aggregates: Sequence[Aggregate], ctx: FilterContext) -> bool:
    """Disabled compute services are left out: COMPUTE_STATUS_DISABLED is forbidden."""
    request_level_params(spec).root_forbidden.add("COMPUTE_STATUS_DISABLED")
    return True


def isolate_aggregates(spec: RequestSpec, config: SchedulerConfig,
                       aggregates: Sequence[Aggregate], ctx: FilterContext) -> bool:
    """Aggregates requiring a trait (``trait:X=required``) the request does not ask for
    are forbidden."""
    if not config.scheduler.enable_isolated_aggregate_filtering:
        return False
    request = from_request_spec(spec)
    wanted: set[str] = set()
    for group in request.groups.values():
        wanted |= group.required_traits
    keys = {f"trait:{t}" for t in wanted}
    isolated = [a.uuid for a in aggregates
                if any(k.startswith("trait:") and v == "required" and k not in keys
                       for k, v in a.metadata.items())]
    if not isolated:
        return False
    _destination(spec).forbidden_aggregates |= set(isolated)
    return True


#: Image property -> trait prefix (the value is upper-cased, ``-`` becomes ``_``).
IMAGE_TRAIT_PREFIXES: dict[str, str] = {
    "hw_cdrom_bus": "COMPUTE_STORAGE_BUS",
    "hw_disk_bus": "COMPUTE_STORAGE_BUS",
    "hw_video_model": "COMPUTE_GRAPHICS_MODEL",
    "hw_vif_model": "COMPUTE_NET_VIF_MODEL",
    "hw_architecture": "HW_ARCH",
    "hw_emulation_architecture": "COMPUTE_ARCH",
    # Nova 34's prefix. os-traits names these traits COMPUTE_VIOMMU_MODEL_<MODEL>, so
    # COMPUTE_VIOMMU_<MODEL> is never known: as in Nova, an image with hw_viommu_model
    # gets an error logged and no image trait at all.
    "hw_viommu_model": "COMPUTE_VIOMMU",
}


def transform_image_metadata(spec: RequestSpec, config: SchedulerConfig,
                             aggregates: Sequence[Aggregate], ctx: FilterContext) -> bool:
    """Image properties (bus, video, vif, arch, viommu) become required root traits;
    if any of them is not a known trait, none is added (which is always the case with
    ``hw_viommu_model``, see :data:`IMAGE_TRAIT_PREFIXES`)."""
    if not config.scheduler.image_metadata_prefilter or spec.image is None:
        return False
    traits = []
    for prop, prefix in IMAGE_TRAIT_PREFIXES.items():
        value = spec.image.properties.get(prop)
        if value is None:
            continue
        trait = f"{prefix}_{str(value).replace('-', '_').upper()}"
        if not trait_exists(trait):
            LOG.error("image property %s=%r maps to unknown trait %s; no image trait is "
                      "added", prop, value, trait)
            return False
        traits.append(trait)
    for trait in traits:
        _root_required(spec, trait)
    return bool(traits)


def accelerators_filter(spec: RequestSpec, config: SchedulerConfig,
                        aggregates: Sequence[Aggregate], ctx: FilterContext) -> bool:
    """A device profile (``accel:device_profile``) requires COMPUTE_ACCELERATORS."""
    if not spec.flavor.extra_specs.get("accel:device_profile"):
        return False
    _root_required(spec, "COMPUTE_ACCELERATORS")
    return True


def packed_virtqueue_filter(spec: RequestSpec, config: SchedulerConfig,
                            aggregates: Sequence[Aggregate], ctx: FilterContext) -> bool:
    """A packed virtqueue (``hw:virtio_packed_ring``) requires COMPUTE_NET_VIRTIO_PACKED."""
    if not _truthy(_flavor_or_image(spec, "hw:virtio_packed_ring", "hw_virtio_packed_ring")):
        return False
    _root_required(spec, "COMPUTE_NET_VIRTIO_PACKED")
    return True


def routed_networks_filter(spec: RequestSpec, config: SchedulerConfig,
                           aggregates: Sequence[Aggregate], ctx: FilterContext) -> bool:
    """Each NIC on a routed network requires one of its segments' aggregates."""
    if not config.scheduler.query_placement_for_routed_network_aggregates:
        return False
    networks = list(spec.requested_networks or [])
    if not networks:
        return False
    lookup = ctx.network_lookup
    if lookup is None:
        raise RequestFilterFailed(
            "routed network aggregates were requested ([scheduler] "
            "query_placement_for_routed_network_aggregates) but no network lookup is "
            "configured")
    for nic in networks:
        port_id, network_id = _field(nic, "port_id"), _field(nic, "network_id")
        found: list[str] = []
        if port_id:
            try:
                port = lookup.port(str(port_id))
            except (LookupError, ValueError) as exc:
                raise RequestFilterFailed(f"port {port_id} not found") from exc
            fixed = port.get("fixed_ips") or []
            if fixed:
                # A port with an address stays on its (first) subnet's segment.
                subnet_id = fixed[0]["subnet_id"]
                try:
                    found = lookup.subnet_aggregates(str(subnet_id))
                except (LookupError, ValueError) as exc:
                    raise RequestFilterFailed(
                        f"Aggregates not found for the subnet {subnet_id}") from exc
                network_id = None
            else:
                network_id = port.get("network_id")
        if network_id:
            try:
                found = lookup.network_aggregates(str(network_id))
            except (LookupError, ValueError) as exc:
                raise RequestFilterFailed(
                    f"Aggregates not found for the network {network_id}") from exc
        if found:
            require_aggregates(spec, found)
    return True


def remote_managed_ports_filter(spec: RequestSpec, config: SchedulerConfig,
                                aggregates: Sequence[Aggregate], ctx: FilterContext) -> bool:
    """A remote-managed port requires COMPUTE_REMOTE_MANAGED_PORTS."""
    for nic in spec.requested_networks or []:
        vnic_type = _field(nic, "vnic_type")
        port_id = _field(nic, "port_id")
        if vnic_type is None and port_id and ctx.network_lookup is not None:
            try:
                vnic_type = ctx.network_lookup.port(str(port_id)).get("binding:vnic_type")
            except (KeyError, LookupError):
                vnic_type = None
        if vnic_type == "remote-managed":
            _root_required(spec, "COMPUTE_REMOTE_MANAGED_PORTS")
            return True
    return False


#: Nova 34's ephemeral encryption formats and sound models (``fields``).
_EPHEMERAL_FORMATS = ("plain", "luks", "luksv2")
_SOUND_MODELS = ("sb16", "es1370", "pcspk", "ac97", "ich6", "ich9", "usb", "virtio")


def ephemeral_encryption_filter(spec: RequestSpec, config: SchedulerConfig,
                                aggregates: Sequence[Aggregate], ctx: FilterContext) -> bool:
    """Ephemeral encryption requires COMPUTE_EPHEMERAL_ENCRYPTION (and the format's trait).

    As Nova: a flavor and an image that ask for and against it, or name two formats,
    are refused (FlavorImageConflict), and so is a format Nova does not know."""
    flavor_value = spec.flavor.extra_specs.get("hw:ephemeral_encryption")
    props = spec.image.properties if spec.image is not None else None
    image_value = props.get("hw_ephemeral_encryption") if props is not None else None
    wanted = None if flavor_value is None else _truthy(flavor_value)
    if wanted is not None and image_value is not None and wanted != _truthy(image_value):
        raise ImagePropertyError(
            "hw_ephemeral_encryption", image_value,
            f"conflicts with the flavor's hw:ephemeral_encryption {flavor_value!r} (Nova's "
            "FlavorImageConflict)")
    if not (wanted or (image_value is not None and _truthy(image_value))):
        return False
    _root_required(spec, "COMPUTE_EPHEMERAL_ENCRYPTION")
    fmt, where = unique_flavor_image_value(spec, "ephemeral_encryption_format")
    if fmt:
        fmt = allowed_value(fmt, where, _EPHEMERAL_FORMATS, "ephemeral encryption format")
        _root_required(spec, f"COMPUTE_EPHEMERAL_ENCRYPTION_{fmt.upper()}")
    return True


def virtio_sound_filter(spec: RequestSpec, config: SchedulerConfig,
                        aggregates: Sequence[Aggregate], ctx: FilterContext) -> bool:
    """The virtio sound model requires COMPUTE_SOUND_MODEL_VIRTIO. As Nova, a flavor
    and an image naming two models, or a model Nova does not know, are refused."""
    model, where = unique_flavor_image_value(spec, "sound_model")
    if not model or allowed_value(model, where, _SOUND_MODELS, "sound device model") != "virtio":
        return False
    _root_required(spec, "COMPUTE_SOUND_MODEL_VIRTIO")
    return True


#: ``hw:tpm_secret_security`` values and their traits.
TPM_SECRET_SECURITY = {
    "user": "COMPUTE_SECURITY_TPM_SECRET_SECURITY_USER",
    "host": "COMPUTE_SECURITY_TPM_SECRET_SECURITY_HOST",
    "deployment": "COMPUTE_SECURITY_TPM_SECRET_SECURITY_DEPLOYMENT",
}


def tpm_secret_security_filter(spec: RequestSpec, config: SchedulerConfig,
                               aggregates: Sequence[Aggregate], ctx: FilterContext) -> bool:
    """A vTPM requires the trait of its secret security (``hw:tpm_secret_security``,
    default ``user``); any other value fails the request."""
    if _flavor_or_image(spec, "hw:tpm_version", "hw_tpm_version") is None:
        return False
    # Unset or empty means user, as Nova's ``... or 'user'``.
    value = spec.flavor.extra_specs.get("hw:tpm_secret_security") or "user"
    trait = TPM_SECRET_SECURITY.get(value)
    if trait is None:
        raise RequestFilterFailed(
            f"unsupported hw:tpm_secret_security {value!r}: expected one of "
            f"{', '.join(TPM_SECRET_SECURITY)}")
    _root_required(spec, trait)
    return True


def _flavor_pci_request_ids(spec: RequestSpec) -> set[str]:
    """Request ids of the spec's PCI requests that did not come from a Neutron port."""
    return {str(r.request_id) for r in requests_of(spec.pci_requests)
            if r.request_id and r.source != InstancePCIRequest.NEUTRON_PORT}


def owner_nova_filter(spec: RequestSpec, config: SchedulerConfig,
                      aggregates: Sequence[Aggregate], ctx: FilterContext) -> bool:
    """Once every compute is new enough, the root and flavor-PCI groups require OWNER_NOVA.

    A spec that already requires OWNER_NOVA (a reschedule) is left as it is, whatever the
    compute versions. A PCI group is one of ``spec.requested_resources`` whose
    ``requester_id`` without its last ``-N`` part is a PCI request id; Neutron ports'
    PCI requests (no alias) are left out.
    """
    params = spec.request_level_params
    if params is not None and "OWNER_NOVA" in params.root_required:
        return True
    version = ctx.min_compute_version
    if version is None or version < OWNER_NOVA_MIN_SERVICE_VERSION:
        return False
    _root_required(spec, "OWNER_NOVA")
    pci_ids = _flavor_pci_request_ids(spec)
    for group in spec.requested_resources or []:
        requester = str(getattr(group, "requester_id", "") or "")
        if requester and requester.rsplit("-", 1)[0] in pci_ids:
            group.required_traits.add("OWNER_NOVA")
    return True


#: Every request filter, in Nova's order.
ALL_REQUEST_FILTERS: tuple[RequestFilter, ...] = (
    require_tenant_aggregate,
    map_az_to_placement_aggregate,
    require_image_type_support,
    compute_status_filter,
    isolate_aggregates,
    transform_image_metadata,
    accelerators_filter,
    packed_virtqueue_filter,
    routed_networks_filter,
    remote_managed_ports_filter,
    ephemeral_encryption_filter,
    virtio_sound_filter,
    tpm_secret_security_filter,
    owner_nova_filter,
)


def process_reqspec(
    spec: RequestSpec,
    config: SchedulerConfig,
    aggregates: Sequence[Aggregate],
    *,
    network_lookup: NetworkLookup | None = None,
    min_compute_version: int | None = None,
) -> list[str]:
    """Run every request filter in order on ``spec`` (mutated); returns the names of
    those that changed it. Raises :class:`RequestFilterFailed`."""
    ctx = FilterContext(network_lookup, min_compute_version)
    applied = []
    for request_filter in ALL_REQUEST_FILTERS:
        if request_filter(spec, config, aggregates, ctx):
            applied.append(request_filter.__name__)
    return applied
