"""Per-aggregate weight multipliers (reference §7.1), per host and in bulk.

Every built-in weigher's multiplier may be overridden by aggregate metadata under the
option's own name (``ram_weight_multiplier``, ``metrics_weight_multiplier``...): the
minimum of the ``float`` values over the host's aggregates wins, there is no comma split,
and a single value that will not convert makes the whole override fall back to the
configured value (with a warning), exactly as Nova's ``get_weight_multiplier``.

:func:`get_weight_multiplier` answers for one host (Nova's name and signature);
:func:`weight_multipliers_all_hosts` answers for many, evaluating each distinct aggregate
membership once per snapshot generation. :class:`MultiplierWeigher` wires both into a
weigher from two class attributes.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from berth.filters.utils import numeric_override
from berth.weighers.base import BaseHostWeigher

LOG = logging.getLogger(__name__)

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Iterable

    from berth.host_state import Hosts, HostState
    from berth.model.aggregate import Aggregate


def multiplier_from_aggregates(
    aggregates: Iterable[Aggregate], name: str, conf_value: float
) -> float:
    """The minimum float value of metadata key ``name`` over ``aggregates``.

    ``conf_value`` when no aggregate carries the key, when any value fails to convert
    or is NaN, or when the minimum is infinite (a deliberate deviation: Nova takes them,
    and its order of hosts then depends on their input order). ``inf`` beside a finite
    value is fine: the minimum is the finite one, in Nova too.
    """
    what = f"{name} weight multiplier"
    value = numeric_override(aggregates, name, conf_value, cast_to=_not_nan, what=what)
    if math.isfinite(value):
        return value
    LOG.warning("could not use %s aggregate metadata %s: %s is not a finite number; "
                "using %s", what, name, value, conf_value)
    return float(conf_value)


def _not_nan(value: Any) -> float:
    number = float(value)
    if math.isnan(number):
        raise ValueError(f"{value!r} is not a finite number")
    return number


def get_weight_multiplier(host_state: HostState, name: str, conf_value: float) -> float:
    """Nova's ``get_weight_multiplier(host_state, multiplier_name, multiplier_config)``."""
    return multiplier_from_aggregates(host_state.aggregates, name, conf_value)


def weight_multipliers_all_hosts(hosts: Hosts, name: str, conf_value: float) -> np.ndarray:
    """:func:`get_weight_multiplier` for every host in ``hosts`` (aligned with its rows).

    Evaluated once per distinct aggregate membership of the snapshot and kept until the
    aggregates change, so a request pays one array index per weigher.
    """
    by_code = _by_signature(hosts.snapshot, name, conf_value)
    if len(by_code) == 0:
        return np.full(len(hosts), float(conf_value))
    return by_code[hosts.codes("aggregates")]


def uniform_weight_multiplier(hosts: Hosts, name: str, conf_value: float) -> float | None:
    """The multiplier :func:`weight_multipliers_all_hosts` gives every host when no
    aggregate membership of the snapshot changes it (the usual cloud: the option's
    value), else None. Decided once until the aggregates change."""
    snapshot = hosts.snapshot

    def decide() -> float | None:
        by_code = _by_signature(snapshot, name, conf_value)
        if len(by_code) == 0:
            return float(conf_value)
        first = float(by_code[0])
        # Identical bits: 0.0 and -0.0 are two values, and a column of NaN only is one.
        same = by_code.view(np.int64) == np.float64(first).view(np.int64)
        return first if bool(same.all()) else None

    signatures = len(snapshot.table("aggregates"))
    return snapshot.table_cached(("uniform_multiplier", name, float(conf_value), signatures),
                                 decide)


def _by_signature(snapshot: Any, name: str, conf_value: float) -> np.ndarray:
    """The multiplier of each aggregate membership signature of ``snapshot`` (kept on
    the snapshot until the aggregates change)."""
    signatures = len(snapshot.table("aggregates"))
    return snapshot.table_cached(  # type: ignore[no-any-return]
        ("weight_multiplier", name, float(conf_value), signatures),
        lambda: np.array(
            [multiplier_from_aggregates(snapshot.aggregates_of_signature(code), name,
                                        conf_value)
             for code in range(signatures)],
            dtype=float,
        ))


class MultiplierWeigher(BaseHostWeigher):
    """A weigher whose multiplier is a config option overridable by aggregate metadata.

    Subclasses set ``multiplier_option`` (the option name, which is also the aggregate
    metadata key unless ``multiplier_key`` says otherwise) and ``multiplier_group``.
    """

    multiplier_group: ClassVar[str] = "filter_scheduler"
    multiplier_option: ClassVar[str] = ""
    multiplier_key: ClassVar[str | None] = None

    @classmethod
    def aggregate_key(cls) -> str:
        """The aggregate metadata key that overrides the multiplier."""
        return cls.multiplier_key or cls.multiplier_option

    def conf_multiplier(self) -> float:
        """The configured multiplier (before any aggregate override; the configuration
        is frozen, so it is read once per weigher)."""
        memo = getattr(self, "__dict__", None)  # None: a subclass with __slots__
        found = memo.get("_conf_multiplier") if memo is not None else None
        if found is None or found[0] is not self.config:
            found = (self.config, float(getattr(self.config.group(self.multiplier_group),
                                                self.multiplier_option)))
            if memo is not None:
                memo["_conf_multiplier"] = found
        return found[1]

    def weight_multiplier(self, host_state: HostState) -> float:
        """The multiplier for ``host_state``: aggregate override (minimum) or the option."""
        return get_weight_multiplier(host_state, self.aggregate_key(), self.conf_multiplier())

    def multipliers_all_hosts(self, hosts: Hosts) -> np.ndarray:
        """:meth:`weight_multiplier` of every host, once per aggregate signature."""
        return weight_multipliers_all_hosts(hosts, self.aggregate_key(), self.conf_multiplier())

    uniform_per_snapshot: ClassVar[bool] = True

    def uniform_multiplier(self, hosts: Hosts) -> float | None:
        """The one multiplier of every host when no aggregate overrides it; None when
        some do, or when a subclass computes multipliers its own way."""
        cls = type(self)
        if (cls.multipliers_all_hosts is not MultiplierWeigher.multipliers_all_hosts
                or cls.weight_multiplier is not MultiplierWeigher.weight_multiplier):
            return None
        return uniform_weight_multiplier(hosts, self.aggregate_key(), self.conf_multiplier())

    def describe(self) -> dict[str, Any]:
        """What explanations print about this weigher, with its lever."""
        info = super().describe()
        info["multiplier_option"] = f"[{self.multiplier_group}] {self.multiplier_option}"
        info["multiplier"] = self.conf_multiplier()
        info["aggregate_key"] = self.aggregate_key()
        return info


def per_host_column(
    hosts: Hosts, name: str, key: Hashable, compute: Callable[[Any], float]
) -> np.ndarray:
    """``compute(obj)`` of per-host object column ``name`` for every host in ``hosts``.

    Computed once per snapshot row and cached (under ``key``), a reported row again
    alone; rows whose object this request replaced (virtual consumption) are computed
    afresh.
    """
    snapshot = hosts.snapshot

    def build() -> np.ndarray:
        # Most hosts usually have nothing in such a column (no PCI devices, say): the
        # value of None is computed once and only the other rows one by one.
        column = snapshot.obj(name)
        present = np.flatnonzero(column != None)  # noqa: E711 - element-wise on objects
        values = np.full(len(column), float(compute(None)))
        if len(present):
            values[present] = np.fromiter(
                (compute(obj) for obj in column[present]), dtype=float, count=len(present)
            )
        return values

    values = snapshot.row_cached(key, build,
                                 lambda row: float(compute(snapshot.obj(name)[row])))[hosts.rows]
    overridden = hosts.ws.overridden(name)
    if overridden:
        for pos in np.flatnonzero(np.isin(hosts.rows, list(overridden))).tolist():
            values[pos] = compute(overridden[int(hosts.rows[pos])])
    return values
