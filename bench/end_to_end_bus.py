"""Benchmark the distributed form end to end (not a test).

    .venv/bin/python bench/end_to_end_bus.py                       # 10,000 hosts, 1 and 4 schedulers
    .venv/bin/python bench/end_to_end_bus.py --hosts 2000 --boots 500 --schedulers 1,2

A fresh PostgreSQL database and RabbitMQ virtual host, then the processes an operator
would start (:class:`~berth.service.localcluster.LocalCluster`):
``--apis`` ``berth api``, one ``berth compute --fleet`` of ``--hosts`` simulated hosts
(32 vCPU, 128 GiB, 2 TB each), then ``berth scheduler`` processes up to each count of
``--schedulers`` in turn. Printed:

* registration: the seconds the fleet took to register every host with the Placement
  API over HTTP (provider + inventories per host);
* boots: ``--boots`` single-instance ``POST /boot`` requests (three flavors) from
  ``--clients`` threads spread over the API processes — HTTP → RPC call to a scheduler →
  claim → RPC build on the host's agent → report — as boots/s over the whole run and
  the p50/p99 latency of one boot, after ``--warmup`` boots; and each scheduler's own
  latency per request (its log), to show the share of the scheduler;
* where the CPU goes: the CPU seconds each process used during the registration and
  during each round of boots (every Berth process, PostgreSQL's and RabbitMQ's
  processes, and this bench's own client threads), per host and per boot, and what
  they imply: the boots/s at which each single-threaded process saturates one core,
  and how many processes and cores :data:`TARGET` boots/s would take on a bigger
  machine (each Berth process is one Python interpreter: one core at most).

With ``--cpus 0`` (a CPU list, as ``taskset -c`` takes it) everything runs on those CPUs
only: this bench and the processes it starts, and PostgreSQL's and RabbitMQ's processes
(every thread; their previous CPUs are given back at the end). Two runs, ``--cpus 0`` and
``--cpus 0,1``, show how the whole path scales with cores on this machine, which is what
the projection above assumes. Pinning the database and the broker takes the right to set
their affinity (root, or their owner); without it the bench stops before starting.

"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from berth.service.localcluster import LocalCluster, rabbit_unavailable, rabbit_vhost  # noqa: E402
from pgdb import fresh_pg_database  # noqa: E402

#: The noauth2 token of the administrator (the servers run --auth-strategy noauth2).
ADMIN = {"X-Auth-Token": "admin"}

FLAVORS = ["m1.tiny", "m1.small", "m1.medium"]

#: The boots/s issue 12 asks of 4 schedulers; the projection says what it would take.
TARGET = 500


def _cpu_seconds(pid: int | str) -> float:
    """User + system CPU seconds of one process (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pids(prefix: str) -> list[str]:
    """Every process whose command name starts with ``prefix``."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as fh:
                name = fh.read().strip()
        except OSError:
            continue
        if name.startswith(prefix):
            out.append(pid)
    return out


def _by_command(prefix: str) -> float:
    """CPU seconds of every process whose command name starts with ``prefix``."""
    return sum(_cpu_seconds(pid) for pid in _pids(prefix))


#: The command names of the database's and the broker's processes (RabbitMQ's Erlang VM
#: and its helpers).
SERVICES = ("postgres", "beam", "epmd", "erl_child_setup", "inet_gethost")


def parse_cpus(text: str) -> set[int]:
    """A CPU list as ``taskset -c`` takes it (``0``, ``0,1``, ``0-3``), checked against
    the CPUs this process may use; a clear error otherwise."""
    allowed = os.sched_getaffinity(0)
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
    except ValueError:
        raise SystemExit(f"--cpus: {text!r} is not a CPU list (such as 0 or 0,1 or 0-3)") from None
    if not cpus or not cpus <= allowed:
        raise SystemExit(f"--cpus: {text!r} names CPUs this machine does not offer "
                         f"(available: {','.join(map(str, sorted(allowed)))})")
    return cpus


def pin_services(cpus: set[int]) -> dict[int, set[int]]:
    """Put every thread of PostgreSQL and RabbitMQ on ``cpus``; their previous CPUs, to
    give back with :func:`unpin`. Stops the bench (after giving back what it pinned)
    when a thread cannot be moved."""
    saved: dict[int, set[int]] = {}
    for prefix in SERVICES:
        for pid in _pids(prefix):
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                continue  # gone meanwhile
            for tid in tids:
                try:
                    before = os.sched_getaffinity(tid)
                    os.sched_setaffinity(tid, cpus)
                except ProcessLookupError:
                    continue
                except OSError as exc:
                    unpin(saved)
                    raise SystemExit(f"--cpus: cannot move {prefix} process {pid} to CPUs "
                                     f"{sorted(cpus)}: {exc.strerror}") from None
                saved[tid] = before
    return saved


def unpin(saved: dict[int, set[int]]) -> None:
    """Give the threads :func:`pin_services` moved their previous CPUs."""
    for tid, cpus in saved.items():
        with contextlib.suppress(OSError):  # the thread has ended
            os.sched_setaffinity(tid, cpus)


def cpu_sample(cluster: LocalCluster) -> dict[str, float]:
    """CPU seconds so far of each cluster process, of PostgreSQL and RabbitMQ (every
    process of theirs on this machine: the bench's database is the only busy one), and
    of this bench (its client threads)."""
    sample = {name: _cpu_seconds(proc.pid) for name, proc in cluster.procs.items()}
    sample["postgres"] = _by_command("postgres")
    sample["rabbitmq"] = _by_command("beam")
    sample["bench clients"] = _cpu_seconds(os.getpid())
    return sample


def cpu_report(before: dict[str, float], after: dict[str, float], count: int, unit: str,
               rate: float | None = None) -> None:
    """Print the CPU milliseconds per ``unit`` of each process between two samples;
    with ``rate`` (units/s achieved), the saturation point of each Python process and
    what :data:`TARGET` would take."""
    shares = {name: 1000 * (after.get(name, 0.0) - before.get(name, 0.0)) / count
              for name in after}
    total = sum(shares.values())
    cores = len(os.sched_getaffinity(0))
    print(f"  CPU per {unit}: " + ", ".join(f"{n} {v:.1f} ms" for n, v in shares.items())
          + f"; total {total:.1f} ms ({cores} CPUs: at most {cores * 1000 / total:.0f} "
          f"{unit}s/s with every core busy)", flush=True)
    if rate is None:
        return
    python = {n: v for n, v in shares.items()
              if n not in ("postgres", "rabbitmq", "bench clients") and v > 0}
    caps = ", ".join(f"{n} {1000 / v:.0f}/s" for n, v in python.items())
    print(f"  one core each saturates at: {caps} (achieved {rate:.0f}/s)", flush=True)
    kinds: dict[str, float] = {}
    for name, value in python.items():
        kind = name.rstrip("0123456789")
        kinds[kind] = kinds.get(kind, 0.0) + value
    need = ", ".join(f"{-(-TARGET * v // 1000):.0f} {k} process(es)" for k, v in kinds.items())
    print(f"  {TARGET} {unit}s/s would take at least {TARGET * total / 1000:.1f} cores and "
          f"{need}, at these costs", flush=True)


def cloud_file(path: Path, hosts: int) -> None:
    """``hosts`` identical hosts, no aggregates."""
    path.write_text(
        "hosts:\n"
        f'  - {{host: "n{{index:05d}}", count: {hosts}, vcpus: 32, memory_mb: 131072, '
        "local_gb: 2000, cpu_allocation_ratio: 4.0}\n")


def boots(urls: list[str], args: argparse.Namespace) -> dict[str, float]:
    """``--warmup`` + ``--boots`` single boots from ``--clients`` threads."""
    latencies: list[float] = []
    lock = threading.Lock()
    counter = iter(range(args.boots + args.warmup))

    def client(index: int) -> None:
        with httpx.Client(timeout=120, headers=ADMIN) as http:
            url = urls[index % len(urls)] + "/boot"
            for n in counter:
                t0 = time.perf_counter()
                resp = http.post(url, json={"flavor": FLAVORS[n % 3]})
                took = time.perf_counter() - t0
                if resp.status_code != 200:
                    raise SystemExit(f"boot {n}: {resp.status_code} {resp.text[:300]}")
                if n >= args.warmup:
                    with lock:
                        latencies.append(took)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.clients) as pool:
        for f in [pool.submit(client, i) for i in range(args.clients)]:
            f.result()
    wall = time.perf_counter() - t0
    latencies.sort()
    return {"boots_per_s": (args.boots + args.warmup) / wall,
            "p50_ms": 1000 * statistics.median(latencies),
            "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))]}


def run(args: argparse.Namespace, counts: list[int]) -> None:
    """One cluster: registration, then the boots with each scheduler count in turn
    (schedulers are added between the rounds)."""
    with tempfile.TemporaryDirectory(prefix="berth-bench-") as tmp, \
            fresh_pg_database("berth_bench") as db, rabbit_vhost("berth_bench") as bus:
        cloud = Path(tmp) / "cloud.yaml"
        cloud_file(cloud, args.hosts)
        cluster = LocalCluster(Path(tmp) / "run", db, bus, cloud, schedulers=0, apis=args.apis,
                               options={"DEFAULT": {"report_interval": 10,
                                                    "service_down_time": 60}},
                               ready_timeout=1800,
                               api_args=("--threads", str(args.api_threads)),
                               compute_args=("--threads", str(args.fleet_threads)))
        try:
            cluster.workdir.mkdir(parents=True)
            cluster.write_conf()
            for i in range(args.apis):
                cluster.start_api(f"api{i}")
            started = time.perf_counter()
            before = cpu_sample(cluster)
            line = cluster.start_compute()
            ready = time.perf_counter() - started
            fleet_s = float(line.split(" registered in ")[1].split()[0])
            print(f"registration of {args.hosts} hosts: {fleet_s:.1f} s in the fleet "
                  f"({args.hosts / fleet_s:.0f} hosts/s; process ready after {ready:.1f} s)",
                  flush=True)
            cpu_report(before, cpu_sample(cluster), args.hosts, "host")
            running = 0
            for count in counts:
                while running < count:
                    cluster.start_scheduler(f"scheduler{running}")
                    running += 1
                urls = cluster.alive_urls()
                for url in urls:
                    cluster.wait_hosts(url, args.hosts, timeout=600)
                time.sleep(2)
                before = cpu_sample(cluster)
                figures = boots(urls, args)
                after = cpu_sample(cluster)
                print(f"schedulers={count}: {figures['boots_per_s']:.1f} boots/s, "
                      f"p50 {figures['p50_ms']:.0f} ms, p99 {figures['p99_ms']:.0f} ms", flush=True)
                cpu_report(before, after, args.boots + args.warmup, "boot",
                           rate=figures["boots_per_s"])
                for name in [n for n in cluster.procs if n.startswith("scheduler")]:
                    stats = [ln for ln in cluster.log(name).splitlines() if "in-scheduler" in ln]
                    if stats:
                        print(f"  {name}: {stats[-1].split(' INFO berth.service ')[-1]}")
        finally:
            cluster.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=10_000)
    parser.add_argument("--boots", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--apis", type=int, default=2)
    parser.add_argument("--api-threads", type=int, default=16,
                        help="server threads of each berth api (its --threads)")
    parser.add_argument("--fleet-threads", type=int, default=16,
                        help="registration threads of the fleet (berth compute --threads)")
    parser.add_argument("--schedulers", default="1,4",
                        help="comma-separated counts (0: registration only)")
    parser.add_argument("--cpus", default=None, metavar="LIST",
                        help="run everything, PostgreSQL and RabbitMQ included, on these "
                        "CPUs only (taskset's list: 0, 0,1, 0-3)")
    args = parser.parse_args()
    cpus = parse_cpus(args.cpus) if args.cpus is not None else None
    reason = rabbit_unavailable()
    if reason:
        print(f"skipped: {reason}")
        return 1
    saved: dict[int, set[int]] = {}
    if cpus is not None:
        saved = pin_services(cpus)
        os.sched_setaffinity(0, cpus)  # the processes the bench starts inherit it
    try:
        print(f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.1f}, "
              f"{len(os.sched_getaffinity(0))} CPUs"
              f"{f' (pinned: {args.cpus}, PostgreSQL and RabbitMQ too)' if cpus else ''}; "
              f"{args.hosts} hosts, {args.boots} boots, {args.clients} clients, "
              f"{args.apis} API processes")
        run(args, sorted(int(c) for c in args.schedulers.split(",") if int(c) > 0))
    finally:
        unpin(saved)
    return 0


if __name__ == "__main__":
    sys.exit(main())
