"""IsolatedHostsFilter: keep isolated images on isolated hosts (and, by default, the
other images off them).

Options, ``[filter_scheduler]``: ``isolated_hosts`` and ``isolated_images`` (lists,
default empty) and ``restrict_isolated_hosts_to_isolated_images`` (default True; False
lets isolated hosts take other images too). With no isolated images, only the restriction
applies: isolated hosts take nothing. A volume-backed request (no image id) counts as a
non-isolated image. Lever: the three options.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from berth.filters.base import BaseHostFilter, Reject

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec


class IsolatedHostsFilter(BaseHostFilter):
    """Isolated images run only on isolated hosts, which take only isolated images.

    With restrict_isolated_hosts_to_isolated_images False, isolated hosts take any image.
    """

    run_filter_once_per_request: ClassVar[bool] = True
    RUN_ON_REBUILD: ClassVar[bool] = True

    def _image_state(self, spec_obj: RequestSpec) -> tuple[str | None, bool]:
        image_ref = spec_obj.image.id if spec_obj.image is not None else None
        return image_ref, image_ref in self.config.filter_scheduler.isolated_images

    def _decide(self, host_iso: bool, img_iso: bool) -> bool:
        opts = self.config.filter_scheduler
        restrict = opts.restrict_isolated_hosts_to_isolated_images
        if not opts.isolated_images:
            return not restrict or not host_iso
        if restrict:
            return img_iso == host_iso
        return not img_iso or host_iso

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """``isolated host`` (other image on an isolated host) or ``host not isolated``."""
        image_ref, img_iso = self._image_state(spec_obj)
        host_iso = host_state.host in self.config.filter_scheduler.isolated_hosts
        if self._decide(host_iso, img_iso):
            return None
        if host_iso:
            return Reject.of("isolated host", image=image_ref)
        return Reject.of("host not isolated", image=image_ref)

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """One membership column per snapshot, then two boolean outcomes spread by it."""
        isolated = tuple(self.config.filter_scheduler.isolated_hosts)
        snapshot = hosts.snapshot

        def build() -> np.ndarray:
            names = set(isolated)
            return np.array([h in names for h in snapshot.obj("host")], dtype=bool)

        host_iso = snapshot.cached(("isolated_hosts", isolated), build)[hosts.rows]
        _, img_iso = self._image_state(spec_obj)
        return np.where(host_iso, self._decide(True, img_iso), self._decide(False, img_iso))
