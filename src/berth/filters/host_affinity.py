"""SameHostFilter / DifferentHostFilter: place near or away from given instances.

The scheduler hints ``same_host`` and ``different_host`` name instance uuids (one uuid
arrives as a string, several as a list). SameHostFilter passes a host iff one of them is on
it; DifferentHostFilter passes a host iff none is; a missing or empty hint passes every
host (reference §3.7). "On it" means on its service host, as in Nova: every node of a
multi-node host (Ironic) sees the instances of all of them. They read no option; the
lever is the hint itself.

In bulk, hinted uuids are looked up in the snapshot's uuid -> row index (plus the stubs the
request itself placed) instead of scanning every host's instances.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from berth.filters.base import BaseHostFilter, Reject

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState, WorkingSet
    from berth.model.request import RequestSpec


def hinted_uuids(value: Any) -> list[str]:
    """Nova's ``instance_uuids_overlap`` input: a str is one uuid, a list several."""
    if not value:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


def members_per_row(ws: WorkingSet, uuids: Iterable[str], rows: np.ndarray) -> np.ndarray:
    """How many distinct ``uuids`` are on the service host of each of ``rows``, as the
    request sees it (Nova's ``HostState.instances`` holds the whole service host's
    instances on every node of it, stubs of this request included).

    Base instances come from the snapshot's uuid -> row index (an instance is reported by
    one node) mapped to service hosts; rows that see stubs this request placed are
    recounted from their merged instance dict. Only the few hosts holding a member are
    counted, then spread over ``rows``: nothing snapshot-sized is built per call.
    """
    wanted = set(uuids)
    if not wanted:
        return np.zeros(len(rows), dtype=np.int64)
    snapshot = ws.snapshot
    index = snapshot.instance_rows()
    hosts = snapshot.service_hosts()
    codes = hosts.codes
    per_host: dict[int, int] = {}
    for u in wanted:
        row = index.get(u)
        if row is not None:
            code = int(codes[row])
            per_host[code] = per_host.get(code, 0) + 1
    recount = ws.extra_instances()
    if ws.share_stubs:
        # Stubs are per service host: recount each such host once.
        for row in recount:
            per_host[int(codes[row])] = len(wanted.intersection(ws.instances(row)))
        recount = {}
    counts = _spread(per_host, hosts.codes_of(rows))
    if recount:
        # Stubs seen by single nodes: those rows' counts replace their host's.
        own = _spread({row: len(wanted.intersection(ws.instances(row))) for row in recount},
                      rows, missing=-1)
        counts = np.where(own >= 0, own, counts)
    return counts


def _spread(values: dict[int, int], keys: np.ndarray, missing: int = 0) -> np.ndarray:
    """``[values.get(k, missing) for k in keys]`` through one small lookup array."""
    if not values:
        return np.full(len(keys), missing, dtype=np.int64)
    top = max(values)
    lookup = np.full(top + 1, missing, dtype=np.int64)
    lookup[np.fromiter(values, dtype=np.int64, count=len(values))] = list(values.values())
    return np.where(keys <= top, lookup[np.minimum(keys, top)], missing)


def _overlap(host_state: HostState, uuids: list[str]) -> list[str]:
    instances = host_state.instances
    return sorted(u for u in set(uuids) if u in instances)


class SameHostFilter(BaseHostFilter):
    """Pass hosts holding one of the instances of the same_host hint (no hint: all pass)."""

    run_filter_once_per_request: ClassVar[bool] = True

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """Reject when the hint names instances and none is on the host."""
        uuids = hinted_uuids(spec_obj.get_scheduler_hint("same_host"))
        if not uuids or _overlap(host_state, uuids):
            return None
        return Reject.of("not on the same host as a hinted instance", instances=sorted(set(uuids)))

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """Rows holding a hinted uuid, found through the uuid index."""
        uuids = hinted_uuids(spec_obj.get_scheduler_hint("same_host"))
        if not uuids:
            return np.ones(len(hosts), dtype=bool)
        return members_per_row(hosts.ws, uuids, hosts.rows) > 0


class DifferentHostFilter(BaseHostFilter):
    """Pass hosts holding none of the instances of the different_host hint."""

    run_filter_once_per_request: ClassVar[bool] = True

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """Reject when an instance the hint names is on the host."""
        uuids = hinted_uuids(spec_obj.get_scheduler_hint("different_host"))
        on_host = _overlap(host_state, uuids) if uuids else []
        if not on_host:
            return None
        return Reject.of("a hinted instance is on the host", instances=on_host)

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """Rows holding no hinted uuid, found through the uuid index."""
        uuids = hinted_uuids(spec_obj.get_scheduler_hint("different_host"))
        if not uuids:
            return np.ones(len(hosts), dtype=bool)
        return members_per_row(hosts.ws, uuids, hosts.rows) == 0
