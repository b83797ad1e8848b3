"""Soft server-group weighers: pack (soft-affinity) or spread (soft-anti-affinity) a group.

Raw value: the number of the group's members already on the host (host instances ∩ group
members, including instances placed earlier in the same multi-create), when the request's
server group has this weigher's policy; 0 otherwise. ServerGroupSoftAntiAffinityWeigher
negates it, so a host with fewer members wins. Options: ``[filter_scheduler]
soft_affinity_weight_multiplier`` / ``soft_anti_affinity_weight_multiplier`` (default
1.0, non-negative); aggregate metadata under the same names overrides them (minimum wins).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

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
        """Members per host from the snapshot's instance index plus this request's stubs."""
        members = self._members(weight_properties)
        if members is None or len(hosts) == 0:
            return np.zeros(len(hosts))
        snapshot = hosts.snapshot
        index = snapshot.instance_rows()
        counts = np.zeros(len(snapshot))
        for uuid in members:
            row = index.get(uuid)
            if row is not None:
                counts[row] += 1
        base = snapshot.obj("instances")
        for row, extra in hosts.ws.extra_instances().items():
            # Stubs of this request: count those not already reported on the row.
            counts[row] += sum(1 for uuid in extra if uuid in members and uuid not in base[row])
        return self.clamp_all(self.sign * counts[hosts.rows])


class ServerGroupSoftAffinityWeigher(_SoftAffinityWeigherBase):
    """Hosts running more members of a soft-affinity group weigh more."""

    policy_name: ClassVar[str] = "soft-affinity"
    multiplier_option: ClassVar[str] = "soft_affinity_weight_multiplier"


class ServerGroupSoftAntiAffinityWeigher(_SoftAffinityWeigherBase):
    """Hosts running more members of a soft-anti-affinity group weigh less (raw negated)."""

    policy_name: ClassVar[str] = "soft-anti-affinity"
    multiplier_option: ClassVar[str] = "soft_anti_affinity_weight_multiplier"
    sign: ClassVar[float] = -1.0
