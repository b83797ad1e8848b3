"""SimpleCIDRAffinityFilter: place the instance on a host inside a given IP network.

With the scheduler hint ``build_near_host_ip`` (an IP) and ``cidr`` (default ``/24``), a
host passes iff its ``host_ip`` is inside the network ``build_near_host_ip + cidr`` (plain
concatenation, so ``cidr`` must start with ``/``); without ``build_near_host_ip`` every host
passes (reference §3.8). It reads no option; the lever is the pair of hints.

Deviations from Nova, which raise in the middle of a request: a network that does not
parse is a :class:`~berth.errors.SchedulerHintError` naming both hints, raised up front by
``validate_request``; a host with no ``host_ip`` fails with the reason "host IP unknown"
instead of Nova's TypeError; a host_ip that is not an IP address is an
:class:`~berth.errors.InputError` naming the host.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any, ClassVar

import netaddr
import numpy as np

from berth.errors import HostStateError, SchedulerHintError
from berth.filters.base import BaseHostFilter, Reject

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec

DEFAULT_CIDR = "/24"
_MASK64 = (1 << 64) - 1


def _hints(spec_obj: RequestSpec) -> tuple[Any, Any]:
    return (spec_obj.get_scheduler_hint("build_near_host_ip"),
            spec_obj.get_scheduler_hint("cidr", DEFAULT_CIDR))


@lru_cache(maxsize=256)
def _network(near_ip: str, cidr: str) -> netaddr.IPNetwork:
    return netaddr.IPNetwork(near_ip + cidr)


def requested_network(spec_obj: RequestSpec) -> netaddr.IPNetwork | None:
    """The hinted network, None without ``build_near_host_ip``; SchedulerHintError when
    the hints do not make a network."""
    near_ip, cidr = _hints(spec_obj)
    if not near_ip:
        return None
    if not isinstance(near_ip, str) or not isinstance(cidr, str):
        raise SchedulerHintError(
            f"scheduler hints build_near_host_ip={near_ip!r}, cidr={cidr!r}: each must be a "
            "single value"
        )
    try:
        return _network(near_ip, cidr)
    except (netaddr.AddrFormatError, ValueError, TypeError) as exc:
        raise SchedulerHintError(
            f"scheduler hints build_near_host_ip={near_ip!r}, cidr={cidr!r}: "
            f"{near_ip + cidr!r} is not an IP network ({exc}); cidr must look like '/24'",
            build_near_host_ip=near_ip, cidr=cidr,
        ) from exc


def _bad_host_ip(host: str, host_ip: Any) -> HostStateError:
    return HostStateError(f"host {host}: host_ip {host_ip!r} is not an IP address",
                          host=host, host_ip=host_ip)


def host_address(host: str, host_ip: str) -> netaddr.IPAddress:
    """The host's ``host_ip`` as the IP address object Nova's host state holds
    (:class:`~berth.errors.HostStateError` naming the host when it is none)."""
    try:
        return netaddr.IPAddress(host_ip)
    except (netaddr.AddrFormatError, ValueError, TypeError) as exc:
        raise _bad_host_ip(host, host_ip) from exc


def _parsed_host_ips(hosts: Hosts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per snapshot row: IP version (0 when unknown, -1 when not an address), high and low
    64 bits of the address."""
    snapshot = hosts.snapshot

    def build() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n = len(snapshot)
        version = np.zeros(n, dtype=np.int8)
        high = np.zeros(n, dtype=np.uint64)
        low = np.zeros(n, dtype=np.uint64)
        for row, host_ip in enumerate(snapshot.obj("host_ip")):
            if host_ip is None:
                continue
            try:
                address = netaddr.IPAddress(host_ip)
            except (netaddr.AddrFormatError, ValueError, TypeError):
                version[row] = -1
                continue
            value = int(address)
            version[row] = address.version
            high[row] = value >> 64
            low[row] = value & _MASK64
        return version, high, low

    return snapshot.cached("simple_cidr_host_ips", build)


def _at_least(high: np.ndarray, low: np.ndarray, bound: int) -> np.ndarray:
    bh, bl = np.uint64(bound >> 64), np.uint64(bound & _MASK64)
    return (high > bh) | ((high == bh) & (low >= bl))


def _at_most(high: np.ndarray, low: np.ndarray, bound: int) -> np.ndarray:
    bh, bl = np.uint64(bound >> 64), np.uint64(bound & _MASK64)
    return (high < bh) | ((high == bh) & (low <= bl))


class SimpleCIDRAffinityFilter(BaseHostFilter):
    """Pass hosts whose host_ip is in build_near_host_ip + cidr (no hint: all pass)."""

    run_filter_once_per_request: ClassVar[bool] = True

    def validate_request(self, spec_obj: RequestSpec) -> None:
        """Reject hints that do not make an IP network, before any host is examined."""
        requested_network(spec_obj)

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """Reject a host outside the hinted network, or one whose IP is unknown."""
        network = requested_network(spec_obj)
        if network is None:
            return None
        host_ip = host_state.host_ip
        if host_ip is None:
            return Reject.of("host IP unknown", network=str(network))
        if host_address(host_state.host, host_ip) in network:
            return None
        return Reject.of("host IP outside the requested network", host_ip=host_ip,
                         network=str(network))

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """Addresses parsed once per snapshot; one range comparison per request."""
        network = requested_network(spec_obj)
        if network is None:
            return np.ones(len(hosts), dtype=bool)
        version, high, low = (a[hosts.rows] for a in _parsed_host_ips(hosts))
        bad = np.flatnonzero(version == -1)
        if len(bad):
            row = int(hosts.rows[bad[0]])
            raise _bad_host_ip(hosts.snapshot.obj("host")[row], hosts.snapshot.obj("host_ip")[row])
        return np.asarray(
            (version == network.version)
            & _at_least(high, low, network.first)
            & _at_most(high, low, network.last),
            dtype=bool,
        )
