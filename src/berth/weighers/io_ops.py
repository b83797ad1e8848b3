"""IoOpsWeigher: prefer hosts with fewer concurrent I/O-heavy operations.

Raw value ``num_io_ops`` (builds, resizes, snapshots... in flight), clamped at 0
(``minval = 0``). It prefers idle hosts only because its default multiplier is negative:
``[filter_scheduler] io_ops_weight_multiplier`` (default -1.0); a positive value prefers
busy hosts. Aggregate metadata ``io_ops_weight_multiplier`` overrides it (minimum wins).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from berth.weighers.utils import MultiplierWeigher

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec


class IoOpsWeigher(MultiplierWeigher):
    """More I/O operations weigh more; the default multiplier -1.0 prefers idle hosts."""

    minval: ClassVar[float | None] = 0
    multiplier_option: ClassVar[str] = "io_ops_weight_multiplier"

    def _weigh_object(self, host_state: HostState, weight_properties: RequestSpec) -> float:
        """The host's ``num_io_ops`` (the negative multiplier makes light hosts win)."""
        return host_state.num_io_ops

    def weigh_all_hosts(self, hosts: Hosts, weight_properties: RequestSpec) -> np.ndarray:
        """``num_io_ops`` of every host, clamped at 0."""
        return self.clamp_all(hosts.col("num_io_ops"))
