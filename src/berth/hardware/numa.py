"""NUMA topologies: the host model, request parsing, fitting and consumption.

This module gathers the public names of three: the model (:mod:`.numa_model`), a
request's parsing (:mod:`.numa_request`) and the fitting and consumption
(:mod:`.numa_fit`).

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
  limits, emulator threads, PCI and network affinity); with :func:`guest_state`, several
  fits of one request carry what each wrote into the guest cells, as Nova's objects do;
* :func:`numa_usage_from_instance_numa` and :func:`consume` — the host topology after the
  instance is placed (pinned CPUs, memory, CPU usage, huge pages);
* :func:`prepare_request` — fill ``spec.numa_topology`` and ``spec.pci_requests``.

The core reads no globals: ``[compute] packing_host_numa_cells_allocation_strategy`` is
passed in explicitly (``pack=``), and travels to consumption inside
:class:`NUMATopologyLimits`, which the filter stores in ``host_state.limits``.
"""

from __future__ import annotations

from berth.hardware.numa_fit import (
    consume,
    guest_state,
    numa_fit_instance_to_host,
    numa_usage_from_instance_numa,
    order_host_cells,
    pci_count_by_cell,
)
from berth.hardware.numa_model import (
    CPU_POLICIES,
    DEDICATED,
    EMULATOR_ISOLATE,
    EMULATOR_POLICIES,
    EMULATOR_SHARE,
    ISOLATE,
    MEMPAGES_ANY,
    MEMPAGES_LARGE,
    MEMPAGES_SMALL,
    MIXED,
    PREFER,
    REQUIRE,
    SHARED,
    THREAD_POLICIES,
    CellNetworkMetadata,
    InstanceNUMACell,
    InstanceNUMATopology,
    NUMACell,
    NUMAPagesTopology,
    NUMATopology,
    NUMATopologyLimits,
    NUMAUsageError,
    format_cpu_spec,
    parse_cpu_spec,
)
from berth.hardware.numa_request import (
    CPUConstraints,
    cpu_constraints,
    numa_topology_from_request,
    prepare_request,
    vpmem_labels,
)

__all__ = [
    "CPUConstraints",
    "CPU_POLICIES",
    "CellNetworkMetadata",
    "DEDICATED",
    "EMULATOR_ISOLATE",
    "EMULATOR_POLICIES",
    "EMULATOR_SHARE",
    "ISOLATE",
    "InstanceNUMACell",
    "InstanceNUMATopology",
    "MEMPAGES_ANY",
    "MEMPAGES_LARGE",
    "MEMPAGES_SMALL",
    "MIXED",
    "NUMACell",
    "NUMAPagesTopology",
    "NUMATopology",
    "NUMATopologyLimits",
    "NUMAUsageError",
    "PREFER",
    "REQUIRE",
    "SHARED",
    "THREAD_POLICIES",
    "consume",
    "cpu_constraints",
    "format_cpu_spec",
    "guest_state",
    "numa_fit_instance_to_host",
    "numa_topology_from_request",
    "numa_usage_from_instance_numa",
    "order_host_cells",
    "parse_cpu_spec",
    "pci_count_by_cell",
    "prepare_request",
    "vpmem_labels",
]
