"""NumInstancesWeigher: weigh hosts by how many instances they run; disabled by default.

Raw value ``num_instances``, min/max normalized. Option:
``[filter_scheduler] num_instances_weight_multiplier`` (default 0.0, disabled); positive
packs onto busy hosts, negative spreads. Aggregate metadata
``num_instances_weight_multiplier`` overrides it per host (minimum wins).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from berth.weighers.utils import MultiplierWeigher

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec


class NumInstancesWeigher(MultiplierWeigher):
    """More instances weigh more (num_instances_weight_multiplier, default 0.0: off)."""

    multiplier_option: ClassVar[str] = "num_instances_weight_multiplier"

    def _weigh_object(self, host_state: HostState, weight_properties: RequestSpec) -> float:
        """The host's ``num_instances``."""
        return host_state.num_instances

    def weigh_all_hosts(self, hosts: Hosts, weight_properties: RequestSpec) -> np.ndarray:
        """``num_instances`` of every host."""
        return self.clamp_all(hosts.col("num_instances"))
