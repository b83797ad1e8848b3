"""PCIWeigher (reference §7.2): 100 - min(free PCI devices, 99), 0 free without PCI stats;
pci_weight_multiplier (1.0, config minimum 0.0)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from berth.errors import ConfigError
from berth.weighers.pci import PCIWeigher, free_pci_devices
from builders import cloud, host, spec, working_set

from ._helpers import (
    FakeFreeCount,
    FakePools,
    check_paths_agree,
    config,
    multipliers_both,
    raw_both,
    weights_of,
)


def test_free_devices_come_from_free_count_or_the_pool_counts():
    assert free_pci_devices(None) == 0
    assert free_pci_devices(FakeFreeCount(7)) == 7
    assert free_pci_devices(FakePools([2, 3])) == 5
    assert free_pci_devices(FakePools([])) == 0


def test_raw_value_prefers_hosts_with_fewer_free_devices():
    # none: 100 - 0 = 100 ; 5 free: 95 ; 150 free: 100 - 99 = 1 ; 99 free: 1
    snap = cloud(host("a"), host("b", pci_stats=FakePools([2, 3])),
                 host("c", pci_stats=FakeFreeCount(150)), host("d", pci_stats=FakeFreeCount(99)))
    assert raw_both(PCIWeigher(), snap, spec()) == [100, 95, 1, 1]
    # min/max normalized: (100-1)/99 = 1, (95-1)/99, 0, 0
    assert weights_of([PCIWeigher()], snap, spec()) == pytest.approx([1.0, 94 / 99, 0.0, 0.0])


def test_the_request_is_not_looked_at():
    snap = cloud(host("a"), host("b", pci_stats=FakePools([4])))
    assert raw_both(PCIWeigher(), snap, spec(vcpus=8)) == raw_both(PCIWeigher(), snap, spec())


def test_a_negative_multiplier_is_refused_at_start_up():
    with pytest.raises(ConfigError, match="pci_weight_multiplier"):
        config(filter_scheduler={"pci_weight_multiplier": -1.0})


def test_the_aggregate_override():
    snap = cloud(host("a").in_aggregate("x", pci_weight_multiplier="0"), host("b"))
    assert multipliers_both(PCIWeigher(), snap) == [0.0, 1.0]


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_bulk_and_per_host_paths_agree(data):
    check_paths_agree([PCIWeigher], data)


def test_the_hardware_models_pci_stats_are_counted():
    from berth.hardware.pci import PciDeviceStats

    stats = PciDeviceStats([{"vendor_id": "8086", "product_id": "1520", "count": 3},
                            {"vendor_id": "8086", "product_id": "1521", "count": 4}])
    assert free_pci_devices(stats) == 7
    snap = cloud(host("a", pci_stats=stats), host("b"))
    assert raw_both(PCIWeigher(), snap, spec()) == [93, 100]


def test_pci_stats_replaced_by_the_request_are_seen_by_both_paths():
    # Virtual consumption replaces a host's pci_stats in the request's working set only.
    snap = cloud(host("a", pci_stats=FakePools([10])), host("b", pci_stats=FakePools([2])))
    ws = working_set(snap)
    ws.host_state(0).pci_stats = FakePools([1])
    assert raw_both(PCIWeigher(), snap, spec(), ws) == [99, 98]
    assert raw_both(PCIWeigher(), snap, spec()) == [90, 98]
