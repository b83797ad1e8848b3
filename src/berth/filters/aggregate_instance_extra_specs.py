"""AggregateInstanceExtraSpecsFilter: the flavor's unscoped and
``aggregate_instance_extra_specs:`` extra specs must match the host's aggregate metadata.

Each such spec (``ssd=true``, ``aggregate_instance_extra_specs:cpu='>= 12'``) needs the
key in the host's aggregate metadata and at least one of its comma-separated values to
satisfy the requirement (operator grammar of :mod:`berth.extra_specs.ops`). A host in no
aggregate fails any flavor with an unscoped extra spec; other scopes (``hw:``,
``resources:``...) are ignored. Options: none. Lever: the aggregate metadata.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from berth.errors import ExtraSpecError
from berth.extra_specs.ops import Requirement, compile_requirement, validate_requirement
from berth.filters.base import BaseHostFilter, Reject
from berth.filters.utils import metadata_by_key

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.aggregate import Aggregate
    from berth.model.request import RequestSpec

SCOPE = "aggregate_instance_extra_specs"


def scoped_requirements(extra_specs: Mapping[str, str]) -> list[tuple[str, str, Requirement]]:
    """``(flavor key, metadata key, requirement)`` for the specs this filter evaluates.

    The key is split on its *first* colon only: ``aggregate_instance_extra_specs:a:b``
    looks up ``a:b``; ``a:b`` (scope ``a``) is ignored.
    """
    found = []
    for key, req in extra_specs.items():
        scope, sep, rest = key.partition(":")
        if sep:
            if scope != SCOPE:
                continue
            md_key = rest
        else:
            md_key = key
        found.append((key, md_key, compile_requirement(req)))
    return found


def check_aggregates(
    aggregates: Iterable[Aggregate],
    requirements: list[tuple[str, str, Requirement]],
    host: str | None,
) -> Reject | None:
    """The first spec the aggregates' metadata does not satisfy, or None.

    Values are tried in sorted order and any match passes; a host value that is not a
    number under a numeric operator raises :class:`ExtraSpecError` only when no value
    matched (Nova's set order would make that outcome random).
    """
    metadata = metadata_by_key(aggregates)
    for key, md_key, requirement in requirements:
        values = metadata.get(md_key)
        if not values:
            return Reject.of("aggregate extra spec mismatch", key=key,
                             requested=requirement.req, aggregate_values="(none)")
        error: ExtraSpecError | None = None
        for value in sorted(values):
            try:
                if requirement.match(value, key=key, host=host):
                    break
            except ExtraSpecError as exc:
                error = error or exc
        else:
            if error is not None:
                raise error
            return Reject.of("aggregate extra spec mismatch", key=key,
                             requested=requirement.req, aggregate_values=",".join(sorted(values)))
    return None


class AggregateInstanceExtraSpecsFilter(BaseHostFilter):
    """Unscoped and aggregate_instance_extra_specs:* extra specs must match aggregate metadata.

    Each key must be in the host's aggregate metadata with a value satisfying the spec.
    """

    run_filter_once_per_request: ClassVar[bool] = True

    def validate_request(self, spec_obj: RequestSpec) -> None:
        """Reject a bare ``<or>`` or a non-numeric operand of a numeric operator."""
        for key, _, requirement in scoped_requirements(spec_obj.flavor.extra_specs or {}):
            validate_requirement(key, requirement.req)

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """``aggregate extra spec mismatch`` naming the key and values, else None."""
        requirements = scoped_requirements(spec_obj.flavor.extra_specs or {})
        if not requirements:
            return None
        return check_aggregates(host_state.aggregates, requirements, host_state.host)

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """Once per aggregate-membership signature."""
        requirements = scoped_requirements(spec_obj.flavor.extra_specs or {})
        if not requirements or len(hosts) == 0:
            return np.ones(len(hosts), dtype=bool)
        unique, inverse = hosts.signatures("aggregates")
        snapshot = hosts.snapshot
        names = snapshot.obj("host")
        # A representative host per signature, to name it in a host-value error.
        first_rows = hosts.rows[np.unique(inverse, return_index=True)[1]]
        verdicts = np.array(
            [
                check_aggregates(snapshot.aggregates_of_signature(int(code)), requirements,
                                 str(names[int(row)])) is None
                for code, row in zip(unique.tolist(), first_rows.tolist())
            ],
            dtype=bool,
        )
        return verdicts[inverse]
