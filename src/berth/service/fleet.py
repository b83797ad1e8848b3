"""The compute side of ``berth compute``: the agents of one process, and the machine's own node.

A :class:`Fleet` holds the :class:`~berth.service.compute.ComputeAgent` of every host
this process runs — the one real machine (:func:`local_node`), or a cloud file's hosts
simulated with the fake driver (``--fleet``) — and does for all of them what one
agent does for itself, in bulk:

* **registration** (:meth:`Fleet.register`): every agent registers with the Placement
  API over HTTP as Nova's resource tracker does (provider, inventories with reserved
  amounts and ratios, traits, aggregates), from a pool of threads; the stored reports
  are read once up front and the new ones written in one batch at the end; which
  process runs each host goes to the agent directory. A host with a stored report (a
  restart) first reads what placement holds of its provider and writes only what
  differs, as Nova's resource tracker does. Heartbeats start with the first
  registered host, so no host waits for the others to be counted up;
* **reports** (:meth:`Fleet.start`, a :class:`~berth.service.reporting.Reporter`):
  after every build or destroy a host reports its whole state at once; every
  ``report_interval`` each registered host sends its heartbeat, and once every
  :data:`~berth.service.reporting.WHOLE_EVERY` rounds its whole state again (see
  :mod:`berth.service.reports` for what reaches the database). At 10,000 hosts building
  every report each round cost the process ~4 s of CPU per round.
"""

from __future__ import annotations

import logging
import os
import platform
import shutil
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from berth.config import SchedulerConfig
from berth.model.aggregate import Aggregate
from berth.model.request import CellMapping
from berth.placement.client import PlacementClient
from berth.provider_tree import cpu_traits
from berth.service.compute import ComputeAgent, ComputeNodeSpec, ServiceSwitches, held_provider
from berth.service.compute_rpc import AgentDirectory
from berth.service.reporting import Reporter
from berth.service.reports import BusRecordStore

LOG = logging.getLogger(__name__)


class Fleet:
    """The agents of one ``berth compute`` process."""

    def __init__(self, nodes: Sequence[ComputeNodeSpec], aggregates: Sequence[Aggregate] | None,
                 *, client: PlacementClient, records: BusRecordStore, directory: AgentDirectory,
                 config: SchedulerConfig, server: str,
                 services: Mapping[str, ServiceSwitches] | None = None,
                 cells: Sequence[CellMapping] | None = None) -> None:
        """``services``: the switches the cloud file sets on its hosts' compute services
        (:func:`~berth.service.seeding.file_services`), taken as each host registers,
        before its first report. ``cells``: the file's cell mappings, stored with the
        aggregates (which schedulers leave out when disabled)."""
        self.config = config
        self.services = dict(services or {})
        self.client = client
        self.records = records
        self.directory = directory
        self.server = server
        #: None: this process owns no aggregates (the database's stay as they are).
        self.aggregates = None if aggregates is None else list(aggregates)
        self.cells = None if cells is None else list(cells)
        self.agents: dict[str, ComputeAgent] = {}
        for node in nodes:
            if node.host in self.agents:
                raise ValueError(f"host {node.host}: listed twice")
            self.agents[node.host] = ComputeAgent(node, client, records, config)
        self._registered: list[ComputeAgent] = []
        self._reg_lock = threading.Lock()
        self.reporter = Reporter(self.registered, records, resend=records.resend)
        #: Seconds the last :meth:`register` took.
        self.registration_s = 0.0

    def register(self, threads: int = 16) -> float:
        """Register every host (see the module doc); returns the seconds it took."""
        started = time.perf_counter()
        self.records.preload([a.uuid for a in self.agents.values()])
        if self.aggregates is not None:
            self.records.set_aggregates(self.aggregates, self.cells)
        self.directory.register(self.agents, self.server)
        aggregates = self.aggregates if self.aggregates is not None else self.records.aggregates()
        self.records.begin_deferred()
        try:
            def one(agent: ComputeAgent) -> None:
                if self.records.report_of(agent.uuid) is not None:
                    # A restart: read what placement holds, write only what differs.
                    held = held_provider(self.client, agent.uuid)
                    if held is not None:
                        agent.adopt(held)
                agent.register(aggregates, self.services.get(agent.node.host))
                with self._reg_lock:
                    self._registered.append(agent)

            with ThreadPoolExecutor(max(1, threads), thread_name_prefix="register") as pool:
                for future in [pool.submit(one, a) for a in self.agents.values()]:
                    future.result()
        finally:
            self.records.end_deferred()
        if self.aggregates is not None:
            self.records.announce_aggregates()
        self.registration_s = time.perf_counter() - started
        return self.registration_s

    def registered(self) -> list[ComputeAgent]:
        """The agents registered so far (the ones that report), less those retired
        since (their service deleted: gone from :attr:`agents`)."""
        agents = self.agents
        with self._reg_lock:
            return [a for a in self._registered if agents.get(a.node.host) is a]

    def start(self, interval: float | None = None) -> None:
        """Report every ``interval`` seconds (``[DEFAULT] report_interval``), from now
        on: hosts registered meanwhile join the next round."""
        self.reporter.start(float(interval if interval is not None
                                  else self.config.report_interval))

    def stop(self) -> None:
        """Stop the periodic reports."""
        self.reporter.stop()


# --------------------------------------------------------------------------- the machine
def local_node(host: str | None = None, *, disk_path: str = "/") -> ComputeNodeSpec:
    """The machine this process runs on, as a compute node: CPUs, memory (MemTotal),
    the disk holding ``disk_path``, and the CPU model, vendor, topology and flags from
    ``/proc/cpuinfo`` (``cpu_info`` in Nova's libvirt shape, and the ``HW_CPU_X86_*``
    traits os-traits knows for the flags)."""
    name = host or socket.gethostname()
    vcpus = os.cpu_count() or 1
    memory_mb = _meminfo_mb("MemTotal") or 1
    local_gb = max(1, shutil.disk_usage(disk_path).total // (1 << 30))
    cpu = _cpuinfo()
    arch = platform.machine() or "x86_64"
    flags = sorted(cpu.get("flags", "").split())
    cpu_info = {
        "arch": arch, "vendor": cpu.get("vendor_id", ""), "model": cpu.get("model name", ""),
        "topology": {"sockets": int(cpu.get("physical_ids", 1)) or 1,
                     "cores": int(cpu.get("cpu cores", vcpus) or vcpus), "threads": 1},
        "features": flags,
    }
    kvm = os.path.exists("/dev/kvm")
    supported = [[arch, "kvm", "hvm"]] if kvm else []
    supported.append([arch, "qemu", "hvm"])
    return ComputeNodeSpec(host=name, vcpus=vcpus, memory_mb=memory_mb, local_gb=int(local_gb),
                           hypervisor_type="QEMU", cpu_info=cpu_info,
                           supported_instances=supported, host_ip=_host_ip(name),
                           traits=cpu_traits(flags))


def _meminfo_mb(key: str) -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                name, _, rest = line.partition(":")
                if name == key:
                    return int(rest.split()[0]) // 1024
    except OSError:
        pass
    return 0


def _cpuinfo() -> dict[str, Any]:
    """The first processor's fields of /proc/cpuinfo, plus the number of sockets."""
    info: dict[str, Any] = {}
    sockets: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, sep, value = line.partition(":")
                if not sep:
                    continue
                key, value = key.strip(), value.strip()
                if key == "physical id":
                    sockets.add(value)
                info.setdefault(key, value)
    except OSError:
        pass
    info["physical_ids"] = max(1, len(sockets))
    return info


def _host_ip(name: str) -> str | None:
    try:
        return socket.gethostbyname(name)
    except OSError:
        return None
