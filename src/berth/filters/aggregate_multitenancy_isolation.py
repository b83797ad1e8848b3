"""AggregateMultiTenancyIsolation: hosts in an aggregate carrying ``filter_tenant_id*``
keys take only the projects those keys list.

Every metadata key that starts with ``filter_tenant_id`` (``filter_tenant_id``,
``filter_tenant_id2``, ``filter_tenant_id:x``...) contributes its comma-separated
projects; hosts with no such key take every project. It keeps other projects *out*; to
force a project *in*, use the ``limit_tenants_to_placement_aggregate`` request filter.
Options: none. Lever: the aggregate metadata.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from berth.filters.base import BaseHostFilter, Reject
from berth.filters.utils import metadata_by_key
from berth.model.aggregate import aggregate_names

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.aggregate import Aggregate
    from berth.model.request import RequestSpec

TENANT_KEY_PREFIX = "filter_tenant_id"


def allowed_tenants(aggregates: Iterable[Aggregate]) -> set[str]:
    """Projects named by the ``filter_tenant_id*`` keys (empty: no restriction)."""
    metadata = metadata_by_key(aggregates)
    tenants: set[str] = set()
    for key, values in metadata.items():
        if key.startswith(TENANT_KEY_PREFIX):
            tenants |= values
    return tenants


class AggregateMultiTenancyIsolation(BaseHostFilter):
    """Hosts in aggregates with filter_tenant_id* keys take only the listed projects."""

    run_filter_once_per_request: ClassVar[bool] = True

    @staticmethod
    def _check_aggregates(aggregates: list[Aggregate], project_id: str | None) -> Reject | None:
        tenants = allowed_tenants(aggregates)
        if not tenants or project_id in tenants:
            return None
        # The aggregates that restrict this host, by name.
        names = aggregate_names(a for a in aggregates
                                if any(k.startswith(TENANT_KEY_PREFIX) for k in a.metadata))
        return Reject.of("tenant not allowed in aggregate", aggregate=names,
                         project=project_id, allowed=",".join(sorted(tenants)))

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """``tenant not allowed in aggregate`` when the project is not listed, else None."""
        return self._check_aggregates(host_state.aggregates, spec_obj.project_id)

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """Once per aggregate-membership signature."""
        unique, inverse = hosts.signatures("aggregates")
        snapshot = hosts.snapshot
        project = spec_obj.project_id

        def tenants_of(code: int) -> set[str]:
            return snapshot.table_cached(
                ("tenants_of_signature", code),
                lambda: allowed_tenants(snapshot.aggregates_of_signature(code)),
            )

        verdicts = np.array(
            [not (t := tenants_of(int(c))) or project in t for c in unique.tolist()], dtype=bool
        )
        return verdicts[inverse] if len(unique) else np.ones(len(hosts), dtype=bool)
