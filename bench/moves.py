"""Benchmark move operations through the service path: migrate, confirm, resize, revert.

    .venv/bin/python bench/moves.py                      # 200 hosts, 50 instances
    .venv/bin/python bench/moves.py --hosts 500 --instances 100

An in-process stack on a fresh SQLite file (the all-in-one ``berth serve`` wiring: the
store called in process, compute agents reporting, the fake driver) registers the hosts,
boots the instances, then times each operation per instance: a migrate (move of the
source allocation to the migration consumer, scheduling with the claim, the build on the
destination), its confirm, a resize and its revert. Wall-clock milliseconds, p50 / p99.
Not a test: nothing is asserted about time.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from berth.config import SchedulerConfig  # noqa: E402
from berth.model.request import Flavor, RequestSpec  # noqa: E402
from berth.moves import MoveRequest  # noqa: E402
from berth.service.compute import ComputeNodeSpec  # noqa: E402
from berth.service.stack import open_stack  # noqa: E402

SMALL = Flavor(name="small", vcpus=1, memory_mb=1024, root_gb=10, id=1)
LARGE = Flavor(name="large", vcpus=2, memory_mb=2048, root_gb=20, id=2)


def _ms(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered) * 1000, p99 * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--instances", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stack = open_stack(f"sqlite:///{tmp}/bench.sqlite", SchedulerConfig.default())
        try:
            stack.register_hosts([ComputeNodeSpec(host=f"h{i:04d}", vcpus=64, memory_mb=262144,
                                                  local_gb=4000) for i in range(args.hosts)])
            service = stack.scheduler(seed=1)
            conductor = stack.conductor(service)
            moves = stack.moves(conductor)
            built = conductor.build_instances(RequestSpec(flavor=SMALL, project_id="p",
                                                          user_id="u",
                                                          num_instances=args.instances))
            timings: dict[str, list[float]] = {"migrate": [], "confirm-resize": [],
                                               "resize": [], "revert-resize": []}
            operations: dict[str, Callable[[str], object]] = {
                "migrate": lambda u: moves.move(u, MoveRequest("migrate")),
                "confirm-resize": moves.confirm,
                "resize": lambda u: moves.move(u, MoveRequest("resize", flavor=LARGE)),
                "revert-resize": moves.revert,
            }
            timings: dict[str, list[float]] = {name: [] for name in operations}
            for b in built:
                for name, call in operations.items():
                    started = time.perf_counter()
                    call(b.instance_uuid)
                    timings[name].append(time.perf_counter() - started)
        finally:
            stack.close()
    load = os.getloadavg()[0]
    print(f"Run {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.machine()}, "
          f"{os.cpu_count()} cores, Python {platform.python_version()}; "
          f"`bench/moves.py --hosts {args.hosts} --instances {args.instances}`; "
          f"load average at end {load:.1f}.\n")
    print("| operation | runs | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|")
    for name, values in timings.items():
        p50, p99 = _ms(values)
        print(f"| {name} | {len(values)} | {p50:.1f} | {p99:.1f} |")


if __name__ == "__main__":
    main()
