"""InMemoryPlacement: placement's capacity rule over a snapshot (reference §8.5)."""

from __future__ import annotations

import pytest

from berth.claims import InMemoryPlacement
from berth.config import SchedulerConfig
from builders import cloud, host, spec

# reserved_host_memory_mb defaults to 512, as in Nova.
CONFIG = SchedulerConfig.default()


@pytest.mark.parametrize(("memory_mb", "fits"), [
    pytest.param(3328, True, id="(4096 - 512 reserved) x 1.5 - 2048 used = 3328 MB fit"),
    pytest.param(3329, False, id="one MB more does not: the reserved amount is not oversubscribed"),
])
def test_capacity_is_total_minus_reserved_times_the_ratio(memory_mb: int, fits: bool) -> None:
    # 2048 MB of instances; the compute reports the reserved 512 MB as used too.
    snap = cloud(host("a", total_usable_ram_mb=4096, free_ram_mb=4096 - 512 - 2048,
                      ram_allocation_ratio=1.5))
    found = InMemoryPlacement(snap, CONFIG).candidates(spec(memory_mb=memory_mb))
    assert (0 in found.by_row) is fits


def test_usage_is_what_the_host_reports_as_used_less_its_reserved_amount() -> None:
    # 1024 MB of instances + 512 reserved reported as used: 3584 - 1024 = 2560 MB left.
    snap = cloud(host("a", total_usable_ram_mb=4096, free_ram_mb=4096 - 512 - 1024))
    placement = InMemoryPlacement(snap, CONFIG)
    assert placement.used["MEMORY_MB"].tolist() == [1024.0]
    assert 0 in placement.candidates(spec(memory_mb=2560)).by_row
    reject = placement.candidates(spec(memory_mb=2561)).rejections[0]
    assert reject.render() == "insufficient MEMORY_MB in placement (requested 2561, free 2560)"


def test_reserved_amounts_come_from_the_config_and_never_exceed_the_total() -> None:
    config = CONFIG.replace("DEFAULT", reserved_host_cpus=2, reserved_host_disk_mb=1500,
                            reserved_host_memory_mb=0)
    snap = cloud(host("a", vcpus_total=1, vcpus_used=1, total_usable_disk_gb=10,
                      free_disk_mb=(10 - 2) * 1024))
    placement = InMemoryPlacement(snap, config)
    # VCPU: reserved min(2, 1) = 1, capacity (1 - 1) x 4.0 = 0; DISK_GB: ceil(1500/1024) = 2.
    assert placement.capacity["VCPU"].tolist() == [0.0]
    assert placement.capacity["DISK_GB"].tolist() == [8.0]
    assert placement.used["DISK_GB"].tolist() == [0.0]


def test_without_a_config_nothing_is_reserved() -> None:
    snap = cloud(host("a", total_usable_ram_mb=4096, free_ram_mb=4096))
    placement = InMemoryPlacement(snap)
    assert placement.capacity["MEMORY_MB"].tolist() == [4096.0]
    assert placement.used["MEMORY_MB"].tolist() == [0.0]


def test_a_candidate_set_gives_its_rows_as_an_array_once():
    import numpy as np

    from berth.claims import CandidateSet

    cands = CandidateSet({5: [{}], 2: [{}]})
    rows = cands.row_array()
    assert rows.dtype == np.int64 and rows.tolist() == [5, 2]
    assert cands.row_array() is rows

    class Kept(dict):
        def row_array(self):
            return np.array([7, 3], dtype=np.int32)

    assert CandidateSet(Kept({7: [{}], 3: [{}]})).row_array().tolist() == [7, 3]
