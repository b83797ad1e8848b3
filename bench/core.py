"""Benchmark the scheduling core: the columnar engine against Nova's per-host shape.

    make bench                                         # 1k, 10k, 100k hosts
    .venv/bin/python bench/core.py --sizes 1000 10000 --repeat 20
    .venv/bin/python bench/core.py --sizes 100000 --perhost-repeat 1 --no-perhost-multi

For each cloud size (bench/synthetic.py) and each filter set, ``select_destinations`` is
timed for one instance and for ``num_instances=10``, on the columnar path
(``Scheduler``) and on the per-host path (``Scheduler(per_host=True)``: every filter's
``host_passes`` and every weigher's ``_weigh_object``/``weight_multiplier`` host by host,
a full stable sort per instance). Placement candidates are computed before timing (the
adapter's job) and every host is a candidate; nothing is claimed.

Filter sets: ``default`` is Nova 34's ``enabled_filters``; ``heavy`` adds
AggregateInstanceExtraSpecsFilter, NumInstancesFilter, IoOpsFilter, SameHostFilter,
DifferentHostFilter, JsonFilter, AggregateMultiTenancyIsolation, NUMATopologyFilter and
PciPassthroughFilter. Filters or weighers whose module does not exist yet are skipped and
listed under the table. All weighers are enabled.

Also timed: building the snapshot from host records, one ``upsert`` of a host report and
one ``update_host`` of a claim. The Markdown table goes to bench/RESULTS.md and stdout.
Not a test: no assertion on time (targets are printed next to the figures).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from synthetic import NOW, SyntheticCloud, make_cloud, request  # noqa: E402

from berth.claims import CandidateSet, InMemoryPlacement  # noqa: E402
from berth.config import SchedulerConfig  # noqa: E402
from berth.filters.base import BaseHostFilter  # noqa: E402
from berth.filters.registry import DEFAULT_ENABLED_FILTERS  # noqa: E402
from berth.filters.registry import load_builtin as load_filter  # noqa: E402
from berth.model.request import new_instance_uuids  # noqa: E402
from berth.pipeline import Scheduler  # noqa: E402
from berth.snapshot import HostSnapshot  # noqa: E402
from berth.weighers.base import BaseHostWeigher  # noqa: E402
from berth.weighers.registry import BUILTIN_WEIGHERS  # noqa: E402
from berth.weighers.registry import load_builtin as load_weigher  # noqa: E402

HEAVY_EXTRA = (
    "AggregateInstanceExtraSpecsFilter",
    "NumInstancesFilter",
    "IoOpsFilter",
    "SameHostFilter",
    "DifferentHostFilter",
    "JsonFilter",
    "AggregateMultiTenancyIsolation",
    "NUMATopologyFilter",
    "PciPassthroughFilter",
)
SETS = {"default": DEFAULT_ENABLED_FILTERS, "heavy": DEFAULT_ENABLED_FILTERS + HEAVY_EXTRA}
#: Targets (median, one process) from the issue.
TARGETS_MS = {("default", 10_000): 5.0, ("default", 100_000): 50.0, ("heavy", 10_000): 15.0}
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


@dataclass
class Row:
    """One line of the results table."""

    hosts: int
    set: str
    instances: int
    path: str
    p50: float
    p99: float
    cpu_p50: float
    runs: int
    ratio: float | None = None
    request_peak_kb: float | None = None
    note: str = ""


def available_filters(names: tuple[str, ...], config: SchedulerConfig) -> tuple[list[BaseHostFilter], list[str]]:
    """Instances of the filters that exist, and the names that do not (yet)."""
    found: list[BaseHostFilter] = []
    missing: list[str] = []
    for name in names:
        try:
            found.append(load_filter(name)(config))
        except (ImportError, AttributeError) as exc:
            missing.append(f"{name} ({type(exc).__name__})")
    return found, missing


def available_weighers(config: SchedulerConfig) -> tuple[list[BaseHostWeigher], list[str]]:
    """Instances of every built-in weigher that exists, and the missing names."""
    found: list[BaseHostWeigher] = []
    missing: list[str] = []
    for name in BUILTIN_WEIGHERS:
        try:
            found.append(load_weigher(name)(config))
        except (ImportError, AttributeError) as exc:
            missing.append(f"{name} ({type(exc).__name__})")
    return found, missing


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank on the sorted values)."""
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def time_calls(call: Callable[[Any], Any], repeat: int, warmup: int = 1,
               prepare: Callable[[int], Any] | None = None) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of ``repeat`` calls (after ``warmup`` untimed ones). With
    ``prepare``, call ``i`` gets ``prepare(i)``, made before its timer starts (what the
    caller of the core brings: its generator and instance uuids); else ``i``."""
    def argument(i: int) -> Any:
        return prepare(i) if prepare is not None else i

    for i in range(warmup):
        call(argument(-1 - i))
    wall: list[float] = []
    cpu: list[float] = []
    for i in range(repeat):
        arg = argument(i)
        w0, c0 = time.perf_counter(), time.process_time()
        call(arg)
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def caller_inputs(num: int) -> Callable[[int], tuple[random.Random, list[str]]]:
    """``prepare`` for :func:`time_calls`: run ``i``'s seeded generator and the uuids of
    its ``num`` instances, drawn from it (as the service names instances before it
    schedules them), outside the timing: Nova's anchor does not time them either."""
    def prepare(i: int) -> tuple[random.Random, list[str]]:
        rng = random.Random(i)
        return rng, new_instance_uuids(rng, num)

    return prepare


def request_peak(call: Callable[[int], Any]) -> float:
    """Peak traced allocation (KB) of one call."""
    tracemalloc.start()
    try:
        call(0)
        return tracemalloc.get_traced_memory()[1] / 1024
    finally:
        tracemalloc.stop()


def bench_size(
    cloud: SyntheticCloud,
    snapshot: HostSnapshot,
    config: SchedulerConfig,
    weighers: list[BaseHostWeigher],
    args: argparse.Namespace,
    notes: list[str],
) -> list[Row]:
    """Every (set, instances, path) combination for one cloud."""
    rows: list[Row] = []
    n = len(snapshot)
    placement = InMemoryPlacement(snapshot)
    for set_name, names in SETS.items():
        filters, missing = available_filters(names, config)
        if missing and n == args.sizes[0]:
            notes.append(f"`{set_name}` set: skipped (not present yet): {', '.join(missing)}")
        heavy = set_name == "heavy"
        for num in (1, 10):
            spec = request(cloud, "medium", heavy=heavy, num_instances=num)
            candidates = placement.candidates(spec)
            cands = CandidateSet(candidates.by_row, candidates.version)
            timings: dict[str, float] = {}
            for path in args.paths:
                per_host = path == "per-host"
                if per_host and n >= 100_000 and num > 1 and not args.perhost_multi:
                    rows.append(Row(n, set_name, num, path, float("nan"), float("nan"),
                                    float("nan"), 0, note="skipped (--no-perhost-multi)"))
                    continue
                scheduler = Scheduler(config, filters=filters, weighers=weighers,
                                      per_host=per_host)

                def call(inputs: tuple[random.Random, list[str]],
                         scheduler: Scheduler = scheduler, spec: Any = spec,
                         cands: CandidateSet = cands) -> Any:
                    rng, uuids = inputs
                    return scheduler.select_destinations(
                        spec, snapshot, now=NOW, rng=rng, candidates=cands,
                        instance_uuids=uuids)

                repeat = args.repeat if not per_host else perhost_repeat(args, n, num)
                prepare = caller_inputs(spec.num_instances)
                wall, cpu = time_calls(call, repeat, warmup=1 if not per_host else 0,
                                       prepare=prepare)
                p50 = statistics.median(wall) * 1000
                timings[path] = p50
                peak = request_peak(lambda i, call=call, prepare=prepare: call(prepare(i))) \
                    if not per_host else None
                rows.append(Row(n, set_name, num, path, p50, percentile(wall, 99) * 1000,
                                statistics.median(cpu) * 1000, repeat, request_peak_kb=peak))
                print(f"  {n:>7} {set_name:<7} x{num:<2} {path:<8} p50 {p50:9.2f} ms",
                      file=sys.stderr, flush=True)
            if "per-host" in timings and "columnar" in timings:
                for row in rows[-2:]:
                    row.ratio = timings["per-host"] / timings["columnar"]
    return rows


def breakdown(
    cloud: SyntheticCloud,
    snapshot: HostSnapshot,
    config: SchedulerConfig,
    weighers: list[BaseHostWeigher],
    repeat: int,
) -> list[tuple[str, str, float, float]]:
    """CPU ms of each plugin alone on every host of the heavy request:
    ``(kind, name, bulk ms, per-host ms)``; the per-host figure is measured on at most
    2,000 hosts and scaled."""
    from berth.host_state import WorkingSet

    spec = request(cloud, "medium", heavy=True)
    filters, _ = available_filters(SETS["heavy"], config)
    n = len(snapshot)
    sample = np.arange(min(n, 2000), dtype=np.int64)
    out: list[tuple[str, str, float, float]] = []

    def cpu_ms(fn: Callable[[], Any], reps: int) -> float:
        fn()
        c0 = time.process_time()
        for _ in range(reps):
            fn()
        return (time.process_time() - c0) / reps * 1000

    for f in filters:
        f.validate_request(spec)
        ws = WorkingSet(snapshot, NOW)
        rows = np.arange(n, dtype=np.int64)
        bulk = cpu_ms(lambda f=f, ws=ws, rows=rows: f.filter_all_hosts(ws.hosts(rows), spec),
                      repeat)
        per = cpu_ms(lambda f=f, ws=ws: BaseHostFilter.filter_all_hosts(f, ws.hosts(sample), spec),
                     1) * n / len(sample)
        out.append(("filter", type(f).__name__, bulk, per))
    numa_spec = _numa_request(cloud, config)
    if numa_spec is not None:
        for f in filters:
            if type(f).__name__ != "NUMATopologyFilter":
                continue
            rows = np.arange(n, dtype=np.int64)
            bulk = cpu_ms(lambda f=f, rows=rows: f.filter_all_hosts(
                WorkingSet(snapshot, NOW).hosts(rows), numa_spec), repeat)
            per = cpu_ms(lambda f=f: BaseHostFilter.filter_all_hosts(
                f, WorkingSet(snapshot, NOW).hosts(sample), numa_spec), 1) * n / len(sample)
            out.append(("filter", "NUMATopologyFilter (hw:numa_nodes=2 request)", bulk, per))
    for w in weighers:
        ws = WorkingSet(snapshot, NOW)
        rows = np.arange(n, dtype=np.int64)

        def bulk_w(w: BaseHostWeigher = w, ws: WorkingSet = ws, rows: np.ndarray = rows) -> None:
            hosts = ws.hosts(rows)
            w.weigh_all_hosts(hosts, spec)
            w.multipliers_all_hosts(hosts)

        def per_w(w: BaseHostWeigher = w, ws: WorkingSet = ws) -> None:
            for h in ws.hosts(sample).states():
                w._weigh_object(h, spec)
                w.weight_multiplier(h)

        out.append(("weigher", type(w).__name__, cpu_ms(bulk_w, repeat),
                    cpu_ms(per_w, 1) * n / len(sample)))
    return out


def _numa_request(cloud: SyntheticCloud, config: SchedulerConfig) -> Any:
    """The heavy request with ``hw:numa_nodes=2``, prepared as Nova's API would, or None
    when berth.hardware cannot prepare it."""
    try:
        from berth.hardware.numa import prepare_request
    except ImportError:
        return None
    spec = request(cloud, "medium", heavy=True)
    spec.flavor.extra_specs["hw:numa_nodes"] = "2"
    prepare_request(spec, config)
    return spec


def perhost_repeat(args: argparse.Namespace, n: int, num: int) -> int:
    """Fewer repeats for the slow path on big clouds."""
    if args.perhost_repeat:
        return int(args.perhost_repeat)
    if n >= 100_000:
        return 1
    if n >= 10_000:
        return 3 if num == 1 else 1
    return 10 if num == 1 else 3


def bench_build(cloud: SyntheticCloud, repeat: int) -> dict[str, float]:
    """Snapshot build time and bytes, and one upsert / update_host."""
    out: dict[str, float] = {}
    builds = []
    cpus = []
    snap = cloud.snapshot()
    for _ in range(repeat):
        del snap  # freeing the previous snapshot is not part of a build
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        snap = cloud.snapshot()
        builds.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    out["build_s"] = statistics.median(builds)
    out["build_cpu_s"] = statistics.median(cpus)
    out["bytes_per_host"] = snap.nbytes() / len(snap)
    tracemalloc.start()
    traced = cloud.snapshot()
    out["traced_per_host"] = tracemalloc.get_traced_memory()[1] / len(traced)
    tracemalloc.stop()
    del traced
    record = cloud.records[len(cloud.records) // 2]
    upserts = []
    updates = []
    for i in range(200):
        fresh = replace(record, free_ram_mb=record.free_ram_mb - i)
        t0 = time.perf_counter()
        snap.upsert(fresh)
        upserts.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        snap.update_host(i % len(snap), free_ram_mb=1024.0 + i)
        updates.append(time.perf_counter() - t0)
    out["upsert_us"] = statistics.median(upserts) * 1e6
    out["update_us"] = statistics.median(updates) * 1e6
    return out


def nova_case(cloud: SyntheticCloud, spec: Any, rows: Any) -> dict[str, Any]:
    """The hosts, the placement candidates among them (``rows``) and the request for
    bench/nova_anchor.py (plain JSON)."""
    hosts = []
    for r in cloud.records:
        service = r.service
        assert service is not None and service.last_seen_up is not None
        hosts.append({
            "host": r.host, "nodename": r.nodename, "cell_uuid": r.cell_uuid, "uuid": r.uuid,
            "total_usable_ram_mb": r.total_usable_ram_mb, "free_ram_mb": r.free_ram_mb,
            "total_usable_disk_gb": r.total_usable_disk_gb, "disk_mb_used": r.disk_mb_used,
            "free_disk_mb": r.free_disk_mb, "vcpus_total": r.vcpus_total,
            "vcpus_used": r.vcpus_used, "hypervisor_type": r.hypervisor_type,
            "hypervisor_version": r.hypervisor_version, "host_ip": r.host_ip,
            "cpu_info": r.cpu_info, "supported_instances": [list(s) for s in r.supported_instances],
            "stats": dict(r.stats), "cpu_allocation_ratio": r.cpu_allocation_ratio,
            "ram_allocation_ratio": r.ram_allocation_ratio,
            "disk_allocation_ratio": r.disk_allocation_ratio,
            "disabled": service.disabled, "heartbeat_age": NOW - service.last_seen_up,
            "updated_age": NOW - (r.updated or NOW),
            "instances": {u: i.project_id for u, i in r.instances.items()},
        })
    f = spec.flavor
    return {
        "hosts": hosts,
        "candidates": [cloud.records[i].uuid for i in rows],
        "aggregates": [{"id": a.id, "uuid": a.uuid, "name": a.name, "hosts": list(a.hosts),
                        "metadata": dict(a.metadata)} for a in cloud.aggregates],
        "request": {
            "flavor": {"id": f.id, "name": f.name, "vcpus": f.vcpus, "memory_mb": f.memory_mb,
                       "root_gb": f.root_gb, "ephemeral_gb": f.ephemeral_gb, "swap": f.swap,
                       "extra_specs": dict(f.extra_specs)},
            "image": {"id": spec.image.id, "properties": dict(spec.image.properties.raw)},
            "project_id": spec.project_id,
        },
    }


@dataclass
class AnchorRow:
    """Berth's core and Nova 34's filter scheduler on the same hosts, same run."""

    hosts: int
    berth_p50: float
    berth_cpu_p50: float
    nova_p50: float
    nova_runs: int
    nova_passed: int
    berth_passed: int


def nova_anchor(n: int, python: str, repeat: int, nova_repeat: int, config: SchedulerConfig,
                weighers: list[BaseHostWeigher]) -> AnchorRow:
    """One size: a cloud without NUMA or PCI (the anchor builds plain Nova hosts), the
    default filters and every weigher, one instance of the medium flavor; Berth's
    columnar ``select_destinations`` timed here, Nova's filter + weigh in Nova's own
    environment (bench/nova_anchor.py, a separate process)."""
    cloud = make_cloud(n, seed=1, with_hardware=False)
    snapshot = cloud.snapshot()
    spec = request(cloud, "medium")
    filters, _ = available_filters(DEFAULT_ENABLED_FILTERS, config)
    placement = InMemoryPlacement(snapshot)
    found = placement.candidates(spec)
    cands = CandidateSet(found.by_row, found.version)
    scheduler = Scheduler(config, filters=filters, weighers=weighers)

    def call(inputs: tuple[random.Random, list[str]]) -> Any:
        rng, uuids = inputs
        return scheduler.select_destinations(spec, snapshot, now=NOW, rng=rng, candidates=cands,
                                             instance_uuids=uuids)

    wall, cpu = time_calls(call, repeat, prepare=caller_inputs(1))
    decision = scheduler.select_destinations(spec, snapshot, now=NOW, rng=random.Random(0),
                                             candidates=cands, explain=True,
                                             instance_uuids=new_instance_uuids(random.Random(0), 1))
    rows = sorted(found.by_row)  # the rows placement returned
    berth_passed = len(rows) - sum(decision.rejections.values())
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(nova_case(cloud, spec, rows), f)
    try:
        out = subprocess.run([python, str(Path(__file__).with_name("nova_anchor.py")), f.name,
                              "--repeat", str(nova_repeat)],
                             capture_output=True, text=True, check=False)
    finally:
        os.unlink(f.name)
    if out.returncode != 0:
        raise SystemExit(f"nova anchor failed: {out.stderr.strip().splitlines()[-1:]}")
    nova = json.loads(out.stdout.strip().splitlines()[-1])
    return AnchorRow(n, statistics.median(wall) * 1000, statistics.median(cpu) * 1000,
                     nova["median_ms"], nova_repeat, nova["passed"], berth_passed)


def render(rows: list[Row], builds: dict[int, dict[str, float]], notes: list[str],
           args: argparse.Namespace,
           plugin_costs: tuple[int, list[tuple[str, str, float, float]]] | None = None,
           anchors: list[AnchorRow] | None = None) -> str:
    """The Markdown report."""
    lines = [
        "# Core benchmark: columnar engine vs per-host path",
        "",
        f"Run {datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')} on {platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, NumPy {np.__version__}; "
        f"`{' '.join(sys.argv)}`; load average at start {args.load:.1f}.",
        "Wall-clock milliseconds per `select_destinations` (p50 / p99 over the runs; CPU p50 "
        "is process time, less sensitive to other processes on the machine). "
        "Ratio = per-host p50 / columnar p50.",
        "",
        "| hosts | set | instances | path | p50 ms | p99 ms | CPU p50 ms | runs | ratio "
        "| snapshot B/host | request peak KB | target |",
        "|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        target = TARGETS_MS.get((r.set, r.hosts)) if r.path == "columnar" and r.instances == 1 else None
        target_text = ""
        if target is not None:
            target_text = (f"≤ {target:g} ms: wall {'✓' if r.p50 <= target else '✗'}, "
                           f"CPU {'✓' if r.cpu_p50 <= target else '✗'}")
        if r.path == "columnar" and r.instances == 10:
            single = next((x for x in rows if x.hosts == r.hosts and x.set == r.set
                           and x.path == "columnar" and x.instances == 1), None)
            if single is not None:
                wall = r.p50 / single.p50
                cpu = r.cpu_p50 / single.cpu_p50
                target_text = (f"≤ 3× single: wall {wall:.1f}× {'✓' if wall <= 3 else '✗'}, "
                               f"CPU {cpu:.1f}× {'✓' if cpu <= 3 else '✗'}")
        b = builds.get(r.hosts, {})
        lines.append(
            f"| {r.hosts:,} | {r.set} | {r.instances} | {r.path} | {_f(r.p50)} | {_f(r.p99)} "
            f"| {_f(r.cpu_p50)} | {r.runs} | {_f(r.ratio, 0)}{'×' if r.ratio else ''} "
            f"| {_f(b.get('bytes_per_host'), 0)} | {_f(r.request_peak_kb, 0)} "
            f"| {target_text or r.note} |"
        )
    lines += [
        "",
        "## Snapshot",
        "",
        "| hosts | build (median) | column bytes/host | tracemalloc peak of a build /host "
        "| upsert (one host report) | update_host (one claim) | target |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for n, b in sorted(builds.items()):
        target = ""
        if n >= 100_000:
            target = (f"build ≤ 1 s {'✓' if b['build_s'] <= 1 else '✗'}; "
                      f"≤ 2 KB/host {'✓' if b['bytes_per_host'] <= 2048 else '✗'}")
        if n >= 100_000:
            target += f" (CPU {b['build_cpu_s'] * 1000:.0f} ms)"
        lines.append(
            f"| {n:,} | {b['build_s'] * 1000:.0f} ms | {b['bytes_per_host']:.0f} B "
            f"| {b['traced_per_host']:.0f} B | {b['upsert_us']:.1f} µs | {b['update_us']:.1f} µs "
            f"| {target} |"
        )
    lines += [
        "",
        "Column bytes count the snapshot's arrays (numbers, codes, object pointers); the "
        "tracemalloc figure also counts what a build allocates for per-host objects "
        "(instance dicts, copies of stats), not the HostRecords themselves.",
    ]
    if anchors:
        lines += [
            "",
            "## Against Nova 34, same run",
            "",
            "The same hosts (no NUMA or PCI), placement's candidates only, Nova 34's default "
            "`enabled_filters` and every weigher, one instance of the medium flavor. Berth: "
            "columnar `select_destinations` (filters, weighers, choice, virtual consumption). "
            "Nova: `HostManager.get_filtered_hosts` + `get_weighed_hosts`, run by "
            "bench/nova_anchor.py in Nova's own environment (`make nova-env`). Targets: "
            "≤ 1 ms and ≥ 250x at 1,000 hosts, ≥ 1,000x at 10,000.",
            "",
            "| hosts | hosts passing (Berth / Nova) | Berth p50 ms | Berth CPU p50 ms "
            "| Nova p50 ms (runs) | Nova / Berth | target |",
            "|---:|---|---:|---:|---:|---:|---|",
        ]
        for a in anchors:
            ratio = a.nova_p50 / a.berth_p50
            target = ""
            if a.hosts == 1000:
                target = (f"≤ 1 ms {'✓' if a.berth_p50 <= 1 else '✗'}, "
                          f"≥ 250x {'✓' if ratio >= 250 else '✗'}")
            elif a.hosts >= 10_000:
                target = f"≥ 1,000x {'✓' if ratio >= 1000 else '✗'}"
            lines.append(
                f"| {a.hosts:,} | {a.berth_passed:,} / {a.nova_passed:,} | {a.berth_p50:.2f} "
                f"| {a.berth_cpu_p50:.2f} | {a.nova_p50:,.0f} ({a.nova_runs}) | {ratio:,.0f}x "
                f"| {target} |")
    if plugin_costs:
        lines += [
            "",
            f"## Per-plugin cost at {plugin_costs[0]:,} hosts (heavy request, every host, CPU ms)",
            "",
            "| kind | name | bulk (columnar) | per-host path |",
            "|---|---|---:|---:|",
        ]
        for kind, name, bulk, per in sorted(plugin_costs[1], key=lambda x: -x[2]):
            lines.append(f"| {kind} | {name} | {bulk:.2f} | {per:,.0f} |")
    if notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def _f(value: float | None, digits: int = 2) -> str:
    if value is None or value != value:
        return "–"
    return f"{value:,.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write bench/RESULTS.md."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--repeat", type=int, default=30, help="runs per columnar figure")
    parser.add_argument("--perhost-repeat", type=int, default=0,
                        help="runs per per-host figure (default: 10/3/1 by size)")
    parser.add_argument("--no-perhost-multi", dest="perhost_multi", action="store_false",
                        help="skip the per-host num_instances=10 run at 100,000 hosts")
    parser.add_argument("--build-repeat", type=int, default=3)
    parser.add_argument("--paths", nargs="+", default=["columnar", "per-host"],
                        choices=["columnar", "per-host"])
    parser.add_argument("--breakdown", type=int, default=5, metavar="N",
                        help="time each plugin alone N times at the largest size (0: off)")
    parser.add_argument("--only-breakdown", action="store_true",
                        help="skip the select_destinations table (profiling aid)")
    parser.add_argument("--nodes-per-host", type=int, default=1, metavar="K",
                        help="K consecutive nodes share a service host (Ironic-style)")
    parser.add_argument("--nova", metavar="PYTHON",
                        help="also time Nova 34's filter scheduler on the same hosts, with the "
                             "Python of its environment (make nova-env: .venv-nova/bin/python)")
    parser.add_argument("--nova-repeat", type=int, default=3, help="Nova runs per size")
    parser.add_argument("--output", type=Path, default=RESULTS,
                        help="the results file; this bench's section of it is replaced")
    args = parser.parse_args(argv)
    if args.nova and not Path(args.nova).exists():
        parser.error(f"--nova: {args.nova}: no such file (make nova-env creates .venv-nova)")
    args.load = os.getloadavg()[0]
    config = SchedulerConfig.default()
    weighers, missing_w = available_weighers(config)
    notes: list[str] = []
    if missing_w:
        notes.append(f"weighers skipped (not present yet): {', '.join(missing_w)}")
    rows: list[Row] = []
    builds: dict[int, dict[str, float]] = {}
    plugin_costs: tuple[int, list[tuple[str, str, float, float]]] | None = None
    anchors: list[AnchorRow] = []
    for n in args.sizes:
        print(f"building a cloud of {n:,} hosts", file=sys.stderr, flush=True)
        cloud = make_cloud(n, seed=1, nodes_per_host=args.nodes_per_host)
        if n == args.sizes[0]:
            notes.append(f"synthetic cloud: NUMA topologies {'on every 10th host' if cloud.has_numa else 'absent (berth.hardware missing)'}, "
                         f"PCI pools {'on every 20th host' if cloud.has_pci else 'absent'}")
        builds[n] = bench_build(cloud, args.build_repeat)
        snapshot = cloud.snapshot()
        # A long-running scheduler holds the snapshot for its lifetime: move it out of
        # the cyclic GC's generations, as a service would after loading it.
        gc.collect()
        gc.freeze()
        if n == max(args.sizes) and args.breakdown:
            plugin_costs = (n, breakdown(cloud, snapshot, config, weighers, args.breakdown))
        if not args.only_breakdown:
            rows += bench_size(cloud, snapshot, config, weighers, args, notes)
        del snapshot, cloud
        gc.unfreeze()
        gc.collect()
        if args.nova:
            print(f"  {n:>7} against Nova 34", file=sys.stderr, flush=True)
            anchors.append(nova_anchor(n, args.nova, args.repeat,
                                       1 if n >= 100_000 else args.nova_repeat, config, weighers))
    text = render(rows, builds, notes, args, plugin_costs, anchors)
    write_section(args.output, text)
    print(text)
    return 0


BEGIN, END = "<!-- bench/core.py: begin -->", "<!-- bench/core.py: end -->"


def write_section(path: Path, text: str, begin: str = BEGIN, end: str = END) -> None:
    """Replace a bench's section of the results file, between its ``begin`` and ``end``
    markers (the other benches' stay); a new section goes first."""
    block = f"{begin}\n{text}{end}\n"
    old = path.read_text() if path.exists() else ""
    if begin in old and end in old:
        head, rest = old.split(begin, 1)
        new = head + block + rest.split(end, 1)[1].lstrip("\n")
    else:
        new = block + ("\n" + old if old else "")
    path.write_text(new)


if __name__ == "__main__":
    raise SystemExit(main())
