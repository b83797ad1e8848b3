"""The resource ledger of a replay: capacity and usage per compute node, as placement
counts them, kept current from the allocations each boot claimed.

Built once from every provider's capacity and usages (each provider counted on its root:
a NUMA cell's or a device's resources are its compute node's), then moved by the
allocation requests the boots answer with and by the deletes — so a sample costs no
request. Capacity per class is ``int((total - reserved) * allocation_ratio)``, as
placement computes it (:mod:`berth.placement.amounts`: a cloud in process is read from
its store's provider graph in one go, a running Berth through its Placement API).

Fragmentation is arithmetic on those free amounts: the largest flavor of the set that
some node could still take (by its whole tree's free amounts, ignoring filters), and
the stranded capacity: what is free on nodes that can take no flavor of the set.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from berth.placement.amounts import ProviderAmounts


@dataclass
class Need:
    """One flavor's amounts per class (what the placement query asks)."""

    name: str
    amounts: dict[str, int]


class Ledger:
    """Capacity and usage of every compute node (a provider tree's root)."""

    def __init__(self, providers: Iterable[ProviderAmounts], nodes: Sequence[Mapping[str, object]],
                 needs: Sequence[Need] = ()) -> None:
        providers = list(providers)
        node_uuids = {str(n["uuid"]) for n in nodes}
        #: The compute nodes (roots named by the scheduler's hosts), in a fixed order.
        self.roots = sorted({p.root_uuid for p in providers if p.root_uuid in node_uuids})
        index = {r: i for i, r in enumerate(self.roots)}
        self.row_of = {p.uuid: index[p.root_uuid] for p in providers if p.root_uuid in index}
        caps: dict[str, np.ndarray] = {}
        used: dict[str, np.ndarray] = {}
        n = len(self.roots)
        for p in providers:
            row = self.row_of.get(p.uuid)
            if row is None:
                continue  # a sharing provider or a tree without a compute node
            for rc, cap in p.capacity.items():
                caps.setdefault(rc, np.zeros(n, dtype=np.int64))[row] += cap
                used.setdefault(rc, np.zeros(n, dtype=np.int64))[row] += int(p.used.get(rc, 0))
        self.classes = sorted(caps)
        self.col = {rc: i for i, rc in enumerate(self.classes)}
        self.capacity = np.stack([caps[rc] for rc in self.classes], axis=1) if caps else \
            np.zeros((n, 0), dtype=np.int64)
        self.used = np.stack([used[rc] for rc in self.classes], axis=1) if used else \
            np.zeros((n, 0), dtype=np.int64)
        self.needs = [nd for nd in needs if nd.amounts]
        self.need_matrix = np.array(
            [[nd.amounts.get(rc, 0) for rc in self.classes] for nd in self.needs],
            dtype=np.int64).reshape(len(self.needs), len(self.classes))
        # A flavor asking for a class no node has never fits anywhere.
        self.need_possible = np.array(
            [all(rc in self.col for rc in nd.amounts) for nd in self.needs], dtype=bool)
        #: Flavors from the largest (by memory, then vCPUs, then disk) to the smallest.
        self.by_size = sorted(range(len(self.needs)), key=lambda i: tuple(
            -self.needs[i].amounts.get(rc, 0) for rc in ("MEMORY_MB", "VCPU", "DISK_GB")))
        # Kept current by every apply (Python numbers: a few per allocation), so the
        # peaks are those of every instant, not of the sampled ones.
        self._row_used: list[int] = [int(v) for v in self.used.sum(axis=1)]
        #: Nodes with anything allocated, now.
        self.in_use = sum(1 for v in self._row_used if v)
        #: Used per class over every node, now (by ``classes``' order).
        self.totals: list[int] = [int(v) for v in self.used.sum(axis=0)]
        #: The highest ``in_use`` and ``totals`` so far.
        self.peak_in_use = self.in_use
        self.peak_totals = list(self.totals)

    def apply(self, allocations: Mapping[str, Mapping[str, int]], sign: int) -> None:
        """Add (``sign`` 1) or remove (-1) one consumer's allocations."""
        row_used, totals = self._row_used, self.totals
        for rp, resources in allocations.items():
            row = self.row_of.get(rp)
            if row is None:
                continue
            before = row_used[row]
            for rc, amount in resources.items():
                col = self.col.get(rc)
                if col is not None:
                    delta = sign * int(amount)
                    self.used[row, col] += delta
                    totals[col] += delta
                    row_used[row] += delta
            if not before and row_used[row]:
                self.in_use += 1
            elif before and not row_used[row]:
                self.in_use -= 1
        if sign > 0:  # only an addition can raise a peak
            self.peak_in_use = max(self.peak_in_use, self.in_use)
            peaks = self.peak_totals
            for col, value in enumerate(totals):
                if value > peaks[col]:
                    peaks[col] = value

    def peak_utilization(self) -> dict[str, float]:
        """The highest used over capacity per class at any instant so far."""
        cap = self.capacity.sum(axis=0)
        return {rc: (self.peak_totals[i] / float(cap[i]) if cap[i] else 0.0)
                for i, rc in enumerate(self.classes)}

    def utilization(self) -> dict[str, float]:
        """Used over capacity per class, over every node."""
        cap = self.capacity.sum(axis=0)
        return {rc: (self.totals[i] / float(cap[i]) if cap[i] else 0.0)
                for i, rc in enumerate(self.classes)}

    def hosts_in_use(self) -> int:
        """Nodes with anything allocated."""
        return self.in_use

    def fragmentation(self) -> tuple[str | None, dict[str, int], int]:
        """The largest flavor some node can still take (None when none can), the free
        amounts stranded on nodes that can take no flavor of the set, and how many such
        nodes there are."""
        if not self.needs:
            return None, {}, 0
        free = self.capacity - self.used
        fits = np.all(free[None, :, :] >= self.need_matrix[:, None, :], axis=2)
        fits &= self.need_possible[:, None]
        largest = next((self.needs[i].name for i in self.by_size if fits[i].any()), None)
        stranded_rows = ~fits.any(axis=0)
        stranded = free[stranded_rows].clip(min=0).sum(axis=0)
        return (largest, {rc: int(stranded[i]) for i, rc in enumerate(self.classes)},
                int(stranded_rows.sum()))
