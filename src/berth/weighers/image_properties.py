"""ImagePropertiesWeigher: prefer hosts whose instances use images like the requested one.

For every ``(property, value)`` of the request's image that instances on the host (every
node of its service host, as in Nova) also have, add how many instances have it, each
count times the property's ratio from ``[filter_scheduler] image_props_weight_setting``
(``name=ratio``; unlisted properties count 0) or times 1 when that option is empty. Values compare as strings. Option:
``[filter_scheduler] image_props_weight_multiplier`` (default 0.0: disabled; the weigher
then returns 0 without looking at any instance, and an aggregate override alone does not
enable it); positive packs alike images, negative spreads them. Aggregate metadata
``image_props_weight_multiplier`` overrides a non-zero option (minimum wins).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from berth.model.request import ImageMetaProps
from berth.weighers.setting import parse_weight_setting
from berth.weighers.utils import MultiplierWeigher

if TYPE_CHECKING:
    from berth.config import SchedulerConfig
    from berth.host_state import Hosts, HostState
    from berth.model.compute import Instance
    from berth.model.request import RequestSpec

Pair = tuple[str, str]


def _pairs(properties: Mapping[str, Any] | ImageMetaProps | None) -> set[Pair]:
    """``(name, str(value))`` of the set image properties (Nova's names, legacy aliases
    translated, unknown names dropped, as ``ImageMetaProps.to_dict()`` gives them)."""
    if properties is None:
        return set()
    props = properties if isinstance(properties, ImageMetaProps) else ImageMetaProps(properties)
    return {(key, str(value)) for key, value in props.to_dict().items()}


def existing_pairs(instances: Mapping[str, Instance]) -> Counter[Pair]:
    """How many of ``instances`` have each ``(property, value)`` pair."""
    counts: Counter[Pair] = Counter()
    for instance in instances.values():
        counts.update(_pairs(instance.image_properties))
    return counts


class ImagePropertiesWeigher(MultiplierWeigher):
    """Instances on the host sharing the requested image's properties weigh more."""

    multiplier_option: ClassVar[str] = "image_props_weight_multiplier"

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        super().__init__(config)
        #: name -> ratio, parsed once (for a repeated name the last ratio wins).
        self.setting: dict[str, float] = dict(
            parse_weight_setting(
                self.config.filter_scheduler.image_props_weight_setting,
                "[filter_scheduler] image_props_weight_setting",
            )
        )

    def _requested(self, spec: RequestSpec) -> list[Pair]:
        # Sorted, so that both paths add the same floats in the same order.
        return sorted(_pairs(spec.image.properties)) if spec.image is not None else []

    def _score(self, requested: list[Pair], existing: Counter[Pair]) -> float:
        weight = 0.0
        for pair in requested:
            count = existing.get(pair, 0)
            if count:
                weight += count * (self.setting.get(pair[0], 0.0) if self.setting else 1)
        return weight

    def _disabled(self) -> bool:
        # Reading every instance's image is costly, so only the option enables the weigher.
        return self.conf_multiplier() == 0.0

    def _weigh_object(self, host_state: HostState, weight_properties: RequestSpec) -> float:
        """Σ over shared (property, value) pairs of the instances having it × its ratio."""
        if self._disabled():
            return 0.0
        return self._score(self._requested(weight_properties), existing_pairs(host_state.instances))

    def weigh_all_hosts(self, hosts: Hosts, weight_properties: RequestSpec) -> np.ndarray:
        """Column arithmetic over per-snapshot counts of each requested pair; hosts that
        received instances earlier in this request are scored one by one."""
        if self._disabled() or len(hosts) == 0:
            return np.zeros(len(hosts))
        requested = self._requested(weight_properties)
        if not requested:
            return np.zeros(len(hosts))
        snapshot = hosts.snapshot
        per_row: list[Counter[Pair]] = snapshot.cached(
            "image_property_pairs",
            lambda: [existing_pairs(i) for i in snapshot.service_hosts().instances_column()])

        def counts_of(pair: Pair) -> np.ndarray:
            return np.array([c.get(pair, 0) for c in per_row], dtype=float)

        raw = np.zeros(len(hosts))
        for pair in requested:
            counts = snapshot.cached(
                ("image_property_pair_counts", pair), lambda: counts_of(pair)  # noqa: B023
            )[hosts.rows]
            ratio = self.setting.get(pair[0], 0.0) if self.setting else 1
            # Added pair by pair in the per-host order; a zero count adds nothing at all.
            raw = raw + np.where(counts != 0, counts * ratio, 0.0)
        extra = hosts.ws.extra_instances()
        if extra:
            for pos in np.flatnonzero(np.isin(hosts.rows, list(extra))).tolist():
                row = int(hosts.rows[pos])
                raw[pos] = self._score(requested, existing_pairs(hosts.ws.instances(row)))
        return self.clamp_all(raw)
