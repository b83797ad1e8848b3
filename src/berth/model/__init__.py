"""Berth's domain model, with Nova's attribute names so that a filter written for Nova
reads the same fields (``spec_obj.flavor.extra_specs``, ``host_state.free_ram_mb``, ...)."""

from berth.model.aggregate import Aggregate
from berth.model.compute import Instance, MetricItem, ServiceRecord
from berth.model.request import (
    CellMapping,
    ComputeNodeRef,
    Destination,
    Flavor,
    ImageMeta,
    ImageMetaProps,
    InstanceGroup,
    NetworkMetadata,
    RequestSpec,
    SchedulerRetries,
)
from berth.model.selection import Selection

__all__ = [
    "Aggregate",
    "CellMapping",
    "ComputeNodeRef",
    "Destination",
    "Flavor",
    "ImageMeta",
    "ImageMetaProps",
    "Instance",
    "InstanceGroup",
    "MetricItem",
    "NetworkMetadata",
    "RequestSpec",
    "SchedulerRetries",
    "Selection",
    "ServiceRecord",
]
