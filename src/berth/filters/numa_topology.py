"""NUMATopologyFilter: pass hosts whose NUMA cells can hold the guest's NUMA topology.

The rule (reference §3.18): a host with a NUMA topology fails a ``dedicated`` +
``require`` request when it has no SMT; a request with a NUMA topology fails hosts
without one and keeps only the allocation candidates for which the guest cells fit
(CPU pinning and thread policies, page sizes, oversubscription by the host's
cpu/ram_allocation_ratio, emulator threads, PCI and network NUMA affinity).
Options: ``[compute] packing_host_numa_cells_allocation_strategy`` (fill the busiest
cells first instead of spreading). The operator's levers are the host's allocation
ratios and that option; the request's are the flavor's ``hw:*`` extra specs.

Memory per guest cell, as Nova 34 decides it: with ``hw:mem_page_size`` only the free
pages of the chosen size count (the cell's memory is a whole number of them), so a
huge-page guest fits a cell whose ``memory_usage`` is high as long as its huge pages
are free; without a page size the smallest pages count (the free ones for pinned
guests), or the cell's memory when it lists no pages. The ``ram_allocation_ratio``
limit applies to shared and mixed guests, never to dedicated ones.

``hw:mem_page_size=any`` (also ``small`` and ``large``) follows Nova including a side
effect: Nova writes the size it picks for a guest cell into the request while it tries
one ordering of host cells, and when that ordering then fails (on CPUs, say) the next
orderings ask for that size only. So a host fails when the first cell tried has free
1 GiB pages but too few CPUs and the cell with the CPUs has only 2 MiB pages free,
although a fresh choice would fit there. Berth keeps this on purpose: it is what every
Nova deployment does, and Berth's contract is Nova's decision host by host, so a host
Nova refuses is refused here too rather than "fixed" into a placement Nova would never
make (a mixed fleet, or a move back to Nova, would otherwise see different answers).

The same side effect reaches across a host's allocation candidates: Nova fits them one
after another on one copy of the request, so each fit starts from the host cell ids,
page sizes and pinning the previous one left in the guest cells. A host whose first
candidate does not fit can keep its second (on a fresh request it would not), and the
reverse; Berth fits a host's candidates in the same order on one guest state too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from berth.filters.base import BaseHostFilter, Reject
from berth.hardware.columns import NONE_CODE, object_codes
from berth.hardware.numa import (
    DEDICATED,
    REQUIRE,
    InstanceNUMACell,
    InstanceNUMATopology,
    NUMATopology,
    NUMATopologyLimits,
    guest_state,
    numa_fit_instance_to_host,
    numa_topology_from_request,
)
from berth.hardware.pci import InstancePCIRequest, PciDeviceStats, mapping_keyer, requests_of
from berth.host_state import Hosts, unique_codes

if TYPE_CHECKING:
    from berth.host_state import HostState
    from berth.model.request import RequestSpec

REASON_NO_FIT = "NUMA topology does not fit"
REASON_NO_TOPOLOGY = "host has no NUMA topology"
REASON_NEEDS_SMT = "CPU thread policy require needs SMT"


@dataclass(frozen=True)
class _Facts:
    """What one request asks of every host, computed once per call."""

    req: InstanceNUMATopology | None
    requires_threads: bool
    pci: list[InstancePCIRequest]
    network_metadata: Any
    pack: bool

    def limits(self, cpu_ratio: float | None, ram_ratio: float | None) -> NUMATopologyLimits:
        return NUMATopologyLimits(cpu_ratio, ram_ratio, self.network_metadata or None, self.pack)

    def fits(
        self,
        host: NUMATopology,
        pci_stats: PciDeviceStats | None,
        limits: NUMATopologyLimits,
        mapping: Any,
        state: list[InstanceNUMACell] | None = None,
    ) -> bool:
        return numa_fit_instance_to_host(
            host, self.req, limits, self.pci or None, pci_stats, provider_mapping=mapping,
            guest_cells=state,
        ) is not None

    def new_state(self) -> list[InstanceNUMACell]:
        """The guest cells one host's candidates are fitted on in turn (see
        :meth:`NUMATopologyFilter.check`)."""
        assert self.req is not None
        return guest_state(self.req)

    def reject(self, host: NUMATopology) -> Reject:
        req = self.req
        assert req is not None
        numbers: dict[str, Any] = {
            "requested_cells": len(req.cells),
            "requested_cpus": sum(len(c) for c in req.cells),
            "requested_memory_mb": sum(c.memory for c in req.cells),
            "host_cells": len(host.cells),
        }
        if req.cpu_pinning_requested:
            numbers["free_pcpus"] = sum(c.avail_pcpus for c in host.cells)
        numbers["free_memory_mb"] = sum(c.avail_memory for c in host.cells)
        return Reject(REASON_NO_FIT, numbers)


def _factorize_codes(codes: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(codes, return_inverse=True)`` for codes in ``[NONE_CODE, size)``,
    in O(n) with a presence table."""
    shifted = codes - NONE_CODE
    unique, inverse = unique_codes(shifted, size - NONE_CODE)
    return unique + NONE_CODE, inverse


def _groups(keys: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """A position of each distinct key (ascending keys) and each key's group index:
    ``np.unique(keys, return_index=True, return_inverse=True)[1:]`` except that the
    position may be any member's (the members of a group are equal in every factor)."""
    if size > 4 * len(keys) + 1024:
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        return first, inverse.reshape(-1)
    unique, inverse = unique_codes(keys, size)
    first = np.empty(len(unique), dtype=np.intp)
    first[inverse] = np.arange(len(keys), dtype=np.intp)
    return first, inverse


def _ratio(value: float) -> float | None:
    return None if value is None or math.isnan(value) else float(value)


class NUMATopologyFilter(BaseHostFilter):
    """Pass hosts whose NUMA cells fit the guest's NUMA topology (pinning, pages, limits).

    Candidates (Nova's CandidateFilterMixin): the host keeps the allocation candidates
    for which the topology fits with the candidate's provider mapping, and fails with
    none left; ``host_state.limits['numa_topology']`` is set on a pass. When the working
    set has no candidates in use (``ws.candidates is None``: the offline/legacy path,
    where Nova would see an empty list and fail every host), Berth evaluates the fit once
    without a provider mapping instead, so offline scheduling stays meaningful.
    The fit works on copies: the request's topology never receives pinning here.
    """

    run_filter_once_per_request: ClassVar[bool] = False
    RUN_ON_REBUILD: ClassVar[bool] = False

    # ------------------------------------------------------------------ request side
    def validate_request(self, spec_obj: RequestSpec) -> None:
        """Parse the flavor/image NUMA extra specs so bad values fail before any host."""
        props = spec_obj.image.properties if spec_obj.image is not None else None
        numa_topology_from_request(spec_obj.flavor, props)

    def _facts(self, spec_obj: RequestSpec) -> _Facts:
        extra_specs = spec_obj.flavor.extra_specs or {}
        # Nova's spec always carries an ImageMeta (empty for volume-backed servers);
        # Berth's None image means the same thing: no properties.
        props = spec_obj.image.properties if spec_obj.image is not None else None
        image_get = props.get if props is not None else (lambda _name, _default=None: None)
        policies = [extra_specs.get("hw:cpu_policy"), image_get("hw_cpu_policy")]
        threads = [extra_specs.get("hw:cpu_thread_policy"), image_get("hw_cpu_thread_policy")]
        compute = getattr(self.config, "compute", None)
        pack = bool(compute.packing_host_numa_cells_allocation_strategy) if compute is not None else False
        return _Facts(
            req=spec_obj.numa_topology or None,
            requires_threads=DEDICATED in policies and REQUIRE in threads,
            pci=requests_of(spec_obj.pci_requests),
            network_metadata=spec_obj.network_metadata,
            pack=pack,
        )

    # ------------------------------------------------------------------ per host
    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """None if the host passes; keeps the fitting candidates and sets the limits."""
        facts = self._facts(spec_obj)
        host = host_state.numa_topology
        if facts.requires_threads and host and not host.has_threads:
            return Reject.of(REASON_NEEDS_SMT)
        if facts.req and host:
            limits = facts.limits(host_state.cpu_allocation_ratio, host_state.ram_allocation_ratio)
            pci_stats = host_state.pci_stats
            if host_state.working_set.candidates is None:
                ok = facts.fits(host, pci_stats, limits, None)
            else:
                # Nova fits a host's candidates one after another on one copy of the
                # request, whose guest cells keep what each fit wrote into them (host
                # cell ids, page sizes, pinning): a later candidate can fit where the
                # first did not, or the reverse, whatever its mapping.
                state = facts.new_state()
                kept = [cand for cand in host_state.allocation_candidates
                        if facts.fits(host, pci_stats, limits, cand.get("mappings"), state)]
                host_state.allocation_candidates = kept
                ok = bool(kept)
            if not ok:
                return facts.reject(host)
            host_state.limits["numa_topology"] = limits
            return None
        if facts.req:
            return Reject.of(REASON_NO_TOPOLOGY)
        return None

    # ------------------------------------------------------------------ bulk
    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """Vectorized: no per-host work without a NUMA request; otherwise one fit per
        distinct (topology, ratios, PCI pools) and, with PCI requests, per candidate
        mapping key."""
        n = len(hosts)
        facts = self._facts(spec_obj)
        if not facts.req and not facts.requires_threads:
            return np.ones(n, dtype=bool)
        codes, table = object_codes(hosts, "numa_topology")
        truthy = np.fromiter((bool(t) for t in table), dtype=bool, count=len(table))
        present = codes != NONE_CODE
        has = np.zeros(n, dtype=bool)
        has[present] = truthy[codes[present]]
        mask = np.ones(n, dtype=bool)
        if facts.requires_threads:
            threads = np.fromiter((t.has_threads for t in table), dtype=bool, count=len(table))
            mask[has] = threads[codes[has]]
        if not facts.req:
            return mask
        mask &= has
        todo = np.flatnonzero(mask)
        if len(todo) == 0:
            return mask
        # Only the hosts with a topology are read further (a tenth of them in a typical
        # cloud): gather their rows once instead of whole columns.
        ws = hosts.ws
        todo_rows = hosts.rows[todo]
        pci_codes, pci_table = object_codes(Hosts(ws, todo_rows), "pci_stats")
        cpu = ws.col("cpu_allocation_ratio")[todo_rows]
        ram = ws.col("ram_allocation_ratio")[todo_rows]
        # One evaluation per distinct (topology, cpu ratio, ram ratio, pools): factorize
        # each column, combine the factors into one integer key, factorize that. Codes
        # are small integers: a presence table does it without sorting.
        factors = [_factorize_codes(codes[todo], len(table)), np.unique(cpu, return_inverse=True),
                   np.unique(ram, return_inverse=True), _factorize_codes(pci_codes, len(pci_table))]
        combined = np.zeros(len(todo), dtype=np.int64)
        size = 1
        for values, inv in factors:
            combined = combined * len(values) + inv.reshape(-1)
            size *= len(values)
        first, inverse = _groups(combined, size)
        picks = [[values[inv.reshape(-1)[i]] for i in first.tolist()] for values, inv in factors]
        group_host = [table[int(c)] for c in picks[0]]
        group_limits = [facts.limits(_ratio(c), _ratio(r)) for c, r in zip(picks[1], picks[2])]
        group_pci = [None if int(c) == NONE_CODE else pci_table[int(c)] for c in picks[3]]
        rows = todo_rows.tolist()
        passed = np.zeros(len(todo), dtype=bool)
        if ws.candidates is None:
            ok = np.fromiter(
                (facts.fits(h, p, lim, None) for h, p, lim in zip(group_host, group_pci, group_limits)),
                dtype=bool, count=len(group_host),
            )
            passed = ok[inverse]
        else:
            passed = self._candidates_bulk(facts, ws.candidates, rows, inverse,
                                           group_host, group_pci, group_limits)
        if passed.any():
            limit_objects = np.empty(len(group_limits), dtype=object)
            limit_objects[:] = group_limits
            ws.set_limits("numa_topology", todo_rows[passed], limit_objects[inverse[passed]])
        mask[todo] = passed
        return mask

    @staticmethod
    def _candidates_bulk(
        facts: _Facts,
        candidates: dict[int, list[dict[str, Any]]],
        rows: list[int],
        inverse: np.ndarray,
        group_host: list[NUMATopology],
        group_pci: list[PciDeviceStats | None],
        group_limits: list[NUMATopologyLimits],
    ) -> np.ndarray:
        """Keep each row's fitting candidates; True where some remain.

        A host's candidates are fitted in turn on one guest state (see :meth:`check`),
        so the answer for its k-th candidate depends on the fits before it. Where the
        mapping cannot change a fit (no PCI requests, or no pools), that is a sequence
        per group: its first answer decides every single-candidate host of the group
        with NumPy, and hosts with more candidates read further down the sequence. The
        others are fitted candidate by candidate, once per (group, mapping keys so far).
        """
        matters = np.fromiter((bool(facts.pci) and p is not None for p in group_pci),
                              dtype=bool, count=len(group_pci))
        plain: dict[int, tuple[list[InstanceNUMACell], list[bool]]] = {}

        def plain_answers(g: int, count: int) -> list[bool]:
            state, answers = plain.setdefault(g, (facts.new_state(), []))
            while len(answers) < count:
                answers.append(facts.fits(group_host[g], group_pci[g], group_limits[g], None, state))
            return answers[:count]

        plain_ok = np.fromiter(
            (not m and plain_answers(g, 1)[0] for g, m in enumerate(matters.tolist())),
            dtype=bool, count=len(group_host),
        )
        counts = np.fromiter((len(candidates.get(row) or ()) for row in rows), dtype=np.int64,
                             count=len(rows))
        passed = (counts == 1) & plain_ok[inverse]
        by_mapping = matters[inverse] & (counts > 0)
        several = ~matters[inverse] & (counts > 1)
        for i in np.flatnonzero(~passed & ~by_mapping & ~several).tolist():
            candidates[rows[i]] = []  # Nova's filter_candidates leaves the empty list
        for i in np.flatnonzero(several).tolist():
            row = rows[i]
            cands = candidates[row]
            answers = plain_answers(int(inverse[i]), len(cands))
            kept = [cand for cand, ok in zip(cands, answers) if ok]
            if len(kept) != len(cands):
                candidates[row] = kept
            passed[i] = bool(kept)
        if by_mapping.any():
            keyer = mapping_keyer(facts.pci)
            # (group, the mapping keys of the candidates fitted so far) -> the answer
            # and the guest state after it.
            memo: dict[tuple[int, tuple[Any, ...]], tuple[bool, list[InstanceNUMACell]]] = {}
            for i in np.flatnonzero(by_mapping).tolist():
                row, g = rows[i], int(inverse[i])
                kept = []
                cands = candidates[row]
                keys: tuple[Any, ...] = ()
                state = facts.new_state()
                for cand in cands:
                    mapping = cand.get("mappings")
                    keys += (keyer(mapping),)
                    known = memo.get((g, keys))
                    if known is None:
                        state = [c.copy() for c in state]
                        ok = facts.fits(group_host[g], group_pci[g], group_limits[g], mapping, state)
                        memo[(g, keys)] = (ok, state)
                    else:
                        ok, state = known
                    if ok:
                        kept.append(cand)
                if len(kept) != len(cands):
                    candidates[row] = kept
                passed[i] = bool(kept)
        return passed

