"""AggregateImagePropertiesIsolation: a host's aggregate metadata restricts the image
properties it takes.

For each aggregate key that names an image property the image sets (to a truthy value),
``str(value)`` must be one of the key's comma-separated values; keys that are not image
properties (``os``, ``foo``) and unset properties are ignored. The value is the typed one
Nova's ImageMetaProps holds (:mod:`berth.model.image_props`): ``hw_cpu_cores: "2"`` is the
integer 2 and matches ``2``; an architecture, hypervisor type or VM mode is canonical
(``AMD64`` matches ``x86_64``); a true boolean is ``True`` (so an aggregate listing
``true`` rejects it) and a false one, like 0, is ignored. Options,
``[filter_scheduler]``: ``aggregate_image_properties_isolation_namespace`` (only keys
starting with ``namespace + separator`` count; deprecated in 33.0.0) and
``aggregate_image_properties_isolation_separator`` (``.``). Lever: the aggregate metadata.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from berth.filters.base import BaseHostFilter, Reject
from berth.filters.utils import metadata_by_key

if TYPE_CHECKING:
    from berth.config import SchedulerConfig
    from berth.host_state import Hosts, HostState
    from berth.model.aggregate import Aggregate
    from berth.model.request import RequestSpec

LOG = logging.getLogger(__name__)

class AggregateImagePropertiesIsolation(BaseHostFilter):
    """Image properties named by aggregate metadata keys must take one of the key's values."""

    run_filter_once_per_request: ClassVar[bool] = True
    RUN_ON_REBUILD: ClassVar[bool] = True

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        super().__init__(config)
        opts = self.config.filter_scheduler
        self.namespace: str | None = opts.aggregate_image_properties_isolation_namespace
        self.separator: str = opts.aggregate_image_properties_isolation_separator
        if self.namespace:
            # Nova warns on every call; once at start-up says the same without the noise.
            LOG.warning(
                "[filter_scheduler] aggregate_image_properties_isolation_namespace is "
                "deprecated since Nova 33.0.0 and will be removed"
            )

    def _check_aggregates(self, aggregates: Iterable[Aggregate], props: Any) -> Reject | None:
        prefix = (self.namespace + self.separator) if self.namespace else None
        for key, options in metadata_by_key(aggregates).items():
            if prefix is not None and not key.startswith(prefix):
                continue
            prop = props.get(key) if props is not None else None
            if prop and str(prop) not in options:
                return Reject.of("image property not allowed in aggregate", property=key,
                                 image_value=str(prop), allowed=",".join(sorted(options)))
        return None

    @staticmethod
    def _props(spec_obj: RequestSpec) -> Any:
        return spec_obj.image.properties if spec_obj.image is not None else None

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """``image property not allowed in aggregate`` naming the property, else None."""
        return self._check_aggregates(host_state.aggregates, self._props(spec_obj))

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """Once per aggregate-membership signature."""
        props = self._props(spec_obj)
        if props is None:
            return np.ones(len(hosts), dtype=bool)
        unique, inverse = hosts.signatures("aggregates")
        snapshot = hosts.snapshot
        verdicts = np.array(
            [self._check_aggregates(snapshot.aggregates_of_signature(int(c)), props) is None
             for c in unique.tolist()],
            dtype=bool,
        )
        return verdicts[inverse] if len(unique) else np.ones(len(hosts), dtype=bool)
