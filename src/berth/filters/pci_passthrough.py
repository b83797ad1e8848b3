"""PciPassthroughFilter: pass hosts whose PCI device pools can serve the request's PCI requests.

The rule (reference §3.19): a request without PCI requests passes every host; a host
without pools fails; otherwise the host keeps the allocation candidates whose provider
mapping lets every request find enough matching devices (spec match, PF/VDPA/remote-
managed exclusion, mapped providers, live-migratable), and fails with none left.
Options: ``[pci] alias`` defines what ``pci_passthrough:alias`` in a flavor asks for.
The operator's lever is the alias definitions and the hosts' device pools.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from berth.filters.base import BaseHostFilter, Reject
from berth.hardware.columns import NONE_CODE, keep_candidates, object_codes
from berth.hardware.pci import (
    InstancePCIRequest,
    mapping_keyer,
    parse_aliases,
    pci_requests_from_flavor,
    requests_of,
)

if TYPE_CHECKING:
    from berth.config import SchedulerConfig
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec

REASON_UNAVAILABLE = "PCI devices unavailable"
REASON_NO_POOLS = "no PCI device pools"


class PciPassthroughFilter(BaseHostFilter):
    """Pass hosts whose PCI pools can serve every PCI request of the instance.

    Candidates (Nova's CandidateFilterMixin): the host keeps the allocation candidates
    whose mapping can be served and fails with none left. When the working set has no
    candidates in use (``ws.candidates is None``: the offline/legacy path), Berth asks the
    pools once without a provider mapping instead of failing every host.
    """

    run_filter_once_per_request: ClassVar[bool] = False
    RUN_ON_REBUILD: ClassVar[bool] = False

    def __init__(self, config: SchedulerConfig | None = None) -> None:
        super().__init__(config)
        # A bad [pci] alias is a start-up error, not a failure of the first PCI request.
        parse_aliases(getattr(getattr(self.config, "pci", None), "alias", None) or ())

    def validate_request(self, spec_obj: RequestSpec) -> None:
        """Check the flavor's ``pci_passthrough:alias`` against ``[pci] alias`` up front."""
        props = spec_obj.image.properties if spec_obj.image is not None else None
        pci_requests_from_flavor(spec_obj.flavor, self.config, props)

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """None if the host passes; keeps the candidates whose mapping can be served."""
        requests = requests_of(spec_obj.pci_requests)
        if not requests:
            return None
        stats = host_state.pci_stats
        if not stats:
            return Reject.of(REASON_NO_POOLS, requested=_requested(requests))
        if host_state.working_set.candidates is None:
            ok = stats.support_requests(requests, None)
        else:
            kept = keep_candidates(
                host_state.allocation_candidates,
                lambda mapping: stats.support_requests(requests, mapping),
                mapping_keyer(requests),
            )
            host_state.allocation_candidates = kept
            ok = bool(kept)
        if ok:
            return None
        return Reject.of(REASON_UNAVAILABLE, requested=_requested(requests), free=stats.free_count())

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """Vectorized: all pass without requests; otherwise one evaluation per distinct
        pool set (and candidate mapping key)."""
        n = len(hosts)
        requests = requests_of(spec_obj.pci_requests)
        if not requests:
            return np.ones(n, dtype=bool)
        codes, table = object_codes(hosts, "pci_stats")
        truthy = np.fromiter((bool(t) for t in table), dtype=bool, count=len(table))
        mask = np.zeros(n, dtype=bool)
        present = codes != NONE_CODE
        mask[present] = truthy[codes[present]]
        todo = np.flatnonzero(mask)
        if len(todo) == 0:
            return mask
        ws = hosts.ws
        if ws.candidates is None:
            unique, inverse = np.unique(codes[todo], return_inverse=True)
            ok = np.fromiter((table[int(c)].support_requests(requests, None) for c in unique),
                             dtype=bool, count=len(unique))
            mask[todo] = ok[inverse.reshape(-1)]
            return mask
        candidates = ws.candidates
        keyer = mapping_keyer(requests)
        memo: dict[tuple[int, Any], bool] = {}
        rows = hosts.rows[todo].tolist()
        sub_codes = codes[todo].tolist()
        passed = np.zeros(len(todo), dtype=bool)
        for i, (row, code) in enumerate(zip(rows, sub_codes)):
            kept = []
            cands = candidates.get(row)
            for cand in cands or ():
                mapping = cand.get("mappings")
                key = (code, keyer(mapping))
                served = memo.get(key)
                if served is None:
                    served = memo[key] = table[code].support_requests(requests, mapping)
                if served:
                    kept.append(cand)
            if cands is None or len(kept) != len(cands):
                candidates[row] = kept  # an unchanged list need not be rewritten
            passed[i] = bool(kept)
        mask[todo] = passed
        return mask


def _requested(requests: list[InstancePCIRequest]) -> int:
    return sum(r.count for r in requests)
