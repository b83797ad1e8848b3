"""Flavor affinity: AggregateTypeAffinityFilter (§3.13) and the legacy TypeAffinityFilter (§12.7).

AggregateTypeAffinityFilter: a host in aggregates carrying ``instance_type`` metadata
accepts only the flavors named there (comma-separated, exact, case-sensitive); a host with
no such metadata accepts every flavor. Lever: the aggregate's ``instance_type`` key.

TypeAffinityFilter (removed in Nova 17): a host accepts the request only if every instance
already on it (on any node of its service host) has the requested flavor
(``instance_type_id == flavor.id``); an empty host accepts any flavor. It reads no option.

For readers of seed 001: its list says TypeAffinityFilter "only passes hosts that are not
already running an instance of the requested type", the opposite of the rule above.
Berth follows Nova's code (and the filter's name: instances of one type keep together),
which always behaved as above; the seed's sentence describes no Nova release.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from berth.filters.base import BaseHostFilter, Reject
from berth.filters.utils import per_signature_array, values_from_key
from berth.model.aggregate import aggregate_names

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.aggregate import Aggregate
    from berth.model.compute import Instance
    from berth.model.request import RequestSpec

KEY = "instance_type"


def _flavor_allowed(aggregates: Iterable[Aggregate], flavor_name: str) -> bool:
    values = values_from_key(aggregates, KEY)
    for value in values:
        if flavor_name in [x.strip() for x in value.split(",")]:
            return True
    return not values


class AggregateTypeAffinityFilter(BaseHostFilter):
    """Pass hosts whose aggregates' instance_type lists name the flavor (or have none)."""

    run_filter_once_per_request: ClassVar[bool] = True

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """Reject when aggregates list flavors and the requested one is not among them."""
        name = spec_obj.flavor.name
        if _flavor_allowed(host_state.aggregates, name):
            return None
        allowed = sorted(values_from_key(host_state.aggregates, KEY))
        named = aggregate_names(a for a in host_state.aggregates if KEY in a.metadata)
        return Reject.of("flavor not allowed in aggregate", aggregate=named,
                         flavor=name, allowed=",".join(allowed))

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """Evaluated once per aggregate-membership signature."""
        name = spec_obj.flavor.name
        return per_signature_array(hosts, lambda aggs: _flavor_allowed(aggs, name), dtype=bool)


#: Marker of a row whose instances have several distinct flavors.
_MIXED = object()
#: Marker of a row without instances.
_EMPTY = object()


def _single_type(instances: dict[str, Instance]) -> Any:
    """The one flavor id all ``instances`` share, ``_EMPTY`` or ``_MIXED``."""
    types = {inst.instance_type_id for inst in instances.values()}
    if not types:
        return _EMPTY
    if len(types) == 1:
        return next(iter(types))
    return _MIXED


class TypeAffinityFilter(BaseHostFilter):
    """Pass hosts whose instances all have the requested flavor (legacy; empty hosts pass).

    An instance whose flavor id is unknown (None, e.g. a bare uuid in a cloud file or a
    stub placed by this request) counts as another flavor, as Nova's set difference
    ``{inst.instance_type_id ...} - {flavor.id}`` does.
    """

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """Reject when some instance on the host has another flavor id."""
        flavor_id = spec_obj.flavor.id
        others = {i.instance_type_id for i in host_state.instances.values()} - {flavor_id}
        if not others:
            return None
        return Reject.of(
            "other flavor on host", flavor_id=flavor_id, other_flavor_ids=sorted(map(str, others))
        )

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """Per snapshot, each row's single flavor id (or empty/mixed) is computed once;
        a request compares that column with its flavor id and re-checks only the rows
        this request placed stub instances on."""
        snapshot = hosts.snapshot
        single = snapshot.cached(
            "type_affinity_single_type",
            lambda: np.array(
                [_single_type(i) for i in snapshot.service_hosts().instances_column()],
                dtype=object),
        )
        empty = snapshot.cached(
            "type_affinity_empty", lambda: np.array([v is _EMPTY for v in single], dtype=bool)
        )
        flavor_id = spec_obj.flavor.id
        # Element-wise ``==`` on an object column: the sentinels equal nothing.
        mask = np.asarray(single[hosts.rows] == flavor_id, dtype=bool) | empty[hosts.rows]
        extra = hosts.ws.extra_instances()
        if extra:
            position = {int(r): p for p, r in enumerate(hosts.rows.tolist())}
            for row in extra:
                p = position.get(row)
                if p is not None:
                    kind = _single_type(hosts.ws.instances(row))
                    mask[p] = kind is _EMPTY or (kind is not _MIXED and kind == flavor_id)
        return mask
