"""ComputeFilter: reject hosts whose compute service is disabled or not up.

A service is down when it is forced down or when its last heartbeat (``last_seen_up``,
else ``created_at``) is more than ``service_down_time`` seconds away from the scheduling
instant. Options: ``[DEFAULT] service_down_time`` (60 s), ``report_interval`` (10 s; when
``service_down_time <= report_interval`` the down time becomes
``int(report_interval * 2.5)``) and ``servicegroup_driver`` (only ``db`` can be
evaluated: Berth judges liveness from reported heartbeats). Lever: enable or disable the
service, or force it down.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from berth.errors import ConfigError
from berth.filters.base import BaseHostFilter, Reject

if TYPE_CHECKING:
    from berth.config import SchedulerConfig
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec


def effective_service_down_time(service_down_time: int, report_interval: int) -> int:
    """Nova's servicegroup API rule: a down time not above the report interval becomes
    ``int(report_interval * 2.5)``, so a single late heartbeat does not mark it down."""
    if service_down_time <= report_interval:
        return int(report_interval * 2.5)
    return service_down_time


def services_up(
    disabled: np.ndarray, forced_down: np.ndarray, heartbeat: np.ndarray, now: float,
    down_time: float,
) -> np.ndarray:
    """ComputeFilter's rule over service columns: enabled, not forced down, and a
    heartbeat no older than ``down_time`` (a NaN heartbeat, never seen, is down)."""
    age = np.abs(now - heartbeat)
    with np.errstate(invalid="ignore"):
        up = age <= down_time
    result: np.ndarray = ~disabled.astype(bool) & ~forced_down.astype(bool) & up
    return result


class ComputeFilter(BaseHostFilter):
    """Pass hosts whose compute service is enabled and up."""

    run_filter_once_per_request: ClassVar[bool] = True

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        super().__init__(config)
        driver = self.config.servicegroup_driver
        if driver != "db":
            raise ConfigError(
                f"[DEFAULT] servicegroup_driver={driver!r}: ComputeFilter can only evaluate the "
                "'db' driver; Berth judges liveness from the heartbeats hosts report "
                "(last_seen_up), not from memcache keys. Set servicegroup_driver=db.",
                option="servicegroup_driver", value=driver,
            )
        self.service_down_time = effective_service_down_time(
            self.config.service_down_time, self.config.report_interval
        )

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """``service disabled`` or ``service down`` (with the heartbeat age), else None."""
        service = host_state.service
        if service.get("disabled"):
            reason = service.get("disabled_reason")
            return Reject.of("service disabled", **({"disabled_reason": reason} if reason else {}))
        if service.get("forced_down"):
            return Reject.of("service down", forced_down=True)
        last = service.get("last_seen_up")
        if last is None:
            last = service.get("created_at")
        age = math.nan if last is None else abs(host_state.now - float(last))
        if not age <= self.service_down_time:
            return Reject.of("service down", heartbeat_age_s=round(age, 1),  # for people
                             service_down_time_s=self.service_down_time)
        return None

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """Vectorized over the service columns (:func:`services_up`)."""
        return services_up(hosts.col("service_disabled"), hosts.col("service_forced_down"),
                           hosts.col("service_heartbeat"), hosts.ws.now,
                           self.service_down_time)
