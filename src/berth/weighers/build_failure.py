"""BuildFailureWeigher: push hosts with recent build failures to the back.

Raw value ``failed_builds`` (reset by the compute on a successful build), min/max
normalized, times the **negated** ``[filter_scheduler] build_failure_weight_multiplier``
(default 1000000.0, so effectively -1e6: a failing host loses to any healthy one without
being taken out of rotation). The negation also applies to the aggregate override
``build_failure_weight_multiplier`` (minimum of the values, then negated).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from berth.weighers.utils import MultiplierWeigher, uniform_weight_multiplier

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec


class BuildFailureWeigher(MultiplierWeigher):
    """Recent build failures weigh against a host (-build_failure_weight_multiplier)."""

    multiplier_option: ClassVar[str] = "build_failure_weight_multiplier"

    def weight_multiplier(self, host_state: HostState) -> float:
        """Minus the (aggregate-overridable) option: more failures means a lower weight."""
        return -1.0 * super().weight_multiplier(host_state)

    def multipliers_all_hosts(self, hosts: Hosts) -> np.ndarray:
        """Minus the multiplier of every host."""
        return -1.0 * super().multipliers_all_hosts(hosts)

    uniform_per_snapshot: ClassVar[bool] = True

    def uniform_multiplier(self, hosts: Hosts) -> float | None:
        """Minus the one multiplier of every host when no aggregate overrides it; None
        when some do, or when a subclass computes multipliers its own way."""
        cls = type(self)
        if (cls.multipliers_all_hosts is not BuildFailureWeigher.multipliers_all_hosts
                or cls.weight_multiplier is not BuildFailureWeigher.weight_multiplier):
            return None
        base = uniform_weight_multiplier(hosts, self.aggregate_key(), self.conf_multiplier())
        return None if base is None else -1.0 * base

    def _weigh_object(self, host_state: HostState, weight_properties: RequestSpec) -> float:
        """The host's ``failed_builds`` counter."""
        return host_state.failed_builds

    def weigh_all_hosts(self, hosts: Hosts, weight_properties: RequestSpec) -> np.ndarray:
        """``failed_builds`` of every host."""
        return self.clamp_all(hosts.col("failed_builds"))
