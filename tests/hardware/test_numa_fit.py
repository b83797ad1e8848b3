"""Fitting a guest NUMA topology onto host cells, and consuming it (reference §3.18, §2.3)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from berth.hardware.numa import (
    MEMPAGES_ANY,
    MEMPAGES_LARGE,
    MEMPAGES_SMALL,
    CellNetworkMetadata,
    InstanceNUMACell,
    InstanceNUMATopology,
    NUMACell,
    NUMAPagesTopology,
    NUMATopology,
    NUMATopologyLimits,
    NUMAUsageError,
    consume,
    guest_state,
    numa_fit_instance_to_host,
    numa_usage_from_instance_numa,
    order_host_cells,
    parse_cpu_spec,
)
from berth.hardware.pci import InstancePCIRequest, PciDeviceStats
from berth.model import NetworkMetadata


def cell(cell_id: int = 0, cpus: str = "", pcpus: str = "", memory: int = 4096,
         siblings: list[str] | None = None, pinned: str = "", **fields: Any) -> NUMACell:
    return NUMACell(
        id=cell_id, cpuset=frozenset(parse_cpu_spec(cpus)), pcpuset=frozenset(parse_cpu_spec(pcpus)),
        memory=memory, siblings=tuple(frozenset(parse_cpu_spec(s)) for s in siblings or []),
        pinned_cpus=frozenset(parse_cpu_spec(pinned)), **fields)


def topo(*cells: NUMACell) -> NUMATopology:
    return NUMATopology(tuple(cells))


def guest(*cells: InstanceNUMACell, emulator: str | None = None) -> InstanceNUMATopology:
    return InstanceNUMATopology(list(cells), emulator)


def shared(cpus: int = 2, memory: int = 1024, cell_id: int = 0, start: int = 0, **kw: Any) -> InstanceNUMACell:
    return InstanceNUMACell(cell_id, cpuset=set(range(start, start + cpus)), memory=memory, **kw)


def dedicated(cpus: int = 2, memory: int = 1024, thread: str | None = None, cell_id: int = 0,
              start: int = 0, **kw: Any) -> InstanceNUMACell:
    return InstanceNUMACell(cell_id, pcpuset=set(range(start, start + cpus)), memory=memory,
                            cpu_policy="dedicated", cpu_thread_policy=thread, **kw)


SMT = cell(0, cpus="0-3", pcpus="4-7", siblings=["4,5", "6,7"])
NO_SMT = cell(0, cpus="0-3", pcpus="4-7")
LIMITS = NUMATopologyLimits(cpu_allocation_ratio=16.0, ram_allocation_ratio=1.5)


def pinning(host: NUMATopology, inst: InstanceNUMATopology) -> dict[int, int] | None:
    fitted = numa_fit_instance_to_host(host, inst, LIMITS)
    return None if fitted is None else fitted.cells[0].cpu_pinning


# ------------------------------------------------------------------------ pinning
def test_prefer_packs_vcpus_onto_sibling_threads_of_one_core() -> None:
    assert pinning(topo(SMT), guest(dedicated(2))) == {0: 4, 1: 5}


def test_prefer_uses_the_cores_with_most_free_siblings_first() -> None:
    # 4 is pinned: free siblings are {5} and {6, 7}; two vCPUs take the whole free core.
    host = topo(cell(0, cpus="0-3", pcpus="4-7", siblings=["4,5", "6,7"], pinned="4"))
    assert pinning(host, guest(dedicated(2))) == {0: 6, 1: 7}


def test_prefer_falls_back_to_any_free_threads() -> None:
    host = topo(cell(0, cpus="0-3", pcpus="4-7", siblings=["4,5", "6,7"], pinned="4"))
    assert pinning(host, guest(dedicated(3))) == {0: 5, 1: 6, 2: 7}


def test_require_needs_smt_on_the_host() -> None:
    assert pinning(topo(NO_SMT), guest(dedicated(2, thread="require"))) is None
    assert pinning(topo(SMT), guest(dedicated(2, thread="require"))) == {0: 4, 1: 5}


def test_require_will_not_settle_for_lone_threads() -> None:
    # Only lone threads (5 and 7) are free: prefer would take them, require may not.
    host = topo(cell(0, cpus="0-3", pcpus="4-7", siblings=["4,5", "6,7"], pinned="4,6"))
    assert pinning(host, guest(dedicated(2, thread="require"))) is None
    assert pinning(host, guest(dedicated(2, thread="prefer"))) == {0: 5, 1: 7}


def test_isolate_takes_one_thread_per_fully_free_core_and_consumes_the_core() -> None:
    # The legacy layout (cpuset == pcpuset) is the one where isolate may reserve siblings.
    host = topo(cell(0, cpus="0-7", pcpus="0-7", siblings=["0,1", "2,3", "4,5", "6,7"], pinned="0"))
    inst = guest(dedicated(2, thread="isolate"))
    fitted = numa_fit_instance_to_host(host, inst, LIMITS)
    assert fitted is not None and fitted.cells[0].cpu_pinning == {0: 2, 1: 4}
    after = numa_usage_from_instance_numa(host, fitted)
    assert after.cells[0].pinned_cpus == {0, 2, 3, 4, 5}


def test_isolate_on_a_host_without_smt_pins_plain_cpus() -> None:
    assert pinning(topo(NO_SMT), guest(dedicated(2, thread="isolate"))) == {0: 4, 1: 5}


def test_isolate_fails_on_an_smt_host_with_separate_dedicated_cpus() -> None:
    # Nova refuses this layout (bug 1889633): placement should have filtered it out.
    assert pinning(topo(SMT), guest(dedicated(2, thread="isolate"))) is None


def test_pinning_needs_enough_free_dedicated_cpus() -> None:
    assert pinning(topo(SMT), guest(dedicated(5))) is None
    host = topo(cell(0, cpus="0-3", pcpus="4-7", siblings=["4,5", "6,7"], pinned="4-6"))
    assert pinning(host, guest(dedicated(2))) is None


def test_pinned_instances_may_not_overcommit_memory() -> None:
    host = topo(cell(0, cpus="0-3", pcpus="4-7", memory=4096, memory_usage=3584))
    assert pinning(host, guest(dedicated(1, memory=1024))) is None
    assert pinning(host, guest(dedicated(1, memory=512))) == {0: 4}


def test_emulator_threads_isolate_reserves_one_more_pcpu_on_the_first_cell() -> None:
    host = topo(SMT)
    assert numa_fit_instance_to_host(host, guest(dedicated(4), emulator="isolate"), LIMITS) is None
    fitted = numa_fit_instance_to_host(host, guest(dedicated(3), emulator="isolate"), LIMITS)
    assert fitted is not None
    assert fitted.cells[0].cpu_pinning == {0: 4, 1: 5, 2: 6}
    assert fitted.cells[0].cpuset_reserved == {7}
    assert numa_usage_from_instance_numa(host, fitted).cells[0].pinned_cpus == {4, 5, 6, 7}


def test_mixed_cells_pin_the_dedicated_part_and_count_the_shared_part() -> None:
    inst = guest(InstanceNUMACell(0, cpuset={0, 1}, pcpuset={2, 3}, memory=1024, cpu_policy="mixed"))
    fitted = numa_fit_instance_to_host(topo(SMT), inst, LIMITS)
    assert fitted is not None and fitted.cells[0].cpu_pinning == {2: 4, 3: 5}
    after = numa_usage_from_instance_numa(topo(SMT), fitted).cells[0]
    assert (after.cpu_usage, after.pinned_cpus, after.memory_usage) == (2, {4, 5}, 1024)


# ------------------------------------------------------------------------ shared CPUs and limits
@pytest.mark.parametrize(
    ("cpu_usage", "cpus", "ratio", "fits"),
    [(6, 2, 2.0, True), (6, 3, 2.0, False), (0, 4, 1.0, True), (0, 5, 16.0, False)],
    ids=["usage plus request exactly at cpus times ratio fits",
         "one vCPU over cpus times ratio fails",
         "a full cell without oversubscription fits",
         "more vCPUs than the cell has never fit, whatever the ratio"],
)
def test_shared_cpu_oversubscription(cpu_usage: int, cpus: int, ratio: float, fits: bool) -> None:
    host = topo(cell(0, cpus="0-3", cpu_usage=cpu_usage))
    limits = NUMATopologyLimits(cpu_allocation_ratio=ratio, ram_allocation_ratio=1.0)
    assert (numa_fit_instance_to_host(host, guest(shared(cpus, memory=512)), limits) is not None) is fits


@pytest.mark.parametrize(
    ("usage", "memory", "ratio", "fits"),
    [(4000, 512, 1.0, False), (4000, 512, 1.5, True), (0, 5000, 2.0, False), (0, 4096, 1.0, True)],
    ids=["used memory plus request over memory times ratio fails",
         "a higher ram ratio lets it fit",
         "an instance may not overcommit against itself on one cell",
         "exactly the cell's memory fits"],
)
def test_shared_memory_oversubscription(usage: int, memory: int, ratio: float, fits: bool) -> None:
    host = topo(cell(0, cpus="0-3", memory=4096, memory_usage=usage))
    limits = NUMATopologyLimits(cpu_allocation_ratio=16.0, ram_allocation_ratio=ratio)
    assert (numa_fit_instance_to_host(host, guest(shared(1, memory=memory)), limits) is not None) is fits


def test_without_limits_shared_usage_is_not_checked() -> None:
    host = topo(cell(0, cpus="0-3", memory=4096, memory_usage=4096, cpu_usage=40))
    assert numa_fit_instance_to_host(host, guest(shared(4, memory=4096))) is not None


def test_fewer_host_cells_than_guest_cells_never_fit() -> None:
    inst = guest(shared(1, cell_id=0), shared(1, cell_id=1, start=1))
    assert numa_fit_instance_to_host(topo(cell(0, cpus="0-3")), inst, LIMITS) is None


def test_guest_cells_get_host_cell_ids_and_the_request_is_untouched() -> None:
    host = topo(cell(0, cpus="0-3", memory=512), cell(1, cpus="4-7", memory=4096))
    inst = guest(shared(2, memory=1024))
    fitted = numa_fit_instance_to_host(host, inst, LIMITS)
    assert fitted is not None and fitted.cells[0].id == 1
    assert inst.cells[0].id == 0 and inst.cells[0].cpu_pinning == {}


def test_permutations_skip_a_full_cell() -> None:
    host = topo(cell(0, cpus="0-1", memory=1024, memory_usage=1024),
                cell(1, cpus="2-3", memory=2048), cell(2, cpus="4-5", memory=2048))
    inst = guest(shared(1, memory=1024), shared(1, memory=1024, cell_id=1, start=1))
    fitted = numa_fit_instance_to_host(host, inst, NUMATopologyLimits(16.0, 1.0))
    assert fitted is not None and sorted(c.id for c in fitted.cells) == [1, 2]


# ------------------------------------------------------------------------ cell ordering
def test_spread_prefers_the_cell_with_most_free_memory_and_pack_the_least() -> None:
    host = topo(cell(0, cpus="0-3", memory=4096, memory_usage=1024),
                cell(1, cpus="4-7", memory=4096))
    inst = guest(shared(1, memory=512))
    spread = numa_fit_instance_to_host(host, inst, LIMITS)
    packed = numa_fit_instance_to_host(host, inst, LIMITS, pack=True)
    assert spread is not None and spread.cells[0].id == 1
    assert packed is not None and packed.cells[0].id == 0


def test_pack_travels_in_the_limits_to_consumption() -> None:
    host = topo(cell(0, cpus="0-3", memory=4096, memory_usage=1024), cell(1, cpus="4-7"))
    fitted, _ = consume(host, guest(shared(1, memory=512)),
                        NUMATopologyLimits(16.0, 1.5, pack=True))
    assert fitted is not None and fitted.cells[0].id == 0


def test_consumption_fits_the_guest_on_the_cell_of_the_provider_placement_chose() -> None:
    # Cell 0 has more free memory (spread picks it first), but the claim took the device
    # from rp1, on cell 1: the fit follows the claimed provider (§2.3 provider_mapping).
    host = topo(cell(0, cpus="0-3", memory=4096), cell(1, cpus="4-7", memory=4096, memory_usage=1024))
    stats = PciDeviceStats.from_pools([
        {"vendor_id": "8086", "product_id": "1520", "numa_node": n, "count": 1, "rp_uuid": f"rp{n}"}
        for n in (0, 1)])
    request = [InstancePCIRequest(1, [{"vendor_id": "8086"}], request_id="nic")]
    unmapped, _ = consume(host, guest(shared(1)), LIMITS, request, stats)
    assert unmapped is not None and unmapped.cells[0].id == 0
    fitted, _ = consume(host, guest(shared(1)), LIMITS, request, stats,
                        provider_mapping={"nic-0": ["rp1"]})
    assert fitted is not None and fitted.cells[0].id == 1


def test_cpu_usage_is_sorted_after_memory_so_it_wins_ties_only_as_a_later_key() -> None:
    # Stable sorts: the later key (cpu usage) is the primary order.
    host = topo(cell(0, cpus="0-3", memory=4096, cpu_usage=3),
                cell(1, cpus="4-7", memory=4096, memory_usage=2048, cpu_usage=0))
    order = order_host_cells(host, guest(shared(1)), None, None)
    assert [c.id for c in order] == [1, 0]


def test_pinned_instances_order_cells_by_free_pcpus() -> None:
    host = topo(cell(0, pcpus="0-3", pinned="0-2"), cell(1, pcpus="4-7"))
    assert [c.id for c in order_host_cells(host, guest(dedicated(1)), None, None)] == [1, 0]
    assert [c.id for c in order_host_cells(host, guest(dedicated(1)), None, None, pack=True)] == [0, 1]


def test_pci_device_count_is_the_primary_cell_order() -> None:
    host = topo(cell(0, cpus="0-3", memory=4096, memory_usage=2048), cell(1, cpus="4-7", memory=4096))
    stats = PciDeviceStats.from_pools([{"vendor_id": "8086", "product_id": "1520", "numa_node": 0, "count": 4}])
    request = [InstancePCIRequest(1, [{"vendor_id": "8086"}])]
    assert [c.id for c in order_host_cells(host, guest(shared(1)), request, stats)] == [0, 1]
    # Without PCI requested, the cells with devices go last.
    assert [c.id for c in order_host_cells(host, guest(shared(1)), None, stats)] == [1, 0]
    # Without pci_stats the memory order stands.
    assert [c.id for c in order_host_cells(host, guest(shared(1)), request, None)] == [1, 0]


def test_cells_keep_host_order_when_the_guest_uses_them_all() -> None:
    host = topo(cell(0, cpus="0-3", memory_usage=2048), cell(1, cpus="4-7"))
    inst = guest(shared(1), shared(1, cell_id=1, start=1))
    assert [c.id for c in order_host_cells(host, inst, None, None)] == [0, 1]


# ------------------------------------------------------------------------ page sizes
PAGED = cell(0, cpus="0-3", pcpus="4-7", memory=4096, mempages=(
    NUMAPagesTopology(4, 1048576 // 4 * 2),           # 2 GiB of small pages
    NUMAPagesTopology(2048, 1024, used=512),            # 1 GiB of 2 MiB pages free
    NUMAPagesTopology(1048576, 2, used=0, reserved=1),  # one free 1 GiB page
))


@pytest.mark.parametrize(
    ("pagesize", "memory", "chosen"),
    [(MEMPAGES_LARGE, 1024, 1048576), (MEMPAGES_LARGE, 1536, None), (2048, 1024, 2048),
     (2048, 1025, None), (MEMPAGES_SMALL, 2048, 4), (512, 1024, None), (-3, 1024, 1048576)],
    ids=["large takes the biggest huge pages that fit",
         "large fails when no huge page size has room",
         "an explicit size uses exactly that size",
         "memory must be a multiple of the page size",
         "small uses the smallest pages",
         "a size the host does not have fails",
         "any tries the biggest pages first"],
)
def test_requested_page_sizes(pagesize: int, memory: int, chosen: int | None) -> None:
    inst = guest(shared(1, memory=memory, pagesize=pagesize))
    fitted = numa_fit_instance_to_host(topo(PAGED), inst, NUMATopologyLimits(16.0, 1.0))
    assert (fitted.cells[0].pagesize if fitted else None) == chosen


def test_consuming_huge_pages_marks_them_used() -> None:
    fitted = numa_fit_instance_to_host(topo(PAGED), guest(shared(1, memory=512, pagesize=2048)), LIMITS)
    assert fitted is not None
    after = numa_usage_from_instance_numa(topo(PAGED), fitted)
    assert [p.used for p in after.cells[0].mempages] == [0, 768, 0]


def test_without_a_page_size_shared_guests_check_total_and_pinned_guests_free_small_pages() -> None:
    full = cell(0, cpus="0-3", pcpus="4-7", memory=4096,
                mempages=(NUMAPagesTopology(4, 262144, used=262144),))
    assert numa_fit_instance_to_host(topo(full), guest(shared(1, memory=512))) is not None
    assert numa_fit_instance_to_host(topo(full), guest(dedicated(1, memory=512))) is None


# ------------------------------------------------------------------------ page sizes as Nova 34 decides
# Nova's rules (_numa_fit_instance_cell), quoted in the comments below:
#   [page]   with a page size asked for, only the free pages of that size count:
#            memory_kib <= free_kib and memory_kib % size_kb == 0 (avail_memory is not read);
#   [small]  without one, the smallest page size must fit: its free pages for dedicated and
#            mixed guests, all of its pages for shared ones;
#   [ratio]  memory_usage + mem <= memory * ram_allocation_ratio, for shared and mixed guests
#            only, never dedicated ones;
#   [cpus]   dedicated vCPUs need free pCPUs; shared vCPUs need len(cpuset) host CPUs.
# The issue's host cell: 1792 MB of memory_usage left, every 4 KiB page used, 8 GiB of
# free 2 MiB pages, three free pCPUs (35-37).
MB = 1024  # KiB per MB


def issue_cell(**changes: Any) -> NUMACell:
    fields: dict[str, Any] = dict(
        cpus="24-33", pcpus="34-37", memory=16384, memory_usage=14592, pinned="34",
        siblings=["34", "35", "36", "37"],
        mempages=(NUMAPagesTopology(4, 2097152, used=2097152), NUMAPagesTopology(2048, 4096)))
    fields.update(changes)
    return cell(2, **fields)


def mixed(memory: int, **kw: Any) -> InstanceNUMACell:
    """Two vCPUs: vCPU 0 shared, vCPU 1 pinned."""
    return InstanceNUMACell(0, cpuset={0}, pcpuset={1}, memory=memory, cpu_policy="mixed", **kw)


NO_OVERCOMMIT = NUMATopologyLimits(cpu_allocation_ratio=16.0, ram_allocation_ratio=1.0)


@pytest.mark.parametrize(
    ("guest_cell", "host_cell", "limits", "placed"),
    [
        # Nova: fits. [page] large = every size but the smallest = 2048 KiB; 2048 MB =
        # 2097152 KiB <= 4096 * 2048 KiB free, a multiple of 2048. avail_memory (1792 MB) is
        # not read, and [ratio] (14592 + 2048 > 16384 * 1.0) does not apply to dedicated.
        (dedicated(1, memory=2048, pagesize=MEMPAGES_LARGE), issue_cell(), NO_OVERCOMMIT, (2, 2048)),
        # Nova: fits. [page] 3072 MB = 3145728 KiB <= 8388608 KiB free.
        (dedicated(1, memory=3072, pagesize=MEMPAGES_LARGE), issue_cell(), NO_OVERCOMMIT, (2, 2048)),
        # Nova: fits. [page] hw:mem_page_size=2048 is 2048 KiB, checked exactly as large was.
        (dedicated(1, memory=3072, pagesize=2048), issue_cell(), NO_OVERCOMMIT, (2, 2048)),
        # Nova: fits. [page] no limits given: still only the 2 MiB pages count.
        (dedicated(1, memory=2048, pagesize=MEMPAGES_LARGE), issue_cell(), None, (2, 2048)),
        # Nova: rejected. [page] small = 4 KiB pages; 0 KiB of them free.
        (dedicated(1, memory=2048, pagesize=MEMPAGES_SMALL), issue_cell(), NO_OVERCOMMIT, None),
        # Nova: rejected. [small] no page size: the free 4 KiB pages count for pinned guests.
        (dedicated(1, memory=2048), issue_cell(), NO_OVERCOMMIT, None),
        # Nova: rejected. [page] 1000 free 2 MiB pages = 2048000 KiB < 2097152 KiB.
        (dedicated(1, memory=2048, pagesize=MEMPAGES_LARGE),
         issue_cell(mempages=(NUMAPagesTopology(4, 2097152, used=2097152),
                              NUMAPagesTopology(2048, 4096, used=3096))), NO_OVERCOMMIT, None),
        # Nova: rejected. [page] 1025 MB = 1049600 KiB is not a whole number of 2 MiB pages.
        (dedicated(1, memory=1025, pagesize=2048), issue_cell(), NO_OVERCOMMIT, None),
        # Nova: rejected. [page] a 1 GiB size listed with no page (as libvirt reports it).
        (dedicated(1, memory=2048, pagesize=1048576),
         issue_cell(mempages=(NUMAPagesTopology(4, 2097152, used=2097152),
                              NUMAPagesTopology(2048, 4096), NUMAPagesTopology(1048576, 0))),
         NO_OVERCOMMIT, None),
        # Nova: rejected. [page] fits, but [cpus]: 35-37 pinned too, no free pCPU.
        (dedicated(1, memory=2048, pagesize=MEMPAGES_LARGE), issue_cell(pinned="34-37"),
         NO_OVERCOMMIT, None),
        # Nova: rejected. [page] fits, but mixed guests are held to [ratio]:
        # 14592 + 2048 = 16640 > 16384 * 1.0.
        (mixed(2048, pagesize=MEMPAGES_LARGE), issue_cell(), NO_OVERCOMMIT, None),
        # Nova: fits. [ratio] 16640 <= 16384 * 1.5 = 24576.
        (mixed(2048, pagesize=MEMPAGES_LARGE), issue_cell(), LIMITS, (2, 2048)),
        # Nova: rejected. Shared guests are held to [ratio] as well: 16640 > 16384.
        (shared(1, memory=2048, pagesize=MEMPAGES_LARGE), issue_cell(), NO_OVERCOMMIT, None),
        # Nova: fits. [small] a shared guest without a page size counts all 4 KiB pages
        # (8 GiB), used or not, and [ratio] 14592 + 1024 <= 16384 * 1.5.
        (shared(1, memory=1024), issue_cell(), LIMITS, (2, None)),
    ],
    ids=[
        "dedicated large fits in free 2 MiB pages though memory_usage leaves less",
        "dedicated large with 3072 MB fits the same way",
        "an explicit 2048 KiB size fits the same way",
        "without limits the huge pages alone decide",
        "dedicated small fails: every 4 KiB page is used",
        "dedicated without a page size fails on the used 4 KiB pages",
        "dedicated large fails when too few 2 MiB pages are free",
        "memory that is not a whole number of pages fails",
        "an explicit 1 GiB size fails when the cell has no 1 GiB page",
        "dedicated large fails without a free pCPU",
        "mixed large is held to the RAM allocation ratio",
        "mixed large fits under a higher RAM allocation ratio",
        "shared large is held to the RAM allocation ratio",
        "shared without a page size checks total small pages",
    ],
)
def test_page_sizes_decide_memory_as_nova_does(
    guest_cell: InstanceNUMACell, host_cell: NUMACell, limits: NUMATopologyLimits | None,
    placed: tuple[int, int | None] | None,
) -> None:
    """``placed``: (host cell id, page size chosen) of the fitted guest cell, or None."""
    fitted = numa_fit_instance_to_host(topo(host_cell), guest(guest_cell), limits)
    assert (None if fitted is None else (fitted.cells[0].id, fitted.cells[0].pagesize)) == placed


def test_a_huge_page_guest_on_the_issue_cell_is_consumed_from_its_2_mib_pages() -> None:
    fitted, after = consume(topo(issue_cell()), guest(dedicated(1, memory=2048, pagesize=MEMPAGES_LARGE)),
                            NO_OVERCOMMIT)
    assert fitted is not None and fitted.cells[0].cpu_pinning == {0: 35}
    used = after.cells[0]
    # 2048 MB / 2 MiB = 1024 pages; memory_usage grows past memory, as in Nova.
    assert [p.used for p in used.mempages] == [2097152, 1024]
    assert used.memory_usage == 14592 + 2048 and used.pinned_cpus == {34, 35}


def test_a_cell_with_empty_siblings_pins_as_one_thread_per_core() -> None:
    # Deliberate deviation: Nova raises ValueError here (max() of the empty siblings list
    # in _pack_instance_onto_cores); Berth counts every dedicated CPU as its own core.
    host = topo(issue_cell(siblings=[]))
    assert pinning(host, guest(dedicated(2, memory=2048, pagesize=MEMPAGES_LARGE))) == {0: 35, 1: 36}


# Two host cells for "any": cell 0 is tried first (equal free memory, lower cpu_usage) and
# has a free 1 GiB page but one CPU; cell 1 has the CPUs but only 2 MiB pages free (its
# 1 GiB size is listed with no page, as libvirt reports it).
ONE_CPU_WITH_1G = cell(0, cpus="0", memory=4096, mempages=(
    NUMAPagesTopology(4, 524288), NUMAPagesTopology(2048, 512), NUMAPagesTopology(1048576, 1)))
CPUS_WITH_2M = cell(1, cpus="1-4", memory=4096, cpu_usage=1, mempages=(
    NUMAPagesTopology(4, 524288), NUMAPagesTopology(2048, 512), NUMAPagesTopology(1048576, 0)))


@pytest.mark.parametrize(
    ("host", "pagesize", "fits_on"),
    [
        # Nova: rejected. Permutation (cell 0): any tries 1 GiB first, 1048576 KiB fit in
        # the free 1 GiB page, so the request's page size becomes 1048576; then [cpus]
        # 2 vCPUs > 1 CPU fails. Permutation (cell 1): asks for 1048576 KiB, 0 free.
        (topo(ONE_CPU_WITH_1G, CPUS_WITH_2M), MEMPAGES_ANY, None),
        # Nova: rejected. large picks 1 GiB on cell 0 the same way and keeps it.
        (topo(ONE_CPU_WITH_1G, CPUS_WITH_2M), MEMPAGES_LARGE, None),
        # Nova: fits on cell 1. An explicit 2048 KiB never changes.
        (topo(ONE_CPU_WITH_1G, CPUS_WITH_2M), 2048, 1),
        # Nova: fits on cell 1. small picks 4 KiB on cell 0, which cell 1 has too.
        (topo(ONE_CPU_WITH_1G, CPUS_WITH_2M), MEMPAGES_SMALL, 1),
        # Nova: fits on cell 1. With cell 0's 1 GiB page used, any picks 2 MiB there, and
        # 2 MiB pages are free on cell 1.
        (topo(dataclasses.replace(ONE_CPU_WITH_1G, mempages=(
            NUMAPagesTopology(4, 524288), NUMAPagesTopology(2048, 512),
            NUMAPagesTopology(1048576, 1, used=1))), CPUS_WITH_2M), MEMPAGES_ANY, 1),
        # Nova: fits on cell 1. Alone, cell 1 gets a fresh choice: 1 GiB none free, 2 MiB fits.
        (topo(CPUS_WITH_2M), MEMPAGES_ANY, 1),
        # Nova: fits on cell 1. Cell 0 has no free page of any size: its page check fails
        # before a size is picked, nothing is written, and cell 1 gets a fresh choice.
        (topo(dataclasses.replace(ONE_CPU_WITH_1G, mempages=(
            NUMAPagesTopology(4, 524288, used=524288), NUMAPagesTopology(2048, 512, used=512),
            NUMAPagesTopology(1048576, 1, used=1))), CPUS_WITH_2M), MEMPAGES_ANY, 1),
    ],
    ids=[
        "any keeps the 1 GiB size picked on a cell that failed on CPUs, and fails",
        "large keeps the 1 GiB size picked on a cell that failed on CPUs, and fails",
        "an explicit 2 MiB size fits on the second cell",
        "small keeps 4 KiB, which the second cell has",
        "any picking 2 MiB on the first cell still fits on the second",
        "any on a host of only the second cell fits",
        "a cell failing on its pages writes no size",
    ],
)
def test_a_page_size_picked_in_one_permutation_stays_for_the_next(
    host: NUMATopology, pagesize: int, fits_on: int | None
) -> None:
    inst = guest(shared(2, memory=1024, pagesize=pagesize))
    fitted = numa_fit_instance_to_host(host, inst, LIMITS)
    assert (fitted.cells[0].id if fitted else None) == fits_on
    assert inst.cells[0].pagesize == pagesize  # the caller's request is never changed


def test_a_multi_cell_guest_keeps_the_size_picked_for_each_of_its_cells() -> None:
    # Three host cells, two guest cells of 2 vCPUs and 1024 MB each, any. The order is
    # cell 0, 1, 2 (equal memory, cpu_usage 0, 1, 2). Permutation (0, 1): guest cell 0
    # picks 1 GiB on cell 0, then fails [cpus]. (0, 2) fails the same way. (1, 0), (1, 2),
    # (2, 0), (2, 1): guest cell 0 now asks for 1 GiB, and cells 1 and 2 have none free.
    # Nova: rejected, though (1, 2) with 2 MiB pages would fit.
    cells = [ONE_CPU_WITH_1G, CPUS_WITH_2M,
             dataclasses.replace(CPUS_WITH_2M, id=2, cpuset=frozenset(range(5, 9)), cpu_usage=2)]
    inst = guest(shared(2, memory=1024, pagesize=MEMPAGES_ANY),
                 shared(2, memory=1024, pagesize=MEMPAGES_ANY, cell_id=1, start=2))
    assert numa_fit_instance_to_host(topo(*cells), inst, LIMITS) is None
    # Nova: fits on (1, 2) once cell 0 has no 1 GiB page to offer. (0, 1) and (0, 2): guest
    # cell 0 picks 2 MiB on cell 0 and fails [cpus]. (1, 0): guest cell 0 fits on cell 1
    # with 2 MiB; guest cell 1 picks 2 MiB on cell 0 and fails [cpus]. (1, 2): both fit.
    cells[0] = dataclasses.replace(ONE_CPU_WITH_1G, mempages=ONE_CPU_WITH_1G.mempages[:2])
    fitted = numa_fit_instance_to_host(topo(*cells), inst, LIMITS)
    assert fitted is not None
    assert [(c.id, c.pagesize) for c in fitted.cells] == [(1, 2048), (2, 2048)]


# ------------------------------------------------------------------------ PCI and networks
def pci_on(node: int | None, count: int = 1) -> dict[str, Any]:
    return {"vendor_id": "8086", "product_id": "1520", "numa_node": node, "count": count}


def test_pci_required_policy_moves_the_guest_to_the_devices_cell() -> None:
    host = topo(cell(0, cpus="0-3", memory=8192), cell(1, cpus="4-7", memory=4096))
    stats = PciDeviceStats.from_pools([pci_on(1)])
    request = [InstancePCIRequest(1, [{"vendor_id": "8086"}], numa_policy="required")]
    fitted = numa_fit_instance_to_host(host, guest(shared(1)), LIMITS, request, stats)
    assert fitted is not None and fitted.cells[0].id == 1


def test_pci_required_policy_fails_when_no_cell_with_devices_fits() -> None:
    host = topo(cell(0, cpus="0-3", memory=8192), cell(1, cpus="4-7", memory=512))
    stats = PciDeviceStats.from_pools([pci_on(1)])
    request = [InstancePCIRequest(1, [{"vendor_id": "8086"}], numa_policy="required")]
    assert numa_fit_instance_to_host(host, guest(shared(1, memory=1024)), LIMITS, request, stats) is None
    legacy = [InstancePCIRequest(1, [{"vendor_id": "8086"}], numa_policy="preferred")]
    assert numa_fit_instance_to_host(host, guest(shared(1, memory=1024)), LIMITS, legacy, stats) is not None


def test_physnet_affinity_to_an_unchosen_cell_fails_the_permutation() -> None:
    net0 = CellNetworkMetadata(frozenset({"physnet0"}))
    host = topo(cell(0, cpus="0-3", memory=8192), cell(1, cpus="4-7", memory=4096, network_metadata=net0))
    limits = NUMATopologyLimits(16.0, 1.0, network_metadata=NetworkMetadata({"physnet0"}))
    fitted = numa_fit_instance_to_host(host, guest(shared(1)), limits)
    assert fitted is not None and fitted.cells[0].id == 1
    # A physnet no cell has affinity to constrains nothing.
    limits = NUMATopologyLimits(16.0, 1.0, network_metadata=NetworkMetadata({"physnet9"}))
    fitted = numa_fit_instance_to_host(host, guest(shared(1)), limits)
    assert fitted is not None and fitted.cells[0].id == 0


def test_tunnel_affinity_follows_the_tunneled_cell() -> None:
    tun = CellNetworkMetadata(tunneled=True)
    host = topo(cell(0, cpus="0-3", memory=8192, network_metadata=tun), cell(1, cpus="4-7", memory=512))
    limits = NUMATopologyLimits(16.0, 1.0, network_metadata=NetworkMetadata(tunneled=True))
    fitted = numa_fit_instance_to_host(host, guest(shared(1, memory=1024)), limits)
    assert fitted is not None and fitted.cells[0].id == 0
    host = topo(cell(0, cpus="0-3", memory=512, network_metadata=tun), cell(1, cpus="4-7", memory=8192))
    assert numa_fit_instance_to_host(host, guest(shared(1, memory=1024)), limits) is None


# ------------------------------------------------------------------------ consumption
def test_consume_pins_cpus_until_the_host_is_full_then_stops_fitting() -> None:
    host = topo(SMT)
    inst = guest(dedicated(2))
    fitted, host = consume(host, inst, LIMITS)
    assert fitted is not None and fitted.cells[0].cpu_pinning == {0: 4, 1: 5}
    assert host.cells[0].pinned_cpus == {4, 5} and host.cells[0].memory_usage == 1024
    fitted, host = consume(host, inst, LIMITS)
    assert fitted is not None and host.cells[0].pinned_cpus == {4, 5, 6, 7}
    fitted, after = consume(host, inst, LIMITS)
    assert fitted is None and after is host


def test_consume_counts_shared_cpu_usage() -> None:
    fitted, host = consume(topo(cell(0, cpus="0-3")), guest(shared(3, memory=256)), LIMITS)
    assert fitted is not None and host.cells[0].cpu_usage == 3 and host.cells[0].memory_usage == 256


def test_usage_refuses_to_pin_a_cpu_twice() -> None:
    fitted = numa_fit_instance_to_host(topo(SMT), guest(dedicated(2)), LIMITS)
    assert fitted is not None
    busy = topo(cell(0, cpus="0-3", pcpus="4-7", siblings=["4,5", "6,7"], pinned="5"))
    with pytest.raises(NUMAUsageError, match="already pinned"):
        numa_usage_from_instance_numa(busy, fitted)


def test_guests_without_a_page_size_use_the_smallest_pages() -> None:
    fitted = numa_fit_instance_to_host(topo(PAGED), guest(shared(1, memory=512)), LIMITS)
    assert fitted is not None and fitted.cells[0].pagesize is None
    after = numa_usage_from_instance_numa(topo(PAGED), fitted)
    assert [p.used for p in after.cells[0].mempages] == [131072, 512, 0]


def test_a_mixed_cell_without_dedicated_vcpus_fits_with_an_empty_pinning() -> None:
    # Nova fails only a pinning that is None; an empty one fits (checked against Nova
    # 34's own numa_fit_instance_to_host: this test said the opposite before).
    inst = guest(InstanceNUMACell(0, cpuset={0, 1}, memory=512, cpu_policy="mixed"))
    fitted = numa_fit_instance_to_host(topo(SMT), inst, LIMITS)
    assert fitted is not None and fitted.cells[0].cpu_pinning == {}


def test_emulator_pcpu_must_be_found_beside_the_pinned_ones() -> None:
    # Four free threads and four vCPUs: no pCPU is left for the emulator threads.
    host = topo(cell(0, cpus="0-3", pcpus="4-8", siblings=["4,5", "6,7", "8"], pinned="8"))
    assert numa_fit_instance_to_host(host, guest(dedicated(4), emulator="isolate"), LIMITS) is None


HOSTS = [
    topo(SMT, cell(1, cpus="8-11", pcpus="12-15", siblings=["12,13", "14,15"])),
    topo(cell(0, cpus="0-7", pcpus="0-7", siblings=["0,1", "2,3", "4,5", "6,7"], memory=8192)),
    topo(cell(0, cpus="0-3", pcpus="4-9", siblings=["4,5,6", "7,8,9"]),
         cell(1, cpus="10-11", pcpus="12-13", memory=2048,
              mempages=(NUMAPagesTopology(4, 524288), NUMAPagesTopology(2048, 256)))),
    topo(dataclasses.replace(ONE_CPU_WITH_1G, pcpuset=frozenset({9, 10})), CPUS_WITH_2M, issue_cell()),
]


@st.composite
def guest_request(draw: Any) -> InstanceNUMATopology:
    policy = draw(st.sampled_from([None, "dedicated", "mixed"]))
    thread = draw(st.sampled_from([None, "prefer", "require", "isolate"])) if policy else None
    n_cells = draw(st.integers(1, 2))
    cells = []
    start = 0
    for i in range(n_cells):
        n = draw(st.integers(1, 3))
        cpus = set(range(start, start + n))
        start += n
        pcpus = cpus if policy == "dedicated" else ({min(cpus)} if policy == "mixed" else set())
        cells.append(InstanceNUMACell(
            i, cpuset=cpus - pcpus, pcpuset=pcpus, memory=draw(st.sampled_from([256, 512, 1024])),
            pagesize=draw(st.sampled_from([None, None, MEMPAGES_SMALL, MEMPAGES_LARGE, MEMPAGES_ANY, 2048])),
            cpu_policy=policy, cpu_thread_policy=thread))
    emulator = draw(st.sampled_from([None, "isolate"])) if policy else None
    return guest(*cells, emulator=emulator)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(HOSTS), st.lists(guest_request(), min_size=1, max_size=6))
def test_whatever_fits_can_be_consumed_and_pins_only_free_dedicated_cpus(
    host: NUMATopology, guests: list[InstanceNUMATopology]
) -> None:
    for inst in guests:
        before = host
        try:
            fitted, host = consume(host, inst, LIMITS)
        except NUMAUsageError:
            # As in Nova: under isolate the emulator threads' pCPU may be a lone free thread
            # whose sibling is pinned, and pinning whole cores then finds that sibling taken
            # (Nova's pin_cpus_with_siblings raises; its consumption step logs and goes on).
            assert inst.emulator_threads_isolated
            assert any(c.cpu_thread_policy == "isolate" for c in inst.cells)
            return
        if fitted is None:
            assert host is before
            continue
        for new, old in zip(host.cells, before.cells):
            assert old.pinned_cpus <= new.pinned_cpus <= new.pcpuset
            placed = [c for c in fitted.cells if c.id == new.id]
            assert new.memory_usage == old.memory_usage + sum(c.memory for c in placed)
            newly = set().union(*(set(c.cpu_pinning.values()) | (c.cpuset_reserved or set())
                                  for c in placed)) if placed else set()
            assert newly <= new.pinned_cpus - old.pinned_cpus


def test_fits_on_one_guest_state_carry_what_each_wrote_as_nova_objects_do() -> None:
    """Nova 34 fits its request objects in place. Three calls on one request, read off
    Nova in its own environment: the first fits on host cells (1, 0) and leaves those
    ids in the guest cells, so the second, whose (host cell, guest cell) pairs are then
    other pairs, finds no fit; nor does the third. A fresh request fits every
    time, and the caller's request is never changed."""
    host = topo(
        cell(0, cpus="0-1", pcpus="0-1", memory=8192, cpu_usage=2, memory_usage=2800),
        cell(1, cpus="2-3", pcpus="2-3", memory=2048, cpu_usage=1, memory_usage=118,
             siblings=["2,3"], pinned="2-3"),
    )
    inst = guest(shared(2, 1024), shared(1, 2048, cell_id=1, start=2))
    limits = NUMATopologyLimits(4.0, 1.0)
    before = inst.copy()
    state = guest_state(inst)
    first = numa_fit_instance_to_host(host, inst, limits, guest_cells=state)
    assert first is not None and [c.id for c in first.cells] == [1, 0]
    assert [c.id for c in state] == [1, 0]
    assert [numa_fit_instance_to_host(host, inst, limits, guest_cells=state)
            for _ in range(2)] == [None, None]
    fresh = [numa_fit_instance_to_host(host, inst, limits) for _ in range(3)]
    assert all(f is not None and [c.id for c in f.cells] == [1, 0] for f in fresh)
    assert inst == before
