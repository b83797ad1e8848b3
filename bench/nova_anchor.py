"""Nova 34's own filter scheduler on the hosts of a Berth bench: the anchor of bench/core.py.

Run by bench/core.py under the Python of Nova's own environment (``make nova-env``:
``.venv-nova``), never imported by Berth:

    .venv-nova/bin/python bench/nova_anchor.py CASE.json --repeat 5

``CASE.json`` (written by bench/core.py) holds the hosts as compute node and service
records, the aggregates, each host's instances, and the request (flavor, image
properties, project). Nova's ``HostState`` objects are built once the way Nova's
``HostManager`` builds them (``HostState.update`` with a ``ComputeNode``, the service,
the aggregates and the instances), outside the timing, as Berth's snapshot is. Timed per
request, as in Nova's ``SchedulerManager._get_sorted_hosts``: ``get_filtered_hosts``
then ``get_weighed_hosts`` with nova.conf's defaults (Nova 34's ``enabled_filters`` and
every weigher). Prints one JSON line: the median and each run in milliseconds, and how
many hosts passed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from typing import Any


def _setup() -> tuple[Any, Any]:
    from nova import config, objects
    from nova.scheduler import host_manager

    objects.register_all()
    config.parse_args(["nova-anchor"], default_config_files=[])
    return objects, host_manager


def _host_manager(host_manager: Any) -> Any:
    """A HostManager without its database start-up (cells, aggregates, instances): the
    hosts come from the case file instead."""
    cls = host_manager.HostManager
    cls.refresh_cells_caches = lambda self: None
    cls._init_aggregates = lambda self: None
    cls._init_instance_info = lambda self: None
    return cls()


def _host_states(case: dict[str, Any], objects: Any, host_manager: Any) -> list[Any]:
    from oslo_utils import timeutils

    # Nova's clock stands still at the instant the ages are counted from: building
    # 100,000 host states takes minutes, longer than service_down_time.
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    timeutils.set_time_override(now)
    aggs_by_host: dict[str, list[Any]] = {}
    for a in case["aggregates"]:
        agg = objects.Aggregate(id=a["id"], uuid=a["uuid"], name=a["name"],
                                hosts=list(a["hosts"]), metadata=dict(a["metadata"]))
        for h in a["hosts"]:
            aggs_by_host.setdefault(h, []).append(agg)
    states = []
    wanted = set(case["candidates"])
    for i, h in enumerate(case["hosts"]):
        if h["uuid"] not in wanted:
            continue  # placement did not return it: Nova's scheduler never sees it
        node = objects.ComputeNode(
            id=i + 1, uuid=h["uuid"], host=h["host"], hypervisor_hostname=h["nodename"],
            vcpus=h["vcpus_total"], vcpus_used=h["vcpus_used"],
            memory_mb=h["total_usable_ram_mb"], free_ram_mb=h["free_ram_mb"],
            memory_mb_used=h["total_usable_ram_mb"] - h["free_ram_mb"],
            local_gb=h["total_usable_disk_gb"], local_gb_used=h["disk_mb_used"] // 1024,
            free_disk_gb=h["free_disk_mb"] // 1024, disk_available_least=None,
            hypervisor_type=h["hypervisor_type"], hypervisor_version=h["hypervisor_version"],
            cpu_info=h["cpu_info"], host_ip=h["host_ip"],
            supported_hv_specs=[objects.HVSpec.from_list(s) for s in h["supported_instances"]],
            stats=dict(h["stats"]), numa_topology=None,
            pci_device_pools=objects.PciDevicePoolList(objects=[]),
            cpu_allocation_ratio=h["cpu_allocation_ratio"],
            ram_allocation_ratio=h["ram_allocation_ratio"],
            disk_allocation_ratio=h["disk_allocation_ratio"],
            metrics="[]", running_vms=int(h["stats"].get("num_instances", 0)),
            current_workload=int(h["stats"].get("io_workload", 0)),
            updated_at=now - dt.timedelta(seconds=h["updated_age"]))
        beat = now - dt.timedelta(seconds=h["heartbeat_age"])
        service = {"id": i + 1, "host": h["host"], "binary": "nova-compute",
                   "topic": "compute", "disabled": h["disabled"], "disabled_reason": None,
                   "forced_down": False, "last_seen_up": beat, "updated_at": beat,
                   "created_at": beat, "report_count": 1, "version": 70}
        instances = {u: objects.Instance(uuid=u, project_id=p, host=h["host"])
                     for u, p in h["instances"].items()}
        state = host_manager.HostState(h["host"], h["nodename"], h["cell_uuid"])
        state.update(node, service, aggs_by_host.get(h["host"], []), instances)
        states.append(state)
    return states


def _request(case: dict[str, Any], objects: Any) -> Any:
    r = case["request"]
    flavor = objects.Flavor(id=r["flavor"]["id"], flavorid=str(r["flavor"]["id"]),
                            name=r["flavor"]["name"], vcpus=r["flavor"]["vcpus"],
                            memory_mb=r["flavor"]["memory_mb"], root_gb=r["flavor"]["root_gb"],
                            ephemeral_gb=r["flavor"]["ephemeral_gb"], swap=r["flavor"]["swap"],
                            extra_specs=dict(r["flavor"]["extra_specs"]), vcpu_weight=0,
                            rxtx_factor=1.0, is_public=True, disabled=False)
    image = objects.ImageMeta.from_dict({"id": r["image"]["id"], "name": "image",
                                         "properties": dict(r["image"]["properties"])})
    return objects.RequestSpec(
        flavor=flavor, image=image, num_instances=1, project_id=r["project_id"],
        user_id="user", scheduler_hints={}, instance_group=None, ignore_hosts=None,
        force_hosts=None, force_nodes=None, requested_destination=None, retry=None,
        availability_zone=None, is_bfv=False, instance_uuid="00000000-0000-4000-8000-00000000aaaa")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with open(args.case) as f:
        case = json.load(f)
    objects, host_manager = _setup()
    manager = _host_manager(host_manager)
    states = _host_states(case, objects, host_manager)
    spec = _request(case, objects)
    runs = []
    passed = 0
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        hosts = manager.get_filtered_hosts(states, spec)
        weighed = manager.get_weighed_hosts(hosts, spec)
        runs.append(1000 * (time.perf_counter() - t0))
        passed = len(weighed)
    print(json.dumps({"hosts": len(states), "passed": passed, "median_ms": statistics.median(runs),
                      "runs_ms": runs, "filters": [type(f).__name__ for f in manager.enabled_filters],
                      "weighers": [type(w).__name__ for w in manager.weighers]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
