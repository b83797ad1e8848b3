"""Multi-create cost against the number of instances, on identical hosts (not a test).

    .venv/bin/python bench/multi_create.py                       # 5,000 hosts, 100..1,000
    .venv/bin/python bench/multi_create.py --hosts 10000 --num 100 1000 2000

Identical hosts are the worst case for ordering: every instance's ranking ties on every
host but those taken before, so each level breaks its ties by the level below. One
``select_destinations`` per ``--num`` with the default filters and every weigher,
claiming in memory (``InMemoryPlacement``), as ``berth schedule`` does after loading a
cloud. Printed: seconds, milliseconds per instance, and the ratio to the smallest
``--num`` per instance (1.0 = linear). Target (issue 14): ``--num 1000`` on 5,000
identical hosts within 2 s.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from datetime import UTC, datetime

from berth.claims import InMemoryPlacement
from berth.config import SchedulerConfig
from berth.model import ServiceRecord
from berth.model.request import Flavor, ImageMeta, RequestSpec, new_instance_uuids
from berth.pipeline import Scheduler
from berth.snapshot import HostRecord, HostSnapshot

NOW = 1_800_000_000.0


def identical_hosts(n: int) -> HostSnapshot:
    """``n`` empty hosts of 32 vCPU, 128 GiB, 2 TB."""
    records = [HostRecord(
        host=f"h{i:06d}", nodename=f"h{i:06d}", uuid=f"00000000-0000-4000-8000-{i:012d}",
        total_usable_ram_mb=131072, free_ram_mb=131072, total_usable_disk_gb=2000,
        disk_mb_used=0, free_disk_mb=2000 * 1024, vcpus_total=32, vcpus_used=0,
        hypervisor_type="QEMU", hypervisor_version=8000000, hypervisor_hostname=f"h{i:06d}",
        cpu_info="{}", supported_instances=[["x86_64", "kvm", "hvm"]], stats={},
        cpu_allocation_ratio=4.0, ram_allocation_ratio=1.0, disk_allocation_ratio=1.0,
        service=ServiceRecord(host=f"h{i:06d}", last_seen_up=NOW), updated=NOW)
        for i in range(n)]
    return HostSnapshot.from_records(records, [])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=5000)
    parser.add_argument("--num", type=int, nargs="+", default=[100, 200, 500, 1000])
    args = parser.parse_args()
    print(f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.2f}; "
          f"{args.hosts:,} identical hosts, default filters, every weigher")
    print("| instances | seconds | ms per instance | per instance vs the smallest |")
    print("|---:|---:|---:|---:|")
    scheduler = Scheduler(SchedulerConfig.default())
    first: float | None = None
    for num in args.num:
        snap = identical_hosts(args.hosts)
        spec = RequestSpec(flavor=Flavor("m1.small", vcpus=1, memory_mb=2048, root_gb=20, id=1),
                           image=ImageMeta(id="image"), num_instances=num, project_id="p")
        placement = InMemoryPlacement(snap)
        rng = random.Random(1)
        started = time.perf_counter()
        decision = scheduler.select_destinations(
            spec, snap, now=NOW, rng=rng, candidates=placement.candidates(spec),
            claimer=placement, instance_uuids=new_instance_uuids(rng, num))
        took = time.perf_counter() - started
        assert len(decision.selections) == num
        per = took / num
        first = first or per
        print(f"| {num:,} | {took:.2f} | {1000 * per:.2f} | {per / first:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
