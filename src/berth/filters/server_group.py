"""Server-group filters: hard affinity and anti-affinity (reference §3.5, §3.6).

ServerGroupAffinityFilter: when the request's group has the ``affinity`` policy and the
group already has hosts, only those hosts pass (the first member may go anywhere).
ServerGroupAntiAffinityFilter: when the group's policy is ``anti-affinity``, a host passes
iff fewer than ``max_server_per_host`` (group rule, default 1) members are on it; the host
already holding the instance being moved passes. Hosts are service hosts, as in Nova: the
group's hosts are service host names, and every node of a multi-node host sees the
members on any of its nodes (stubs of this request included). They read no option; the
levers are the group's policy and its ``max_server_per_host`` rule.

In bulk, members are counted per row through the snapshot's uuid -> row index plus the
stubs this request placed, never by scanning each host's instances.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from berth.filters.base import BaseHostFilter, Reject
from berth.filters.host_affinity import members_per_row

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.request import InstanceGroup, RequestSpec


def _affinity_hosts(spec_obj: RequestSpec) -> list[str] | None:
    """The group's hosts when the affinity rule applies, else None."""
    group = spec_obj.instance_group
    # Nova tests the deprecated list field here (``'affinity' in policies``).
    if group is None or "affinity" not in group.policies:
        return None
    return list(group.hosts) if group.hosts else None


class ServerGroupAffinityFilter(BaseHostFilter):
    """Pass only the hosts of an affinity group's existing members (any host for the first)."""

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """Reject a host that is not among the group's hosts."""
        group_hosts = _affinity_hosts(spec_obj)
        if group_hosts is None or host_state.host in group_hosts:
            return None
        return Reject.of("not a server group host", group_hosts=sorted(set(group_hosts)))

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """Membership of the host-name column in the group's hosts."""
        group_hosts = _affinity_hosts(spec_obj)
        if group_hosts is None:
            return np.ones(len(hosts), dtype=bool)
        names = hosts.snapshot.obj("host")[hosts.rows]
        return np.isin(names, np.asarray(sorted(set(group_hosts)), dtype=object))


def _anti_affinity_group(spec_obj: RequestSpec) -> InstanceGroup | None:
    group = spec_obj.instance_group
    # Nova tests the scalar field here, unlike the affinity filter.
    if group is None or group.policy != "anti-affinity":
        return None
    return group


def _max_server_per_host(group: InstanceGroup) -> int:
    rules = group.rules
    if rules and "max_server_per_host" in rules:
        return int(rules["max_server_per_host"])
    return 1


class ServerGroupAntiAffinityFilter(BaseHostFilter):
    """Pass hosts holding fewer than max_server_per_host members of an anti-affinity group."""

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """Reject a host already holding ``max_server_per_host`` group members."""
        group = _anti_affinity_group(spec_obj)
        if group is None:
            return None
        instances = host_state.instances
        # A move may keep the source host, which already holds the instance.
        if spec_obj.instance_uuid in instances:
            return None
        on_host = set(instances).intersection(group.members)
        max_server_per_host = _max_server_per_host(group)
        if len(on_host) < max_server_per_host:
            return None
        return Reject.of(
            "server group member already on host",
            members_on_host=len(on_host), max_server_per_host=max_server_per_host,
        )

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """Members counted per row through the uuid index, compared with the rule."""
        group = _anti_affinity_group(spec_obj)
        if group is None:
            return np.ones(len(hosts), dtype=bool)
        counts = members_per_row(hosts.ws, group.members, hosts.rows)
        passes = counts < _max_server_per_host(group)
        if spec_obj.instance_uuid is not None:
            passes |= members_per_row(hosts.ws, [spec_obj.instance_uuid], hosts.rows) > 0
        return passes
