"""``berth simulate`` speed: events per second of a replay on N compute nodes.

    .venv/bin/python bench/simulate.py --hosts 1000 --events 100000
    .venv/bin/python bench/simulate.py --hosts 10000 --events 20000 --profile
    .venv/bin/python bench/simulate.py --hosts 10000 --events 1000000 --progress 50000
    .venv/bin/python bench/simulate.py --hosts 1000 --events 20000 --configurations 2

A cloud of ``--hosts`` nodes (three sizes) and a generated trace of ``--events`` events
(Poisson arrivals; lognormal lifetimes sized so that the cloud settles near 60% of its
memory; a mix of four flavors; 5% of the creates in anti-affinity groups) are written to
a scratch directory, and the trace is replayed as ``berth simulate`` replays it
(:class:`~berth.simulate.targets.LocalTarget`: the objects ``berth serve`` runs per
request, on a scratch SQLite store). Printed: events/s, create request p50/p99, the
acceptance, and with ``--profile`` where the time goes (cProfile, by component). With
``--output`` the table replaces this bench's section of bench/RESULTS.md.

``--configurations N`` replays the trace under N configurations as ``berth simulate
--compare`` does (:func:`~berth.simulate.jobs.replay_all`: side by side, a process each,
as many at a time as there are CPUs, or ``--jobs``), the weighers spreading and stacking
in turn, and prints the events/s of the whole run (N times the trace over its wall time)
beside each configuration's own.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import write_section  # noqa: E402

from berth.config import SchedulerConfig  # noqa: E402
from berth.service.offline import offline_cloud  # noqa: E402
from berth.simulate.generate import GroupSpec, Lifetime, generate  # noqa: E402
from berth.simulate.run import Replay  # noqa: E402
from berth.simulate.targets import LocalTarget  # noqa: E402

BEGIN, END = "<!-- bench/simulate.py: begin -->", "<!-- bench/simulate.py: end -->"
SIZES = ((32, 131072, 1000), (64, 262144, 2000), (96, 524288, 4000))
MIX = {"m1.small": 4.0, "m1.medium": 3.0, "m1.large": 2.0, "m1.xlarge": 1.0}
MIX_MB = {"m1.small": 2048, "m1.medium": 4096, "m1.large": 8192, "m1.xlarge": 16384}
#: Components of the profile: (name, file, function); cumulative time of each.
COMPONENTS = (
    ("create: allocation candidates", "berth/service/scheduler.py", "query_candidates"),
    ("create: pipeline (filters, weighers)", "berth/pipeline.py", "select_destinations"),
    ("create: claims", "berth/service/placement.py", "claim"),
    ("create: build (agent spawn and report)", "berth/service/conductor.py", "build_all"),
    ("create: build records", "berth/service/builds.py", "begin"),
    ("create: build records settle", "berth/service/builds.py", "settle"),
    ("create: instance records", "berth/service/instances.py", "record_many"),
    ("snapshot refresh (changes since the last request)", "berth/service/records.py", "refresh"),
    ("delete (whole)", "berth/service/moves.py", "delete"),
    ("agent reports (in builds and deletes)", "berth/service/compute.py", "report"),
)


def cloud_file(path: Path, hosts: int) -> None:
    """``hosts`` compute nodes in three sizes, one AZ, empty."""
    per = [hosts // 3 + (1 if i < hosts % 3 else 0) for i in range(3)]
    lines = ["host_defaults: {cpu_allocation_ratio: 4.0, ram_allocation_ratio: 1.0}", "hosts:"]
    start = 1
    for (vcpus, ram, disk), count in zip(SIZES, per):
        if count:
            lines.append(f'  - {{host: "h{{index:05d}}", count: {count}, start: {start}, '
                         f"vcpus: {vcpus}, memory_mb: {ram}, local_gb: {disk}}}")
            start += count
    lines.append("flavors:")
    for name, mb in MIX_MB.items():
        lines.append(f"  - {{name: {name}, vcpus: {mb // 2048}, memory_mb: {mb}, "
                     f"root_gb: {mb // 200}}}")
    path.write_text("\n".join(lines) + "\n")


def trace_for(hosts: int, events: int, seed: int):  # type: ignore[no-untyped-def]
    """``events`` events: creates at 10/s whose live instances settle at 60% of the
    memory, or at a quarter of the creates when the trace is too short to get there
    (so that deletes are most of the other events either way)."""
    per = [hosts // 3 + (1 if i < hosts % 3 else 0) for i in range(3)]
    memory = sum(count * ram for (_, ram, _), count in zip(SIZES, per))
    mean_mb = sum(MIX[n] * MIX_MB[n] for n in MIX) / sum(MIX.values())
    creates = int(events / 1.7) + 1
    live = min(0.6 * memory / mean_mb, 0.25 * creates)
    rate = 10.0
    median = live / rate / 1.65  # a lognormal of sigma 1 has mean = median * e^0.5
    trace = generate(creates=creates, rate=rate, lifetime=Lifetime("lognormal", (median, 1.0)),
                     mix=MIX, seed=seed, groups=GroupSpec(0.05, 50, "anti-affinity"))
    trace.events = trace.events[:events]
    return trace


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[1000])
    parser.add_argument("--events", type=int, nargs="+", default=[100_000])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--progress", type=int, default=0, metavar="N",
                        help="print the rate and resident memory every N events (long runs)")
    parser.add_argument("--configurations", type=int, default=1, metavar="N",
                        help="replay under N configurations as berth simulate --compare does")
    parser.add_argument("--jobs", type=int, default=0,
                        help="with --configurations: at most this many at once (default: CPUs)")
    parser.add_argument("--output", type=Path, default=None,
                        help="write the table into this results file (bench/RESULTS.md)")
    args = parser.parse_args(argv)
    config = SchedulerConfig.default()
    load = os.getloadavg()[0]
    began = datetime.now(UTC)
    rows = []
    profiles = []
    if args.configurations > 1:
        for hosts, events in zip(args.hosts, args.events):
            side_by_side(hosts, events, args.seed, args.configurations, args.jobs)
        return 0
    for hosts, events in zip(args.hosts, args.events):
        trace = trace_for(hosts, events, args.seed)
        with tempfile.TemporaryDirectory() as tmp:
            cloud = Path(tmp) / "cloud.yaml"
            cloud_file(cloud, hosts)
            t0 = time.perf_counter()
            with offline_cloud(str(cloud), config, now=1.7e9, events=len(trace.events)) as offline:
                load_s = time.perf_counter() - t0
                replay = Replay(LocalTarget(offline, seed=args.seed), trace, config=config,
                                label="bench", samples=100,
                                on_event=_progress(args.progress) if args.progress else None)
                prof = cProfile.Profile() if args.profile else None
                if prof:
                    prof.enable()
                result = replay.run()
                if prof:
                    prof.disable()
                    profiles.append((hosts, len(trace.events), prof, result.wall_seconds))
        lat = result.latency()
        rows.append((hosts, len(trace.events), load_s, result.wall_seconds,
                     len(trace.events) / result.wall_seconds, lat["p50"], lat["p99"],
                     result.acceptance, result.peak()["utilization"].get("MEMORY_MB", 0.0)))
        print(f"{hosts} hosts, {len(trace.events)} events: {rows[-1][4]:.0f} events/s "
              f"(p50 {lat['p50']:.2f} ms, p99 {lat['p99']:.2f} ms per create; acceptance "
              f"{result.acceptance:.1%}; cloud loaded in {load_s:.1f} s)", flush=True)
    text = render(rows, profiles, began, load, argv if argv is not None else sys.argv[1:])
    print(text)
    if args.output:
        write_section(args.output, text, BEGIN, END)
    return 0


def side_by_side(hosts: int, events: int, seed: int, count: int, workers: int) -> None:
    """The trace under ``count`` configurations (spreading, stacking, spreading...)
    through :func:`~berth.simulate.jobs.replay_all`; prints the run's events/s."""
    from berth.simulate.jobs import Job, ReplayOptions, cpus, replay_all
    from berth.simulate.trace import write_csv

    trace = trace_for(hosts, events, seed)
    with tempfile.TemporaryDirectory() as tmp:
        cloud, path = Path(tmp) / "cloud.yaml", Path(tmp) / "trace.csv"
        cloud_file(cloud, hosts)
        write_csv(trace, str(path))
        jobs = []
        for i in range(count):
            conf = Path(tmp) / f"c{i}.conf"
            sign = -1.0 if i % 2 else 1.0
            conf.write_text("[filter_scheduler]\n" + "".join(
                f"{w}_weight_multiplier = {sign}\n" for w in ("ram", "cpu", "disk")))
            jobs.append(Job((str(conf),), f"c{i}"))
        workers = workers or cpus()
        began = time.perf_counter()
        results = replay_all(ReplayOptions(str(cloud), str(path), seed=seed, samples=100),
                             jobs, 1.7e9, len(trace.events), workers=workers, progress=False)
        wall = time.perf_counter() - began
    own = ", ".join(f"{r.label} {r.events / r.wall_seconds:.0f}" for r in results)
    print(f"{hosts} hosts, {len(trace.events)} events x {count} configurations, {workers} at "
          f"once: {count * len(trace.events) / wall:.0f} events/s over the run ({wall:.1f} s, "
          f"clouds loaded and workers started included); each configuration's own: {own} "
          f"events/s", flush=True)


def _progress(every: int):  # type: ignore[no-untyped-def]
    """An ``on_event`` callback printing, every ``every`` events, the rate since the
    last line and the process's resident memory."""
    began = last = time.perf_counter()

    def report(done: int) -> None:
        nonlocal last
        if done % every:
            return
        now = time.perf_counter()
        with open("/proc/self/status") as status:
            rss = next((int(line.split()[1]) // 1024 for line in status
                        if line.startswith("VmRSS")), 0)
        print(f"  {done:,} events in {now - began:.0f} s ({every / (now - last):.0f} events/s "
              f"lately), resident {rss} MB, load {os.getloadavg()[0]:.1f}", flush=True)
        last = now

    return report


def render(rows, profiles, began, load, argv) -> str:  # type: ignore[no-untyped-def]
    out = [f"## `berth simulate` replay speed (`bench/simulate.py`, {began:%Y-%m-%d %H:%M} UTC)",
           "", f"`bench/simulate.py {' '.join(argv)}`; load average at start {load:.1f}; 2 cores.",
           "Events through `LocalTarget` (the objects `berth serve` runs per request, scratch "
           "SQLite store); target ≥ 2,000 events/s at 1,000 hosts.", "",
           "| hosts | events | cloud load s | replay s | events/s | create p50 ms | create p99 ms "
           "| acceptance | peak RAM use |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for h, n, ls, ws, eps, p50, p99, acc, mem in rows:
        out.append(f"| {h:,} | {n:,} | {ls:.1f} | {ws:.1f} | {eps:,.0f} | {p50:.2f} | {p99:.2f} "
                   f"| {acc:.1%} | {mem:.0%} |")
    for hosts, events, prof, wall in profiles:
        stats = pstats.Stats(prof)
        out += ["", f"Where the time goes at {hosts:,} hosts ({events:,} events, cProfile "
                "cumulative, ms per event; components overlap where one calls another):", "",
                "| component | ms/event | share |", "|---|---:|---:|"]
        for name, path, function in COMPONENTS:
            total = sum(v[3] for (file, _, func), v in stats.stats.items()  # type: ignore[attr-defined]
                        if file.endswith(path) and func == function)
            out.append(f"| {name} | {1000 * total / events:.2f} | {total / wall:.0%} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
