"""NUMA topologies: fitting an instance topology onto a host's cells, and the host
topology after it is placed (see :mod:`berth.hardware.numa`)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from berth.hardware.pci import InstancePCIRequest, PciDeviceStats

from berth.hardware.numa_model import (
    ISOLATE,
    MEMPAGES_ANY,
    MEMPAGES_LARGE,
    MEMPAGES_SMALL,
    MIXED,
    PINNING_POLICIES,
    REQUIRE,
    SHARED,
    InstanceNUMACell,
    InstanceNUMATopology,
    NUMACell,
    NUMAPagesTopology,
    NUMATopology,
    NUMATopologyLimits,
    NUMAUsageError,
    format_cpu_spec,
)


# -------------------------------------------------------------------------- fitting
def _get_pinning(
    threads_no: int, sibling_sets: Sequence[set[int]], instance_cores: set[int]
) -> list[tuple[int, int]] | None:
    """Pin ``instance_cores`` (sorted) on the first ``threads_no`` threads of each
    sibling set in turn; None if those threads are too few."""
    if threads_no * len(sibling_sets) < len(instance_cores):
        return None
    usable = [sorted(s)[:threads_no] for s in sibling_sets]
    return list(zip(sorted(instance_cores), itertools.chain.from_iterable(usable)))


def _get_reserved(
    sibling_sets: Sequence[set[int]],
    pinning: list[tuple[int, int]] | None,
    num_reserved: int,
    isolate: bool = False,
) -> set[int] | None:
    """The pCPUs set aside for emulator threads: the first free threads left once the
    pinned ones (or, under ``isolate``, their whole cores) are taken; None if none."""
    if not pinning or not num_reserved:
        return None
    usable = [sorted(s) for s in sibling_sets]
    for _, pcpu in pinning:
        for core in usable:
            if pcpu in core:
                if isolate:
                    usable.remove(core)
                else:
                    core.remove(pcpu)
                break
    reserved = set(list(itertools.chain.from_iterable(usable))[:num_reserved])
    return reserved or None


def _pack_instance_onto_cores(
    host_cell: NUMACell, instance_cell: InstanceNUMACell, num_cpu_reserved: int = 0
) -> InstanceNUMACell | None:
    """Choose host pCPUs for the cell's dedicated vCPUs under its thread policy.

    ``require`` only uses cores with at least two free siblings; ``isolate`` takes one
    thread per fully free core (and the whole core is consumed); ``prefer`` (the default)
    tries the cores with the most free siblings first and falls back to any free threads.
    Emulator threads need ``num_cpu_reserved`` further free pCPUs. As in Nova, a cell
    with no dedicated vCPU to pin (a mixed guest's shared-only cell) fits with an empty
    pinning: only no pinning at all (None) fails.
    """
    threads_per_core = max((len(s) for s in host_cell.siblings), default=1) or 1
    # sibling_sets[k]: the sibling sets with at least k free threads, in host order.
    sibling_sets: dict[int, list[set[int]]] = {}
    for sib in host_cell.free_siblings:
        for k in range(1, len(sib) + 1):
            sibling_sets.setdefault(k, []).append(sib)
    wanted = instance_cell.pcpuset
    policy = instance_cell.cpu_thread_policy
    pinning: list[tuple[int, int]] | None = None
    reserved: set[int] | None = None

    if policy == ISOLATE:
        if threads_per_core not in sibling_sets:
            return None  # no fully free core to emulate a non-SMT host with
        if threads_per_core != 1 and host_cell.pcpuset != host_cell.cpuset:
            # Nova refuses isolate on an SMT host configured with cpu_dedicated_set: only
            # the legacy vcpu_pin_set layout (cpuset == pcpuset) may reserve siblings.
            return None
        pinning = _get_pinning(1, sibling_sets[threads_per_core], wanted)
        reserved = _get_reserved(sibling_sets.get(1, []), pinning, num_cpu_reserved, isolate=True)
    else:
        if policy == REQUIRE and threads_per_core <= 1:
            return None
        for threads_no in sorted(sibling_sets, reverse=True):
            if policy == REQUIRE and threads_no <= 1:
                continue
            pinning = _get_pinning(threads_no, sibling_sets[threads_no], wanted)
            reserved = _get_reserved(sibling_sets.get(1, []), pinning, num_cpu_reserved)
            if pinning is None or (num_cpu_reserved and not reserved):
                continue
            break
        if policy != REQUIRE and not pinning:
            singles = [{cpu} for sib in sibling_sets.get(1, []) for cpu in sorted(sib)]
            pinning = _get_pinning(1, singles, wanted)
            reserved = _get_reserved(singles, pinning, num_cpu_reserved)
    if pinning is None or (num_cpu_reserved and not reserved):
        return None
    fitted = instance_cell.copy()
    fitted.cpu_pinning = dict(pinning)
    fitted.cpuset_reserved = reserved
    fitted.id = host_cell.id
    return fitted


def _pagesize_request_fits(host_cell: NUMACell, request: int, memory_mb: int) -> int | None:
    """The page size (KiB) that serves a page size request on this cell, or None.

    ``request`` is ``small`` (the smallest size the cell lists), ``large`` (the others,
    biggest first), ``any`` (all of them, biggest first) or an explicit size in KiB. A
    size serves when the guest cell's memory fits in its free pages and is a whole number
    of them.
    """
    sizes = sorted((p.size_kb for p in host_cell.mempages), reverse=True)
    if request == MEMPAGES_SMALL:
        candidates = sizes[-1:]
    elif request == MEMPAGES_LARGE:
        candidates = sizes[:-1]
    elif request == MEMPAGES_ANY:
        candidates = sizes
    else:
        candidates = [request]
    memory_kb = memory_mb * 1024
    for size in candidates:
        if host_cell.can_fit_pagesize(size, memory_kb):
            return size
    return None


class _CellFit(NamedTuple):
    """What :func:`_fit_cell` found: the fitted cell or None, and the cell as CPU
    packing left it, which Nova writes into the guest cell even when a later check of
    the same fit fails (None when no packing ran or it found no pCPUs)."""

    fitted: InstanceNUMACell | None
    packed: InstanceNUMACell | None = None


def _fit_cell(
    host_cell: NUMACell,
    instance_cell: InstanceNUMACell,
    pagesize: int | None,
    limits: NUMATopologyLimits | None,
    cpuset_reserved: int = 0,
) -> _CellFit:
    """Nova's ``_numa_fit_instance_cell``: the fitted copy of the cell, or None.

    ``pagesize`` is the page size (KiB) that :func:`_pagesize_request_fits` found for
    the guest cell's request on this host cell, or None when the guest asks for none
    (``instance_cell.pagesize`` is not read). With a page size, its free pages were the
    whole memory check: ``avail_memory`` is not read. Without one, the smallest pages
    must hold the memory (their free pages for pinned guests, all of them otherwise), or,
    on a cell listing no pages, the free memory (pinned) or the cell's memory (shared).
    The CPU and RAM allocation ratio limits apply to shared and mixed guests only.
    """
    pinned = instance_cell.cpu_policy in PINNING_POLICIES
    if pagesize is None:
        if host_cell.mempages:
            # Overcommit is allowed on small pages, except for pinned guests.
            smallest = min(p.size_kb for p in host_cell.mempages)
            if not host_cell.can_fit_pagesize(smallest, instance_cell.memory * 1024, use_free=pinned):
                return _CellFit(None)
        elif pinned:
            if host_cell.avail_memory < instance_cell.memory:
                return _CellFit(None)
        elif host_cell.memory < instance_cell.memory:
            # A shared instance may not overcommit against itself on one cell.
            return _CellFit(None)

    if pinned and len(instance_cell.pcpuset) + cpuset_reserved > len(host_cell.pcpuset):
        return _CellFit(None)
    if instance_cell.cpu_policy in (SHARED, MIXED, None) and len(instance_cell.cpuset) > len(host_cell.cpuset):
        return _CellFit(None)

    fitted: InstanceNUMACell | None = instance_cell
    packed: InstanceNUMACell | None = None
    if pinned:
        if len(instance_cell.pcpuset) + cpuset_reserved > host_cell.avail_pcpus:
            return _CellFit(None)
        fitted = _pack_instance_onto_cores(host_cell, instance_cell, cpuset_reserved)
        if fitted is None:
            return _CellFit(None)
        packed = fitted
    if instance_cell.cpu_policy in (SHARED, MIXED, None) and limits is not None:
        if limits.cpu_allocation_ratio is not None:
            cpu_limit = len(host_cell.cpuset) * limits.cpu_allocation_ratio
            if host_cell.cpu_usage + len(instance_cell.cpuset) > cpu_limit:
                return _CellFit(None, packed)
        if limits.ram_allocation_ratio is not None:
            ram_limit = host_cell.memory * limits.ram_allocation_ratio
            if host_cell.memory_usage + instance_cell.memory > ram_limit:
                return _CellFit(None, packed)
    if fitted is instance_cell:
        fitted = instance_cell.copy()
    assert fitted is not None
    fitted.id = host_cell.id
    if pagesize is not None:
        fitted.pagesize = pagesize
    return _CellFit(fitted, packed)


def _network_affinity_ok(
    host: NUMATopology, chosen: Sequence[NUMACell], network_metadata: Any
) -> bool:
    """A required physnet or tunnel with affinity only to cells outside ``chosen`` fails."""
    if not network_metadata:
        return True
    physnets = set(getattr(network_metadata, "physnets", None) or ())
    tunneled = bool(getattr(network_metadata, "tunneled", False))
    if physnets:
        for cell in chosen:
            if cell.network_metadata is not None:
                physnets -= cell.network_metadata.physnets
        for cell in host.cells:
            if cell.network_metadata is not None and physnets & cell.network_metadata.physnets:
                return False
    if tunneled:
        if any(c.network_metadata is not None and c.network_metadata.tunneled for c in chosen):
            return True
        if any(c.network_metadata is not None and c.network_metadata.tunneled for c in host.cells):
            return False
    return True


def pci_count_by_cell(pci_stats: PciDeviceStats) -> dict[Any, int]:
    """Free PCI devices per NUMA node id (the cell-ordering key)."""
    totals: dict[Any, int] = {}
    for pool in pci_stats.pools:
        node = pool.get("numa_node")
        totals[node] = totals.get(node, 0) + int(pool.get("count", 0))
    return totals


def order_host_cells(
    host: NUMATopology,
    instance: InstanceNUMATopology,
    pci_requests: Sequence[InstancePCIRequest] | None,
    pci_stats: PciDeviceStats | None,
    pack: bool = False,
) -> list[NUMACell]:
    """Host cells in the order permutations are tried (reference §3.18).

    Three stable sorts, so the last key (PCI devices per cell) is the primary order:
    free memory (descending unless packing); then shared CPU usage (ascending unless
    packing) or free pCPUs for pinned instances (descending unless packing); then PCI
    devices per cell when ``pci_stats`` is given (descending if PCI is requested).
    Cells keep host order when the instance uses as many cells as the host has.
    """
    cells = list(host.cells)
    if len(cells) <= len(instance.cells):
        return cells
    cells.sort(key=lambda c: c.avail_memory, reverse=not pack)
    if instance.cells[0].cpu_policy in (None, SHARED):
        cells.sort(key=lambda c: c.cpu_usage, reverse=pack)
    else:
        cells.sort(key=lambda c: len(c.free_pcpus), reverse=not pack)
    if pci_stats is not None:
        per_cell = pci_count_by_cell(pci_stats)
        cells.sort(key=lambda c: per_cell.get(c.id, 0), reverse=bool(pci_requests))
    return cells


def numa_fit_instance_to_host(
    host: NUMATopology | None,
    instance: InstanceNUMATopology | None,
    limits: NUMATopologyLimits | None = None,
    pci_requests: Sequence[InstancePCIRequest] | None = None,
    pci_stats: PciDeviceStats | None = None,
    provider_mapping: Mapping[str, Sequence[str]] | None = None,
    *,
    pack: bool | None = None,
    guest_cells: list[InstanceNUMACell] | None = None,
) -> InstanceNUMATopology | None:
    """Fit the instance's cells onto host cells; the fitted topology (cell ids are host
    cell ids, with CPU pinning and chosen page sizes) or None.

    Permutations of the ordered host cells (:func:`order_host_cells`) are tried in turn;
    one is accepted when every cell fits, the PCI requests can be served from those
    cells and network NUMA affinity holds. ``pack`` defaults to ``limits.pack``.
    As in Nova, the page size picked for a guest cell that asks for ``small``, ``large``
    or ``any`` is the size asked for in every later permutation, even when the
    permutation that picked it failed (on CPUs, say).

    ``guest_cells`` (from :func:`guest_state`) stands for Nova's request objects when one
    request is fitted several times: it starts as the instance's cells and this call
    writes into it what Nova's fit writes into them, so the next call on the same list
    starts where Nova's would. Without it each call starts from the instance's cells.
    The other arguments are never modified.
    """
    if not host or not instance:
        return None
    if len(host.cells) < len(instance.cells):
        return None
    if pack is None:
        pack = bool(limits.pack) if limits is not None else False
    network_metadata = limits.network_metadata if limits is not None else None
    cells = order_host_cells(host, instance, pci_requests, pci_stats, pack)
    isolate_emulator = instance.emulator_threads_isolated
    # Nova's guest cells are objects its fits write into, and it does not undo what a
    # failed permutation wrote: the page size picked for small, large or any as soon as
    # the cell's pages fit (before its CPUs are checked), so the next permutations ask
    # for that exact size; the pinning, reserved pCPUs and host cell id once CPU packing
    # succeeds (even if a later check of that fit fails); the id again on a fit. `state`
    # is those objects, per call, so the caller's request stays untouched (Nova's
    # filter works on a copy of the request per host).
    # Nova also remembers which (host cell id, guest cell id) pairs fitted and which did
    # not, and skips the fit of a pair it has seen, taking a remembered fit as the guest
    # cell is, unchecked. As the ids change, a pair can be skipped that would fit now,
    # or taken for a guest cell not fitted yet (differential runs against Nova 34 found
    # hosts decided both ways).
    state = guest_cells if guest_cells is not None else guest_state(instance)
    fit_pairs: set[tuple[int, int]] = set()
    misfit_pairs: set[tuple[int, int]] = set()
    for perm in itertools.permutations(cells, len(instance.cells)):
        fitted: list[InstanceNUMACell] = []
        for i, (host_cell, instance_cell) in enumerate(zip(perm, instance.cells)):
            guest = state[i]
            pair = (host_cell.id, guest.id)
            if pair in misfit_pairs:
                break
            if pair in fit_pairs:
                guest.id = host_cell.id
                fitted.append(guest.copy())
                continue
            pagesize = None
            if guest.pagesize:
                pagesize = _pagesize_request_fits(host_cell, guest.pagesize, instance_cell.memory)
                if pagesize is None:
                    misfit_pairs.add(pair)
                    break
                guest.pagesize = pagesize
            # Emulator threads get their pCPU on the host cell of guest cell 0.
            reserved = 1 if isolate_emulator and not fitted else 0
            found = _fit_cell(host_cell, instance_cell, pagesize, limits, reserved)
            if found.packed is not None:
                guest.cpu_pinning = dict(found.packed.cpu_pinning)
                guest.cpuset_reserved = found.packed.cpuset_reserved
                guest.id = host_cell.id
            if found.fitted is None:
                misfit_pairs.add(pair)
                break
            guest.id = host_cell.id
            fit_pairs.add(pair)
            fitted.append(guest.copy())
        if len(fitted) != len(instance.cells):
            continue
        # A host without PCI pools serves no PCI request (Nova's host state always holds
        # a PciDeviceStats, empty then).
        if pci_requests and (pci_stats is None or not pci_stats.support_requests(
            pci_requests, provider_mapping, fitted, host_numa=host
        )):
            continue
        if network_metadata and not _network_affinity_ok(host, perm, network_metadata):
            continue
        return InstanceNUMATopology(fitted, instance.emulator_threads_policy)
    return None


def guest_state(instance: InstanceNUMATopology) -> list[InstanceNUMACell]:
    """Fresh guest-cell state for :func:`numa_fit_instance_to_host`: copies of the
    instance's cells, which fits write their ids, page sizes and pinning into."""
    return [c.copy() for c in instance.cells]


# -------------------------------------------------------------------------- consumption
def _pin(cell: NUMACell, cpus: set[int], with_siblings: bool) -> frozenset[int]:
    if with_siblings:
        whole = set(cpus)
        for sib in cell.siblings:
            if sib & cpus:
                whole |= sib
        cpus = whole
    unknown = cpus - cell.pcpuset
    if unknown:
        raise NUMAUsageError(f"cannot pin CPUs {format_cpu_spec(unknown)} on cell {cell.id}: "
                             f"not dedicated CPUs ({format_cpu_spec(cell.pcpuset) or 'none'})")
    taken = cpus & cell.pinned_cpus
    if taken:
        raise NUMAUsageError(f"cannot pin CPUs {format_cpu_spec(taken)} on cell {cell.id}: "
                             "already pinned")
    return cell.pinned_cpus | cpus


def _pages_after(cell: NUMACell, instance_cell: InstanceNUMACell) -> tuple[NUMAPagesTopology, ...]:
    """Mempages after the guest cell's memory is taken from its page size (the chosen one,
    or the smallest when none was asked for)."""
    if not cell.mempages:
        return cell.mempages
    size = instance_cell.pagesize
    if not size or size < 0:
        size = min(p.size_kb for p in cell.mempages)
    pages = []
    for p in cell.mempages:
        if p.size_kb == size:
            used = max(0, p.used + (instance_cell.memory * 1024) // p.size_kb)
            p = dataclasses.replace(p, used=used)
        pages.append(p)
    return tuple(pages)


def numa_usage_from_instance_numa(
    host: NUMATopology, instance: InstanceNUMATopology | None
) -> NUMATopology:
    """The host topology with a fitted instance added: memory and shared CPU usage grow,
    huge pages of the chosen size are used, dedicated vCPUs' pCPUs (and the emulator
    pCPU) are pinned; ``isolate`` pins whole cores.

    Raises :class:`NUMAUsageError` if a pCPU is unknown or already pinned.
    """
    if not instance:
        return host
    new_cells = []
    for cell in host.cells:
        memory_usage, cpu_usage, pinned = cell.memory_usage, cell.cpu_usage, cell.pinned_cpus
        mempages = cell.mempages
        for inst_cell in instance.cells:
            if inst_cell.id != cell.id:
                continue
            current = dataclasses.replace(cell, pinned_cpus=pinned, mempages=mempages)
            mempages = _pages_after(current, inst_cell)
            memory_usage += inst_cell.memory
            cpu_usage += len(inst_cell.cpuset)
            if inst_cell.cpu_policy in (None, SHARED):
                continue
            cpus = set(inst_cell.cpu_pinning.values()) | set(inst_cell.cpuset_reserved or ())
            pinned = _pin(current, cpus, inst_cell.cpu_thread_policy == ISOLATE)
        new_cells.append(dataclasses.replace(
            cell, memory_usage=max(0, memory_usage), cpu_usage=max(0, cpu_usage),
            pinned_cpus=pinned, mempages=mempages))
    return NUMATopology(tuple(new_cells))


def consume(
    host_numa: NUMATopology,
    instance_numa: InstanceNUMATopology,
    limits: NUMATopologyLimits | None = None,
    pci_requests: Sequence[InstancePCIRequest] | None = None,
    pci_stats: PciDeviceStats | None = None,
    provider_mapping: Mapping[str, Sequence[str]] | None = None,
) -> tuple[InstanceNUMATopology | None, NUMATopology]:
    """Virtual consumption of a NUMA request on a host (reference §2.3).

    Returns the fitted instance topology (what Nova stores back on the spec) and the
    host topology after the instance is placed. As in Nova, when the request no longer
    fits the instance topology becomes None and the host is unchanged (so later
    instances of a multi-create are no longer NUMA-constrained). ``provider_mapping`` is
    the spec's request-group mapping after the claim, so the PCI check of the fit looks
    at the pools of the providers placement allocated from.
    """
    fitted = numa_fit_instance_to_host(host_numa, instance_numa, limits, pci_requests, pci_stats,
                                       provider_mapping)
    return fitted, numa_usage_from_instance_numa(host_numa, fitted)
