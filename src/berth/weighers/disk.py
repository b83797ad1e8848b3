"""DiskWeigher: prefer hosts with more free disk (spread); a negative multiplier stacks.

Raw value ``free_disk_mb``, clamped at 0 (``minval = 0``). Option:
``[filter_scheduler] disk_weight_multiplier`` (default 1.0); aggregate metadata
``disk_weight_multiplier`` overrides it per host (minimum wins).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from berth.weighers.utils import MultiplierWeigher

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec


class DiskWeigher(MultiplierWeigher):
    """More free disk weighs more (disk_weight_multiplier; negative stacks)."""

    minval: ClassVar[float | None] = 0
    multiplier_option: ClassVar[str] = "disk_weight_multiplier"

    def _weigh_object(self, host_state: HostState, weight_properties: RequestSpec) -> float:
        """Higher wins: spreading is the default."""
        return host_state.free_disk_mb

    def weigh_all_hosts(self, hosts: Hosts, weight_properties: RequestSpec) -> np.ndarray:
        """``free_disk_mb`` of every host, clamped at 0."""
        return self.clamp_all(hosts.col("free_disk_mb"))
