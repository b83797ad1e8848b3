"""The filter contract: per-host ``host_passes`` (Nova's), reasons, and a bulk path.

A filter written for Nova subclasses :class:`BaseHostFilter` and implements
``host_passes(host_state, spec_obj)``; nothing else is needed. Built-in filters implement
:meth:`BaseHostFilter.check`, which returns a :class:`Reject` carrying a short constant
reason and the numbers, and :meth:`BaseHostFilter.filter_all_hosts`, which decides for all
hosts at once. The pipeline uses the bulk path; explanations and custom plugins use the
per-host path; property tests prove both give the same pass set.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:
    from berth.config import SchedulerConfig
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec

#: Units shown after a number whose key ends with the suffix, in explanations.
_UNIT_SUFFIXES = (("_mb", "MB"), ("_gb", "GB"), ("_kb", "KB"), ("_s", "s"))


@dataclass(frozen=True)
class Reject:
    """Why a filter rejected a host: a short constant reason and the numbers behind it.

    ``reason`` groups rejections in explanations ("insufficient RAM"); ``numbers`` hold the
    request's and the host's values (``requested_mb=4096, usable_mb=2048``).
    """

    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, reason: str, **numbers: Any) -> Reject:
        """Shorthand: ``Reject.of("insufficient RAM", requested_mb=4096)``."""
        return cls(reason, numbers)

    def render(self, keys: Iterable[str] | None = None) -> str:
        """``reason (k v, ...)`` with units from key suffixes (``requested_mb`` -> MB)."""
        wanted = list(self.numbers) if keys is None else list(keys)
        parts = [render_number(k, self.numbers[k]) for k in wanted if k in self.numbers]
        return f"{self.reason} ({', '.join(parts)})" if parts else self.reason


def render_number(key: str, value: Any) -> str:
    """``requested_mb=4096`` -> ``requested 4096 MB``."""
    for suffix, unit in _UNIT_SUFFIXES:
        if key.endswith(suffix):
            return f"{key[: -len(suffix)].replace('_', ' ')} {_fmt(value)} {unit}"
    return f"{key.replace('_', ' ')} {_fmt(value)}"


def _fmt(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class BaseHostFilter:
    """Base class of every host filter; the class name is the config name.

    Class attributes, as Nova's:
    * ``run_filter_once_per_request``: run only for the first instance of a multi-create;
    * ``RUN_ON_REBUILD``: run on rebuilds too (otherwise a rebuild passes every host).

    ``self.config`` is the frozen :class:`~berth.config.SchedulerConfig` the scheduler was
    built with (a plugin reads its options there instead of a global CONF).
    """

    run_filter_once_per_request: ClassVar[bool] = False
    RUN_ON_REBUILD: ClassVar[bool] = False

    #: Reason used when a filter that only answers True/False rejects a host.
    generic_reason: ClassVar[str | None] = None

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        if config is None:
            from berth.config import SchedulerConfig

            config = SchedulerConfig.default()
        self.config = config

    @classmethod
    def name(cls) -> str:
        """The config name (the class name)."""
        return cls.__name__

    # -- Nova's contract ------------------------------------------------------------
    def run_filter_for_index(self, index: int) -> bool:
        """False for once-per-request filters after the first instance."""
        return not (self.run_filter_once_per_request and index > 0)

    def host_passes(self, host_state: HostState, spec_obj: RequestSpec) -> bool:
        """True if the host may hold the request (override this, or :meth:`check`)."""
        if type(self).check is BaseHostFilter.check:
            raise NotImplementedError(f"{type(self).__name__} implements neither host_passes nor check")
        return self.check(host_state, spec_obj) is None

    def filter_all(
        self, filter_obj_list: Iterable[HostState], spec_obj: RequestSpec
    ) -> Iterator[HostState]:
        """Nova's generator form: the hosts that pass, in order."""
        for host_state in filter_obj_list:
            if self._filter_one(host_state, spec_obj):
                yield host_state

    def _filter_one(self, host_state: HostState, spec_obj: RequestSpec) -> bool:
        if spec_obj.is_rebuild() and not self.RUN_ON_REBUILD:
            return True
        return self.host_passes(host_state, spec_obj)

    # -- Berth's contract -----------------------------------------------------------
    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """None if the host passes, else the reason (built-ins override this)."""
        if type(self).host_passes is BaseHostFilter.host_passes:
            raise NotImplementedError(f"{type(self).__name__} implements neither host_passes nor check")
        if self.host_passes(host_state, spec_obj):
            return None
        return Reject(self.generic_reason or f"rejected by {type(self).__name__}")

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """A boolean mask over ``hosts``: True where the host passes.

        The default asks :meth:`host_passes` host by host; built-ins override it with a
        whole-snapshot evaluation. Side effects (``limits``, ``allocation_candidates``)
        must match the per-host path's on the hosts that pass.
        """
        return np.fromiter(
            (self.host_passes(h, spec_obj) for h in hosts.states()), dtype=bool, count=len(hosts)
        )

    def validate_request(self, spec_obj: RequestSpec) -> None:
        """Reject a malformed request up front (raise an :class:`~berth.errors.InputError`).

        Called once per request, when the filter is first about to check hosts (before
        it examines any), so that a bad extra spec or hint is an error naming the key
        and value, never a half-filtered host list. A filter that does not run for the
        request (hosts forced, a rebuild and not ``RUN_ON_REBUILD``, no host left by the
        filters before it) does not validate either, as Nova raises only at a spec a
        host actually reaches.
        """
