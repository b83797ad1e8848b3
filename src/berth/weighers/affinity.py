"""Soft server-group weighers: pack (soft-affinity) or spread (soft-anti-affinity) a group.

Raw value: the number of the group's members already on the host (host instances ∩ group
members, including instances placed earlier in the same multi-create; the instances of
the whole service host, as Nova shares them among its nodes), when the request's
server group has this weigher's policy; 0 otherwise. ServerGroupSoftAntiAffinityWeigher
negates it, so a host with fewer members wins. Options: ``[filter_scheduler]
soft_affinity_weight_multiplier`` / ``soft_anti_affinity_weight_multiplier`` (default
1.0, non-negative); aggregate metadata under the same names overrides them (minimum wins).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from berth.filters.host_affinity import members_per_row
from berth.weighers.utils import MultiplierWeigher

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec


class _SoftAffinityWeigherBase(MultiplierWeigher):
    """Counts the request's server-group members on each host for one soft policy."""

    policy_name: ClassVar[str] = ""
    #: +1 to prefer hosts with members, -1 to avoid them.
    sign: ClassVar[float] = 1.0

    def _members(self, spec: RequestSpec) -> set[str] | None:
        group = spec.instance_group
        if group is None or group.policy != self.policy_name:
            return None
        return set(group.members)

    def _weigh_object(self, host_state: HostState, weight_properties: RequestSpec) -> float:
        """(Minus, for anti-affinity) the number of group members on the host."""
        members = self._members(weight_properties)
        if members is None:
            return 0
        count = len(set(host_state.instances) & members)
        return self.sign * count if count else 0

    def weigh_all_hosts(self, hosts: Hosts, weight_properties: RequestSpec) -> np.ndarray:
        """Members per service host from the snapshot's instance index plus this
        request's stubs (the count SameHostFilter and anti-affinity use)."""
        members = self._members(weight_properties)
        if members is None or len(hosts) == 0:
            return np.zeros(len(hosts))
        counts = members_per_row(hosts.ws, members, hosts.rows).astype(float)
        return self.clamp_all(self.sign * counts)


class ServerGroupSoftAffinityWeigher(_SoftAffinityWeigherBase):
    """Hosts running more members of a soft-affinity group weigh more."""

    policy_name: ClassVar[str] = "soft-affinity"
    multiplier_option: ClassVar[str] = "soft_affinity_weight_multiplier"


class ServerGroupSoftAntiAffinityWeigher(_SoftAffinityWeigherBase):
    """Hosts running more members of a soft-anti-affinity group weigh less (raw negated)."""

    policy_name: ClassVar[str] = "soft-anti-affinity"
    multiplier_option: ClassVar[str] = "soft_anti_affinity_weight_multiplier"
    sign: ClassVar[float] = -1.0
