"""CrossCellWeigher: during a cross-cell move, prefer hosts in the instance's current cell.

Raw value 1 for a host in ``requested_destination.cell``, -1 for any other host, and 0
for every host unless the request has a ``requested_destination`` with a ``cell`` and
``allow_cross_cell_move`` set. Option: ``[filter_scheduler]
cross_cell_move_weight_multiplier`` (default 1000000.0, so staying in the cell dominates);
aggregate metadata ``cross_cell_move_weight_multiplier`` overrides it (minimum wins).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from berth.weighers.utils import MultiplierWeigher

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec


def _preferred_cell(spec: RequestSpec) -> str | None:
    """The cell a cross-cell move prefers, or None when the weigher does not apply."""
    dest = spec.requested_destination
    if dest is None or dest.cell is None or not dest.allow_cross_cell_move:
        return None
    return dest.cell.uuid


class CrossCellWeigher(MultiplierWeigher):
    """On a cross-cell move, hosts in the source cell weigh 1 and others -1."""

    multiplier_option: ClassVar[str] = "cross_cell_move_weight_multiplier"

    def _weigh_object(self, host_state: HostState, weight_properties: RequestSpec) -> float:
        """1 in the preferred cell, -1 outside it, 0 when this is not a cross-cell move."""
        cell = _preferred_cell(weight_properties)
        if cell is None:
            return 0
        return 1 if host_state.cell_uuid == cell else -1

    def weigh_all_hosts(self, hosts: Hosts, weight_properties: RequestSpec) -> np.ndarray:
        """One comparison per distinct cell, spread to the hosts."""
        cell = _preferred_cell(weight_properties)
        if cell is None:
            return np.zeros(len(hosts))
        table = hosts.snapshot.table("cell_uuid")
        in_cell = np.array([value == cell for value in table], dtype=bool)
        if len(in_cell) == 0:
            return np.full(len(hosts), -1.0)
        return np.where(in_cell[hosts.codes("cell_uuid")], 1.0, -1.0)
