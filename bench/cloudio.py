"""What `berth cloud import` / `export` cost past the reads: the emitter (joining nodes
with their provider trees, validating, and loading the result once as a check), writing
the file as YAML and as JSON, and loading each back as `berth schedule` does.

    python bench/cloudio.py [--hosts 2000] [--servers-per-host 10]

The cloud is synthetic: every host a root provider with VCPU/MEMORY_MB/DISK_GB and a
trait, 300 flavors, 100 images, ten AZ aggregates, N x servers-per-host instances.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import uuid

from berth.cloudfile import load_cloud
from berth.cloudio.emit import dump, to_document
from berth.cloudio.state import CloudState, ComputeNode, Provider, Server


def _inventory(total: int, **fields: float) -> dict[str, float]:
    return {"total": total, "reserved": 0, "min_unit": 1, "max_unit": total, "step_size": 1,
            "allocation_ratio": 1.0, **fields}


def synthetic(hosts: int, per_host: int) -> CloudState:
    """A cloud of ``hosts`` compute nodes and ``hosts * per_host`` servers."""
    state = CloudState(source="bench")
    for i in range(hosts):
        node_uuid = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"node{i}"))
        state.nodes.append(ComputeNode(f"h{i}", f"h{i}", node_uuid, service={"up": True},
                                       fields={"hypervisor_type": "QEMU",
                                               "cpu_info": {"arch": "x86_64"}}))
        state.providers.append(Provider(
            node_uuid, f"h{i}", None, node_uuid,
            {"VCPU": _inventory(64, allocation_ratio=4.0),
             "MEMORY_MB": _inventory(262144, reserved=512), "DISK_GB": _inventory(2000)},
            traits=["CUSTOM_RACK_A"]))
    state.flavors = [{"name": f"f{j}", "vcpus": 1 + j % 8, "memory_mb": 1024 * (1 + j % 16),
                      "root_gb": 10, "extra_specs": {"hw:cpu_policy": "shared"}}
                     for j in range(300)]
    state.images = [{"name": f"img{j}", "id": str(uuid.uuid4()), "disk_format": "qcow2",
                     "properties": {"hw_architecture": "x86_64"}} for j in range(100)]
    for k in range(hosts * per_host):
        state.servers.append(Server(str(uuid.uuid4()), f"h{k % hosts}", f"h{k % hosts}",
                                    flavor=f"f{k % 300}", image=f"img{k % 100}",
                                    project_id="p"))
    state.aggregates = [{"name": f"az{a}", "availability_zone": f"az{a}",
                         "hosts": [f"h{i}" for i in range(a, hosts, 10)], "metadata": {}}
                        for a in range(10)]
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=2000)
    parser.add_argument("--servers-per-host", type=int, default=10)
    args = parser.parse_args()
    state = synthetic(args.hosts, args.servers_per_host)
    start = time.perf_counter()
    doc = to_document(state)
    emitted = time.perf_counter() - start
    print(f"{args.hosts} hosts, {len(state.servers)} instances; load average "
          f"{os.getloadavg()[0]:.1f}")
    print(f"  to_document (with its load check): {emitted:.2f} s")
    with tempfile.TemporaryDirectory() as directory:
        for fmt in ("yaml", "json"):
            path = os.path.join(directory, f"cloud.{fmt}")
            start = time.perf_counter()
            dump(doc, path, fmt)
            written = time.perf_counter() - start
            start = time.perf_counter()
            load_cloud(path)
            loaded = time.perf_counter() - start
            print(f"  {fmt}: write {written:.2f} s, load {loaded:.2f} s, "
                  f"{os.path.getsize(path) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
