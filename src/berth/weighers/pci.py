"""PCIWeigher: keep hosts with free PCI devices for the requests that need them.

Raw value ``100 - min(free, 99)`` where ``free`` is the host's number of free PCI
devices (0 without PCI stats), so the host with the fewest free devices wins whatever the
request asks (stacking). Option: ``[filter_scheduler] pci_weight_multiplier`` (default
1.0, only non-negative values allowed); aggregate metadata ``pci_weight_multiplier``
overrides it (minimum wins).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from berth.weighers.utils import MultiplierWeigher, per_host_column

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec

#: Hosts with this many free devices or more all weigh the same (1).
MAX_DEVICES = 100


def free_pci_devices(pci_stats: Any) -> int:
    """Free devices over every pool of ``pci_stats`` (0 when the host has none)."""
    if pci_stats is None:
        return 0
    free_count = getattr(pci_stats, "free_count", None)
    if callable(free_count):
        return int(free_count())
    total = 0
    for pool in getattr(pci_stats, "pools", None) or []:
        count = pool.get("count", 0) if isinstance(pool, Mapping) else getattr(pool, "count", 0)
        total += int(count or 0)
    return total


class PCIWeigher(MultiplierWeigher):
    """Fewer free PCI devices weigh more, keeping PCI-rich hosts for PCI requests."""

    multiplier_option: ClassVar[str] = "pci_weight_multiplier"

    def _weigh_object(self, host_state: HostState, weight_properties: RequestSpec) -> float:
        """``100 - min(free devices, 99)``: the request is not looked at."""
        return MAX_DEVICES - min(free_pci_devices(host_state.pci_stats), MAX_DEVICES - 1)

    def weigh_all_hosts(self, hosts: Hosts, weight_properties: RequestSpec) -> np.ndarray:
        """The raw value of every host (device counts cached per snapshot row)."""
        free = per_host_column(hosts, "pci_stats", "pci_free_devices", free_pci_devices)
        return self.clamp_all(MAX_DEVICES - np.minimum(free, MAX_DEVICES - 1))
