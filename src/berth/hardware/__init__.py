"""Host hardware models the NUMA and PCI filters reason about (reference §3.18, §3.19).

* :mod:`berth.hardware.numa` — host and instance NUMA topologies, request parsing from
  flavor extra specs and image properties, fitting an instance onto a host
  (``numa_fit_instance_to_host``) and consumption (``consume``).
* :mod:`berth.hardware.pci` — PCI device pools (``PciDeviceStats``), PCI requests and
  aliases.
* :mod:`berth.hardware.columns` — per-row signature codes of these objects, so the bulk
  filters evaluate once per distinct topology instead of once per host.

Host-side objects are immutable values: consumption returns new ones, which is what lets
a topology's signature be computed once and cached.
"""

from berth.hardware.numa import (
    InstanceNUMACell,
    InstanceNUMATopology,
    NUMACell,
    NUMAPagesTopology,
    NUMATopology,
    NUMATopologyLimits,
    consume,
    numa_fit_instance_to_host,
    numa_topology_from_request,
    numa_usage_from_instance_numa,
    prepare_request,
)
from berth.hardware.pci import (
    InstancePCIRequest,
    InstancePCIRequests,
    PciDeviceStats,
    pci_requests_from_flavor,
)

__all__ = [
    "InstanceNUMACell",
    "InstanceNUMATopology",
    "InstancePCIRequest",
    "InstancePCIRequests",
    "NUMACell",
    "NUMAPagesTopology",
    "NUMATopology",
    "NUMATopologyLimits",
    "PciDeviceStats",
    "consume",
    "numa_fit_instance_to_host",
    "numa_topology_from_request",
    "numa_usage_from_instance_numa",
    "pci_requests_from_flavor",
    "prepare_request",
]
