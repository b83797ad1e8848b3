"""The explicit table of built-in filters: config name -> ``module:Class``.

No directory scanning: a filter exists for the scheduler when it is listed here (or comes
from a dotted path or the ``berth.filters`` entry-point group, see :mod:`berth.plugins`).
Modules are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from berth.filters.base import BaseHostFilter

BUILTIN_FILTERS: dict[str, str] = {
    # Current Nova filters (reference §3).
    "AllHostsFilter": "berth.filters.all_hosts:AllHostsFilter",
    "ComputeFilter": "berth.filters.compute:ComputeFilter",
    "ComputeCapabilitiesFilter": "berth.filters.compute_capabilities:ComputeCapabilitiesFilter",
    "ImagePropertiesFilter": "berth.filters.image_properties:ImagePropertiesFilter",
    "ServerGroupAffinityFilter": "berth.filters.server_group:ServerGroupAffinityFilter",
    "ServerGroupAntiAffinityFilter": "berth.filters.server_group:ServerGroupAntiAffinityFilter",
    "SameHostFilter": "berth.filters.host_affinity:SameHostFilter",
    "DifferentHostFilter": "berth.filters.host_affinity:DifferentHostFilter",
    "SimpleCIDRAffinityFilter": "berth.filters.simple_cidr:SimpleCIDRAffinityFilter",
    "IoOpsFilter": "berth.filters.io_ops:IoOpsFilter",
    "AggregateIoOpsFilter": "berth.filters.io_ops:AggregateIoOpsFilter",
    "NumInstancesFilter": "berth.filters.num_instances:NumInstancesFilter",
    "AggregateNumInstancesFilter": "berth.filters.num_instances:AggregateNumInstancesFilter",
    "AggregateInstanceExtraSpecsFilter": (
        "berth.filters.aggregate_instance_extra_specs:AggregateInstanceExtraSpecsFilter"
    ),
    "AggregateMultiTenancyIsolation": (
        "berth.filters.aggregate_multitenancy_isolation:AggregateMultiTenancyIsolation"
    ),
    "AggregateTypeAffinityFilter": "berth.filters.type_affinity:AggregateTypeAffinityFilter",
    "AggregateImagePropertiesIsolation": (
        "berth.filters.aggregate_image_properties_isolation:AggregateImagePropertiesIsolation"
    ),
    "IsolatedHostsFilter": "berth.filters.isolated_hosts:IsolatedHostsFilter",
    "JsonFilter": "berth.filters.json_filter:JsonFilter",
    "MetricsFilter": "berth.filters.metrics:MetricsFilter",
    "NUMATopologyFilter": "berth.filters.numa_topology:NUMATopologyFilter",
    "PciPassthroughFilter": "berth.filters.pci_passthrough:PciPassthroughFilter",
    # Removed from Nova, kept for the seeds' configurations (reference §12).
    "AvailabilityZoneFilter": "berth.filters.availability_zone:AvailabilityZoneFilter",
    "RamFilter": "berth.filters.ram:RamFilter",
    "AggregateRamFilter": "berth.filters.ram:AggregateRamFilter",
    "CoreFilter": "berth.filters.core:CoreFilter",
    "AggregateCoreFilter": "berth.filters.core:AggregateCoreFilter",
    "DiskFilter": "berth.filters.disk:DiskFilter",
    "AggregateDiskFilter": "berth.filters.disk:AggregateDiskFilter",
    "RetryFilter": "berth.filters.retry:RetryFilter",
    "TrustedFilter": "berth.filters.trusted:TrustedFilter",
    "TypeAffinityFilter": "berth.filters.type_affinity:TypeAffinityFilter",
}

#: The filters Nova's old ``standard_filters`` helper named (seeds 001-003 era).
LEGACY_STANDARD_FILTERS = tuple(BUILTIN_FILTERS)

#: Nova 34's default ``enabled_filters``.
DEFAULT_ENABLED_FILTERS = (
    "ComputeFilter",
    "ComputeCapabilitiesFilter",
    "ImagePropertiesFilter",
    "ServerGroupAntiAffinityFilter",
    "ServerGroupAffinityFilter",
)


def load_builtin(name: str) -> type[BaseHostFilter]:
    """Import and return the built-in filter class registered as ``name``."""
    module_name, _, class_name = BUILTIN_FILTERS[name].partition(":")
    cls: type[BaseHostFilter] = getattr(importlib.import_module(module_name), class_name)
    return cls


def builtin_filter_classes() -> list[type[BaseHostFilter]]:
    """Every built-in filter class, in registry order."""
    return [load_builtin(name) for name in BUILTIN_FILTERS]
