"""The weigher contract and Nova's normalization.

A weigher returns one raw number per host (``_weigh_object``); the handler clamps it to
the class's ``minval``/``maxval``, normalizes it to [0, 1] across the hosts in play
(:func:`normalize`), multiplies it by ``weight_multiplier(host)`` (per host, because
aggregate metadata can override it) and sums over weighers. Higher total wins.

A weigher that needs every host at once may override ``weigh_objects`` alone (seed 000
allows it): it returns one raw weight per host, which the handler normalizes as usual
(Nova clamps to ``minval``/``maxval`` only inside the base ``weigh_objects``, so such a
weigher's values are not clamped). Seed 000 spells the two methods ``weight_objects``
and ``_weight_object``; a class defining those names gets them under Nova's names, with
a warning.

Built-ins also implement the bulk methods :meth:`BaseHostWeigher.weigh_all_hosts` and
:meth:`BaseHostWeigher.multipliers_all_hosts`; property tests prove they agree with the
per-host methods within 1e-9.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from berth.errors import ConfigError

if TYPE_CHECKING:
    from berth.config import SchedulerConfig
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec

LOG = logging.getLogger(__name__)

#: Seed 000's spellings of the weigher methods -> Nova's names.
SEED_METHOD_NAMES = {"weight_objects": "weigh_objects", "_weight_object": "_weigh_object"}


def normalize(
    weights: Sequence[float] | np.ndarray,
    minval: float | None = None,
    maxval: float | None = None,
) -> np.ndarray:
    """Nova's min/max normalization of raw weights to [0, 1] (reference §7.1).

    ``minval``/``maxval`` given explicitly replace the list's own extremes. When the two
    are equal every weight becomes 0. Values are not clamped here (the weigher clamps raw
    values first), so an explicit ``minval`` above a weight yields a negative result.

    >>> normalize([1, 2, 3]).tolist()
    [0.0, 0.5, 1.0]
    >>> normalize([5, 5], minval=0).tolist()
    [1.0, 1.0]
    """
    values = np.asarray(weights, dtype=float)
    if values.size == 0:
        return values
    low = float(values.min()) if minval is None else float(minval)
    high = float(values.max()) if maxval is None else float(maxval)
    if low == high:
        return np.zeros_like(values)
    return (values - low) / (high - low)


@dataclass
class WeighedHost:
    """A host with its accumulated weight (Nova's ``WeighedHost``: ``.obj``, ``.weight``)."""

    obj: HostState
    weight: float = 0.0


class BaseHostWeigher:
    """Base class of every host weigher; the class name is the config name.

    Override ``_weigh_object`` (and ``weight_multiplier`` for a configurable lever). Set
    ``minval``/``maxval`` to fix the normalization range instead of using the hosts'
    extremes. ``self.config`` is the scheduler's frozen configuration.
    """

    minval: ClassVar[float | None] = None
    maxval: ClassVar[float | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for old, new in SEED_METHOD_NAMES.items():
            if old in cls.__dict__ and new not in cls.__dict__:
                LOG.warning("%s.%s: %s is an old spelling of %s; using it as %s",
                            cls.__module__, cls.__name__, old, new, new)
                setattr(cls, new, cls.__dict__[old])

    @classmethod
    def implements_weighing(cls) -> bool:
        """Whether the class gives raw weights: ``_weigh_object``, ``weigh_objects`` or
        the bulk ``weigh_all_hosts`` overridden."""
        return any(getattr(cls, m) is not getattr(BaseHostWeigher, m)
                   for m in ("_weigh_object", "weigh_objects", "weigh_all_hosts"))

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
    def weight_multiplier(self, host_state: HostState) -> float:
        """How much this weigher counts for ``host_state`` (default 1.0)."""
        return 1.0

    def _weigh_object(self, host_state: HostState, weight_properties: RequestSpec) -> float:
        """The raw weight of one host (override this)."""
        raise NotImplementedError(f"{type(self).__name__} must implement _weigh_object")

    def _clamp(self, weight: float) -> float:
        if self.minval is not None:
            weight = max(weight, self.minval)
        if self.maxval is not None:
            weight = min(weight, self.maxval)
        return weight

    def weigh_objects(
        self, weighed_obj_list: Sequence[WeighedHost], weight_properties: RequestSpec
    ) -> list[float]:
        """Raw weights, clamped to ``minval``/``maxval``, one per weighed host."""
        return [self._clamp(self._weigh_object(w.obj, weight_properties)) for w in weighed_obj_list]

    # -- Berth's bulk contract -------------------------------------------------------
    def weigh_all_hosts(self, hosts: Hosts, weight_properties: RequestSpec) -> np.ndarray:
        """Raw clamped weights of all ``hosts`` (built-ins override with array code).

        A weigher that overrides only ``weigh_objects`` gets its list, unclamped as in
        Nova; a list of the wrong length or of non-numbers is a ``ConfigError`` naming
        the weigher.
        """
        if type(self).weigh_objects is not BaseHostWeigher.weigh_objects:
            return self._weigh_objects_column(hosts, weight_properties)
        raw = np.fromiter(
            (self._weigh_object(h, weight_properties) for h in hosts.states()),
            dtype=float,
            count=len(hosts),
        )
        return self.clamp_all(raw)

    def _weigh_objects_column(self, hosts: Hosts, weight_properties: RequestSpec) -> np.ndarray:
        name = type(self).__name__
        weights = self.weigh_objects([WeighedHost(h) for h in hosts.states()], weight_properties)
        try:
            raw = np.array(list(weights), dtype=float)
        except (TypeError, ValueError):
            raise ConfigError(f"weigher {name}: weigh_objects returned {weights!r}; "
                              "it must return one number per host", weigher=name) from None
        if raw.shape != (len(hosts),):
            raise ConfigError(f"weigher {name}: weigh_objects returned {raw.size} weights "
                              f"for {len(hosts)} hosts", weigher=name)
        return raw

    def clamp_all(self, raw: np.ndarray) -> np.ndarray:
        """Apply ``minval``/``maxval`` to an array of raw weights."""
        if self.minval is not None:
            raw = np.maximum(raw, self.minval)
        if self.maxval is not None:
            raw = np.minimum(raw, self.maxval)
        return raw

    #: Declared by a class that defines :meth:`uniform_multiplier`, in the same class
    #: body: its answer depends only on the snapshot's aggregates and the configuration,
    #: so the ranker may ask once per aggregates epoch (see :func:`uniform_per_snapshot`).
    uniform_per_snapshot: ClassVar[bool] = True

    def uniform_multiplier(self, hosts: Hosts) -> float | None:
        """The multiplier when it is known to be the same for every host of ``hosts``
        (the ranker then multiplies by a number instead of gathering a column); None
        when it is not known to be (the default): :meth:`multipliers_all_hosts` says."""
        return None

    def multipliers_all_hosts(self, hosts: Hosts) -> np.ndarray:
        """``weight_multiplier`` of every host (built-ins evaluate once per aggregate set)."""
        return np.fromiter(
            (self.weight_multiplier(h) for h in hosts.states()), dtype=float, count=len(hosts)
        )

    def describe(self) -> dict[str, Any]:
        """What explanations print about this weigher."""
        return {"name": self.name(), "minval": self.minval, "maxval": self.maxval}


def uniform_per_snapshot(weigher: BaseHostWeigher) -> bool:
    """Whether ``weigher``'s :meth:`~BaseHostWeigher.uniform_multiplier` is a function
    of the snapshot's aggregates and the configuration alone: the class that defines
    the method says so in its own body (a subclass that overrides the method without
    saying so is asked for every ranking)."""
    for klass in type(weigher).__mro__:
        own = vars(klass)
        if "uniform_multiplier" in own:
            return bool(own.get("uniform_per_snapshot", False))
    return False
