"""CPUWeigher: prefer hosts with more free vCPUs (spread); a negative multiplier stacks.

Raw value ``vcpus_total * cpu_allocation_ratio - vcpus_used``, clamped at 0
(``minval = 0``). Option: ``[filter_scheduler] cpu_weight_multiplier`` (default 1.0);
aggregate metadata ``cpu_weight_multiplier`` overrides it per host (minimum wins).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from berth.errors import HostStateError
from berth.weighers.utils import MultiplierWeigher

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec


class MissingAllocationRatio(HostStateError):
    """A host reports no ``cpu_allocation_ratio``, so its free vCPUs cannot be computed.

    Nova fails with a TypeError here; real compute nodes always report a ratio.
    """

    code = "berth.input.host_allocation_ratio"


def _missing_ratio(host: str, nodename: str) -> MissingAllocationRatio:
    return MissingAllocationRatio(
        f"CPUWeigher: host {host}/{nodename} reports no cpu_allocation_ratio; "
        "free vCPUs = vcpus_total * cpu_allocation_ratio - vcpus_used cannot be computed",
        host=host,
        nodename=nodename,
    )


class CPUWeigher(MultiplierWeigher):
    """More free vCPUs (total x allocation ratio - used) weigh more (cpu_weight_multiplier)."""

    minval: ClassVar[float | None] = 0
    multiplier_option: ClassVar[str] = "cpu_weight_multiplier"

    def _weigh_object(self, host_state: HostState, weight_properties: RequestSpec) -> float:
        """Higher wins: spreading is the default."""
        ratio = host_state.cpu_allocation_ratio
        if ratio is None:
            raise _missing_ratio(host_state.host, host_state.nodename)
        return host_state.vcpus_total * ratio - host_state.vcpus_used

    def weigh_all_hosts(self, hosts: Hosts, weight_properties: RequestSpec) -> np.ndarray:
        """Free vCPUs of every host, clamped at 0."""
        ratio = hosts.col("cpu_allocation_ratio")
        missing = np.isnan(ratio)
        if missing.any():
            row = int(hosts.rows[int(np.argmax(missing))])
            snapshot = hosts.snapshot
            raise _missing_ratio(snapshot.obj("host")[row], snapshot.obj("nodename")[row])
        return self.clamp_all(hosts.col("vcpus_total") * ratio - hosts.col("vcpus_used"))
