"""HypervisorVersionWeigher: prefer hosts running a newer hypervisor.

Raw value ``hypervisor_version or 0`` (an unreported version counts as 0), min/max
normalized. Option: ``[filter_scheduler] hypervisor_version_weight_multiplier``
(default 1.0); negative prefers older hypervisors. Aggregate metadata
``hypervisor_version_weight_multiplier`` overrides it per host (minimum wins).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from berth.weighers.utils import MultiplierWeigher

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec


class HypervisorVersionWeigher(MultiplierWeigher):
    """Newer hypervisor versions weigh more (hypervisor_version_weight_multiplier)."""

    multiplier_option: ClassVar[str] = "hypervisor_version_weight_multiplier"

    def _weigh_object(self, host_state: HostState, weight_properties: RequestSpec) -> float:
        """``hypervisor_version``, 0 when the host does not report one."""
        return host_state.hypervisor_version or 0

    def weigh_all_hosts(self, hosts: Hosts, weight_properties: RequestSpec) -> np.ndarray:
        """``hypervisor_version`` of every host, NaN (not reported) as 0."""
        values = hosts.col("hypervisor_version")
        missing = np.isnan(values)
        if missing.any():
            values = np.where(missing, 0.0, values)
        return self.clamp_all(values)
