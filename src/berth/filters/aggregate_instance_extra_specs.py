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
from berth.model.aggregate import aggregate_names

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
    aggregates = list(aggregates)
    metadata = metadata_by_key(aggregates)
    for key, md_key, requirement in requirements:
        values = metadata.get(md_key)
        if not values:
            return Reject.of("aggregate extra spec mismatch", key=key,
                             requested=requirement.req, aggregate_values="(none)",
                             aggregates=aggregate_names(aggregates) or "(none)")
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
                             requested=requirement.req, aggregate_values=",".join(sorted(values)),
                             aggregates=aggregate_names(a for a in aggregates
                                                        if md_key in a.metadata))
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
        """Once per aggregate-membership signature until the aggregates change: the
        verdicts of every signature are kept on the snapshot per set of specs, so a
        request only looks its hosts' codes up (O(n), no sort)."""
        requirements = scoped_requirements(spec_obj.flavor.extra_specs or {})
        if not requirements or len(hosts) == 0:
            return np.ones(len(hosts), dtype=bool)
        snapshot = hosts.snapshot
        count = len(snapshot.table("aggregates"))
        specs = tuple((key, requirement.req) for key, _, requirement in requirements)

        def build() -> tuple[np.ndarray, np.ndarray]:
            # Per signature code: passes, and whether evaluating it raises (a host value
            # that is not a number under a numeric operator; the host is named below).
            verdicts = np.zeros(count, dtype=bool)
            raises = np.zeros(count, dtype=bool)
            for code in range(count):
                try:
                    verdicts[code] = check_aggregates(
                        snapshot.aggregates_of_signature(code), requirements, None) is None
                except ExtraSpecError:
                    raises[code] = True
            return verdicts, raises

        verdicts, raises = snapshot.table_cached(
            ("AggregateInstanceExtraSpecsFilter", specs, count), build)
        codes = hosts.codes("aggregates")
        if raises.any():
            bad = np.flatnonzero(raises[codes])
            if len(bad):
                # The per-host path's error: the first host, in order, whose check raises.
                row = int(hosts.rows[bad[0]])
                check_aggregates(snapshot.aggregates_of_signature(int(codes[bad[0]])),
                                 requirements, str(snapshot.obj("host")[row]))
        result: np.ndarray = verdicts[codes]
        return result
