"""Start-up and restart times of the processes an operator restarts (not a test).

    .venv/bin/python bench/restarts.py --hosts 10000
    .venv/bin/python bench/restarts.py --hosts 3000 --only serve

``serve`` (SQLite in a scratch directory, as ``berth serve`` runs by default), seconds from
the command to the first HTTP answer:

* ``berth serve --cloud FILE`` on a new database (every host registered);
* ``berth serve`` again on that database (the stored hosts resumed);
* ``berth serve --cloud FILE`` again (the same file registered over the stored hosts).

``fleet`` (PostgreSQL and RabbitMQ on this machine, two ``berth api``): the seconds a
``berth compute --fleet`` took to register every host (its ready line), on a new
database and again after a SIGKILL of it (the restart reads what placement holds and
writes what differs). Printed with how many providers changed generation across the
restart (0: nothing was written).

The cloud is ``--hosts`` identical hosts (bench/end_to_end_bus.py's).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from end_to_end_bus import cloud_file  # noqa: E402

from berth.service.localcluster import LocalCluster, free_port, rabbit_vhost  # noqa: E402
from pgdb import fresh_pg_database  # noqa: E402

ADMIN = {"X-Auth-Token": "admin"}


def serve_until_listening(db: Path, *extra: str) -> float:
    """Start ``berth serve`` on ``db``; the seconds until it answers; then stop it."""
    port = free_port()
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "berth.cli", "serve", "--db", f"sqlite:///{db}", "--port",
         str(port), "--auth-strategy", "noauth2", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"berth serve exited ({proc.returncode})")
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=5)
                return time.perf_counter() - started
            except httpx.HTTPError:
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def serve(hosts: int) -> None:
    with tempfile.TemporaryDirectory(prefix="berth-restarts-") as tmp:
        cloud = Path(tmp) / "cloud.yaml"
        cloud_file(cloud, hosts)
        db = Path(tmp) / "berth.sqlite"
        fresh = serve_until_listening(db, "--cloud", str(cloud))
        resumed = serve_until_listening(db)
        again = serve_until_listening(db, "--cloud", str(cloud))
    print(f"berth serve, {hosts} hosts: listening after {fresh:.1f} s on a new database, "
          f"{resumed:.1f} s resumed, {again:.1f} s with the same cloud file again", flush=True)


def generations(url: str) -> dict[str, int]:
    providers = httpx.get(url + "/placement/resource_providers", headers=ADMIN,
                          timeout=120).json()["resource_providers"]
    return {p["name"]: p["generation"] for p in providers}


def fleet(hosts: int) -> None:
    with tempfile.TemporaryDirectory(prefix="berth-restarts-") as tmp, \
            fresh_pg_database("berth_restarts") as db, rabbit_vhost("berth_restarts") as bus:
        cloud = Path(tmp) / "cloud.yaml"
        cloud_file(cloud, hosts)
        cluster = LocalCluster(Path(tmp) / "run", db, bus, cloud, schedulers=0, apis=2,
                               options={"DEFAULT": {"report_interval": 10,
                                                    "service_down_time": 60}},
                               ready_timeout=1800)
        try:
            cluster.workdir.mkdir(parents=True)
            cluster.write_conf()
            for i in range(2):
                cluster.start_api(f"api{i}")
            first = cluster.start_compute("compute")
            url = next(iter(cluster.urls.values()))
            before = generations(url)
            cluster.kill("compute")
            second = cluster.start_compute("compute2")
            after = generations(url)
        finally:
            cluster.close()
    took = [float(line.split(" registered in ")[1].split()[0]) for line in (first, second)]
    changed = sum(1 for name, gen in after.items() if before.get(name) != gen)
    print(f"berth compute --fleet, {hosts} hosts: registered in {took[0]:.1f} s on a new "
          f"database, {took[1]:.1f} s after a SIGKILL; {changed} of {len(after)} providers "
          "written by the restart", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, nargs="+", default=[10_000])
    parser.add_argument("--only", choices=("serve", "fleet"))
    args = parser.parse_args()
    print(f"# {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.1f}, "
          f"{os.cpu_count()} CPUs", flush=True)
    for hosts in args.hosts:
        if args.only in (None, "serve"):
            serve(hosts)
        if args.only in (None, "fleet"):
            fleet(hosts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
