"""Fitting a guest NUMA topology onto host cells, and consuming it (reference §3.18, §2.3)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from berth.hardware.numa import (
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


def test_a_mixed_cell_without_dedicated_vcpus_does_not_fit() -> None:
    # Nova counts an empty pinning as a failed pinning.
    inst = guest(InstanceNUMACell(0, cpuset={0, 1}, memory=512, cpu_policy="mixed"))
    assert numa_fit_instance_to_host(topo(SMT), inst, LIMITS) is None


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
            pagesize=draw(st.sampled_from([None, None, MEMPAGES_SMALL, MEMPAGES_LARGE, 2048])),
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
