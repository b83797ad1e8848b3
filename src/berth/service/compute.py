"""The compute agent: a compute node's registration with Placement and its reports.

A compute node publishes two things, as Nova's resource tracker does:

* to **Placement** (through the typed client): its resource provider (uuid = the compute
  node uuid), inventories — VCPU, MEMORY_MB, DISK_GB with ``reserved`` from the DEFAULT
  ``reserved_*`` options and the allocation ratios resolved per reference §10.3/§11.4,
  PCPU (ratio 1) when it has dedicated CPUs — its traits (``COMPUTE_STATUS_DISABLED``
  while the service is disabled) and its aggregate membership;
* to the **compute-record store** (:mod:`berth.service.records`): its report, whenever
  it changes, and its heartbeat.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from berth.config import SchedulerConfig
from berth.errors import BerthError, InputError
from berth.hardware.numa import (
    InstanceNUMATopology,
    NUMAUsageError,
    numa_fit_instance_to_host,
    numa_usage_from_instance_numa,
)
from berth.hardware.pci import InstancePCIRequest, PciRequestFailed, requests_of
from berth.model.aggregate import Aggregate
from berth.model.compute import Instance, MetricItem, ServiceRecord
from berth.model.request import Flavor
from berth.placement.client import ConflictError, NotFoundError, PlacementClient
from berth.provider_tree import ProviderSpec
from berth.service.records import ComputeRecordStore, record_to_report, report_to_record
from berth.snapshot import HostRecord

LOG = logging.getLogger(__name__)

STATUS_DISABLED_TRAIT = "COMPUTE_STATUS_DISABLED"


# --------------------------------------------------------------------------- agent
@dataclass
class ComputeNodeSpec:
    """What a compute node is: its size, capabilities and placement traits.

    ``vcpus`` are shared (VCPU) CPUs and ``pcpus`` dedicated ones (PCPU, like
    ``[compute] cpu_dedicated_set``). Ratios None resolve per reference §10.3.
    ``stats`` are extra host stats reported as they are (ComputeCapabilitiesFilter's
    ``stats.*`` keys); ``io_workload`` is the I/O-heavy operations the node runs besides
    this system's builds (the ``io_workload`` stat, IoOpsFilter's ``num_io_ops``).
    """

    host: str
    vcpus: int
    memory_mb: int
    local_gb: int
    uuid: str | None = None
    nodename: str | None = None
    cell_uuid: str | None = None
    pcpus: int = 0
    hypervisor_type: str = "QEMU"
    hypervisor_version: int = 8002000
    cpu_info: Mapping[str, Any] | str = field(default_factory=dict)
    supported_instances: list[list[str]] = field(
        default_factory=lambda: [["x86_64", "qemu", "hvm"]])
    host_ip: str | None = None
    numa_topology: Any = None
    pci_stats: Any = None
    metrics: list[MetricItem] = field(default_factory=list)
    traits: list[str] = field(default_factory=list)
    cpu_allocation_ratio: float | None = None
    ram_allocation_ratio: float | None = None
    disk_allocation_ratio: float | None = None
    stats: dict[str, str] = field(default_factory=dict)
    io_workload: int = 0
    #: Inventories of the root provider beyond VCPU, PCPU, MEMORY_MB and DISK_GB
    #: (custom classes, VGPU...), each a full Placement inventory record.
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Providers nested under the root (NUMA cells, PCI PFs...), each after its parent.
    children: list[ProviderSpec] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("vcpus", "memory_mb", "local_gb", "pcpus", "io_workload"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InputError(f"compute node {self.host}: {name} must be an integer >= 0, "
                                 f"got {value!r}")
        if self.uuid is None:
            from berth.cloudfile import stable_uuid

            self.uuid = stable_uuid("node", self.host, self.nodename or self.host)


def agent_key(host: str, nodename: str | None) -> str:
    """The name a compute node's agent goes by (``Stack.agents``, the fake driver): the
    host name when the node is named like its host, else ``host/node`` — the nodes of a
    multi-node service host (Ironic) each have their own agent."""
    return host if not nodename or nodename == host else f"{host}/{nodename}"


#: Stats an agent computes itself; any other stat of a node is its own (``node.stats``).
AGENT_STATS = frozenset({"num_instances", "io_workload", "failed_builds"})


def node_from_record(record: HostRecord, traits: Iterable[str] = (), pcpus: int = 0) -> ComputeNodeSpec:
    """The node a stored record describes, for an agent re-created on a restart.

    A record does not hold what only placement knows: the provider's ``traits``
    (COMPUTE_STATUS_DISABLED is the service's state, not the node's, and is dropped)
    and its PCPU total (``pcpus``). The ratios are the record's resolved ones.
    """
    stats = {str(k): str(v) for k, v in (record.stats or {}).items() if k not in AGENT_STATS}
    raw_io = str((record.stats or {}).get("io_workload", "0"))
    io_workload = int(raw_io) if raw_io.isdigit() else 0
    if not raw_io.isdigit():
        stats["io_workload"] = raw_io  # reported as the node reported it
    return ComputeNodeSpec(
        host=record.host, nodename=record.nodename, uuid=record.uuid, cell_uuid=record.cell_uuid,
        vcpus=int(record.vcpus_total), memory_mb=int(record.total_usable_ram_mb),
        local_gb=int(record.total_usable_disk_gb), pcpus=pcpus,
        hypervisor_type=record.hypervisor_type or "QEMU",
        hypervisor_version=int(record.hypervisor_version or 0), cpu_info=record.cpu_info,
        supported_instances=[list(s) for s in record.supported_instances],
        host_ip=record.host_ip, numa_topology=record.numa_topology, pci_stats=record.pci_stats,
        metrics=list(record.metrics), traits=sorted(set(traits) - {STATUS_DISABLED_TRAIT}),
        cpu_allocation_ratio=record.cpu_allocation_ratio,
        ram_allocation_ratio=record.ram_allocation_ratio,
        disk_allocation_ratio=record.disk_allocation_ratio,
        stats=stats, io_workload=io_workload)


def resolved_ratio(value: float | None, kind: str, config: SchedulerConfig) -> float:
    """A node's ratio: its own when set and non-zero, else the option, else initial_*."""
    if value:
        return float(value)
    configured = getattr(config, f"{kind}_allocation_ratio")
    if configured:
        return float(configured)
    return float(getattr(config, f"initial_{kind}_allocation_ratio"))


def inventories_for(node: ComputeNodeSpec, config: SchedulerConfig) -> dict[str, dict[str, Any]]:
    """The inventories the node reports to placement (reference §8.5, capacity rule)."""
    inv: dict[str, dict[str, Any]] = {}
    if node.vcpus:
        inv["VCPU"] = {"total": node.vcpus, "reserved": min(config.reserved_host_cpus, node.vcpus),
                       "min_unit": 1, "max_unit": node.vcpus, "step_size": 1,
                       "allocation_ratio": resolved_ratio(node.cpu_allocation_ratio, "cpu", config)}
    if node.pcpus:
        inv["PCPU"] = {"total": node.pcpus, "reserved": 0, "min_unit": 1,
                       "max_unit": node.pcpus, "step_size": 1, "allocation_ratio": 1.0}
    if node.memory_mb:
        inv["MEMORY_MB"] = {
            "total": node.memory_mb,
            "reserved": min(config.reserved_host_memory_mb, node.memory_mb),
            "min_unit": 1, "max_unit": node.memory_mb, "step_size": 1,
            "allocation_ratio": resolved_ratio(node.ram_allocation_ratio, "ram", config)}
    if node.local_gb:
        inv["DISK_GB"] = {
            "total": node.local_gb,
            "reserved": min(math.ceil(config.reserved_host_disk_mb / 1024), node.local_gb),
            "min_unit": 1, "max_unit": node.local_gb, "step_size": 1,
            "allocation_ratio": resolved_ratio(node.disk_allocation_ratio, "disk", config)}
    for rc, extra in node.resources.items():
        inv[rc] = dict(extra)
    return inv


@dataclass(frozen=True)
class ServiceSwitches:
    """What a cloud file sets on a node's compute service: disabled (with its reason),
    forced down, and ``down_since``, the old heartbeat of a host the file says is down
    (it stays silent under it)."""

    disabled: bool = False
    disabled_reason: str | None = None
    forced_down: bool = False
    down_since: float | None = None


@dataclass(frozen=True)
class HeldProvider:
    """What placement holds of a node's root provider, as a restart reads it for every
    stored host at once (:meth:`~berth.service.stack.Stack.resume_agents`): the agent
    then writes only what differs (:meth:`ComputeAgent.adopt`)."""

    inventory: dict[str, dict[str, Any]]
    traits: frozenset[str]
    aggregates: frozenset[str]
    usages: dict[str, int]


def held_provider(client: Any, uuid: str) -> HeldProvider | None:
    """What placement holds of provider ``uuid``, through the API (its traits,
    inventories, aggregates and usages: what Nova's resource tracker reads of a provider
    that exists before it writes); None when there is no such provider."""
    try:
        _, traits = client.get_provider_traits(uuid)
        _, inventory = client.get_inventories(uuid)
        _, aggregates = client.get_aggregates(uuid)
        usages = client.provider_usages(uuid)
    except NotFoundError:
        return None
    return HeldProvider(dict(inventory), frozenset(traits), frozenset(aggregates), dict(usages))


def child_uuid(node: ComputeNodeSpec, name: str) -> str:
    """The uuid of the nested provider ``name`` of ``node`` (stable across runs)."""
    from berth.cloudfile import stable_uuid

    assert node.uuid is not None
    return stable_uuid("provider", node.uuid, name)


def publish_provider(client: PlacementClient, uuid: str, name: str, *,
                     parent: str | None = None, inventory: Mapping[str, Mapping[str, Any]],
                     traits: Sequence[str], aggregates: Sequence[str] | None = None) -> None:
    """Create the provider if it is missing, then replace its inventories, traits and
    (when given) aggregates, retrying on a generation conflict."""
    for attempt in range(5):
        try:
            try:
                generation = client.get_provider(uuid).generation
            except NotFoundError:
                try:
                    generation = client.create_provider(
                        name, uuid=uuid, parent_provider_uuid=parent).generation
                except ConflictError:  # created concurrently
                    generation = client.get_provider(uuid).generation
            for rc in inventory:
                if rc.startswith("CUSTOM_"):
                    client.create_resource_class(rc)
            generation = client.set_inventories(uuid, generation, inventory)
            for trait in traits:
                if trait.startswith("CUSTOM_"):
                    client.create_trait(trait)
            generation = client.set_provider_traits(uuid, generation, sorted(traits))
            if aggregates is not None:
                client.set_aggregates(uuid, generation, sorted(aggregates))
            return
        except ConflictError as exc:
            if not exc.is_generation_conflict or attempt == 4:
                raise
            LOG.debug("provider %s changed meanwhile; retrying", uuid)


@dataclass
class _Placed:
    instance: Instance
    flavor: Flavor
    #: What the instance holds of the node's NUMA cells and PCI pools: its fitted
    #: topology, and its PCI requests (taken again, in order, from the node's pools).
    numa: Any = None
    pci: Any = None


def _restored(instance: Instance, flavor: Flavor) -> _Placed:
    """An instance of a stored record, with the NUMA cells and PCI requests its record
    says it claimed."""
    claims = instance.claims or {}
    numa = claims.get("numa")
    pci = claims.get("pci")
    return _Placed(instance, flavor,
                   numa=InstanceNUMATopology.from_dict(numa) if numa else None,
                   pci=[InstancePCIRequest(**r) for r in pci] if pci else None)


class DeviceClaimFailed(BerthError):
    """The node cannot give an instance the NUMA cells or PCI devices it asks for now
    (Nova's compute claim failing: the build is rescheduled)."""

    code = "berth.compute.claim_failed"


def _same_state(a: HostRecord, b: HostRecord) -> bool:
    """Whether two records of a node differ in nothing but their heartbeat."""
    if a.service is not None and b.service is not None:
        b = replace(b, service=replace(b.service, last_seen_up=a.service.last_seen_up,
                                       updated_at=a.service.updated_at))
    return replace(b, updated=a.updated) == a


def _flavor_of(resources: Mapping[str, int], flavor_id: int | str | None) -> Flavor:
    """The flavor numbers an allocation on one node stands for (VCPU and PCPU are both
    the flavor's vCPUs; disk is root + ephemeral, counted here as root)."""
    return Flavor(name="restored", id=flavor_id,
                  vcpus=int(resources.get("VCPU", 0)) + int(resources.get("PCPU", 0)),
                  memory_mb=int(resources.get("MEMORY_MB", 0)),
                  root_gb=int(resources.get("DISK_GB", 0)))


def _int_stat(stats: Mapping[str, Any], key: str) -> int:
    try:
        return max(0, int(stats.get(key, 0) or 0))
    except (TypeError, ValueError):
        return 0


class ComputeAgent:
    """One compute node's reporter (Nova's resource tracker and service heartbeat).

    ``register()`` takes over the usage of the node's stored record (a restart), creates
    the provider and publishes everything; ``report()`` publishes state and heartbeat;
    ``spawn``/``destroy`` change the node's usage and report at once. The periodic
    reports of a process's agents come from one thread
    (:class:`~berth.service.reporting.Reporter`): mostly a heartbeat, now and then the
    whole state, and Placement again only after a publication that failed.

    The agent owns its provider's traits and aggregate membership: registration
    replaces them with the node's own, so nothing an earlier run published survives
    (traits set on the provider by other means are removed too).
    """

    def __init__(
        self,
        node: ComputeNodeSpec,
        client: PlacementClient,
        records: ComputeRecordStore,
        config: SchedulerConfig | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.client = client
        self.records = records
        self.config = config or SchedulerConfig.default()
        self.clock = clock
        self.disabled = False
        self.disabled_reason: str | None = None
        self.forced_down = False
        #: A silent agent does not report periodically (a host that is down); what it
        #: still publishes keeps its last heartbeat.
        self.silent = False
        #: Consecutive failed builds (reset by a successful one), reported as the
        #: ``failed_builds`` stat while ``[compute]
        #: consecutive_build_service_disable_threshold`` is non-zero.
        self.failed_builds = 0
        self.created_at = clock()
        #: The heartbeat of the last report (None before the first).
        self.last_heartbeat: float | None = None
        self._placed: dict[str, _Placed] = {}
        #: Instances moved away whose usage stays until the move is confirmed.
        self._held: dict[str, _Placed] = {}
        #: The node's NUMA topology and PCI pools with its instances' claims taken
        #: (None: to be worked out again).
        self._devices: tuple[Any, Any] | None = None
        #: Usage by workloads this system did not place (seeded clouds), as a flavor.
        self.baseline: Flavor | None = None
        #: Instances this system did not place and knows only by count (seeded clouds).
        self.baseline_instances = 0
        self._published_inventory: dict[str, dict[str, Any]] | None = None
        self._published_traits: set[str] | None = None
        #: What placement held when the agent was re-created (:meth:`adopt`), until
        #: the first :meth:`sync_placement` and :meth:`restore_usage` have used it.
        self._adopted: HeldProvider | None = None
        self._children_published = False
        #: The provider may differ from the node: nothing published yet, or the last
        #: :meth:`sync_placement` failed part-way (the periodic reports try again).
        self.placement_pending = True
        #: The last report published, heartbeat aside (:meth:`report` ``if_changed``).
        self._last_record: HostRecord | None = None
        self._lock = threading.RLock()

    @property
    def uuid(self) -> str:
        """The compute node uuid (= the root resource provider uuid)."""
        assert self.node.uuid is not None
        return self.node.uuid

    @property
    def down(self) -> bool:
        """The host does not run builds: its agent is silent or its service forced down."""
        return self.silent or self.forced_down

    # ----------------------------------------------------------------- placement side
    def traits(self) -> set[str]:
        """The provider traits: the node's plus COMPUTE_STATUS_DISABLED when disabled."""
        traits = set(self.node.traits)
        if self.disabled:
            traits.add(STATUS_DISABLED_TRAIT)
        return traits

    def _ensure_provider(self) -> tuple[int, bool]:
        """The provider's generation, and whether this call created it. An agent that
        has published nothing yet tries to create it first (a new host: one call)."""
        name = self.node.nodename or self.node.host
        # A 409 is read back by uuid, whatever created the provider: a restart, a
        # concurrent call, or this call sent twice (so it may go on a kept connection).
        if self._published_inventory is None:
            try:
                return self.client.create_provider(name, uuid=self.uuid,
                                                   repeatable=True).generation, True
            except ConflictError:  # it exists, or its name is taken
                pass
        try:
            return self.client.get_provider(self.uuid).generation, False
        except NotFoundError:
            try:
                return self.client.create_provider(name, uuid=self.uuid,
                                                   repeatable=True).generation, True
            except ConflictError:  # created concurrently
                return self.client.get_provider(self.uuid).generation, False

    def sync_placement(self, aggregates: Sequence[Aggregate] | None = None) -> None:
        r"""Publish inventories and traits when they differ from what this agent last
        published (always on its first call, so a provider left from an earlier run
        loses what the node no longer has; unless the agent :meth:`adopt`\ ed what
        placement holds, when only what differs from that is written), and, when
        ``aggregates`` is given, the node's membership in them — an empty membership
        too. A provider this call created has no traits or aggregates yet, so empty ones
        are not written to it."""
        with self._lock:
            inventory = inventories_for(self.node, self.config)
            traits = self.traits()
            mine = (sorted(a.uuid for a in aggregates if self.node.host in a.hosts)
                    if aggregates is not None else None)
            adopted, self._adopted = self._adopted, None
            if (adopted is not None and inventory == adopted.inventory
                    and traits == adopted.traits
                    and (mine is None or set(mine) == adopted.aggregates)):
                # A restart: placement holds all this already (no write, as Nova's
                # resource tracker writes only what differs from what it read).
                self._sync_children()
                self.placement_pending = False
                return
            if (aggregates is None and not self.placement_pending
                    and inventory == self._published_inventory
                    and traits == self._published_traits):
                return  # the provider holds all this already: no call (as Nova's cache)
            self.placement_pending = True
            for attempt in range(5):
                generation, created = self._ensure_provider()
                try:
                    if inventory != self._published_inventory:
                        for rc in inventory:
                            if rc.startswith("CUSTOM_"):
                                self.client.create_resource_class(rc)
                        generation = self.client.set_inventories(self.uuid, generation, inventory)
                        self._published_inventory = inventory
                    if created and not traits:
                        self._published_traits = traits
                    if self._published_traits is None or traits != self._published_traits:
                        for trait in traits:
                            if trait.startswith("CUSTOM_"):
                                self.client.create_trait(trait)
                        generation = self.client.set_provider_traits(
                            self.uuid, generation, sorted(traits))
                        self._published_traits = traits
                    if mine is not None and (mine or not created) and (
                            adopted is None or set(mine) != adopted.aggregates):
                        self.client.set_aggregates(self.uuid, generation, mine)
                    break
                except ConflictError as exc:
                    if not exc.is_generation_conflict or attempt == 4:
                        raise
                    LOG.debug("provider %s changed meanwhile; retrying", self.uuid)
                    if adopted is not None:  # what was read is stale: write it all
                        adopted = self._published_inventory = self._published_traits = None
            self._sync_children()
            self.placement_pending = False

    def _sync_children(self) -> None:
        """Publish the nested providers once (named ``<node>_<name>``, as Nova names
        the children it makes); a node without any leaves what is there alone."""
        if self._children_published or not self.node.children:
            return
        root_name = self.node.nodename or self.node.host
        uuids: dict[str | None, str] = {None: self.uuid}
        for child in self.node.children:
            uuid = uuids[child.name] = child_uuid(self.node, child.name)
            publish_provider(self.client, uuid, f"{root_name}_{child.name}",
                             parent=uuids[child.parent], inventory=child.resources,
                             traits=child.traits)
        self._children_published = True

    # ----------------------------------------------------------------- usage
    def spawn(self, instance_uuid: str, flavor: Flavor, project_id: str | None = None,
              publish: bool = True, image_properties: Mapping[str, Any] | None = None, *,
              numa: Any = None, pci_requests: Any = None, numa_limits: Any = None) -> None:
        """Account for a new instance on this node and report. A report that fails
        takes the instance back out (the caller sees a failed spawn, and its claim goes):
        otherwise every later report of the node would carry it, and fail alike.

        ``numa`` (the guest's requested topology) and ``pci_requests`` are claimed from
        the node's cells and pools as they are now, under ``numa_limits`` (the
        scheduler's), as Nova's resource tracker claims them: DeviceClaimFailed when
        they no longer fit."""
        placed = _Placed(
            Instance(uuid=instance_uuid, instance_type_id=flavor.id, project_id=project_id,
                     image_properties=dict(image_properties or {})),
            flavor)
        with self._lock:
            if numa is not None or requests_of(pci_requests):
                placed.numa, placed.pci = self._claim_devices(numa, pci_requests, numa_limits)
                self._devices = None
                # Kept with the instance in the node's record: a restart claims it again.
                placed.instance.claims = {
                    "numa": placed.numa.to_dict() if placed.numa is not None else None,
                    "pci": [r.to_dict() for r in placed.pci] if placed.pci else None}
            self._placed[instance_uuid] = placed
        if publish:
            try:
                self.report()
            except BaseException:
                with self._lock:
                    if self._placed.get(instance_uuid) is placed:
                        del self._placed[instance_uuid]
                        self._devices = None  # its NUMA and PCI claims go with it
                raise

    def destroy(self, instance_uuid: str, publish: bool = True) -> None:
        """Forget an instance and report."""
        with self._lock:
            self._placed.pop(instance_uuid, None)
            self._devices = None
        if publish:
            self.report()

    # Moves: the source of a migration keeps the instance's usage (as Nova's resource
    # tracker counts an outgoing migration) but no longer lists the instance, which
    # runs on the destination now, until the move is confirmed (release) or reverted
    # (unhold).
    def hold(self, instance_uuid: str, publish: bool = True) -> None:
        """The instance left for another host; its usage stays here."""
        with self._lock:
            placed = self._placed.pop(instance_uuid, None)
            if placed is not None:
                self._held[instance_uuid] = placed
        if publish:
            self.report()

    def release(self, instance_uuid: str, publish: bool = True) -> None:
        """The move was confirmed: the held usage goes."""
        with self._lock:
            self._held.pop(instance_uuid, None)
            self._devices = None
        if publish:
            self.report()

    def unhold(self, instance_uuid: str, publish: bool = True) -> None:
        """The move was reverted: the instance runs here again, as it was."""
        with self._lock:
            placed = self._held.pop(instance_uuid, None)
            if placed is not None:
                self._placed[instance_uuid] = placed
        if publish:
            self.report()

    def _devices_now(self) -> tuple[Any, Any]:
        """The node's NUMA topology and PCI pools less what its instances (those held
        for a move too) claimed; under the lock."""
        if self._devices is None:
            numa, pci = self.node.numa_topology, self.node.pci_stats
            for p in [*self._placed.values(), *self._held.values()]:
                if p.numa is not None and numa is not None:
                    try:
                        numa = numa_usage_from_instance_numa(numa, p.numa)
                    except NUMAUsageError as exc:  # a restored claim the node cannot hold
                        LOG.warning("compute %s: instance %s: %s", self.node.host,
                                    p.instance.uuid, exc)
                if p.pci is not None and pci is not None:
                    try:
                        pci = pci.apply_requests(p.pci, p.numa.cells if p.numa else None,
                                                 host_numa=numa)
                    except PciRequestFailed as exc:  # the node's pools shrank under it
                        LOG.warning("compute %s: %s", self.node.host, exc)
                        pci = exc.partial
            self._devices = (numa, pci)
        return self._devices

    def _claim_devices(self, numa: Any, pci_requests: Any, limits: Any) -> tuple[Any, Any]:
        """The fitted topology and the PCI requests of a new instance; under the lock."""
        numa_now, pci_now = self._devices_now()
        requests = requests_of(pci_requests) or None
        fitted = None
        # A node that reports no NUMA topology checks none (Nova's claim skips it).
        if numa is not None and numa_now is not None:
            fitted = numa_fit_instance_to_host(numa_now, numa, limits, requests, pci_now)
            if fitted is None:
                raise DeviceClaimFailed(
                    f"{self.node.host}: the instance's NUMA topology no longer fits the "
                    "host's NUMA cells")
        if requests:
            if pci_now is None:
                raise DeviceClaimFailed(f"{self.node.host}: no PCI device pools for the "
                                        "instance's PCI requests")
            try:
                pci_now.apply_requests(requests, fitted.cells if fitted else None,
                                       host_numa=numa_now)
            except PciRequestFailed as exc:
                raise DeviceClaimFailed(f"{self.node.host}: {exc}") from None
        return fitted, requests

    def record_failed_build(self) -> None:
        """Count a failed build (the ``failed_builds`` stat, BuildFailureWeigher's
        input), as Nova's compute does only while ``[compute]
        consecutive_build_service_disable_threshold`` is non-zero."""
        if not self.config.compute.consecutive_build_service_disable_threshold:
            return
        with self._lock:
            self.failed_builds += 1

    def record_successful_build(self) -> None:
        """A build succeeded: the failures are no longer consecutive (Nova resets its
        counter the same way)."""
        with self._lock:
            self.failed_builds = 0

    def set_disabled(self, disabled: bool, reason: str | None = None) -> None:
        """Disable/enable the service: the trait and the service row change together."""
        self.set_service(disabled=disabled, reason=reason)

    def set_service(self, *, disabled: bool | None = None, reason: str | None = None,
                    forced_down: bool | None = None) -> dict[str, Any]:
        """An operator's switches on the node's compute service (Nova's ``PUT
        /os-services``): ``disabled`` (with its ``reason``; enabling clears it) and
        ``forced_down``; None leaves one as it is. A change of ``disabled`` publishes
        the ``COMPUTE_STATUS_DISABLED`` trait too, then the node reports at once. They
        last until changed again: a restarted agent takes them back from its stored
        record (:meth:`restore_usage`). Answers the service's state afterwards."""
        with self._lock:
            trait_changes = disabled is not None and disabled != self.disabled
            if disabled is not None:
                self.disabled = disabled
                self.disabled_reason = reason if disabled else None
            if forced_down is not None:
                self.forced_down = forced_down
            state = {"host": self.node.host, "nodename": self.node.nodename or self.node.host,
                     "disabled": self.disabled, "disabled_reason": self.disabled_reason,
                     "forced_down": self.forced_down}
        if trait_changes or self.placement_pending:
            self.sync_placement()
        self.report()
        return state

    # ----------------------------------------------------------------- reports
    def host_record(self, now: float) -> HostRecord:
        """The node's state as the scheduler sees it (Nova's ComputeNode + Service)."""
        config, node = self.config, self.node
        with self._lock:
            # Keyed by instance uuid; a report is built after every change, so at a busy
            # host's 100 instances these loops are a good part of it.
            instances = {uuid: p.instance for uuid, p in self._placed.items()}
            flavors = [p.flavor for p in self._placed.values()]
            flavors += [p.flavor for p in self._held.values()]
            baseline = [self.baseline] if self.baseline is not None else []
            baseline_instances = self.baseline_instances
            failed = self.failed_builds
            numa_now, pci_now = self._devices_now()
            disabled, reason, forced = self.disabled, self.disabled_reason, self.forced_down
        vcpus_used = config.reserved_host_cpus
        ram_used = config.reserved_host_memory_mb
        disk_used = math.ceil(config.reserved_host_disk_mb / 1024)
        for f in flavors + baseline:
            vcpus_used += f.vcpus
            ram_used += f.memory_mb
            disk_used += f.root_gb + f.ephemeral_gb
        cpu_info = node.cpu_info if isinstance(node.cpu_info, str) else json.dumps(
            dict(node.cpu_info), sort_keys=True)
        stats = dict(node.stats)
        stats.setdefault("io_workload", str(node.io_workload))
        stats["num_instances"] = str(len(instances) + baseline_instances)
        # Nova's computes report failed_builds only while the threshold is non-zero.
        stats.pop("failed_builds", None)
        if config.compute.consecutive_build_service_disable_threshold:
            stats["failed_builds"] = str(failed)
        service = ServiceRecord(host=node.host, disabled=disabled, disabled_reason=reason,
                                forced_down=forced, last_seen_up=now, created_at=self.created_at,
                                updated_at=now)
        return HostRecord(
            host=node.host, nodename=node.nodename or node.host, cell_uuid=node.cell_uuid,
            uuid=node.uuid,
            total_usable_ram_mb=node.memory_mb, free_ram_mb=node.memory_mb - ram_used,
            total_usable_disk_gb=node.local_gb, disk_mb_used=disk_used * 1024,
            free_disk_mb=(node.local_gb - disk_used) * 1024,
            vcpus_total=node.vcpus, vcpus_used=vcpus_used,
            hypervisor_type=node.hypervisor_type, hypervisor_version=node.hypervisor_version,
            hypervisor_hostname=node.nodename or node.host, host_ip=node.host_ip,
            cpu_info=cpu_info, supported_instances=[list(s) for s in node.supported_instances],
            stats=stats, metrics=list(node.metrics), numa_topology=numa_now,
            pci_stats=pci_now,
            cpu_allocation_ratio=resolved_ratio(node.cpu_allocation_ratio, "cpu", config),
            ram_allocation_ratio=resolved_ratio(node.ram_allocation_ratio, "ram", config),
            disk_allocation_ratio=resolved_ratio(node.disk_allocation_ratio, "disk", config),
            service=service, instances=instances,
            updated=now,
        )

    def report(self, now: float | None = None, *, if_changed: bool = False) -> int | None:
        """Publish state and heartbeat (now, or ``now``); returns the record's change
        number. A silent agent publishes its state under its last heartbeat: a host
        that is down stays down however its usage changes.

        With ``if_changed``, a state equal to the last one published (heartbeat aside)
        is not published: None, and the caller sends the heartbeat alone."""
        with self._lock:
            if now is None:
                silent_beat = self.last_heartbeat if self.silent else None
                now = self.clock() if silent_beat is None else silent_beat
            record = self.host_record(now)
            last = self._last_record
            self.last_heartbeat = now
            if if_changed and last is not None and _same_state(record, last):
                return None
            self._last_record = record
        return self.records.publish(self.uuid, record_to_report(record), now)

    def beat(self) -> float:
        """The heartbeat of now, for a report of it alone (the state went out with the
        last report: every change reports at once)."""
        with self._lock:
            now = self.last_heartbeat = self.clock()
        return now

    def adopt(self, held: HeldProvider) -> None:
        """Start from what placement holds of this node's provider (read by the caller
        before :meth:`register`): the first :meth:`sync_placement` writes only the
        inventories, traits and aggregates that differ from it, and
        :meth:`restore_usage` takes the provider's usages from it."""
        with self._lock:
            self._adopted = held
            self._published_inventory = held.inventory
            self._published_traits = set(held.traits)

    def register(self, aggregates: Sequence[Aggregate] | None = None,
                 switches: ServiceSwitches | None = None) -> None:
        """Take over the stored record's usage (:meth:`restore_usage`), take a cloud
        file's ``switches``, create the provider, publish inventories/traits/aggregates,
        then the record: its first report already says what the file says."""
        self.restore_usage()
        if switches is not None:
            self.take_switches(switches)
        self.sync_placement(aggregates)
        self.report()

    def take_switches(self, switches: ServiceSwitches) -> None:
        """A cloud file's switches on the node's service, for the next placement sync
        (the ``COMPUTE_STATUS_DISABLED`` trait) and report to publish. One an operator
        set (restored from the stored record) stays: the file can disable or force down,
        not undo an operator's."""
        with self._lock:
            if switches.down_since is not None:
                self.silent, self.last_heartbeat = True, switches.down_since
            self.forced_down = self.forced_down or switches.forced_down
            if switches.disabled:
                self.disabled, self.disabled_reason = True, switches.disabled_reason

    def restore_usage(self) -> None:
        """Take over what the node's stored record says it runs, as a compute service
        restarted on the same database does (Nova reads its instances back from its
        database; the usage a fresh agent reports must not drop them).

        Every instance of the record that still holds an allocation on this node is
        placed again, sized by that allocation (so the reports agree with placement);
        instances without one are gone. The rest of the provider's usage — consumers
        this agent does not know as instances, such as a seeded cloud's pre-existing
        workload — becomes the ``baseline``. ``failed_builds``, the last heartbeat and
        the service's switches (disabled with its reason, forced down: an operator's,
        which last until changed, as Nova's service row) come back too. Nothing happens
        without a stored record.
        """
        previous = self.records.report_of(self.uuid)
        if previous is None:
            return
        record = report_to_record(previous)
        placed: dict[str, _Placed] = {}
        for uuid, instance in record.instances.items():
            held = self.client.get_allocations(uuid).allocations.get(self.uuid)
            if not held:
                LOG.info("compute %s: instance %s holds no allocation here any more; "
                         "not restored", self.node.host, uuid)
                continue
            placed[uuid] = _restored(instance, _flavor_of(held, instance.instance_type_id))
        adopted = self._adopted
        if adopted is not None:
            usages = adopted.usages
        else:
            try:
                usages = self.client.provider_usages(self.uuid)
            except NotFoundError:
                usages = {}
        known = [p.flavor for p in placed.values()]
        rest = Flavor(
            name="preexisting",
            vcpus=max(0, usages.get("VCPU", 0) + usages.get("PCPU", 0)
                      - sum(f.vcpus for f in known)),
            memory_mb=max(0, usages.get("MEMORY_MB", 0) - sum(f.memory_mb for f in known)),
            root_gb=max(0, usages.get("DISK_GB", 0) - sum(f.root_gb for f in known)))
        stats = record.stats or {}
        with self._lock:
            if record.service is not None:  # an operator's switches last across restarts
                self.disabled = bool(record.service.disabled)
                self.disabled_reason = (record.service.disabled_reason if self.disabled
                                        else None)
                self.forced_down = bool(record.service.forced_down)
            self._placed.update(placed)
            self._devices = None
            self.baseline = rest if (rest.vcpus or rest.memory_mb or rest.root_gb) else None
            self.baseline_instances = max(
                0, _int_stat(stats, "num_instances") - len(record.instances))
            self.failed_builds = _int_stat(stats, "failed_builds")
            if record.service is not None and record.service.last_seen_up is not None:
                self.last_heartbeat = float(record.service.last_seen_up)

